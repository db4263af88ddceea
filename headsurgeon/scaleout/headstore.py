"""A read-only view of an attention store (surgery/store.py) that reads only the heads a task needs.

Workers open the store by a path or an fsspec URL that every worker can see, and fetch each (layer, head)
slice of each shard by byte range: a head of a dense store is one contiguous run of float16 in its
sequence's ``[L, H, n, n]`` tensor (a top-q store: ``[L, H, q]`` indices and values). Shard sizes are checked
against the manifest; sha256 is not (that would read every head), the driver's capture checked it when it wrote.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Sequence as Seq

import numpy as np

from ..kernels.fileio import UnsafeFileError, read_bounded
from ..surgery.store import (MAX_MANIFEST_BYTES, MAX_SEQUENCES_BYTES, SEQUENCES_FILE, StoreError, check_manifest,
                              check_sequences, check_settings, listed_shards, manifest_from_bytes, sequences_from_bytes,
                              shard_records)

_DTYPES = {"F16": np.float16, "F32": np.float32, "I32": np.int32, "I64": np.int64}


class StoreUnreachable(StoreError):
    """This process cannot read the store at the location it was given."""


def _filesystem(location: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for a local path or an fsspec URL."""
    import fsspec  # a dependency of transformers/huggingface_hub; imported here so the module loads without it

    if "://" not in location:
        location = os.path.abspath(location)
    fs, path = fsspec.core.url_to_fs(location)
    return fs, path.rstrip("/")


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def read_small(fs: Any, path: str, limit: int, what: str) -> bytes:
    """A whole (small) file of the store, bounded: locally through kernels/fileio.py ``read_bounded`` (no symlinks
    or devices, size first); elsewhere the size the filesystem reports is checked before the bytes are fetched."""
    if _is_local(fs):
        return read_bounded(path, limit, what)
    size = fs.size(path)
    if not isinstance(size, int) or size > limit:
        raise StoreError(f"{path} is {size} bytes; {what} may hold at most {limit} bytes")
    return fs.cat_file(path, start=0, end=size)


