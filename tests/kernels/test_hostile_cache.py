"""A tensor-cache folder that someone else writes to (headsurgeon/kernels/cache.py, SECURITY.md "Tensor cache").

An entry rewritten by another writer (still valid safetensors, its stored digest kept or recomputed without
this user's key) must not change a hybrid's output: it is a miss with a warning, and the program is run
again. Shards are read like hostile files (no symlinks, no FIFOs, offsets checked), and a new cache folder
is private.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save

from headsurgeon.kernels.cache import CacheEntryWarning, TensorCache, cache_key
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."


def key(i: int) -> str:
    return cache_key(f"prog{i}", "seq", "causal/norm1")


def metadata_of(path) -> dict:
    n = int.from_bytes(path.read_bytes()[:8], "little")
    return json.loads(path.read_bytes()[8:8 + n]).get("__metadata__", {})


def rewrite(path, change) -> None:
    """Rewrite every tensor of a shard with ``change(array)``, keeping it valid safetensors and its metadata."""
    meta = metadata_of(path)
    tensors = {k: np.ascontiguousarray(change(v)) for k, v in load_file(path).items()}
    path.write_bytes(save(tensors, metadata=meta))


def test_rewritten_entry_is_a_miss_with_a_warning(tmp_path):
    c = TensorCache(directory=tmp_path)
    good = np.full((4, 4), 0.25, np.float32)
    c.put(key(0), good)
    (shard,) = tmp_path.glob("*.safetensors")
    rewrite(shard, lambda a: np.eye(4, dtype=a.dtype))
    fresh = TensorCache(directory=tmp_path)
    with pytest.warns(CacheEntryWarning, match="do not match their digests"):
        assert fresh.get(key(0)) is None
    fresh.put(key(0), good)  # the caller recomputes; the next reader gets the right entry
    np.testing.assert_array_equal(TensorCache(directory=tmp_path).get(key(0)), good)


def test_a_digest_recomputed_without_the_users_key_is_refused(tmp_path):
    """The digest is keyed: another writer who knows the format still cannot make a valid one."""
    TensorCache(directory=tmp_path).put(key(0), np.zeros((3, 3), np.float32))
    (shard,) = tmp_path.glob("*.safetensors")
    fake = np.ones((3, 3), np.float32)
    meta = metadata_of(shard)
    for name in meta:
        if name != "format":
            meta[name] = hashlib.sha256(key(0).encode() + fake.tobytes()).hexdigest()
    shard.write_bytes(save({key(0): fake}, metadata=meta))
    with pytest.warns(CacheEntryWarning):
        assert TensorCache(directory=tmp_path).get(key(0)) is None


def test_entries_without_a_digest_are_misses(tmp_path):
    TensorCache(directory=tmp_path)  # makes the folder's key
    (tmp_path / ("a" * 32 + ".safetensors")).write_bytes(save({key(0): np.ones((2, 2), np.float32)}))
    with pytest.warns(CacheEntryWarning):
        assert TensorCache(directory=tmp_path).get(key(0)) is None


def test_poisoned_cache_does_not_change_a_hybrids_output(stories, tmp_path):
    ids = torch.tensor([stories.tokenizer(STORY).input_ids])
    programs = {(0, 1): Program.parse("uniform()"), (2, 3): Program.parse("decay(0.5)")}  # dense float32 entries

    def logits(cache):
        hybrid = replace_heads(stories, programs, cache=cache)
        try:
            with torch.no_grad():
                return hybrid(ids)
        finally:
            hybrid.restore()

    want = logits(TensorCache())  # uncached: memory only, fresh
    logits(TensorCache(directory=tmp_path))  # fills the folder
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert shards
    for shard in shards:  # another writer swaps in different, valid patterns under the same names
        rewrite(shard, lambda a: np.tril(np.ones_like(a))[..., ::-1].copy() if a.ndim >= 2 else a)
    poisoned = TensorCache(directory=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = logits(poisoned)
    assert any(issubclass(w.category, CacheEntryWarning) for w in caught)
    assert poisoned.stats.disk_hits == 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_symlinked_and_fifo_entries_are_refused(tmp_path):
    cache_dir, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    TensorCache(directory=cache_dir).put(key(0), np.ones((2, 2), np.float32))
    (shard,) = cache_dir.glob("*.safetensors")
    elsewhere.mkdir()
    moved = elsewhere / shard.name
    os.rename(shard, moved)
    os.symlink(moved, shard)  # the same valid bytes, reached through a link
    assert TensorCache(directory=cache_dir).get(key(0)) is None
    shard.unlink()
    os.mkfifo(shard)  # reading a FIFO would block forever
    c = TensorCache(directory=cache_dir)
    assert c.get(key(0)) is None and key(0) not in c


def test_header_and_offsets_are_checked_before_reading(tmp_path):
    TensorCache(directory=tmp_path).put(key(0), np.ones((2, 2), np.float32))
    (shard,) = tmp_path.glob("*.safetensors")
    data = shard.read_bytes()
    shard.write_bytes((1 << 40).to_bytes(8, "little") + data[8:])  # a header larger than the file
    assert TensorCache(directory=tmp_path).get(key(0)) is None
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header[key(0)]["data_offsets"] = [0, 1 << 30]  # a tensor past the end of the file
    text = json.dumps(header).encode()
    shard.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])
    assert TensorCache(directory=tmp_path).get(key(0)) is None


def test_a_new_cache_folder_and_its_key_are_private(tmp_path):
    folder = tmp_path / "new" / "cache"
    TensorCache(directory=folder)
    assert stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(folder / ".cache-key").st_mode) == 0o600


def test_a_folder_others_can_write_is_warned_about(tmp_path):
    os.chmod(tmp_path, 0o777)
    with pytest.warns(CacheEntryWarning, match="can be written by other users"):
        TensorCache(directory=tmp_path)


def test_a_key_file_others_can_read_is_not_used(tmp_path):
    c = TensorCache(directory=tmp_path)
    c.put(key(0), np.ones((2, 2), np.float32))
    os.chmod(tmp_path / ".cache-key", 0o644)
    with pytest.warns(CacheEntryWarning, match="cannot be used"):
        other = TensorCache(directory=tmp_path)
    with pytest.warns(CacheEntryWarning, match="do not match"):
        assert other.get(key(0)) is None
