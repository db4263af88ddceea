"""One reader of attention stores over a byte source: the local store (headsurgeon/surgery/patterns/store.py) and Ray workers'
``HeadStore`` (headsurgeon/scaleout/headstore.py) read manifests, sequences and shards through it.

A :class:`ByteSource` serves a store folder's files whole (bounded) or by byte range: :class:`LocalBytes` never reads
through a link (headsurgeon/core/fileio.py ``read_bounded``), :class:`FsspecBytes` serves an fsspec URL. :class:`StoreReader`
makes the manifest's checks (format and version through headsurgeon/core/formats.py, settings, sequences, finished shards)
and decodes shards whole (size and sha256 against the manifest) or one head's byte range (size and header against
the manifest and the layout), so a damaged store fails with the same message whichever reader meets it. The
:class:`Layout` (dense or top-q) is the store's one mode value: what tensors a sequence has and how they decode.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...core import HeadsurgeonError
from ...core.fileio import UnsafeFileError, read_bounded, sha256_bytes
from ...core.formats import FileFormat, check_versioned
from ...synth.errors import excerpt
from ...synth.sequence import Sequence, sequences_key

__all__ = ["StoreError", "STORE_MANIFEST", "ByteSource", "LocalBytes", "FsspecBytes", "Layout", "layout_of", "norm_name",
           "StoreReader", "StoreFacts", "stored_entries", "check_settings", "check_manifest", "manifest_from_bytes",
           "sequences_from_bytes", "shard_records", "listed_shards", "shard_name", "byte_source", "MANIFEST",
           "SEQUENCES_FILE", "SHARD_FIX"]


class StoreError(HeadsurgeonError, ValueError):
    """The store directory is missing, incomplete, corrupted or built for other inputs."""


#: the store's manifest.json (its version is 0 in files written before it had one; 2 adds ``value_norms``: shards may hold
#: ``s{i}.vnorm`` float16 [L, H, n], headsurgeon/surgery/patterns/value_norms.py; older stores read as without them)
STORE_MANIFEST = FileFormat("headsurgeon.attention_store", 2, (0, 1, 2), "an attention-store manifest",
                            "delete the directory and capture again", default=0, error=StoreError)
MANIFEST = "manifest.json"
SEQUENCES_FILE = "sequences.json"
#: the largest manifest.json / sequences.json read (no symlinks or devices; headsurgeon/core/fileio.py ``read_bounded``)
MAX_MANIFEST_BYTES = 256 << 20
MAX_SEQUENCES_BYTES = 8 << 30
#: the largest shard read when the manifest has no record of it (recorded shards are read up to their size only)
MAX_UNLISTED_SHARD_BYTES = 8 << 30
SHARD_FIX = "re-run the same capture command to recompute it"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DTYPES = {"F16": "float16", "F32": "float32", "I32": "int32", "I64": "int64"}


def check_settings(mode: str, q_frac: float, shard_size: int) -> None:
    """Refuse store settings that would fail later (division by zero, top-k past the grid) with a clear StoreError."""
    if mode not in ("dense", "topq"):
        raise StoreError(f"mode must be 'dense' or 'topq', got {excerpt(mode)}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, numbers.Integral) or shard_size < 1:
        raise StoreError(f"shard_size must be a whole number of sequences >= 1 (e.g. 64), got {excerpt(shard_size)}")
    if (isinstance(q_frac, bool) or not isinstance(q_frac, numbers.Real) or not math.isfinite(q_frac)
            or not 0 < q_frac <= 1):
        raise StoreError(f"q_frac must be a fraction in (0, 1] (e.g. 0.025 keeps the top 2.5%), got {excerpt(q_frac)}")


def stored_entries(n: int, q_frac: float) -> int:
    """Entries a top-q store keeps per head and sequence: ceil(q_frac · n²), at least 1 (the top-q IoU metric counts
    its own q over visible cells: headsurgeon/synth/metrics.py ``topq_count``)."""
    return max(1, int(math.ceil(q_frac * n * n)))


# ----------------------------------------------------------------------------------------------- the mode
@dataclass(frozen=True)
class Layout:
    """How a store holds a sequence's patterns: ``dense`` float16 [L, H, n, n], or ``topq`` (the top ``q_frac``
    flat indices int32 [L, H, q] and float16 values) — the one place the store's mode is read."""

    mode: str
    q_frac: float
    value_norms: bool = False  # whether each sequence also holds s{i}.vnorm: ‖v_j·W_O^h‖ float16 [L, H, n]

    @property
    def dense(self) -> bool:
        return self.mode == "dense"

    def tensors(self, index: int, n: int, lh: tuple[int, int]) -> dict[str, tuple[tuple[int, ...], str]]:
        """name → (shape, dtype) of sequence ``index``'s tensors (patterns, then value norms when kept)."""
        out = self.pattern_tensors(index, n, lh)
        if self.value_norms:
            out[norm_name(index)] = ((*lh, n), "float16")
        return out

    def pattern_tensors(self, index: int, n: int, lh: tuple[int, int]) -> dict[str, tuple[tuple[int, ...], str]]:
        """name → (shape, dtype) of sequence ``index``'s pattern tensors only."""
        if self.dense:
            return {f"s{index}": ((*lh, n, n), "float16")}
        q = stored_entries(n, self.q_frac)
        return {f"s{index}.index": ((*lh, q), "int32"), f"s{index}.value": ((*lh, q), "float16")}

    def entry(self, index: int, pattern: Any) -> dict[str, np.ndarray]:
        """Sequence ``index``'s entry from a float torch tensor [L, H, n, n] (torch casts and selects; store.put)."""
        import torch  # here: searchers read stores without paying torch's import time

        if self.dense:
            return {f"s{index}": pattern.to(torch.float16).numpy()}
        n_layers, n_heads, n, _ = pattern.shape
        val, idx = torch.topk(pattern.reshape(n_layers, n_heads, n * n).float(), stored_entries(n, self.q_frac), dim=-1,
                              sorted=True)
        return {f"s{index}.index": idx.to(torch.int32).numpy(), f"s{index}.value": val.to(torch.float16).numpy()}

    def decode(self, entries: dict[str, np.ndarray], index: int, n: int) -> np.ndarray:
        """float32 [..., n, n] from an entry's tensors (whole [L, H, ...] or one head's [...] slices)."""
        if self.dense:
            return entries[f"s{index}"].astype(np.float32)
        idx, val = entries[f"s{index}.index"], entries[f"s{index}.value"]
        out = np.zeros((*idx.shape[:-1], n * n), dtype=np.float32)
        np.put_along_axis(out, idx.astype(np.int64), val.astype(np.float32), axis=-1)
        return out.reshape(*idx.shape[:-1], n, n)

    def topq(self, entries: dict[str, np.ndarray], index: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-q flat indices (int64 [L, H, q]) and values (float32) of an entry, in either mode."""
        if not self.dense:
            return entries[f"s{index}.index"].astype(np.int64), entries[f"s{index}.value"].astype(np.float32)
        flat = self.decode(entries, index, n)
        flat = flat.reshape(*flat.shape[:-2], n * n)
        idx = np.argsort(-flat, axis=-1, kind="stable")[..., :stored_entries(n, self.q_frac)]
        return idx, np.take_along_axis(flat, idx, axis=-1)


def layout_of(mode: str, q_frac: float, shard_size: int = 1, value_norms: bool = False) -> Layout:
    """The layout of a store's settings, refused with a StoreError when they would fail later."""
    check_settings(mode, q_frac, shard_size)
    if not isinstance(value_norms, bool):
        raise StoreError(f"value_norms must be True or False, got {excerpt(value_norms)}")
    return Layout(mode, float(q_frac), value_norms)


def norm_name(index: int) -> str:
    """The tensor holding sequence ``index``'s value norms [L, H, n] (headsurgeon/surgery/patterns/value_norms.py)."""
    return f"s{index}.vnorm"


# ----------------------------------------------------------------------------------------------- byte sources
class ByteSource(Protocol):
    """The files of one store folder, by name."""

    def where(self, name: str) -> str: ...

    def whole(self, name: str, limit: int, what: str) -> bytes: ...

    def size(self, name: str) -> int: ...

    def span(self, name: str, start: int, end: int) -> bytes: ...


_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class LocalBytes:
    """A local store folder; files are read never through a link, and only if regular."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def where(self, name: str) -> str:
        return str(self.directory / name)

    def whole(self, name: str, limit: int, what: str) -> bytes:
        return read_bounded(self.directory / name, limit, what)

    def _open(self, name: str) -> int:
        path = self.directory / name
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise UnsafeFileError(f"{path} is a symbolic link; a store shard is read only from a regular file")
        fd = os.open(path, _READ)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafeFileError(f"{path} is not a regular file; a store shard must be a regular file")
        return fd

    def size(self, name: str) -> int:
        fd = self._open(name)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def span(self, name: str, start: int, end: int) -> bytes:
        fd = self._open(name)
        try:
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)


class FsspecBytes:
    """A store folder behind an fsspec URL (``s3://``, ``gs://``, ``memory://`` ...); sizes are checked first."""

    def __init__(self, fs: Any, root: str, label: str) -> None:
        self.fs, self.root, self.label = fs, root.rstrip("/"), label.rstrip("/")

    def where(self, name: str) -> str:
        return f"{self.label}/{name}"

    def whole(self, name: str, limit: int, what: str) -> bytes:
        size = self.size(name)
        if size > limit:
            raise UnsafeFileError(f"{self.where(name)} is {size} bytes; {what} may hold at most {limit} bytes")
        return self.fs.cat_file(f"{self.root}/{name}", start=0, end=size)

    def size(self, name: str) -> int:
        size = self.fs.size(f"{self.root}/{name}")
        if not isinstance(size, int):
            raise OSError(f"{self.where(name)} reports no size")
        return size

    def span(self, name: str, start: int, end: int) -> bytes:
        return self.fs.cat_file(f"{self.root}/{name}", start=start, end=end)


def byte_source(location: str | os.PathLike) -> ByteSource:
    """LocalBytes for a path (or a ``file://`` URL), FsspecBytes for any other fsspec URL."""
    text = str(location)
    if "://" not in text:
        return LocalBytes(os.path.abspath(text))
    import fsspec  # a dependency of transformers/huggingface_hub; imported here so the module loads without it

    fs, path = fsspec.core.url_to_fs(text)
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "file" in protocol or "local" in protocol:
        return LocalBytes(path)
    return FsspecBytes(fs, path, text)


# ----------------------------------------------------------------------------------------------- the reader
def shard_name(shard: int) -> str:
    return f"shard_{shard:05d}.safetensors"


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


def listed_shards(meta: dict, n_shards: int) -> set[int]:
    """The valid shard numbers a manifest lists as done."""
    done = meta.get("done_shards", [])
    if not isinstance(done, list):
        return set()
    return {s for s in done if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < n_shards}


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
    """Refuse a manifest of another format, a malformed version, or a version not read here (headsurgeon/core/formats.py)."""
    check_versioned(meta, STORE_MANIFEST, where)


def sequences_from_bytes(data: bytes, where: str) -> list[Sequence]:
    """The sequences held by a store's ``sequences.json`` bytes, or a StoreError naming ``where``."""
    try:
        items = json.loads(data)
        return [Sequence(ids=np.array(s["ids"]), tokens=s["tokens"], text=s["text"], offsets=np.array(s["offsets"]),
                         doc=s["doc"], has_bos=s["has_bos"]) for s in items]
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as e:
        raise StoreError(f"{where} is missing or corrupted ({excerpt(str(e))}); delete the directory and capture "
                         "again") from None


@dataclass
class StoreFacts:
    """What a store's manifest and sequences say: the settings a reader needs."""

    meta: dict
    sequences: list[Sequence]
    n_layers: int
    n_heads: int
    layout: Layout
    causal: bool
    model: str
    shard_size: int
    records: dict[int, dict]
    sequences_digest: str  # sha256 of the sequences file's bytes: the same windows, text and offsets

    @property
    def n_shards(self) -> int:
        return max(1, math.ceil(len(self.sequences) / self.shard_size))


class StoreReader:
    """Reads one store through a ByteSource: its facts once, then shards whole or heads by byte range."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.hashed: set[int] = set()
        self._headers: dict[int, tuple[int, dict, int]] = {}

    def _small(self, name: str, limit: int, what: str) -> bytes:
        try:
            return self.source.whole(name, limit, what)
        except UnsafeFileError as e:  # its message names the file and the fix already
            raise StoreError(f"{e}; delete the directory and capture again") from None

    def manifest(self, limit: int = MAX_MANIFEST_BYTES) -> dict:
        """The parsed manifest.json (not yet checked); OSErrors propagate to the caller."""
        return manifest_from_bytes(self._small(MANIFEST, limit, "a store manifest"), self.source.where(MANIFEST))

    def facts(self, manifest_limit: int = MAX_MANIFEST_BYTES,
              sequences_limit: int = MAX_SEQUENCES_BYTES) -> StoreFacts:
        """The manifest (format, version, settings) and sequences, checked; OSErrors propagate to the caller."""
        where, seq_where = self.source.where(MANIFEST), self.source.where(SEQUENCES_FILE)
        raw_meta = self._small(MANIFEST, manifest_limit, "a store manifest")  # both files read before any check
        try:
            raw = self._small(SEQUENCES_FILE, sequences_limit, "a store's sequences file")
        except FileNotFoundError as e:
            raise StoreError(f"{seq_where} is missing or corrupted ({excerpt(str(e))}); delete the directory and "
                             "capture again") from None
        meta = manifest_from_bytes(raw_meta, where)
        check_manifest(meta, where)
        sequences = sequences_from_bytes(raw, seq_where)
        if sequences_key(sequences) != meta.get("sequences_key"):
            raise StoreError(f"{seq_where} does not match its manifest; capture again")
        try:
            facts = StoreFacts(meta, sequences, int(meta["n_layers"]), int(meta["n_heads"]),
                               layout_of(meta["mode"], meta["q_frac"], meta["shard_size"],
                                         meta.get("value_norms", False)), bool(meta["causal"]),
                               meta["model"], int(meta["shard_size"]), shard_records(meta), sha256_bytes(raw))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"{where} is missing or has malformed settings ({excerpt(str(e))}); delete the "
                             "directory and capture again") from None
        return facts

    def damaged(self, shard: int, problem: str) -> StoreError:
        return StoreError(f"{self.source.where(shard_name(shard))} is damaged: {problem}; {SHARD_FIX}")

    def _fetch(self, fn: Any, shard: int, *args: Any) -> Any:
        try:
            return fn(shard_name(shard), *args)
        except UnsafeFileError as e:
            raise StoreError(f"{e}; {SHARD_FIX}") from None
        except OSError as e:
            raise StoreError(f"{self.source.where(shard_name(shard))} is unreadable ({e.strerror or e}); "
                             f"{SHARD_FIX}") from None

    def shard_bytes(self, shard: int, record: dict | None) -> bytes:
        """A whole shard, never past its recorded size, checked against the record (sha256 on the first read)."""
        data = self._fetch(self.source.whole, shard, record["bytes"] if record else MAX_UNLISTED_SHARD_BYTES,
                           "a store shard")
        if record is not None and len(data) != record["bytes"]:
            raise self.damaged(shard, f"it has {len(data)} bytes, the manifest recorded {record['bytes']}")
        if record is not None and shard not in self.hashed:
            if sha256_bytes(data) != record["sha256"]:
                raise self.damaged(shard, "its sha256 differs from the one the manifest recorded")
            self.hashed.add(shard)
        return data

    def header(self, shard: int, record: dict | None) -> tuple[int, dict]:
        """(data start, safetensors header) of a shard, its size and header length checked against the record."""
        if shard not in self._headers:
            size = self._fetch(self.source.size, shard)
            if record is not None and size != record["bytes"]:
                raise self.damaged(shard, f"it has {size} bytes, the manifest recorded {record['bytes']}")
            head = self._fetch(self.source.span, shard, 0, 8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
            if 8 + n > size:
                raise self.damaged(shard, f"it declares a header of {n} bytes, past its {size}")
            try:
                header = json.loads(self._fetch(self.source.span, shard, 8, 8 + n))
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                raise self.damaged(shard, f"it is not a readable safetensors file ({excerpt(str(e))})") from None
            if not isinstance(header, dict):
                raise self.damaged(shard, "it is not a readable safetensors file (its header is not an object)")
            self._headers[shard] = (8 + n, header, size)
        start, header, _ = self._headers[shard]
        return start, header

    def head_slice(self, shard: int, record: dict | None, name: str, want: tuple[tuple[int, ...], str],
                   layer: int, head: int) -> np.ndarray:
        """The (layer, head) slice of tensor ``name`` (expected shape and dtype ``want``), read by byte range."""
        start, header = self.header(shard, record)
        size = self._headers[shard][2]
        info = header.get(name)
        shape, dtype = want
        if not isinstance(info, dict) or _DTYPES.get(str(info.get("dtype"))) != dtype or info.get("shape") != list(shape):
            found = (f"{_DTYPES.get(str(info.get('dtype')), info.get('dtype'))}{info.get('shape')}" if isinstance(info, dict)
                     else "missing")
            raise self.damaged(shard, f"tensor {name} is {found}, expected {dtype}{list(shape)}")
        itemsize = np.dtype(dtype).itemsize
        per = int(np.prod(shape[2:], dtype=np.int64)) * itemsize
        offsets = info.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2 or offsets[1] - offsets[0] != per * shape[0] * shape[1]
                or start + offsets[1] > size):
            raise self.damaged(shard, f"tensor {name} has byte offsets outside the file or its shape")
        lo = start + offsets[0] + (layer * shape[1] + head) * per
        return np.frombuffer(self._fetch(self.source.span, shard, lo, lo + per), dtype=dtype).reshape(shape[2:])
