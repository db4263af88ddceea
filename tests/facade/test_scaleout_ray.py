"""explain on Ray (headsurgeon/scaleout/): a local runtime and a `ray start` cluster reached by address select
exactly the programs, with the same scores, as the serial run; a driver killed mid-run resumes on the cluster from
the per-head journal, and a worker killed mid-run is retried by Ray; an unreachable cluster or an invisible store
is a clear error. A serial explain never imports Ray. stories260K, 24 windows of 16 tokens, a narrow enumerative search."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CORPUS, need
from support.explain_driver import MODEL, SETTINGS, drive, programs

ray = pytest.importorskip("ray", reason="pip install 'headsurgeon[ray]' (in the test extra)")

def _assert_sameprograms(got: dict, want: dict, path: str = "programs.json") -> None:
    """The same programs, texts, glosses, frontiers and scores, bit for bit (the path names the first difference)."""
    if isinstance(want, dict) and isinstance(got, dict):
        assert got.keys() == want.keys(), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            _assert_sameprograms(got[key], want[key], f"{path}/{key}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), f"{path}: {len(got)} items != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_sameprograms(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def _wait_for_records(out: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while len(list((out / "heads").glob("L*H*.json"))) < n:
        assert proc.poll() is None, "the run ended before it could be interrupted: " + proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "no journal records appeared"
        time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def ray_auth():
    """Token authentication off for this module's clusters (loopback only, stopped by the tests): the token file
    ~/.ray/auth_token is shared with every other Ray user of this machine, who may replace it mid-test."""
    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    yield
    if old is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = old


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The serial run (with per-head ΔPPL), in its own process, and whether it imported Ray."""
    tmp = tmp_path_factory.mktemp("serial")
    summary = drive(tmp, tmp / "out", delta_ppl=True)
    return tmp / "out", summary


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray runtime of 2 CPUs for this module, shut down after it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield
    ray.shutdown()


@pytest.mark.e2e
def test_a_serial_explain_never_imports_ray(serial):
    out, summary = serial
    assert summary["ray_imported"] is False
    assert len(list((out / "heads").glob("L*H*.json"))) == 40  # every head journaled, serial or not


@pytest.mark.e2e
def test_a_worker_that_cannot_see_the_store_is_a_clear_error(serial, local_ray, tmp_path):
    from headsurgeon.pipeline import explain
    from headsurgeon.scaleout import StoreUnreachable

    with pytest.raises(StoreUnreachable, match="cannot read the store.*hs-nowhere.*fsspec URL"):
        explain(MODEL, need(CORPUS), tmp_path / "out", executor="ray", store_url=str(tmp_path / "hs-nowhere"),
                **SETTINGS)


