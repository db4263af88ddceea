"""AttentionStore: captured attention patterns, dense (float16) or top-q sparse, in memory or in shards.

On disk: ``manifest.json`` + ``shard_00000.safetensors`` ...; a shard holds, per sequence ``s`` of the
shard, ``s{idx}`` = float16 [L, H, n, n] (dense) or ``s{idx}.index`` int32 [L, H, q] (flat i*n+j) and
``s{idx}.value`` float16 [L, H, q] (top-q). Shards and the manifest are written atomically, and the
manifest records each finished shard's size and sha256 so that a damaged shard is noticed on resume and on read.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import re
from pathlib import Path
from typing import Iterable

import numpy as np
from safetensors.numpy import load, save_file

from ..kernels.fileio import (UnsafeFileError, atomic_path, atomic_write_bytes, atomic_write_json, read_bounded, sha256_bytes,
                              sha256_file)
from ..synth.errors import excerpt
from ..synth.sequence import Sequence, sequences_key
from ..kernels.core import HeadsurgeonError

FORMAT_VERSION = 1
#: the manifest's ``format`` field
STORE_FORMAT = "headsurgeon.attention_store"


class StoreError(HeadsurgeonError, ValueError):
    """The store directory is missing, incomplete, corrupted or built for other inputs."""


def check_settings(mode: str, q_frac: float, shard_size: int) -> None:
    """Refuse store settings that would fail later (division by zero, top-k past the grid) with a clear StoreError."""
    if mode not in ("dense", "topq"):
        raise StoreError(f"mode must be 'dense' or 'topq', got {excerpt(mode)}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, numbers.Integral) or shard_size < 1:
        raise StoreError(f"shard_size must be a whole number of sequences >= 1 (e.g. 64), got {excerpt(shard_size)}")
    if (isinstance(q_frac, bool) or not isinstance(q_frac, numbers.Real) or not math.isfinite(q_frac)
            or not 0 < q_frac <= 1):
        raise StoreError(f"q_frac must be a fraction in (0, 1] (e.g. 0.025 keeps the top 2.5%), got {excerpt(q_frac)}")


def topq_count(n: int, q_frac: float) -> int:
    """Entries kept per head and sequence: ceil(q_frac · n²), at least 1."""
    return max(1, int(math.ceil(q_frac * n * n)))


#: the largest manifest.json / sequences.json read (no symlinks or devices; kernels/fileio.py ``read_bounded``)
MAX_MANIFEST_BYTES = 256 << 20
MAX_SEQUENCES_BYTES = 8 << 30
#: the largest shard read when the manifest has no record of it (recorded shards are read up to their size only)
MAX_UNLISTED_SHARD_BYTES = 8 << 30


def read_manifest(path: Path) -> dict:
    """The parsed manifest.json of a store, or a StoreError naming the file and the fix."""
    try:
        data = read_bounded(path, MAX_MANIFEST_BYTES, "a store manifest")
    except (OSError, ValueError) as e:  # UnsafeFileError is a ValueError
        raise StoreError(f"{path} is unreadable or corrupted ({excerpt(str(e))}); delete the directory and capture "
                         "again") from None
    return manifest_from_bytes(data, str(path))


# Reading a store from its bytes: AttentionStore.load (local files) and the workers' reader
# (headsurgeon/scaleout/headstore.py: paths or fsspec URLs) make the same checks through these.

def manifest_from_bytes(data: bytes, where: str) -> dict:
    """The manifest held by ``data`` (read from ``where``), or a StoreError naming ``where`` and the fix."""
    try:
        meta = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise StoreError(f"{where} is unreadable or corrupted ({excerpt(str(e))}); delete the directory and capture "
                         "again") from None
    if not isinstance(meta, dict):
        raise StoreError(f"{where} is not an attention-store manifest; delete the directory and capture again")
    return meta


def check_manifest(meta: dict, where: str) -> None:
    """Refuse a manifest of another format, a malformed version, or a version newer than this library reads."""
    if meta.get("format") != STORE_FORMAT:
        raise StoreError(f"{where} is not an attention-store manifest")
    if not isinstance(meta.get("version", 0), int):
        raise StoreError(f"{where} has a malformed version; delete the directory and capture again")
    if meta.get("version", 0) > FORMAT_VERSION:
        raise StoreError(f"{where} has format version {meta['version']}; upgrade headsurgeon to read it")


def sequences_from_bytes(data: bytes, where: str) -> list[Sequence]:
    """The sequences held by a store's ``sequences.json`` bytes, or a StoreError naming ``where``."""
    try:
        items = json.loads(data)
        return [Sequence(ids=np.array(s["ids"]), tokens=s["tokens"], text=s["text"], offsets=np.array(s["offsets"]),
                         doc=s["doc"], has_bos=s["has_bos"]) for s in items]
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as e:
        raise StoreError(f"{where} is missing or corrupted ({excerpt(str(e))}); delete the directory and capture "
                         "again") from None


