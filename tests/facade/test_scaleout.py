"""headsurgeon/scaleout without a cluster: the per-head journal, the head-slice store reader (paths and fsspec
URLs), the executor's checks before the capture, and the ``explain --ray`` options."""
from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import CORPUS, need
from headsurgeon.scaleout import HeadJournal, HeadStore, JournalMismatchError, StoreUnreachable, chunked, preflight
from headsurgeon.scaleout.config import ScaleoutConfig
from headsurgeon.synth.splits import StoreSplits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stores(tmp_path_factory, stories):
    """A dense and a top-q store of 6 stories260K windows (two shards each)."""
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import load_corpus

    seqs = load_corpus(stories, need(CORPUS), max_len=16, max_sequences=12, seed=0).all[:6]
    root = tmp_path_factory.mktemp("stores")
    return {mode: capture(stories, seqs, out=root / mode, mode=mode, shard_size=4, progress=False)
            for mode in ("dense", "topq")}


@pytest.mark.parametrize("mode", ["dense", "topq"])
def test_head_store_reads_exactly_what_the_store_reads(stores, mode):
    store = stores[mode]
    heads = [(0, 1), (3, 7), (4, 0)]
    view = HeadStore(store.directory, heads)
    assert view.heads == heads and view.causal == store.causal and len(view.sequences) == len(store.sequences)
    for dtype in (np.float32, np.float16):
        want, want_len = store.batch([5, 0, 3], heads, dtype=dtype)
        got, got_len = view.batch([5, 0, 3], heads, dtype=dtype)
        assert got.dtype == want.dtype and np.array_equal(got, want) and np.array_equal(got_len, want_len)
    assert view.batch()[0].shape[0] == len(heads)  # default: the view's heads only


def test_head_store_reads_through_an_fsspec_url(stores):
    import fsspec

    store = stores["dense"]
    fs = fsspec.filesystem("memory")
    for path in store.directory.iterdir():
        fs.pipe(f"/hs-test-store/{path.name}", path.read_bytes())
    try:
        view = HeadStore("memory://hs-test-store", [(2, 5)])
        assert np.array_equal(view.batch([1, 4])[0], store.batch([1, 4], [(2, 5)])[0])
    finally:
        fs.rm("/hs-test-store", recursive=True)


def test_head_store_names_the_location_and_the_fix_when_it_cannot_read(tmp_path):
    with pytest.raises(StoreUnreachable, match="cannot read the attention store.*fsspec URL"):
        HeadStore(tmp_path / "absent")


def test_head_store_refuses_a_shard_of_the_wrong_size(stores, tmp_path):
    import shutil

    from headsurgeon.surgery.patterns.store import StoreError

    copy = tmp_path / "store"
    shutil.copytree(stores["dense"].directory, copy)
    with open(copy / "shard_00001.safetensors", "ab") as f:
        f.write(b"\0")
    with pytest.raises(StoreError, match="shard_00001.*bytes, the manifest recorded"):
        HeadStore(copy, [(0, 0)]).batch([5])


@pytest.mark.parametrize("change, message", [({"version": 99}, "format version 99; upgrade headsurgeon"),
                                             ({"version": "1"}, "malformed version"),
                                             ({"format": "other"}, "not an attention-store manifest"),
                                             ({"shard_size": 0}, "shard_size must be a whole number")])
def test_head_store_refuses_what_the_store_refuses(stores, tmp_path, change, message):
    """Workers read a store through the same manifest checks as AttentionStore.load (headsurgeon/surgery/patterns/store.py)."""
    import json
    import shutil

    from headsurgeon.surgery.patterns.store import AttentionStore, StoreError

    copy = tmp_path / "store"
    shutil.copytree(stores["dense"].directory, copy)
    meta = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**meta, **change}))
    for reader in (AttentionStore.load, HeadStore):
        with pytest.raises(StoreError, match=message):
            reader(copy)


