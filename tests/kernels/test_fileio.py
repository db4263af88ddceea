"""The shared file primitives: atomic replacement (no torn file after a failed write), hashes, JSON, documents."""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from headsurgeon.core.fileio import (atomic_file, atomic_write_bytes, atomic_write_json, json_bytes, sha256_bytes,
                                        sha256_file, split_documents)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "a.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["a.bin"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask  # as open() would create it, not mkstemp's 0600


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_file(target) as f:
            f.write(b'{"v": 2')
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_hashes_agree(tmp_path):
    data = bytes(range(256)) * 5000
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == sha256_bytes(data) == hashlib.sha256(data).hexdigest()


def test_json_handles_numpy_counters_paths_and_non_finite():
    obj = {"a": np.float32(1.5), "b": np.arange(3), "c": Counter("aab"), "d": Path("/x"), "e": float("nan"),
           "f": {1, 2}, "g": [float("inf")]}
    back = json.loads(json_bytes(obj))
    assert back == {"a": 1.5, "b": [0, 1, 2], "c": {"a": 2, "b": 1}, "d": "/x", "e": None, "f": [1, 2], "g": [None]}
    with pytest.raises(TypeError, match="not JSON-serializable"):
        json_bytes({"x": object()})


def test_split_documents():
    assert split_documents("a\nb\n\n  \n\nc\r\n\r\nd\n \t\ne") == ["a\nb", "c", "d", "e"]
    assert split_documents("\n\n") == []


def test_atomic_path_for_writers_that_take_a_file_name(tmp_path):
    from headsurgeon.core.fileio import atomic_path

    target = tmp_path / "shard.bin"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"first")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"torn")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["shard.bin"]
    assert target.stat().st_mode & 0o044  # readable like a file open() makes, not mkstemp's 0600
