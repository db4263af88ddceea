"""capture's shard writer thread: overlaps the forward, bounded, errors reach the caller, nothing lost, resumable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from headsurgeon.surgery.patterns import capture as capture_mod
from headsurgeon.surgery.patterns.capture import capture
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.patterns.pattern_entries import EntryBuilder
from headsurgeon.surgery.patterns.shard_writer import ShardWriteError, ShardWriter
from headsurgeon.surgery.patterns.store import AttentionStore

REAL_WRITE = AttentionStore.write_shard


@pytest.fixture(scope="module")
def seqs(stories, documents):
    return make_sequences(stories, documents[:24], max_len=32)[:16]


@pytest.fixture(scope="module")
def reference(stories, seqs, tmp_path_factory):
    """The same capture with nothing patched: what every interrupted or resumed run must end up equal to."""
    out = tmp_path_factory.mktemp("ref") / "store"
    capture(stories, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
    return AttentionStore.load(out)


def assert_same_store(directory: Path, reference: AttentionStore) -> None:
    store = AttentionStore.load(directory)
    for shard in range(reference.n_shards):
        got, want = store.read_shard(shard), reference.read_shard(shard)
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def listed_done(directory: Path) -> set[int]:
    return set(json.loads((directory / "manifest.json").read_text())["done_shards"])


def shard_of_batch(store: AttentionStore, idx: list[int]) -> int:
    return store.shard_of(idx[0])


def test_shards_are_written_while_the_next_batches_run(stories, seqs, tmp_path, monkeypatch, reference):
    """Shard 0's write waits until a batch of shard 1 has run: a capture that wrote in line could never get there."""
    next_batch_ran = threading.Event()
    waited: dict[int, bool] = {}
    real_forward = capture_mod.forward_entries

    def forward(handle, store, idx, call=None, executor=None):
        if shard_of_batch(store, idx) >= 1:
            next_batch_ran.set()
        return real_forward(handle, store, idx, call, executor)

    def write(self, shard, entries):
        if shard == 0:
            waited[shard] = next_batch_ran.wait(timeout=30)
        return REAL_WRITE(self, shard, entries)

    monkeypatch.setattr(capture_mod, "forward_entries", forward)
    monkeypatch.setattr(AttentionStore, "write_shard", write)
    capture(stories, seqs, out=tmp_path / "s", mode="topq", shard_size=4, batch_size=2, progress=False)
    assert waited == {0: True}
    assert_same_store(tmp_path / "s", reference)