def check_sequences(meta: dict, sequences: list[Sequence], where: str) -> None:
    """Refuse sequences (read from ``where``) that are not the ones the manifest was written for."""
    if sequences_key(sequences) != meta.get("sequences_key"):
        raise StoreError(f"{where} does not match its manifest; capture again")


def listed_shards(meta: dict, n_shards: int) -> set[int]:
    """The valid shard numbers a manifest lists as done."""
    done = meta.get("done_shards", [])
    if not isinstance(done, list):
        return set()
    return {s for s in done if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < n_shards}


_SHA256 = re.compile(r"[0-9a-f]{64}")


def shard_records(meta: dict) -> dict[int, dict]:
    """Well-formed {shard: {"bytes", "sha256"}} records of a manifest; malformed ones are left out."""
    raw = meta.get("shards")
    out: dict[int, dict] = {}
    if not isinstance(raw, dict):
        return out
    for key, rec in raw.items():
        if (isinstance(key, str) and key.isdigit() and isinstance(rec, dict) and isinstance(rec.get("bytes"), int)
                and isinstance(rec.get("sha256"), str) and _SHA256.fullmatch(rec["sha256"])):
            out[int(key)] = {"bytes": rec["bytes"], "sha256": rec["sha256"]}
    return out


SEQUENCES_FILE = "sequences.json"


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
    sequence). ``pattern(i, layer, head)`` returns a float32 n×n matrix either way (zeros where a
    sparse store kept nothing).
    """

    def __init__(self, sequences: list[Sequence], n_layers: int, n_heads: int, mode: str = "dense",
                 q_frac: float = 0.025, causal: bool = True, model_name: str = "", directory: Path | None = None,
                 shard_size: int = 64) -> None:
        check_settings(mode, q_frac, shard_size)
        self.sequences = list(sequences)
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.mode, self.q_frac, self.causal = mode, float(q_frac), bool(causal)
        self.model_name = model_name
        self.directory = Path(directory) if directory is not None else None
        self.shard_size = int(shard_size)
        self._memory: dict[int, dict[str, np.ndarray]] = {}
        self.shard_records: dict[int, dict] = {}
        self._hashed: set[int] = set()
        self._shard_cache: tuple[int, dict[str, np.ndarray]] | None = None

    # ----------------------------------------------------------------- facts
    def __repr__(self) -> str:
        where = f"in {self.directory}" if self.directory is not None else "in memory"
        mode = f"top-q ({self.q_frac:g} of each pattern)" if self.mode == "topq" else self.mode
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
        return self.directory / f"shard_{shard:05d}.safetensors"

    def __len__(self) -> int:
        return len(self.sequences)

    # ----------------------------------------------------------------- writing
    def put(self, index: int, pattern: np.ndarray) -> dict[str, np.ndarray]:
        """Record the float pattern [L, H, n, n] of sequence ``index`` (dense or reduced to top-q).

        torch does the float16 cast and the top-q selection: numpy's cast is ~100× slower on the many
        subnormal attention weights, and torch.topk beats argpartition + argsort.
        """
        import torch  # here, not at the top: searchers read stores without paying torch's import time

        n = self.sequences[index].n
        if pattern.shape != (self.n_layers, self.n_heads, n, n):
            raise StoreError(f"pattern for sequence {index} has shape {pattern.shape}, expected "
                             f"{(self.n_layers, self.n_heads, n, n)}")
        t = torch.from_numpy(np.ascontiguousarray(pattern))
        if self.mode == "dense":
            entry = {f"s{index}": t.to(torch.float16).numpy()}
        else:
            q = topq_count(n, self.q_frac)
            val, idx = torch.topk(t.reshape(self.n_layers, self.n_heads, n * n).float(), q, dim=-1, sorted=True)
            entry = {f"s{index}.index": idx.to(torch.int32).numpy(), f"s{index}.value": val.to(torch.float16).numpy()}
        self.keep(index, entry)
        return entry

    def keep(self, index: int, entry: dict[str, np.ndarray]) -> None:
        """Hold sequence ``index``'s entry in an in-memory store (a store with a directory keeps shards on disk)."""
        if self.directory is None:
            self._memory[index] = entry

    def write_shard(self, shard: int, entries: dict[str, np.ndarray]) -> dict:
        """Stream the shard to disk atomically (kernels/fileio.py ``atomic_path``: safetensors writes straight from
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
            "format": STORE_FORMAT, "version": FORMAT_VERSION, "model": self.model_name,
            "n_layers": self.n_layers, "n_heads": self.n_heads, "mode": self.mode, "q_frac": self.q_frac,
            "causal": self.causal, "shard_size": self.shard_size, "n_sequences": len(self.sequences),
            "sequences_file": SEQUENCES_FILE, "sequences_key": sequences_key(self.sequences),
            "done_shards": sorted(set(done_shards)),
            "shards": {f"{s:05d}": self.shard_records[s] for s in sorted(set(done_shards)) if s in self.shard_records},
        }

    def save_manifest(self, done_shards: Iterable[int]) -> None:
        """Write the small manifest (the sequences live in sequences.json, written once by save_sequences)."""
        assert self.directory is not None
        atomic_write_json(self.directory / "manifest.json", self.manifest(done_shards))

    def save_sequences(self) -> None:
        assert self.directory is not None
        atomic_write_bytes(self.directory / SEQUENCES_FILE, sequences_to_json(self.sequences))

    def done_shards(self) -> set[int]:
        """Shards already on disk (as recorded by the manifest and present as files)."""
        if self.directory is None or not (self.directory / "manifest.json").is_file():
            return set()
        return {s for s in self._listed_shards(read_manifest(self.directory / "manifest.json"))
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
        if self.directory is None or not (self.directory / "manifest.json").is_file():
            return {}
        out = {}
        for shard in sorted(self._listed_shards(read_manifest(self.directory / "manifest.json"))):
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

    def _expected_tensors(self, shard: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """name → (shape, dtype) of every tensor a shard must hold."""
        lo, hi = shard * self.shard_size, min((shard + 1) * self.shard_size, len(self.sequences))
        out: dict[str, tuple[tuple[int, ...], str]] = {}
        for i in range(lo, hi):
            n, lh = self.sequences[i].n, (self.n_layers, self.n_heads)
            if self.mode == "dense":
                out[f"s{i}"] = ((*lh, n, n), "float16")
            else:
                q = topq_count(n, self.q_frac)
                out[f"s{i}.index"], out[f"s{i}.value"] = ((*lh, q), "int32"), ((*lh, q), "float16")
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
        path = self.shard_path(shard)
        fix = "re-run the same capture command to recompute it"
        record = self.shard_records.get(shard)
        try:  # never past the recorded size, never through a link (kernels/fileio.py read_bounded)
            data = read_bounded(path, record["bytes"] if record is not None else MAX_UNLISTED_SHARD_BYTES,
                                "a store shard")
        except UnsafeFileError as e:
            raise StoreError(f"{e}; {fix}") from None
        except OSError as e:
            raise StoreError(f"{path} is unreadable ({e.strerror or e}); {fix}") from None
        if record is not None and len(data) != record["bytes"]:
            raise StoreError(f"{path} is damaged: it has {len(data)} bytes, the manifest recorded {record['bytes']}; "
                             f"{fix}")
        if record is not None and shard not in self._hashed:
            if sha256_bytes(data) != record["sha256"]:
                raise StoreError(f"{path} is damaged: its sha256 differs from the one the manifest recorded; {fix}")
            self._hashed.add(shard)
        try:
            return self._parse_shard(shard, data)
        except StoreError as e:
            raise StoreError(f"{path} is damaged: {e.args[0]}; {fix}") from None

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
        path = directory / "manifest.json"
        if not path.is_file():
            raise StoreError(f"{directory} is not an attention store (no manifest.json); run capture first")
        meta = read_manifest(path)
        check_manifest(meta, str(path))
        seqs = read_sequences(directory)
        check_sequences(meta, seqs, str(directory / SEQUENCES_FILE))
        try:
            store = cls(seqs, meta["n_layers"], meta["n_heads"], meta["mode"], meta["q_frac"], meta["causal"],
                        meta["model"], directory, meta["shard_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{path} is missing or has malformed settings ({excerpt(str(e))}); delete the directory "
                             "and capture again") from None
        store.adopt_records(meta)
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
                                 "re-run the same capture command to recompute it")

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
        entries = self._entries(index)
        n = self.sequences[index].n
        if self.mode == "dense":
            return entries[f"s{index}"].astype(np.float32)
        idx, val = entries[f"s{index}.index"], entries[f"s{index}.value"]
        out = np.zeros((self.n_layers, self.n_heads, n * n), dtype=np.float32)
        np.put_along_axis(out, idx.astype(np.int64), val.astype(np.float32), axis=-1)
        return out.reshape(self.n_layers, self.n_heads, n, n)

    def pattern(self, index: int, layer: int, head: int) -> np.ndarray:
        """One head's pattern for sequence ``index`` as float32 [n, n]."""
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise IndexError(f"head L{layer}H{head} not in store ({self.n_layers} layers × {self.n_heads} heads)")
        return self.patterns(index)[layer, head]

    def topq(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-q flat indices (int64 [L,H,q]) and values (float32) for sequence ``index`` (any mode)."""
        if self.mode == "topq":
            e = self._entries(index)
            return e[f"s{index}.index"].astype(np.int64), e[f"s{index}.value"].astype(np.float32)
        n = self.sequences[index].n
        flat = self.patterns(index).reshape(self.n_layers, self.n_heads, n * n)
        q = topq_count(n, self.q_frac)
        idx = np.argsort(-flat, axis=-1, kind="stable")[..., :q]
        return idx, np.take_along_axis(flat, idx, axis=-1)

    def batch(self, indices: list[int] | None = None, heads: list[tuple[int, int]] | None = None,
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
            n = lengths[b]
            out[:, b, :n, :n] = self.patterns(i)[layer_idx, head_idx]
        return out, lengths
