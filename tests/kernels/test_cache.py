"""Tensor cache (LRU by bytes, safetensors disk store, concurrent writers) and program_tensors."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from headsurgeon.kernels.cache import TensorCache, cache_key
from headsurgeon.synth.sequence import Sequence
from headsurgeon.synth.tensors import mask_policy, program_tensors


def arr(seed: int, shape=(4, 4), dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).random(shape).astype(dtype)


def key(i: int) -> str:
    return cache_key(f"prog{i}", "seq", "causal/norm1")


# --------------------------------------------------------------------------- keys
def test_cache_key_is_content_address():
    k = cache_key("p" * 64, "s" * 32, "causal/norm1")
    assert k == cache_key("p" * 64, "s" * 32, "causal/norm1")
    assert len(k) == 40 and all(c in "0123456789abcdef" for c in k)
    others = {cache_key("q" * 64, "s" * 32, "causal/norm1"), cache_key("p" * 64, "t" * 32, "causal/norm1"),
              cache_key("p" * 64, "s" * 32, "bidirectional/norm1"), cache_key("p" * 64 + "s", "s" * 31, "causal/norm1")}
    assert k not in others and len(others) == 4
    with pytest.raises(ValueError, match="non-empty str seq_key"):
        cache_key("p", "", "causal")


# --------------------------------------------------------------------------- memory LRU
def test_roundtrip_copies_and_read_only():
    c = TensorCache(max_bytes=1 << 20)
    a = arr(0)
    c.put(key(0), a)
    a[0, 0] = 99.0                                  # the cache kept its own copy
    got = c.get(key(0))
    np.testing.assert_array_equal(got, arr(0))
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0, 0] = 1.0
    assert c.get(key(1)) is None
    s = c.stats
    assert (s.hits, s.misses, s.puts, s.entries, s.bytes) == (1, 1, 1, 1, a.nbytes)
    assert s.hit_rate == 0.5


def test_lru_evicts_least_recently_used_by_bytes():
    item = arr(0).nbytes                            # 64 bytes each
    c = TensorCache(max_bytes=3 * item)
    for i in range(3):
        c.put(key(i), arr(i))
    assert c.get(key(0)) is not None                # 0 becomes most recent; 1 is now the oldest
    c.put(key(3), arr(3))
    assert key(1) not in c and all(key(i) in c for i in (0, 2, 3))
    assert c.stats.evictions == 1 and c.stats.bytes == 3 * item
    c.put(key(4), arr(4, shape=(8, 4)))             # 2 items' worth: evicts the two oldest (2, then 0)
    assert [key(i) in c for i in range(5)] == [False, False, False, True, True]
    assert c.stats.bytes == 3 * item and c.stats.evictions == 3
    c.put(key(5), arr(5, shape=(16, 4)))            # larger than the budget: not kept in memory
    assert key(5) not in c and c.stats.bytes == 3 * item
    c.clear()
    assert len(c) == 0 and c.stats.bytes == 0


def test_rejects_bad_keys_and_object_arrays():
    c = TensorCache()
    with pytest.raises(ValueError, match="bad cache key"):
        c.put("../evil", arr(0))
    with pytest.raises(TypeError, match="numeric"):
        c.put(key(0), np.array([{"a": 1}], dtype=object))


# --------------------------------------------------------------------------- disk store
def test_disk_store_persists_and_is_safetensors(tmp_path):
    from safetensors.numpy import load_file

    c = TensorCache(max_bytes=1 << 20, directory=tmp_path)
    items = {key(i): arr(i, dtype=dt) for i, dt in enumerate([np.float32, np.float16, np.float64, np.int64])}
    c.put_many(items)
    c.put(key(9), arr(9))
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) == 2
    loaded = {}
    for s in shards:                                # the official reader agrees with ours
        loaded.update(load_file(s))
    assert set(loaded) == set(items) | {key(9)}
    for k, v in items.items():
        np.testing.assert_array_equal(loaded[k], v)
        assert loaded[k].dtype == v.dtype

    fresh = TensorCache(max_bytes=1 << 20, directory=tmp_path)
    for k, v in items.items():
        got = fresh.get(k)
        np.testing.assert_array_equal(got, v)
        assert got.dtype == v.dtype and not got.flags.writeable
    assert fresh.stats.disk_hits == 4 and fresh.stats.hits == 4
    assert fresh.get(key(0)) is not None and fresh.stats.disk_hits == 4  # now served from memory
    assert fresh.get(key(42)) is None and fresh.stats.misses == 1
    assert not list(tmp_path.glob(".tmp-*"))


def test_tiny_memory_budget_still_serves_from_disk(tmp_path):
    c = TensorCache(max_bytes=0, directory=tmp_path)
    c.put(key(0), arr(0))
    assert len(c) == 0
    np.testing.assert_array_equal(c.get(key(0)), arr(0))
    assert c.stats.disk_hits == 1


def test_partial_and_foreign_files_are_ignored(tmp_path):
    (tmp_path / ".tmp-abc.safetensors").write_bytes(b"\x10\x00")            # a writer's unfinished temp file
    (tmp_path / "broken.safetensors").write_bytes(b"\xff" * 8 + b"{")       # garbage header
    (tmp_path / "notes.txt").write_text("hello")
    c = TensorCache(directory=tmp_path)
    assert c.get(key(0)) is None
    c.put(key(0), arr(0))
    assert TensorCache(directory=tmp_path).get(key(0)) is not None


def test_sees_shards_written_by_another_instance(tmp_path):
    reader = TensorCache(directory=tmp_path)
    assert reader.get(key(0)) is None
    TensorCache(directory=tmp_path).put(key(0), arr(0))
    np.testing.assert_array_equal(reader.get(key(0)), arr(0))


def _writer(directory: str, worker: int, rounds: int) -> None:
    """Child process: write shared keys (same content in every process) and private keys, repeatedly."""
    c = TensorCache(max_bytes=1 << 20, directory=directory)
    for r in range(rounds):
        c.put_many({key(i): arr(i, shape=(64, 64)) for i in range(8)})      # same shard name in every worker
        c.put(key(100 + 10 * worker + r), arr(100 + 10 * worker + r, shape=(64, 64)))
        c._index.clear()                                                 # forget, so the next round rewrites
        c._scanned.clear()


def test_concurrent_writers_never_expose_partial_shards(tmp_path):
    workers, rounds = 4, 20
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, rounds)) for w in range(workers)]
    for p in procs:
        p.start()
    seen = 0
    deadline = time.time() + 60
    while any(p.is_alive() for p in procs) and time.time() < deadline:
        reader = TensorCache(max_bytes=0, directory=tmp_path)             # fresh reader: always from disk
        for i in list(range(8)) + [100 + 10 * w + r for w in range(workers) for r in range(rounds)]:
            got = reader.get(key(i))
            if got is not None:
                np.testing.assert_array_equal(got, arr(i, shape=(64, 64)))
                seen += 1
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    final = TensorCache(directory=tmp_path)
    for i in list(range(8)) + [100 + 10 * w + r for w in range(workers) for r in range(rounds)]:
        np.testing.assert_array_equal(final.get(key(i)), arr(i, shape=(64, 64)))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert final.stats.misses == 0


# --------------------------------------------------------------------------- program_tensors
def mkseq(ids) -> Sequence:
    ids = list(ids)
    tokens = [f"t{i}" for i in ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append((pos, pos + len(t)))
        pos += len(t) + 1
    return Sequence(ids=np.array(ids), tokens=tokens, text=" ".join(tokens), offsets=np.array(offsets))


class FakeProgram:
    """Attends to the key ``shift`` back (or to 0), records which sequences it evaluated."""

    def __init__(self, shift: int) -> None:
        self.shift = shift
        self.hash = f"fake-prev-{shift}"
        self.calls: list[list[int]] = []

    def evaluate(self, sequences, causal=True):
        self.calls.append([s.n for s in sequences])
        n = max(s.n for s in sequences)
        out = np.zeros((len(sequences), n, n), np.float32)
        for b, s in enumerate(sequences):
            for i in range(s.n):
                out[b, i, max(0, i - self.shift) if causal else min(s.n - 1, i + self.shift)] = 1.0
        return out


def direct(programs, seqs, causal=True):
    """Reference: each program evaluated on each sequence alone, padded by hand."""
    N = max(s.n for s in seqs)
    out = np.zeros((len(programs), len(seqs), N, N), np.float32)
    for p, prog in enumerate(programs):
        for b, s in enumerate(seqs):
            out[p, b, : s.n, : s.n] = prog.evaluate([s], causal=causal)[0, : s.n, : s.n]
    return out


def test_program_tensors_hits_and_partial_misses(tmp_path):
    seqs = [mkseq(range(n)) for n in (5, 3, 7)]
    progs = [FakeProgram(1), FakeProgram(2)]
    cache = TensorCache(directory=tmp_path)
    first = program_tensors(progs, seqs, causal=True, cache=cache)
    assert first.shape == (2, 3, 7, 7) and first.dtype == np.float32
    np.testing.assert_array_equal(first, direct([FakeProgram(1), FakeProgram(2)], seqs))
    assert [p.calls for p in progs] == [[[5, 3, 7]], [[5, 3, 7]]]
    assert cache.stats.misses == 6 and cache.stats.hits == 0

    again = program_tensors(progs, seqs, causal=True, cache=cache)      # all hits, no evaluation
    np.testing.assert_array_equal(again, first)
    assert [len(p.calls) for p in progs] == [1, 1] and cache.stats.hits == 6

    more = seqs[:2] + [mkseq([9, 9, 9, 9]), seqs[0]]                    # one new sequence, one duplicate
    mixed = program_tensors(progs, more, causal=True, cache=cache)
    assert [p.calls[-1] for p in progs] == [[4], [4]]                    # only the miss was computed
    np.testing.assert_array_equal(mixed, direct([FakeProgram(1), FakeProgram(2)], more))

    fresh = TensorCache(directory=tmp_path)                              # another process / a restart
    progs2 = [FakeProgram(1), FakeProgram(2)]
    np.testing.assert_array_equal(program_tensors(progs2, more, cache=fresh), mixed)
    assert all(p.calls == [] for p in progs2) and fresh.stats.disk_hits == 6


def test_program_tensors_mask_policy_and_no_cache():
    seqs = [mkseq(range(4)), mkseq(range(6))]
    prog = FakeProgram(1)
    cache = TensorCache()
    causal = program_tensors([prog], seqs, causal=True, cache=cache)
    bidir = program_tensors([prog], seqs, causal=False, cache=cache)     # different policy: not a hit
    assert len(prog.calls) == 2 and mask_policy(True) != mask_policy(False)
    np.testing.assert_array_equal(bidir, direct([FakeProgram(1)], seqs, causal=False))
    assert not np.array_equal(causal, bidir)
    half = program_tensors([prog], seqs, cache=None, dtype=np.float16)
    assert half.dtype == np.float16 and len(prog.calls) == 3
    np.testing.assert_array_equal(half.astype(np.float32), causal)


def test_program_tensors_rejects_bad_program_output():
    class Bad(FakeProgram):
        def evaluate(self, sequences, causal=True):
            return np.zeros((len(sequences), 2, 2), np.float32)

    with pytest.raises(ValueError, match="must return \\[B, N, N\\]"):
        program_tensors([Bad(1)], [mkseq(range(5))], cache=TensorCache())
    with pytest.raises(ValueError, match="at least one sequence"):
        program_tensors([FakeProgram(1)], [])


def test_program_tensors_with_real_dsl_program(tmp_path):
    program = pytest.importorskip("headsurgeon.synth.program", reason="headsurgeon/synth/program.py is not there yet")
    progs = [program.Program.parse("prev(1)"), program.Program.parse("0.7*prev(1) + 0.3*first()")]
    seqs = [mkseq([1, 5, 2, 5, 7]), mkseq([3, 3]), mkseq([4, 8, 15, 16, 23, 42])]
    cache = TensorCache(directory=tmp_path)
    got = program_tensors(progs, seqs, causal=True, cache=cache)
    np.testing.assert_allclose(got, direct(progs, seqs), atol=1e-7)
    # prev(1): row i puts all its mass on key i-1; row 0 has no previous key and falls back to key 0
    np.testing.assert_array_equal(got[0, 0, np.arange(1, 5), np.arange(0, 4)], 1.0)
    assert got[0, 0, 0, 0] == 1.0
    again = program_tensors(progs, seqs, causal=True, cache=TensorCache(directory=tmp_path))
    np.testing.assert_array_equal(again, got)


def test_program_tensors_fills_a_given_buffer():
    seqs = [mkseq(range(4)), mkseq(range(2))]
    buf = np.full((1, 2, 4, 4), 7.0, np.float32)             # stale content must not survive
    got = program_tensors([FakeProgram(1)], seqs, cache=TensorCache(), out=buf)
    assert got is buf
    np.testing.assert_array_equal(buf, direct([FakeProgram(1)], seqs))
    with pytest.raises(ValueError, match="needs \\(1, 2, 4, 4\\)"):
        program_tensors([FakeProgram(1)], seqs, out=np.zeros((1, 2, 5, 5), np.float32))