def test_tasks_of_one_process_share_the_windows_of_one_sequences_file(stores, tmp_path, monkeypatch):
    """A worker's tasks read the same windows: the second task gets the first one's Sequence objects, with the
    features already computed; a sequences file that differs in anything (here one character of a text, which the
    ids' key does not see) gets its own, and only the last few files are kept."""
    import json
    import shutil

    from headsurgeon.scaleout import headstore

    first = HeadStore(stores["dense"].directory, [(0, 1)])
    first.sequences[0].features.word_index  # computed in the first task
    second = HeadStore(stores["dense"].directory, [(3, 7)])
    assert second.sequences is first.sequences
    assert "word_index" in second.sequences[0].features.to_dict()

    copy = tmp_path / "store"
    shutil.copytree(stores["dense"].directory, copy)
    items = json.loads((copy / "sequences.json").read_text())
    items[0]["text"] = items[0]["text"][:-1] + ("x" if items[0]["text"][-1] != "x" else "y")
    (copy / "sequences.json").write_text(json.dumps(items))
    changed = HeadStore(copy, [(0, 1)])
    assert changed.sequences is not first.sequences and changed.sequences[0].text != first.sequences[0].text

    monkeypatch.setattr(headstore, "KEPT_STORES", 1)
    HeadStore(copy, [(0, 1)])  # the most recent file is kept, the one before dropped
    assert HeadStore(stores["dense"].directory, [(0, 1)]).sequences is not first.sequences


@pytest.mark.smoke
def test_journal_keeps_the_first_record_and_refuses_other_inputs(tmp_path):
    book = HeadJournal(tmp_path / "heads")
    assert book.start({"seed": 0, "searchers": ["enumerative"]}) == {}
    book.write({"head": "L1H2", "entry": None, "value": 1})
    book.write({"head": "L1H2", "entry": None, "value": 2})  # a head is journaled once
    (tmp_path / "heads" / ".L0H0.json.abc.tmp").write_text("{half")  # a writer killed before its rename
    again = HeadJournal(tmp_path / "heads").start({"seed": 0, "searchers": ["enumerative"]})
    assert list(again) == [(1, 2)] and again[(1, 2)]["value"] == 1
    with pytest.raises(JournalMismatchError, match="differs in: seed.*delete"):
        HeadJournal(tmp_path / "heads").start({"seed": 1, "searchers": ["enumerative"]})


def test_journal_keeps_nan_scores(tmp_path):
    book = HeadJournal(tmp_path)
    book.start({})
    book.write({"head": "L0H0", "score": float("nan")})
    assert np.isnan(book.records()[(0, 0)]["score"])


def test_chunks_and_bad_heads_per_task():
    heads = [(0, h) for h in range(5)]
    assert chunked(heads, 2) == [heads[:2], heads[2:4], heads[4:]]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="heads_per_task"):
            chunked(heads, bad)


def test_preflight_refuses_bad_executors_and_unreachable_clusters():
    with pytest.raises(ValueError, match="executor must be one of"):
        preflight(ScaleoutConfig("dask"))
    with pytest.raises(ValueError, match="executor='ray'"):
        preflight(ScaleoutConfig("local", address="127.0.0.1:6379"))
    port = _free_port()
    with pytest.raises(ConnectionError, match=f"cannot reach a Ray cluster at 127.0.0.1:{port}.*ray start --head"):
        preflight(ScaleoutConfig("ray", address=f"127.0.0.1:{port}"))
    with pytest.raises(ConnectionError, match="not HOST:PORT"):
        preflight(ScaleoutConfig("ray", address="nowhere"))