@pytest.fixture
def cluster(tmp_path):
    """`ray start --head` on 127.0.0.1 with 2 CPUs (kept in the foreground by --block, so this test stops exactly
    the processes it started), and its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = Path("/tmp") / f"hsray-{os.getpid()}-{port}"  # short: Ray's unix socket paths must stay < 108 bytes
    exe = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(exe), "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                             "--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--block", "--disable-usage-stats"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert head.poll() is None, "ray start failed: " + head.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the Ray head did not come up"
            time.sleep(0.5)
    yield head, f"127.0.0.1:{port}"
    head.send_signal(signal.SIGTERM)  # --block: stopping it stops the cluster's processes
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.e2e
def test_a_killed_driver_resumes_on_a_cluster_that_survives_a_killed_worker(serial, cluster, tmp_path):
    """A serial driver killed mid-run; the same run resumed on a `ray start` cluster by address keeps the journaled
    heads, survives a worker killed mid-task (Ray retries it), computes every other head and every head's ΔPPL on
    workers, and ends where the serial run did."""
    import psutil

    head, address = cluster
    out = tmp_path / "out"
    proc = drive(tmp_path, out, wait=False, heads_per_task=2, delta_ppl=True)
    try:
        _wait_for_records(out, 6, proc)
    finally:
        proc.kill()  # SIGKILL: no cleanup, as a lost driver
        proc.communicate()
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "heads").glob("L*H*.json")}
    assert 6 <= len(before) < 40 and not (out / "programs.json").exists()
    proc = drive(tmp_path, out, wait=False, executor="ray", address=address, heads_per_task=4, delta_ppl=True)
    killed = None
    try:
        deadline = time.monotonic() + 600
        while killed is None:  # kill a worker while it runs a task (its process title names the task)
            assert proc.poll() is None, "the run ended before a worker could be killed: " + proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no worker ran a task"
            for p in psutil.Process(head.pid).children(recursive=True):
                try:
                    if "ray::explain_heads" in " ".join(p.cmdline()):
                        p.kill()
                        killed = p.pid
                        break
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == psutil.STATUS_ZOMBIE
    notes = json.loads(stdout.strip().splitlines()[-1])["notes"]
    assert f"resumed {len(before)} of 40 heads from the journal {out / 'heads'}" in notes
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "heads").glob("L*H*.json")}
    assert len(after) == 40 and all(after[name] == before[name] for name in before)  # finished heads untouched
    _assert_sameprograms(programs(out), programs(serial[0]))  # same programs, frontier and scores
    want = json.loads((serial[0] / "summary.json").read_text())["delta_ppl"]
    got = json.loads((out / "summary.json").read_text())["delta_ppl"]
    assert len(got) == 40 and got.keys() == want.keys()
    assert all(abs(got[h] - want[h]) <= 1e-9 * max(1.0, abs(want[h])) for h in want)


def test_llm_caps_hold_across_the_cluster(local_ray):
    """Two tasks of three request threads each share one gate: at most ``concurrency`` requests in flight over
    the cluster, and no request starts once the cluster's cost reached ``cost_cap`` (a per-worker cap would let
    each worker spend the whole cap)."""
    import threading
    from types import SimpleNamespace

    from headsurgeon.scaleout.llmgate import start_gate
    from headsurgeon.synth.search.llm.config import AgentConfig

    config = AgentConfig(model="m", base_url="http://127.0.0.1:9/v1", concurrency=2, cost_cap=0.1,
                         price_prompt_per_1k=0.01, progress=False)  # 0.01 USD per request below

    def ask_until_capped(gate_name, config, threads):
        from headsurgeon.scaleout.llmgate import GatedClient
        from headsurgeon.synth.search.llm.transport import CostCapReached

        class Endpoint:
            def create(self, **kwargs):
                time.sleep(0.05)
                return SimpleNamespace(usage=SimpleNamespace(prompt_tokens=1000, completion_tokens=0), choices=[])

        client = GatedClient(gate_name, config, inner=SimpleNamespace(chat=SimpleNamespace(completions=Endpoint())))
        sent = []

        def loop():
            n = 0
            while True:
                try:
                    client.chat.completions.create(model="m", messages=[])
                except CostCapReached:
                    break
                n += 1
            sent.append(n)

        workers = [threading.Thread(target=loop) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return sum(sent)

    gate = start_gate("hs-test-gate", config)
    try:
        sent = ray.get([ray.remote(ask_until_capped).remote("hs-test-gate", config, 3) for _ in range(2)])
        stats = ray.get(gate.stats.remote())
    finally:
        ray.kill(gate)
    assert sum(sent) == stats["requests"] and stats["refused"] >= 6  # every thread was refused once at the end
    assert 1 <= stats["max_in_flight"] <= config.concurrency
    assert config.cost_cap <= stats["cost"] <= config.cost_cap + config.concurrency * 0.01 + 1e-9


@pytest.mark.e2e
def test_a_searcher_registered_at_run_time_runs_on_workers(local_ray, tmp_path):
    """The driver's registry entry travels with the task: a searcher registered only in this process (as
    docs/architecture.md's recipe does) runs on workers whose registry never saw it, and selects as serially."""
    from headsurgeon.pipeline import explain
    from headsurgeon.synth.search import register_searcher, unregister_searcher

    def factory(settings):
        class Offsets:
            name = "hs-offsets"

            def search(self, store, splits, *, heads=None, progress=True, budget=None, cancel=None):
                from headsurgeon.synth.scored import ScoredProgram
                from headsurgeon.synth.program import Program
                from headsurgeon.synth.select import score_programs

                heads = list(store.heads if heads is None else heads)
                programs = [Program.parse(f"prev({k})") for k in (1, 2, 3)]
                got = {s: score_programs(store, heads, programs, splits[s]) for s in ("synth", "select")}
                return {h: [ScoredProgram(p, self.name, scores={s: {m: float(got[s][m][r, j]) for m in ("iou", "jsd")}
                                                              for s in got}) for j, p in enumerate(programs)]
                        for r, h in enumerate(heads)}

            def report(self):
                return ""

        return Offsets()

    register_searcher("hs-offsets", factory)
    try:
        kw = {**SETTINGS, "searchers": ["hs-offsets"]}
        explain(MODEL, need(CORPUS), tmp_path / "serial", **kw)
        explain(MODEL, need(CORPUS), tmp_path / "ray", executor="ray", heads_per_task=8, **kw)
    finally:
        unregister_searcher("hs-offsets")
    _assert_sameprograms(programs(tmp_path / "ray"), programs(tmp_path / "serial"))
    assert any(e["source"] == "hs-offsets" for e in programs(tmp_path / "ray")["programs"])