class HeadStore:
    """``PatternSource`` (synth/search/base.py) over ``heads`` of the store at ``location`` (path or fsspec URL).

    Reads ``manifest.json`` and ``sequences.json`` once, then per ``batch`` call only the byte ranges of the
    requested heads (kept in memory for the task's later reads).
    """

    def __init__(self, location: str | os.PathLike, heads: Seq[tuple[int, int]] | None = None) -> None:
        self.location = str(location)
        try:
            self.fs, self.root = _filesystem(self.location)
            raw_meta = read_small(self.fs, f"{self.root}/manifest.json", MAX_MANIFEST_BYTES, "a store manifest")
            raw_seqs = read_small(self.fs, f"{self.root}/{SEQUENCES_FILE}", MAX_SEQUENCES_BYTES,
                                  "a store's sequences file")
        except UnsafeFileError as e:
            raise StoreError(f"{e}; capture the store again") from None
        except StoreError:
            raise
        except (OSError, ValueError, ImportError) as e:
            raise StoreUnreachable(
                f"cannot read the attention store at {self.location!r} from host {os.uname().nodename} "
                f"({type(e).__name__}: {e}); put the store on a filesystem every worker mounts at the same path, "
                "or pass an fsspec URL the workers can open (e.g. s3://bucket/run/store)") from None
        # the same checks as AttentionStore.load (surgery/store.py), on the bytes this reader fetched
        where = f"{self.location}/manifest.json"
        meta = manifest_from_bytes(raw_meta, where)
        check_manifest(meta, where)
        self.sequences = sequences_from_bytes(raw_seqs, f"{self.location}/{SEQUENCES_FILE}")
        check_sequences(meta, self.sequences, f"{self.location}/{SEQUENCES_FILE}")
        try:
            self.n_layers, self.n_heads = int(meta["n_layers"]), int(meta["n_heads"])
            self.mode, self.causal = meta["mode"], bool(meta["causal"])
            self.model_name, self.shard_size = meta.get("model", ""), meta["shard_size"]
            check_settings(self.mode, meta["q_frac"], self.shard_size)
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{where} is missing or has malformed settings ({e}); delete the directory and capture "
                             "again") from None
        n_shards = max(1, -(-len(self.sequences) // self.shard_size))
        missing = set(range(n_shards)) - listed_shards(meta, n_shards)
        if missing:
            raise StoreError(f"{self.location} is incomplete ({len(missing)} of {n_shards} shards missing); re-run the "
                             "capture to finish it")
        self.records = shard_records(meta)
        everything = [(layer, h) for layer in range(self.n_layers) for h in range(self.n_heads)]
        self._heads = everything if heads is None else [(int(a), int(b)) for a, b in heads]
        bad = [h for h in self._heads if h not in set(everything)]
        if bad:
            raise StoreError(f"heads {bad[:5]} are not in the store ({self.n_layers} layers x {self.n_heads} heads)")
        self._headers: dict[int, tuple[int, dict]] = {}
        self._cache: dict[tuple[int, int, int], np.ndarray] = {}

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The heads this view serves (the task's heads)."""
        return list(self._heads)

    def shard_path(self, shard: int) -> str:
        return f"{self.root}/shard_{shard:05d}.safetensors"

    def _header(self, shard: int) -> tuple[int, dict]:
        """(data start, safetensors header) of a shard, its size checked against the manifest's record."""
        if shard not in self._headers:
            path = self.shard_path(shard)
            record = self.records.get(shard)
            if record is not None and self.fs.size(path) != record["bytes"]:
                raise StoreError(f"{path} has {self.fs.size(path)} bytes, the manifest recorded {record['bytes']}; "
                                 "re-run the capture to recompute it")
            (size,) = struct.unpack("<Q", self.fs.cat_file(path, start=0, end=8))
            if record is not None and 8 + size > record["bytes"]:
                raise StoreError(f"{path} declares a header of {size} bytes, past its {record['bytes']}; re-run the "
                                 "capture to recompute it")
            header = json.loads(self.fs.cat_file(path, start=8, end=8 + size))
            self._headers[shard] = (8 + size, header)
        return self._headers[shard]

    def _slice(self, shard: int, name: str, layer: int, head: int) -> np.ndarray:
        """The (layer, head) slice of tensor ``name`` of a shard, read by byte range."""
        start, header = self._header(shard)
        info = header[name]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        shape = info["shape"]
        per = int(np.prod(shape[2:])) * dtype.itemsize
        lo = start + info["data_offsets"][0] + (layer * shape[1] + head) * per
        raw = self.fs.cat_file(self.shard_path(shard), start=lo, end=lo + per)
        return np.frombuffer(raw, dtype=dtype).reshape(shape[2:])

    def pattern(self, index: int, layer: int, head: int) -> np.ndarray:
        """One head's pattern on sequence ``index`` as float32 [n, n] (as ``AttentionStore.pattern``)."""
        key = (index, layer, head)
        if key not in self._cache:
            shard, n = index // self.shard_size, self.sequences[index].n
            if self.mode == "dense":
                self._cache[key] = self._slice(shard, f"s{index}", layer, head).astype(np.float32)
            else:
                idx = self._slice(shard, f"s{index}.index", layer, head).astype(np.int64)
                val = self._slice(shard, f"s{index}.value", layer, head).astype(np.float32)
                out = np.zeros(n * n, dtype=np.float32)
                np.put_along_axis(out, idx, val, axis=-1)
                self._cache[key] = out.reshape(n, n)
        return self._cache[key]

    def batch(self, indices: list[int] | None = None, heads: list[tuple[int, int]] | None = None,
              dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Padded patterns [H, B, N, N] and lengths [B], exactly as ``AttentionStore.batch`` returns them."""
        indices = list(range(len(self.sequences))) if indices is None else list(indices)
        heads = self.heads if heads is None else heads
        lengths = np.array([self.sequences[i].n for i in indices], dtype=np.int64)
        width = int(lengths.max()) if len(indices) else 0
        out = np.zeros((len(heads), len(indices), width, width), dtype=dtype)
        for b, i in enumerate(indices):
            n = lengths[b]
            for k, (layer, head) in enumerate(heads):
                out[k, b, :n, :n] = self.pattern(i, layer, head)
        return out, lengths


def store_location(directory: str | Path | None, url: str | None = None) -> str:
    """Where workers read the store: ``url`` when given, else the store's directory as an absolute path."""
    if url:
        return str(url)
    if directory is None:
        raise StoreError("the store lives in memory; capture it to a directory (capture(..., out=DIR)) so workers "
                         "can read it")
    return str(Path(directory).resolve())
