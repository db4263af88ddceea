"""AttentionStore: captured attention patterns, dense (float16) or top-q sparse, in memory or in shards.

On disk: ``manifest.json`` + ``shard_00000.safetensors`` ...; a shard holds, per sequence ``s`` of the
shard, ``s{idx}`` = float16 [L, H, n, n] (dense) or ``s{idx}.index`` int32 [L, H, q] (flat i*n+j) and
``s{idx}.value`` float16 [L, H, q] (top-q). Shards and the manifest are written atomically, and the
manifest records each finished shard's size and sha256 so that a damaged shard is noticed on resume and on read.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence as Seq

import numpy as np
from safetensors.numpy import load, save_file

from ...core.fileio import UnsafeFileError, atomic_path, atomic_write_bytes, read_bounded, sha256_file
from ...core import Head, InputError
from ...core.formats import write_versioned
from ...synth.errors import excerpt
from ...synth.sequence import Sequence, sequences_key
from .store_reader import (MANIFEST, MAX_MANIFEST_BYTES, MAX_SEQUENCES_BYTES, MAX_UNLISTED_SHARD_BYTES,
                           SEQUENCES_FILE, SHARD_FIX, STORE_MANIFEST, LocalBytes, StoreError, StoreReader,
                           check_manifest, norm_name,
                           check_settings, layout_of, listed_shards, manifest_from_bytes, sequences_from_bytes,
                           shard_name, shard_records, stored_entries)

__all__ = ["AttentionStore", "StoreError", "FORMAT_VERSION", "STORE_FORMAT", "stored_entries", "check_settings",
           "read_manifest", "read_sequences", "check_manifest", "check_sequences", "SEQUENCES_FILE",
           "MAX_MANIFEST_BYTES", "MAX_SEQUENCES_BYTES", "MAX_UNLISTED_SHARD_BYTES", "listed_shards", "shard_records",
           "manifest_from_bytes", "sequences_from_bytes"]

#: the manifest's format and version, declared once in headsurgeon/surgery/patterns/store_reader.py ``STORE_MANIFEST``
FORMAT_VERSION = STORE_MANIFEST.version
STORE_FORMAT = STORE_MANIFEST.name


def read_manifest(path: Path) -> dict:
    """The parsed manifest.json of a store, or a StoreError naming the file and the fix."""
    try:
        data = read_bounded(path, MAX_MANIFEST_BYTES, "a store manifest")
    except UnsafeFileError as e:  # its message names the file and the fix already
        raise StoreError(f"{e}; delete the directory and capture again") from None
    except (OSError, ValueError) as e:
        raise StoreError(f"{path} is unreadable or corrupted ({excerpt(str(e))}); delete the directory and capture "
                         "again") from None
    return manifest_from_bytes(data, str(path))


def check_sequences(meta: dict, sequences: list[Sequence], where: str) -> None:
    """Refuse sequences (read from ``where``) that are not the ones the manifest was written for."""
    if sequences_key(sequences) != meta.get("sequences_key"):
        raise StoreError(f"{where} does not match its manifest; capture again")


def sequences_to_json(sequences: list[Sequence]) -> bytes:
    return json.dumps([{"ids": s.ids.tolist(), "tokens": s.tokens, "text": s.text, "offsets": s.offsets.tolist(),
                        "doc": s.doc, "has_bos": s.has_bos} for s in sequences], separators=(",", ":")).encode()


def read_sequences(directory: Path) -> list[Sequence]:
    """The sequences of a store directory (``sequences.json``, written once when the capture starts)."""
    path = Path(directory) / SEQUENCES_FILE
    try:
        data = read_bounded(path, MAX_SEQUENCES_BYTES, "a store's sequences file")
    except UnsafeFileError as e:  # its message names the file and the fix already
        raise StoreError(f"{e}; delete the directory and capture again") from None
    except OSError as e:
        raise StoreError(f"{path} is missing or corrupted ({excerpt(str(e))}); delete the directory and capture "
                         "again") from None
    return sequences_from_bytes(data, str(path))


class AttentionStore:
    """Patterns for every (layer, query head) over a list of sequences.

    ``mode`` is ``"dense"`` (float16 patterns) or ``"topq"`` (the top ``q_frac`` entries per head and
    sequence); the store's ``layout`` (headsurgeon/surgery/patterns/store_reader.py) holds it and decodes either. ``pattern(i, layer,
    head)`` returns a float32 n×n matrix either way (zeros where a sparse store kept nothing). A store with a
    ``directory`` reads its shards through a StoreReader, the reader Ray workers' HeadStore uses too.
    """

    def __init__(self, sequences: list[Sequence], n_layers: int, n_heads: int, mode: str = "dense",
                 q_frac: float = 0.025, causal: bool = True, model_name: str = "", directory: Path | None = None,
                 shard_size: int = 64, value_norms: bool = False) -> None:
        self.layout = layout_of(mode, q_frac, shard_size, value_norms)
        self.sequences = list(sequences)
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.causal = bool(causal)
        self.model_name = model_name
        self.directory = Path(directory) if directory is not None else None
        self.shard_size = int(shard_size)
        self._memory: dict[int, dict[str, np.ndarray]] = {}
        self.shard_records: dict[int, dict] = {}
        self._reader = StoreReader(LocalBytes(self.directory)) if self.directory is not None else None
        self._shard_cache: tuple[int, dict[str, np.ndarray]] | None = None

    @property
    def mode(self) -> str:
        return self.layout.mode

    @property
    def q_frac(self) -> float:
        return self.layout.q_frac

    @property
    def has_value_norms(self) -> bool:
        """Whether the store holds ‖v_j·W_O^h‖ per key (headsurgeon/surgery/patterns/value_norms.py); stores before version 2 do not."""
        return self.layout.value_norms

    @property
    def _hashed(self) -> set[int]:
        """Shards whose sha256 this store has checked (kept by its reader)."""
        return self._reader.hashed if self._reader is not None else set()

    # ----------------------------------------------------------------- facts
    def __repr__(self) -> str:
        where = f"in {self.directory}" if self.directory is not None else "in memory"
        mode = self.mode if self.layout.dense else f"top-q ({self.q_frac:g} of each pattern)"
        return (f"AttentionStore({self.model_name or 'model'}: {len(self.sequences)} sequences x {self.n_layers} "
                f"layers x {self.n_heads} heads, {mode}, {'causal' if self.causal else 'bidirectional'}, {where})")

    @property
    def heads(self) -> list[tuple[int, int]]:
        return [(layer, head) for layer in range(self.n_layers) for head in range(self.n_heads)]

    @property
    def n_shards(self) -> int:
        return max(1, math.ceil(len(self.sequences) / self.shard_size))

    def shard_of(self, index: int) -> int:
        return index // self.shard_size

    def shard_path(self, shard: int) -> Path:
        assert self.directory is not None
        return self.directory / shard_name(shard)

    def __len__(self) -> int:
        return len(self.sequences)

    # ----------------------------------------------------------------- writing
    def put(self, index: int, pattern: np.ndarray, norms: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Record the float pattern [L, H, n, n] of sequence ``index`` (dense or reduced to top-q), and its value
        norms [L, H, n] when the store keeps them.

        torch does the float16 cast and the top-q selection: numpy's cast is ~100× slower on the many
        subnormal attention weights, and torch.topk beats argpartition + argsort.
        """
        import torch  # here, not at the top: searchers read stores without paying torch's import time

        n = self.sequences[index].n
        if pattern.shape != (self.n_layers, self.n_heads, n, n):
            raise StoreError(f"pattern for sequence {index} has shape {pattern.shape}, expected "
                             f"{(self.n_layers, self.n_heads, n, n)}")
        entry = self.layout.entry(index, torch.from_numpy(np.ascontiguousarray(pattern)))
        if self.has_value_norms:
            if norms is None or np.shape(norms) != (self.n_layers, self.n_heads, n):
                raise StoreError(f"this store keeps value norms: put sequence {index} with norms of shape "
                                 f"{(self.n_layers, self.n_heads, n)}, got {None if norms is None else np.shape(norms)}")
            entry[norm_name(index)] = torch.from_numpy(np.asarray(norms, dtype=np.float32)).to(torch.float16).numpy()
        elif norms is not None:
            raise StoreError("this store was made with value_norms=False; make it with value_norms=True to keep norms")
        self.keep(index, entry)
        return entry

    def keep(self, index: int, entry: dict[str, np.ndarray]) -> None:
        """Hold sequence ``index``'s entry in an in-memory store (a store with a directory keeps shards on disk)."""
        if self.directory is None:
            self._memory[index] = entry

    def write_shard(self, shard: int, entries: dict[str, np.ndarray]) -> dict:
        """Stream the shard to disk atomically (headsurgeon/core/fileio.py ``atomic_path``: safetensors writes straight from
        the arrays, no second copy in memory), recording its size and sha256; returns the record."""
        path = self.shard_path(shard)
        with atomic_path(path) as tmp:
            save_file({k: np.ascontiguousarray(v) for k, v in entries.items()}, str(tmp))
            record = {"bytes": os.path.getsize(tmp), "sha256": sha256_file(tmp)}
        self.shard_records[shard] = record
        self._hashed.add(shard)
        return record

    def manifest(self, done_shards: Iterable[int]) -> dict:
        return {
            **STORE_MANIFEST.header(), "model": self.model_name,
            "n_layers": self.n_layers, "n_heads": self.n_heads, "mode": self.mode, "q_frac": self.q_frac,
            "causal": self.causal, "shard_size": self.shard_size, "n_sequences": len(self.sequences),
            "value_norms": self.has_value_norms,
            "sequences_file": SEQUENCES_FILE, "sequences_key": sequences_key(self.sequences),
            "done_shards": sorted(set(done_shards)),
            "shards": {f"{s:05d}": self.shard_records[s] for s in sorted(set(done_shards)) if s in self.shard_records},
        }

    def save_manifest(self, done_shards: Iterable[int]) -> None:
        """Write the small manifest (the sequences live in sequences.json, written once by save_sequences)."""
        assert self.directory is not None
        write_versioned(self.directory / MANIFEST, STORE_MANIFEST, self.manifest(done_shards))  # headsurgeon/core/formats.py

    def save_sequences(self) -> None:
        assert self.directory is not None
        atomic_write_bytes(self.directory / SEQUENCES_FILE, sequences_to_json(self.sequences))

    def done_shards(self) -> set[int]:
        """Shards already on disk (as recorded by the manifest and present as files)."""
        if self.directory is None or not (self.directory / MANIFEST).is_file():
            return set()
        return {s for s in self._listed_shards(read_manifest(self.directory / MANIFEST))
                if self.shard_path(s).is_file()}

    def _listed_shards(self, meta: dict) -> set[int]:
        """The valid shard numbers a manifest lists as done."""
        return listed_shards(meta, self.n_shards)

    def adopt_records(self, meta: dict) -> None:
        """Take the shard sizes and hashes a manifest recorded (when resuming or opening a store)."""
        self.shard_records.update(shard_records(meta))
        self._hashed.clear()

    def damaged_shards(self) -> dict[int, str]:
        """Shards the manifest lists as done that are missing or damaged, each with what is wrong."""
        if self.directory is None or not (self.directory / MANIFEST).is_file():
            return {}
        out = {}
        for shard in sorted(self._listed_shards(read_manifest(self.directory / MANIFEST))):
            problem = self.shard_problem(shard)
            if problem:
                out[shard] = problem
        return out

    def shard_problem(self, shard: int) -> str | None:
        """What is wrong with a finished shard (missing, wrong size or hash, unreadable, wrong tensors), or None."""
        path = self.shard_path(shard)
        if not path.is_file():
            return "the file is missing"
        record = self.shard_records.get(shard)
        if record is not None:
            size = path.stat().st_size
            if size != record["bytes"]:
                return f"it has {size} bytes, the manifest recorded {record['bytes']}"
            if sha256_file(path) != record["sha256"]:
                return "its sha256 differs from the one the manifest recorded"
            self._hashed.add(shard)
            return None
        try:
            self._parse_shard(shard, path.read_bytes())
        except StoreError as e:
            return str(e.args[0])
        return None

    def expected(self, index: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """name → (shape, dtype) of sequence ``index``'s tensors."""
        return self.layout.tensors(index, self.sequences[index].n, (self.n_layers, self.n_heads))

    def _expected_tensors(self, shard: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """name → (shape, dtype) of every tensor a shard must hold."""
        lo, hi = shard * self.shard_size, min((shard + 1) * self.shard_size, len(self.sequences))
        out: dict[str, tuple[tuple[int, ...], str]] = {}
        for i in range(lo, hi):
            out.update(self.expected(i))
        return out

    def _parse_shard(self, shard: int, data: bytes) -> dict[str, np.ndarray]:
        """Deserialize a shard's bytes and require exactly the expected tensors; problems raise StoreError(reason)."""
        try:
            entries = load(data)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type on damaged files
            raise StoreError(f"it is not a readable safetensors file ({excerpt(str(e))})") from None
        want = self._expected_tensors(shard)
        if set(entries) != set(want):
            raise StoreError(f"it holds tensors {excerpt(sorted(entries))}, expected {excerpt(sorted(want))}")
        for name, (shape, dtype) in want.items():
            if entries[name].shape != shape or entries[name].dtype != np.dtype(dtype):
                raise StoreError(f"tensor {name} is {entries[name].dtype}{list(entries[name].shape)}, expected "
                                 f"{dtype}{list(shape)}")
        return entries

    def read_shard(self, shard: int) -> dict[str, np.ndarray]:
        """A shard's tensors, checked against the manifest (size; sha256 on this store's first read) and the shapes."""
        assert self._reader is not None
        data = self._reader.shard_bytes(shard, self.shard_records.get(shard))
        try:
            return self._parse_shard(shard, data)
        except StoreError as e:
            raise self._reader.damaged(shard, e.args[0]) from None

    @property
    def complete(self) -> bool:
        if self.directory is None:
            return len(self._memory) == len(self.sequences)
        return self.done_shards() >= set(range(self.n_shards))

    # ----------------------------------------------------------------- reading
    @classmethod
    def load(cls, directory: str | Path) -> "AttentionStore":
        """Open a store written by ``capture(..., out=directory)``."""
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise StoreError(f"{directory} is not an attention store (no manifest.json); run capture first")
        try:
            facts = StoreReader(LocalBytes(directory)).facts(MAX_MANIFEST_BYTES, MAX_SEQUENCES_BYTES)
        except OSError as e:
            raise StoreError(f"{path} is unreadable or corrupted ({excerpt(str(e))}); delete the directory and "
                             "capture again") from None
        store = cls(facts.sequences, facts.n_layers, facts.n_heads, facts.layout.mode, facts.layout.q_frac,
                    facts.causal, facts.model, directory, facts.shard_size, facts.layout.value_norms)
        store.adopt_records(facts.meta)
        missing = set(range(store.n_shards)) - store.done_shards()
        if missing:
            names = ", ".join(store.shard_path(m).name for m in sorted(missing)[:5])
            raise StoreError(f"{directory} is incomplete: {names}{' ...' if len(missing) > 5 else ''} missing; re-run "
                             "the same capture command to resume")
        store._check_sizes()
        return store

    def _check_sizes(self) -> None:
        """Compare every shard's size with the manifest's record (cheap); hashes are checked when a shard is read."""
        for shard, record in sorted(self.shard_records.items()):
            path = self.shard_path(shard)
            size = path.stat().st_size if path.is_file() else 0
            if shard < self.n_shards and size != record["bytes"]:
                raise StoreError(f"{path} is damaged: it has {size} bytes, the manifest recorded {record['bytes']}; "
                                 f"{SHARD_FIX}")

    def _entries(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < len(self.sequences):
            raise IndexError(f"sequence {index} out of range (store has {len(self.sequences)})")
        if self.directory is None:
            if index not in self._memory:
                raise StoreError(f"sequence {index} was not captured")
            return self._memory[index]
        shard = self.shard_of(index)
        if self._shard_cache is None or self._shard_cache[0] != shard:
            self._shard_cache = (shard, self.read_shard(shard))
        return self._shard_cache[1]

    def patterns(self, index: int) -> np.ndarray:
        """All heads' patterns for sequence ``index`` as float32 [L, H, n, n]."""
        return self.layout.decode(self._entries(index), index, self.sequences[index].n)

    def pattern(self, index: Any, layer: Any = None, head: int | None = None) -> np.ndarray:
        """One head's pattern for a sequence as float32 [n, n]: ``pattern(index, layer, head)`` or, by the head's
        name first, ``pattern("L18H6", index)``."""
        if isinstance(index, (str, tuple)):
            (layer, head), index = Head.parse(index), layer
        if index is None or layer is None or head is None:
            raise InputError("pattern takes (index, layer, head) or (head, index), e.g. store.pattern('L1H2', 0)")
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise IndexError(f"head L{layer}H{head} not in store ({self.n_layers} layers × {self.n_heads} heads)")
        return self.patterns(index)[layer, head]

    def norms(self, index: int) -> np.ndarray:
        """Value norms ‖v_j·W_O^h‖ of sequence ``index`` as float32 [L, H, n] (a StoreError if the store lacks them)."""
        if not self.has_value_norms:
            raise StoreError(f"{self!r} holds no value norms (captured before they were kept, or with "
                             "value_norms=False); capture again to score by value-weighted attention")
        return self._entries(index)[norm_name(index)].astype(np.float32)

    def norm_batch(self, indices: list[int], heads: Seq[tuple[int, int]]) -> np.ndarray:
        """Padded value norms [H, B, N] of ``heads`` over ``indices`` (zeros beyond each length), as ``batch``."""
        lengths = [self.sequences[i].n for i in indices]
        out = np.zeros((len(heads), len(indices), max(lengths, default=0)), dtype=np.float32)
        rows, cols = np.array([h[0] for h in heads], dtype=np.int64), np.array([h[1] for h in heads], dtype=np.int64)
        for b, i in enumerate(indices):
            out[:, b, : lengths[b]] = self.norms(i)[rows, cols]
        return out

    def topq(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-q flat indices (int64 [L,H,q]) and values (float32) for sequence ``index`` (any mode)."""
        return self.layout.topq(self._entries(index), index, self.sequences[index].n)

    def batch(self, indices: list[int] | None = None, heads: Seq[tuple[int, int]] | None = None,
              dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Padded patterns [H, B, N, N] for ``heads`` (default all) over ``indices``, and lengths [B]."""
        indices = list(range(len(self.sequences))) if indices is None else list(indices)
        heads = self.heads if heads is None else heads
        lengths = np.array([self.sequences[i].n for i in indices], dtype=np.int64)
        width = int(lengths.max()) if len(indices) else 0
        out = np.zeros((len(heads), len(indices), width, width), dtype=dtype)
        layer_idx = np.array([h[0] for h in heads], dtype=np.int64)
        head_idx = np.array([h[1] for h in heads], dtype=np.int64)
        for b, i in enumerate(indices):
            n = int(lengths[b])
            entries = self._entries(i)  # decode only the heads asked for, not all [L, H] of the window
            wanted = {name: entries[name][layer_idx, head_idx]
                      for name in self.layout.pattern_tensors(i, n, (self.n_layers, self.n_heads))}
            out[:, b, :n, :n] = self.layout.decode(wanted, i, n)
        return out, lengths
