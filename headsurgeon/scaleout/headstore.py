"""A read-only view of an attention store (headsurgeon/surgery/patterns/store.py) that reads only the heads a task needs.

Workers open the store by a path or an fsspec URL that every worker can see, and fetch each (layer, head)
slice of each shard by byte range: a head of a dense store is one contiguous run of float16 in its
sequence's ``[L, H, n, n]`` tensor (a top-q store: ``[L, H, q]`` indices and values). Shard sizes are checked
against the manifest; sha256 is not (that would read every head), the driver's capture checked it when it wrote.
Reading and decoding are AttentionStore's own (headsurgeon/surgery/patterns/store_reader.py ``StoreReader`` and ``Layout``).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence as Seq

import numpy as np

from ..synth.sequence import Sequence
from ..surgery.patterns.store_reader import (MAX_MANIFEST_BYTES, MAX_SEQUENCES_BYTES, StoreError, StoreReader, byte_source,
                                    norm_name,
                                    listed_shards)


class StoreUnreachable(StoreError):
    """This process cannot read the store at the location it was given."""


#: the most stores whose sequences a process keeps for its next tasks (a worker serves one run at a time)
KEPT_STORES = 4
_kept: OrderedDict[str, list[Sequence]] = OrderedDict()


def shared_sequences(digest: str, sequences: list[Sequence]) -> list[Sequence]:
    """The Sequence objects this process already read from a sequences file with sha256 ``digest`` (else
    ``sequences``, kept for the next task): every task of a worker reads the same windows, and their features
    (spaCy's tags, word and sentence indices) are computed once per process rather than once per task."""
    kept = _kept.setdefault(digest, sequences)
    _kept.move_to_end(digest)
    while len(_kept) > KEPT_STORES:
        _kept.popitem(last=False)
    return kept


class HeadStore:
    """``PatternSource`` (headsurgeon/synth/search/base.py) over ``heads`` of the store at ``location`` (path or fsspec URL).

    Reads ``manifest.json`` and ``sequences.json`` once through the store's reader (headsurgeon/surgery/patterns/store_reader.py: the
    same format, version, settings and sequence checks as ``AttentionStore.load``; the windows as the Sequence objects
    of this process's earlier tasks on the same file, :func:`shared_sequences`), then per ``batch`` call only the byte
    ranges of the requested heads (kept in memory for the task's later reads).
    """

    def __init__(self, location: str | os.PathLike, heads: Seq[tuple[int, int]] | None = None) -> None:
        self.location = str(location)
        try:
            self.reader = StoreReader(byte_source(self.location))
            facts = self.reader.facts(MAX_MANIFEST_BYTES, MAX_SEQUENCES_BYTES)
        except StoreError:
            raise
        except (OSError, ValueError, ImportError) as e:
            raise StoreUnreachable(
                f"cannot read the attention store at {self.location!r} from host {os.uname().nodename} "
                f"({type(e).__name__}: {e}); put the store on a filesystem every worker mounts at the same path, "
                "or pass an fsspec URL the workers can open (e.g. s3://bucket/run/store)") from None
        self.sequences = shared_sequences(facts.sequences_digest, facts.sequences)
        self.layout, self.causal = facts.layout, facts.causal
        self.n_layers, self.n_heads = facts.n_layers, facts.n_heads
        self.mode, self.model_name, self.shard_size = facts.layout.mode, facts.model, facts.shard_size
        missing = set(range(facts.n_shards)) - listed_shards(facts.meta, facts.n_shards)
        if missing:
            raise StoreError(f"{self.location} is incomplete ({len(missing)} of {facts.n_shards} shards missing); "
                             "re-run the capture to finish it")
        self.records = facts.records
        everything = [(layer, h) for layer in range(self.n_layers) for h in range(self.n_heads)]
        self._heads = everything if heads is None else [(int(a), int(b)) for a, b in heads]
        bad = [h for h in self._heads if h not in set(everything)]
        if bad:
            raise StoreError(f"heads {bad[:5]} are not in the store ({self.n_layers} layers x {self.n_heads} heads)")
        self._cache: dict[tuple[int, int, int], np.ndarray] = {}

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The heads this view serves (the task's heads)."""
        return list(self._heads)

    def pattern(self, index: int, layer: int, head: int) -> np.ndarray:
        """One head's pattern on sequence ``index`` as float32 [n, n] (as ``AttentionStore.pattern``)."""
        key = (index, layer, head)
        if key not in self._cache:
            shard, n = index // self.shard_size, self.sequences[index].n
            want = self.layout.pattern_tensors(index, n, (self.n_layers, self.n_heads))
            parts = {name: self.reader.head_slice(shard, self.records.get(shard), name, spec, layer, head)
                     for name, spec in want.items()}
            self._cache[key] = self.layout.decode(parts, index, n)
        return self._cache[key]

    @property
    def has_value_norms(self) -> bool:
        """Whether the store holds each key's value norm (headsurgeon/surgery/patterns/value_norms.py)."""
        return self.layout.value_norms

    def norm(self, index: int, layer: int, head: int) -> np.ndarray:
        """One head's value norms on sequence ``index`` as float32 [n] (as ``AttentionStore.norms``)."""
        key = (index, layer, -1 - head)
        if key not in self._cache:
            if not self.has_value_norms:
                raise StoreError(f"{self.location} holds no value norms; capture again to score by value-weighted "
                                 "attention")
            shard, n = index // self.shard_size, self.sequences[index].n
            name = norm_name(index)
            spec = ((self.n_layers, self.n_heads, n), "float16")
            part = self.reader.head_slice(shard, self.records.get(shard), name, spec, layer, head)
            self._cache[key] = np.asarray(part, dtype=np.float32).reshape(n)
        return self._cache[key]

    def norm_batch(self, indices: list[int], heads: Seq[tuple[int, int]]) -> np.ndarray:
        """Padded value norms [H, B, N], as ``AttentionStore.norm_batch``."""
        lengths = [self.sequences[i].n for i in indices]
        out = np.zeros((len(heads), len(indices), max(lengths, default=0)), dtype=np.float32)
        for b, i in enumerate(indices):
            for k, (layer, head) in enumerate(heads):
                out[k, b, : lengths[b]] = self.norm(i, layer, head)
        return out

    def batch(self, indices: list[int] | None = None, heads: Seq[tuple[int, int]] | None = None,
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