def test_cli_explain_reports_an_unreachable_cluster_in_one_line(tmp_path):
    port = _free_port()
    r = subprocess.run([sys.executable, "-m", "headsurgeon.cli", "explain", "tiny-stories", str(need(CORPUS)),
                        str(tmp_path / "out"), "--ray", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "store").exists()  # refused before the capture


def test_cli_explain_ray_options_parse():
    from headsurgeon.cli import build_parser, parse

    parser = build_parser()
    plain = parse(parser, ["explain", "tiny-stories"])
    assert plain.address is None and plain.heads_per_task is None and not plain.delta_ppl
    local = parse(parser, ["explain", "tiny-stories", "corpus.txt", "out", "--ray"])
    assert local.address == "" and local.out == "out"  # --ray: the dest is ScaleoutConfig.address
    remote = parse(parser, ["explain", "tiny-stories", "--ray", "10.0.0.1:6379", "--heads-per-task", "4",
                            "--delta-ppl", "--store-url", "s3://b/store"])
    assert (remote.address, remote.heads_per_task, remote.delta_ppl, remote.store_url) == ("10.0.0.1:6379", 4, True,
                                                                                       "s3://b/store")


def test_a_task_runs_its_searchers_through_run_searchers(stores, monkeypatch):
    """explain's per-head work (scaleout/task.py) pools candidates with headsurgeon/synth/search/base.py ``run_searchers``,
    with the driver's factories (an unavailable searcher is noted, not fatal), and selects from that pool."""
    from headsurgeon.scaleout import task
    from headsurgeon.synth.search.base import run_searchers, searcher_factory

    store = stores["dense"]
    splits = StoreSplits((0, 1, 2), (3, 4), (5,))
    names = ("llm", "library")  # no endpoint configured here: the LLM agent is skipped with a note
    job = task.HeadJob(str(store.directory), splits,
                       searchers=tuple((n, searcher_factory(n)) for n in names),
                       options={"library": ["prev(1)", "first()", "self()"]})
    for var in ("HEADSURGEON_LLM_BASE_URL", "OPENAI_BASE_URL", "HEADSURGEON_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs["factories"])
        return run_searchers(*args, **kwargs)

    monkeypatch.setattr(task, "run_searchers", spy)
    records = task.explain_heads(job, [(1, 2), (0, 3)])
    assert [set(f) for f in calls] == [set(names)]
    notes: list[str] = []
    heads = [(1, 2), (0, 3)]
    want = run_searchers(HeadStore(store.directory, heads), names, splits, heads=heads, notes=notes,
                         settings=task.SearchSettings(progress=False, options=dict(job.options)))
    assert [r["candidates"] for r in records] == [len(want[h]) for h in heads] == [3, 3]
    assert records[0]["notes"] == notes and any("LLM agent skipped" in n for n in notes)


def test_the_compile_clock_counts_numba_compiles_inside_its_block_only():
    """scaleout/warmup.py: a fresh kernel's compile is counted inside the block; nothing after it."""
    from numba import njit

    from headsurgeon.scaleout.warmup import compile_clock

    @njit(cache=False)
    def twice(x):  # pragma: no cover - compiled
        return 2 * x

    with compile_clock() as clock:
        assert twice(3) == 6
    counted = clock.seconds
    assert counted > 0
    twice(4.5)  # a second signature compiles outside the block
    assert clock.seconds == counted


def test_the_run_estimate_waits_for_a_later_task_and_leaves_out_its_warm_up(stores, monkeypatch, tmp_path, capsys):
    """A worker's first task also starts it (here: 1.5 s of simulated numba warm-up), so the printed estimate for the
    rest of the run comes from the task after every worker's first, at its heads' own pace less its own warm-up
    (here 1.0 s under numba's compiler lock, then 0.2 s of work): scaleout/run.py."""
    import re
    import time

    from numba.core import event

    from headsurgeon.scaleout import run, task
    from headsurgeon.synth.search.base import run_searchers, searcher_factory

    assert run._estimate(2.0, 10, 1) == "20 s" and run._estimate(2.0, 10, 2) == "10 s"
    assert run._estimate(3.0, 60, 1) == "3 min" and run._estimate(-1.0, 5, 1) == "0 s"
    store = stores["dense"]
    job = task.HeadJob(str(store.directory), StoreSplits((0, 1, 2), (3, 4), (5,)),
                       searchers=(("library", searcher_factory("library")),), options={"library": ["prev(1)"]})
    calls = []

    def warming(*args, **kwargs):
        t0 = time.perf_counter()
        if len(calls) < 2:  # the first task warms up for 1.5 s; the second for 1.0 s, then works for 0.2 s
            with event.trigger_event("numba:compiler_lock"):
                time.sleep(1.5 if not calls else 1.0)
        if len(calls) == 1:
            time.sleep(0.2)
        calls.append(1)
        found = run_searchers(*args, **kwargs)
        kwargs["timings"]["library"] += time.perf_counter() - t0  # inside the searcher's time, as a compile is
        return found

    monkeypatch.setattr(task, "run_searchers", warming)
    heads = [(0, 0), (0, 1), (1, 0), (1, 1)]
    records, _, _ = run.run_heads(job, heads, tmp_path / "heads", fingerprint=job.fingerprint(store), workers=1,
                                  heads_per_task=1)
    assert records[heads[0]]["seconds"]["warmup"] >= 1.5 and records[heads[1]]["seconds"]["warmup"] >= 1.0
    said = capsys.readouterr()
    lines = re.findall(r"explain heads: (\d+) done in (\d+) s; at a later task's pace \(([\d.]+) s a head\) the other "
                       r"(\d+) will take about (\d+) s", said.out + said.err)
    assert len(lines) == 1, said.out + said.err  # once, after the second task
    done, took, pace, left, rest = lines[0]
    assert (done, left) == ("2", "2") and int(took) >= 2
    assert 0.15 <= float(pace) < 0.9  # the second task's 0.2 s of work, not its warm-up nor the first task's
    assert int(rest) <= 2