def test_a_failed_write_is_raised_in_the_caller_and_the_capture_resumes(stories, seqs, tmp_path, monkeypatch,
                                                                       reference):
    def write(self, shard, entries):
        if shard == 1:
            raise OSError(28, "No space left on device")
        return REAL_WRITE(self, shard, entries)

    monkeypatch.setattr(AttentionStore, "write_shard", write)
    out = tmp_path / "s"
    with pytest.raises(ShardWriteError, match=r"shard_00001\.safetensors.*No space left.*re-run the same capture") as e:
        capture(stories, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
    assert isinstance(e.value.__cause__, OSError)
    assert listed_done(out) == {0}  # shard 0 stays recorded; nothing after the failure is written
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    monkeypatch.setattr(AttentionStore, "write_shard", REAL_WRITE)
    ran: list[int] = []
    real_forward = capture_mod.forward_entries
    monkeypatch.setattr(capture_mod, "forward_entries",
                        lambda h, st, ix, c=None, ex=None: ran.extend(ix) or real_forward(h, st, ix, c, ex))
    capture(stories, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
    assert sorted(ran) == list(range(4, len(seqs)))  # only the shards not written are recomputed
    assert_same_store(out, reference)


def test_shards_handed_over_are_written_when_the_caller_fails(stories, seqs, tmp_path, monkeypatch, reference):
    """The forward dies in shard 2 while shard 1 still waits in a slow writer's queue: shard 1 is written anyway."""
    real_forward = capture_mod.forward_entries

    def forward(handle, store, idx, call=None, executor=None):
        if shard_of_batch(store, idx) == 2:
            raise KeyboardInterrupt("killed")
        return real_forward(handle, store, idx, call, executor)

    def slow_write(self, shard, entries):
        time.sleep(0.3)
        return REAL_WRITE(self, shard, entries)

    monkeypatch.setattr(capture_mod, "forward_entries", forward)
    monkeypatch.setattr(AttentionStore, "write_shard", slow_write)
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        capture(stories, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
    assert listed_done(out) == {0, 1}
    assert not capture_threads()  # clean shutdown
    monkeypatch.setattr(capture_mod, "forward_entries", real_forward)
    capture(stories, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
    assert_same_store(out, reference)


def capture_threads() -> list[str]:
    """Capture's own threads still alive (other subsystems, e.g. the sandbox's spawner, keep theirs)."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("headsurgeon shard writer", "headsurgeon topq"))]


def test_a_failed_topq_selection_reaches_the_caller(stories, seqs, tmp_path, monkeypatch):
    def broken(self, layer, rows):
        raise RuntimeError("selection broke")

    monkeypatch.setattr(EntryBuilder, "_select", broken)
    with pytest.raises(RuntimeError, match="selection broke"):
        capture(stories, seqs, out=tmp_path / "s", mode="topq", shard_size=4, batch_size=2, progress=False)
    assert listed_done(tmp_path / "s") == set()
    assert not capture_threads()


def test_the_manifest_is_written_at_shard_boundaries_only(stories, seqs, tmp_path, monkeypatch):
    """One manifest write at the start and one per finished shard, each after that shard's file is complete."""
    calls: list[set[int]] = []
    real_save = AttentionStore.save_manifest

    def save(self, done):
        done = set(done)
        for shard in done:  # every shard the manifest is about to list is already in place, as recorded
            assert self.shard_path(shard).stat().st_size == self.shard_records[shard]["bytes"]
        calls.append(done)
        return real_save(self, done)

    monkeypatch.setattr(AttentionStore, "save_manifest", save)
    capture(stories, seqs, out=tmp_path / "s", shard_size=4, batch_size=3, progress=False)
    n_shards = -(-len(seqs) // 4)
    assert calls == [set()] + [set(range(k + 1)) for k in range(n_shards)]


@pytest.mark.parametrize("depth", [0, 1])
def test_writer_holds_at_most_depth_plus_one_shards(tmp_path, seqs, depth):
    """While one shard is being written and ``depth`` wait, handing over one more blocks until the write ends."""
    store = AttentionStore(seqs, 1, 1, directory=tmp_path, shard_size=4)
    started, release = threading.Event(), threading.Event()
    written: list[int] = []

    def write(shard, entries):
        started.set()
        release.wait(timeout=30)
        written.append(shard)
        return {"bytes": 0, "sha256": "0" * 64}

    store.write_shard = write
    store.save_manifest = lambda done: None
    with ShardWriter(store, depth=depth) as writer:
        writer.submit(0, {})
        assert started.wait(timeout=30)
        for shard in range(1, depth + 1):
            writer.submit(shard, {})  # waits beside the one being written
        extra = threading.Thread(target=writer.submit, args=(depth + 1, {}))
        extra.start()
        extra.join(timeout=0.5)
        assert extra.is_alive(), "submit must block while the writer holds depth + 1 shards"
        release.set()
        extra.join(timeout=30)
    assert written == list(range(depth + 2)) and writer.done == set(range(depth + 2))
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(9, {})


def test_writer_refuses_bad_settings(seqs, tmp_path):
    with pytest.raises(ValueError, match="needs a store with a directory"):
        ShardWriter(AttentionStore(seqs, 1, 1))
    with pytest.raises(ValueError, match="depth must be a whole number"):
        ShardWriter(AttentionStore(seqs, 1, 1, directory=tmp_path), depth=-1)


KILLED_RUN = textwrap.dedent("""
    import sys, time
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents
    from headsurgeon.surgery.models.loading import load_model
    import headsurgeon.surgery.patterns.store as store_mod

    real = store_mod.sha256_file
    def stall(path):
        if ".shard_00001." in str(path):
            time.sleep(600)  # inside shard 1's atomic write, its temporary written: the parent kills it here
        return real(path)
    store_mod.sha256_file = stall
    model, tok, corpus, out = sys.argv[1:5]
    h = load_model("llama2c:" + model, tokenizer=tok)
    seqs = make_sequences(h, read_documents(corpus)[:24], max_len=32)[:16]
    capture(h, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
""")


def test_a_capture_killed_by_sigkill_resumes_to_the_same_store(stories, seqs, tmp_path, reference, corpus_path):
    """A real crash (SIGKILL in the middle of writing shard 1) leaves a manifest that resumes to the same store."""
    from conftest import STORIES

    out = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(STORIES / "stories260K.bin"),
                             str(STORIES / "tok512.model"), str(corpus_path), str(out)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not list(out.glob(".shard_00001.*.tmp")):
            time.sleep(0.05)
        assert proc.poll() is None, "the capture ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert listed_done(out) == {0}
    assert list(out.glob(".shard_00001.*.tmp")), "the kill left shard 1's temporary behind"
    capture(stories, seqs, out=out, mode="topq", shard_size=4, batch_size=2, progress=False)
    assert_same_store(out, reference)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]  # the killed write's temporary is removed
