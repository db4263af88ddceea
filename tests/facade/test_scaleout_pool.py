"""explain on this machine's cores (headsurgeon/scaleout/pool.py): two worker processes select exactly the programs,
with the same scores, as one process; a worker killed mid-run has its heads re-run; Ctrl-C stops the driver and
every worker and leaves a journal the same command resumes from. stories260K, 24 windows of 16 tokens, a narrow
enumerative search (as tests/facade/test_scaleout_ray.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import CORPUS, need
from support.explain_driver import MODEL, SETTINGS, drive, programs
from headsurgeon.scaleout.chunks import FIRST_TASK_HEADS, MAX_HEADS_PER_TASK, balanced

def _workers(pid: int) -> list[int]:
    """The driver's pool workers (its children running loky's worker main)."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"loky" in cmd and b"resource_tracker" not in cmd:
            found.append(int(child))
    return found


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: " + proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The run with every head in one process, this one (a driver of its own would only add a Python start): the
    reference."""
    from headsurgeon.pipeline import explain

    out = tmp_path_factory.mktemp("one") / "out"
    explain(MODEL, need(CORPUS), out, workers=1, **SETTINGS)
    return out


def test_balanced_tasks_cover_every_head_in_order_and_shrink_toward_the_end():
    heads = [(layer, head) for layer in range(30) for head in range(9)]
    for workers in (1, 2, 3, 16):
        chunks = balanced(heads, workers)
        assert [h for c in chunks for h in c] == heads
        assert all(0 < len(c) <= MAX_HEADS_PER_TASK for c in chunks)
        assert all(len(c) <= FIRST_TASK_HEADS for c in chunks[:workers])  # every worker's first task is short
    sizes = [len(c) for c in balanced(heads, 2)[2:]]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1  # the last tasks are the smallest
    assert balanced([], 2) == [] and balanced([], 1) == []


@pytest.fixture(scope="module")
def script_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """explain on two workers from a script that registers its own searcher ("mine": the enumerative searcher under
    another name, as a closure in __main__ with no main guard) and asks for the LLM agent without an endpoint; its
    folder and notes. One run serves the two tests below."""
    from support.searcher_store import LLM_ENV

    tmp = tmp_path_factory.mktemp("script")
    script = tmp / "mine.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from headsurgeon.pipeline import explain
        from headsurgeon.synth.search.base import register_searcher, searcher_factory

        runs = Path(sys.argv[1]) / "runs.txt"
        runs.write_text(runs.read_text() + "x" if runs.exists() else "x")

        def narrow(settings):  # the enumerative searcher under another name, as a closure of this script
            return searcher_factory("enumerative")(settings)

        register_searcher("mine", narrow)
        kw = json.loads(sys.argv[2])
        result = explain(kw.pop("model"), kw.pop("corpus"), kw.pop("out"), **kw)
        print(json.dumps({"notes": result.notes}))
    """))
    args = json.dumps({"model": MODEL, "corpus": str(need(CORPUS)), "out": str(tmp / "out"), **SETTINGS,
                       "searchers": ["mine", "llm"], "workers": 2})
    env = {k: v for k, v in os.environ.items() if k not in LLM_ENV}
    proc = subprocess.run([sys.executable, str(script), str(tmp), args], cwd=tmp, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, json.loads(proc.stdout.strip().splitlines()[-1])["notes"]


@pytest.mark.e2e
def test_two_workers_select_what_one_process_selects(one_process, script_run):
    """The script's searcher is the enumerative one under another name (its candidates name their searcher, so the
    files compare whole); the skipped LLM agent adds nothing."""
    folder, notes = script_run
    assert programs(folder / "out") == programs(one_process)  # programs, frontiers and scores, bit for bit
    assert any("2 worker processes × 1 thread" in n and "peak memory" in n for n in notes), notes




@pytest.mark.e2e
def test_ctrl_c_stops_every_worker_and_the_resumed_run_survives_a_killed_worker(one_process, tmp_path):
    """Ctrl-C stops the driver and every worker and leaves a journal; the same command resumes from it, and a worker
    killed during the resumed run has its heads re-run: the programs are the one process's (one chain, one full run)."""
    out = tmp_path / "out"
    proc = drive(tmp_path, out, wait=False, workers=2, heads_per_task=2)
    _wait_for(lambda: len(list((out / "heads").glob("L*H*.json"))) >= 2, proc, "the first heads were journaled")
    workers = _workers(proc.pid)
    assert workers
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "a worker outlived the interrupted driver"
    journaled = len(list((out / "heads").glob("L*H*.json")))
    assert 2 <= journaled < 40
    proc = drive(tmp_path, out, wait=False, workers=2, heads_per_task=2)
    _wait_for(lambda: len(_workers(proc.pid)) == 2, proc, "two workers started")
    _wait_for(lambda: len(list((out / "heads").glob("L*H*.json"))) >= journaled + 2, proc, "the resumed run journaled")
    os.kill(_workers(proc.pid)[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    notes = json.loads(stdout.strip().splitlines()[-1])["notes"]
    assert any(f"resumed {journaled} of 40 heads" in n for n in notes), notes
    assert any("lost workers 1 time(s)" in n for n in notes), notes
    assert programs(out) == programs(one_process)


def test_bad_worker_counts_are_refused_before_the_capture():
    from headsurgeon.scaleout.config import ScaleoutConfig
    from headsurgeon.scaleout.stage import preflight

    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="workers must be a whole number"):
            preflight(ScaleoutConfig("local", workers=bad))
    with pytest.raises(ValueError, match="drop --workers"):
        preflight(ScaleoutConfig("ray", workers=2))


def test_a_worker_whose_memory_grows_keeps_running_the_tasks():
    """A worker that keeps 400 MB after its first task (its kept windows, a large task's patterns) is not replaced, as
    loky replaces one that grew 300 MB: a new worker would pay its imports and the windows' features again."""
    from headsurgeon.scaleout.pool import worker_pool

    pytest.importorskip("psutil", reason="loky measures a worker's memory only where psutil is installed")
    grow = "import builtins; builtins.hs_kept = getattr(builtins, 'hs_kept', []) + [b'x' * (400 << 20)]"
    executor = worker_pool(1, 1)
    try:
        first = executor.submit(os.getpid).result(timeout=120)
        time.sleep(1.2)  # loky checks a worker's memory at most once a second, after a task
        executor.submit(exec, grow).result(timeout=120)
        time.sleep(1.2)
        pids = {executor.submit(os.getpid).result(timeout=120) for _ in range(3)}
    finally:
        executor.shutdown(wait=True, kill_workers=True)
    assert pids == {first}


@pytest.mark.e2e
def test_a_searcher_registered_in_a_script_runs_on_the_workers(script_run):
    """A script that registers its own searcher (a closure in __main__, no main guard) reaches the workers, and
    never runs twice: the workers do not re-run the script. The same run asks for the LLM agent without an
    endpoint: the agent is skipped with a note and the heads stay on the pool."""
    folder, notes = script_run
    assert (folder / "runs.txt").read_text() == "x"
    assert any("2 worker processes" in n for n in notes), notes
    assert any(n.startswith("LLM agent skipped") for n in notes), notes
    assert not any(n.startswith("the heads ran in this process") for n in notes), notes
    assert len(json.loads((folder / "out" / "programs.json").read_text())["programs"]) == 40


def test_forwards_take_the_free_cores_and_never_more(monkeypatch):
    import subprocess as sp

    import torch

    from headsurgeon.surgery import threads

    assert threads.threads_for(2, 0) == 2 and threads.threads_for(2, 2) == 1 and threads.threads_for(16, 5) == 11
    assert threads.threads_for(4, 0) == 4 and threads.threads_for(1, 9) == 1
    hogs = [sp.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        assert threads.busy_elsewhere() >= 2  # the two spinning processes are seen as busy
    finally:
        for p in hogs:
            p.kill()
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("HEADSURGEON_THREADS", "3")
        assert threads.fit_threads() == 3 and torch.get_num_threads() == 3
        monkeypatch.setenv("HEADSURGEON_THREADS", "two")
        with pytest.raises(ValueError, match="HEADSURGEON_THREADS='two' is not a whole number"):
            threads.fit_threads()
        monkeypatch.delenv("HEADSURGEON_THREADS")
        assert 1 <= threads.fit_threads() <= threads.usable_cores()
    finally:
        threads.pin_threads(before)
