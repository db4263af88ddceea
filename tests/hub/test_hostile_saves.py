"""Concurrent saves into one checkpoint folder (headsurgeon/hub/checkpoint/lock.py, SECURITY.md "Checkpoints").

Two real processes save different hybrids into one folder, 15 rounds each, while this process loads it
over and over: every load must succeed and show one writer's complete checkpoint, and the folder left at
the end must load as the last writer's.
"""
from __future__ import annotations

import multiprocessing as mp
import pytest

from headsurgeon.hub.checkpoint import CheckpointError, load_hybrid, save_hybrid
from headsurgeon.hub.checkpoint import lock as ck_lock
from headsurgeon.hub.checkpoint.lock import folder_lock
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program

ROUNDS = 15
WRITERS = {
    "a": {(0, 1): "prev(1)", (1, 2): "first()"},
    "b": {(2, 3): "prev(2)", (3, 4): "uniform()", (4, 5): "self()"},
}


def _programs(name: str) -> dict:
    return {head: Program.parse(text) for head, text in WRITERS[name].items()}


def _writer(handle, name: str, target: str, go, errors) -> None:
    """One saving process: ROUNDS saves of its own hybrid (forked, so it shares the parent's model)."""
    try:
        hybrid = replace_heads(handle, _programs(name))
        hybrid.restore()
        go.wait(30)
        for k in range(ROUNDS):
            save_hybrid(hybrid, target, metrics={"writer": name, "round": k})
    except BaseException as e:  # reported to the parent, which fails the test with it
        errors.put(f"{name}: {type(e).__name__}: {e}")
        raise SystemExit(1)


def test_two_processes_saving_fifteen_rounds_leave_a_loadable_folder(stories, tmp_path):
    target = tmp_path / "ck"
    first = replace_heads(stories, _programs("a"))
    first.restore()
    save_hybrid(first, target)
    ctx = mp.get_context("fork")  # the writers share the loaded model; conftest pins torch to one thread
    go, errors = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(stories, name, str(target), go, errors)) for name in WRITERS]
    for p in procs:
        p.start()
    go.set()
    loads, seen = 0, set()
    try:
        while any(p.is_alive() for p in procs):
            loaded = load_hybrid(target)  # never a half-written folder, never one save's manifest with another's files
            loaded.restore()
            seen.add(frozenset((h, str(p)) for h, p in loaded.replaced.items()))
            loads += 1
    finally:
        for p in procs:
            p.join(120)
    problems = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert not problems, problems
    assert [p.exitcode for p in procs] == [0, 0]
    assert loads >= 1
    wanted = {name: frozenset((h, str(p)) for h, p in _programs(name).items()) for name in WRITERS}
    assert seen <= set(wanted.values())
    final = load_hybrid(target)
    final.restore()
    manifest = (target / "manifest.json").read_text()
    assert f'"round": {ROUNDS - 1}' in manifest  # the folder holds a last round, complete
    assert frozenset((h, str(p)) for h, p in final.replaced.items()) in wanted.values()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary or aside folders left


def _hold(target: str, ready, release) -> None:
    with folder_lock(target, exclusive=True):
        ready.set()
        release.wait(30)


def test_a_load_while_another_process_holds_the_swap_lock_says_it_is_being_written(stories, tmp_path,
                                                                                     monkeypatch):
    target = tmp_path / "ck"
    hybrid = replace_heads(stories, _programs("a"))
    hybrid.restore()
    save_hybrid(hybrid, target)
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(target), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        monkeypatch.setattr(ck_lock, "LOCK_WAIT_S", 0.2)
        with pytest.raises(CheckpointError, match="being written by another process"):
            load_hybrid(target)
    finally:
        release.set()
        holder.join(30)
    load_hybrid(target).restore()  # the lock went with its holder: the folder loads again
