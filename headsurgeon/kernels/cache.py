"""Content-addressed tensor cache: in-memory LRU with a byte budget plus an optional on-disk store.

Keys come from :func:`cache_key` (program hash, sequence-ids hash, mask policy), so an entry is valid
for as long as those three things are the same; nothing is ever invalidated, only evicted.

On disk, entries live in safetensors shard files (one or many tensors each, tensor name = key) in one
directory, written and read with the ``safetensors`` library (``safetensors.numpy``: numpy alone; shards
of earlier versions' own codec are valid safetensors and still load). Writes go through
``fileio.atomic_write_bytes`` (temp file, fsync, ``os.replace``): concurrent readers see either no shard
or a whole one, and two processes writing the same entries both succeed (shard names are content hashes
of their keys, so they simply replace each other with equal content). Readers discover shards written by
other processes by rescanning the directory when its modification time changes. No pickle. The disk
store is never pruned automatically (``clear(disk=True)`` empties it).

Entries on disk are verified (SECURITY.md, "Tensor cache"): each carries, in its shard's metadata, an
HMAC-SHA256 of its key (program hash, sequence key, mask policy), dtype, shape and bytes under a secret that
only this user can read (``.cache-key`` in the directory, mode 0600). An entry that another writer of the
folder changed, or that has no valid digest, is a miss with a warning: the caller recomputes it. Shards are
read like hostile files: symlinks and non-regular files are refused, and the header and each tensor's byte
range are checked against the file's size before they are read. A new cache directory is created with mode
0700.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from ..core.fileio import UnsafeFileError, atomic_write_bytes, private_key
from ..core import InputError
from ..core.formats import FileFormat, FutureFormatError, metadata_version

__all__ = ["TensorCache", "CacheStats", "CacheEntryWarning", "cache_key"]

SHARD_SUFFIX = ".safetensors"
KEY_FILE = ".cache-key"
MAX_HEADER_BYTES = 64 << 20
#: a shard's ``format`` metadata, ``headsurgeon-tensor-cache/1`` (headsurgeon/core/formats.py); shards without it still load
SHARD_FORMAT = FileFormat("headsurgeon-tensor-cache", 1, (1,), "a tensor-cache shard",
                          "clear the cache folder (TensorCache.clear(disk=True))", error=UnsafeFileError)
_MAC_PREFIX = "hmac-sha256:"
_MTIME_SLACK_NS = 2_000_000_000
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
           "I32": np.int32, "I64": np.int64, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64,
           "BOOL": np.bool_}


class CacheEntryWarning(UserWarning):
    """A tensor-cache entry on disk failed verification (changed by another writer, or damaged) and is recomputed."""


def cache_key(program_hash: str, seq_key: str, mask_policy: str) -> str:
    """Content address of one (program, sequence, mask policy) tensor: 40 hex chars."""
    for name, part in (("program_hash", program_hash), ("seq_key", seq_key), ("mask_policy", mask_policy)):
        if not isinstance(part, str) or not part:
            raise InputError(f"cache_key needs a non-empty str {name}; got {part!r}")
    raw = "\x1f".join((program_hash, seq_key, mask_policy)).encode()
    return hashlib.sha256(raw).hexdigest()[:40]


@dataclass
class CacheStats:
    """Counters of a :class:`TensorCache` (``hits`` includes ``disk_hits``)."""

    hits: int = 0
    misses: int = 0
    disk_hits: int = 0
    puts: int = 0
    evictions: int = 0
    disk_writes: int = 0
    entries: int = 0
    bytes: int = 0
    max_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Fraction of lookups answered from memory or disk (0 when nothing was looked up)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict[str, float]:
        """Plain dict (JSON-friendly) of the counters and the hit rate."""
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d


def _open_shard(path: Path) -> tuple[int, int]:
    """A descriptor and the size of a shard opened as a hostile file: no symlink, regular files only."""
    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise UnsafeFileError(f"{path} is a symbolic link; tensor-cache shards are read only from regular files")
    fd = os.open(path, _O_READ)  # O_NOFOLLOW: a link swapped in since the lstat fails here
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{path} is not a regular file; tensor-cache shards must be regular files")
    return fd, st.st_size


def _pread(fd: int, n: int, offset: int) -> bytes:
    """Exactly ``n`` bytes at ``offset`` (the caller checked the range against the file's size)."""
    chunks, done = [], 0
    while done < n:
        chunk = os.pread(fd, n - done, offset + done)
        if not chunk:
            raise UnsafeFileError("the shard shrank while it was read")
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _header(fd: int, size: int) -> dict:
    """The safetensors header of an open shard, its length checked against the file before it is read."""
    if size < 8:
        raise UnsafeFileError("the shard is shorter than a safetensors header")
    n = int.from_bytes(_pread(fd, 8, 0), "little")
    if n > min(size - 8, MAX_HEADER_BYTES):
        raise UnsafeFileError(f"the shard's header claims {n} bytes, more than the file or the limit holds")
    header = json.loads(_pread(fd, n, 8))
    if not isinstance(header, dict):
        raise UnsafeFileError("the shard's header is not a JSON object")
    header["\0start"] = 8 + n
    return header


def _shard_keys(path: Path) -> list[str]:
    """The tensor names of a safetensors shard (its header only; no tensor is read)."""
    fd, size = _open_shard(path)
    try:
        return [k for k in _header(fd, size) if not k.startswith(("__", "\0"))]
    finally:
        os.close(fd)


def _read_entry(path: Path, key: str) -> tuple[np.ndarray, str | None]:
    """One tensor of a shard and the digest stored with it, every offset checked against the file's size."""
    fd, size = _open_shard(path)
    try:
        header = _header(fd, size)
        info = header.get(key)
        if not isinstance(info, dict):
            raise UnsafeFileError(f"{path} lists no entry {key}")
        meta = header.get("__metadata__") or {}
        if isinstance(meta, dict) and "format" in meta:
            metadata_version(meta["format"], SHARD_FORMAT, str(path))
        dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")  # safetensors is little-endian
        shape = tuple(int(d) for d in info["shape"])
        start, end = (int(x) for x in info["data_offsets"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        base = header["\0start"]
        if not (0 <= start <= end and end - start == nbytes and base + end <= size):
            raise UnsafeFileError(f"entry {key} of {path} has byte offsets outside the file or its shape")
        arr = np.frombuffer(_pread(fd, nbytes, base + start), dtype=dtype).reshape(shape)
        digest = meta.get(_MAC_PREFIX + key) if isinstance(meta, dict) else None
        return arr, digest if isinstance(digest, str) else None
    finally:
        os.close(fd)


def _digest(secret: bytes, key: str, arr: np.ndarray) -> str:
    """HMAC-SHA256 of an entry's key (program, sequence, mask policy), dtype, shape and bytes."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    mac.update(f"{key}\x1f{arr.dtype.str}\x1f{arr.shape}\x1f".encode())
    mac.update(np.ascontiguousarray(arr).data)
    return mac.hexdigest()


def _private_directory(directory: Path) -> None:
    """Create the cache folder with mode 0700; warn when an existing one can be written by other users."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.stat(directory)
    if st.st_mode & 0o022 or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        warnings.warn(f"the tensor cache folder {directory} can be written by other users; its entries are verified "
                      f"and changed ones recomputed, but give it mode 0700 (chmod 700 {directory})",
                      CacheEntryWarning, stacklevel=3)


def _secret_of(directory: Path) -> bytes:
    """This user's key for the folder's digests (created once, mode 0600); a fresh one where it cannot be trusted."""
    path = directory / KEY_FILE
    return private_key(path, lambda why: _untrusted_key(path, why))


def _untrusted_key(path: Path, why: str) -> bytes:
    """A key for this process only: entries on disk will not verify (misses), new ones verify within the process."""
    warnings.warn(f"the tensor cache key {path} cannot be used: {why}; entries on disk are recomputed. Delete the "
                  "file (the cache makes a new one) or use another cache folder", CacheEntryWarning, stacklevel=6)
    return secrets.token_bytes(32)


def _key_of(key: str) -> str:
    """Validate a cache key (what :func:`cache_key` makes, or any other safe tensor name)."""
    if not isinstance(key, str) or not key or len(key) > 200 or "/" in key or "\\" in key or "\0" in key:
        raise InputError(f"bad cache key {key!r}; build keys with cache_key(program_hash, seq_key, mask_policy)")
    return key


class TensorCache:
    """LRU of numpy arrays bounded by ``max_bytes``, optionally backed by a safetensors directory.

    ``get`` returns read-only arrays shared with the cache (copy before writing). Thread-safe.
    Arrays larger than ``max_bytes`` are not kept in memory (but still written to disk).
    """

    def __init__(self, max_bytes: int = 1 << 30, directory: str | os.PathLike | None = None) -> None:
        if max_bytes < 0:
            raise InputError(f"max_bytes must be >= 0; got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.directory = Path(directory) if directory is not None else None
        self._secret = b""
        if self.directory is not None:
            _private_directory(self.directory)
            self._secret = _secret_of(self.directory)
        self._mem: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.RLock()
        self._stats = CacheStats(max_bytes=self.max_bytes)
        self._index: dict[str, Path] = {}  # key -> the shard that holds it
        self._scanned: set[str] = set()
        self._dir_mtime: int | None = None

    # ------------------------------------------------------------------ memory
    def _remember(self, key: str, arr: np.ndarray) -> None:
        """Insert (or refresh) an entry as most recent and evict down to the budget."""
        old = self._mem.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        if arr.nbytes > self.max_bytes:
            return
        self._mem[key] = arr
        self._bytes += arr.nbytes
        while self._bytes > self.max_bytes and self._mem:
            _, gone = self._mem.popitem(last=False)
            self._bytes -= gone.nbytes
            self._stats.evictions += 1

    @staticmethod
    def _frozen(array: np.ndarray) -> np.ndarray:
        """Private, contiguous, read-only copy of ``array``."""
        arr = np.array(array, copy=True, order="C")
        if arr.dtype == object:
            raise TypeError("TensorCache stores numeric arrays only (no object dtype, no pickle)")
        arr.flags.writeable = False
        return arr

    # ------------------------------------------------------------------ disk
    def _refresh_index(self, force: bool = False) -> None:
        """Index shards written since the last scan (by this or another process)."""
        if self.directory is None:
            return
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return
        if not force and mtime == self._dir_mtime:
            return
        # Directory mtimes tick coarsely: trust one only once it is old enough that no write can
        # still land in the same tick; until then rescan on every miss (cheap: known shards are skipped).
        self._dir_mtime = mtime if time.time_ns() - mtime > _MTIME_SLACK_NS else None
        with os.scandir(self.directory) as it:
            names = [e.name for e in it if e.name.endswith(SHARD_SUFFIX) and not e.name.startswith(".")]
        for name in names:
            if name in self._scanned:
                continue
            path = self.directory / name
            try:
                keys = _shard_keys(path)
            except Exception:  # noqa: BLE001 - removed meanwhile or foreign file (SafetensorError, OSError): ignore
                continue
            self._scanned.add(name)
            for key in keys:
                self._index.setdefault(key, path)

    def _load(self, key: str) -> np.ndarray | None:
        """Read one tensor from its shard, or None when it is not on disk."""
        entry = self._index.get(key)
        if entry is None:
            self._refresh_index()
            entry = self._index.get(key)
        if entry is None:
            return None
        try:
            arr, digest = _read_entry(entry, key)
        except FutureFormatError as e:  # a newer headsurgeon's shard: a miss that says why
            self._index.pop(key, None)
            warnings.warn(f"{e}; recomputing its entries", CacheEntryWarning, stacklevel=4)
            return None
        except Exception:  # noqa: BLE001 - shard removed, truncated, a link, or of a dtype numpy lacks: a miss
            self._index.pop(key, None)
            return None
        if digest is None or not hmac.compare_digest(digest, _digest(self._secret, key, arr)):
            self._index.pop(key, None)
            warnings.warn(f"tensor cache entries in {entry} do not match their digests (changed by another writer of "
                          "the cache folder, or written with another key); recomputing them. Clear the cache folder if "
                          "this repeats", CacheEntryWarning, stacklevel=4)
            return None
        return arr

    def _write_shard(self, items: Mapping[str, np.ndarray]) -> Path:
        """Atomically write ``items`` as one safetensors shard named by the hash of its keys."""
        assert self.directory is not None
        digest = hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:32]
        final = self.directory / f"{digest}{SHARD_SUFFIX}"
        metadata = {"format": SHARD_FORMAT.tag, **{_MAC_PREFIX + k: _digest(self._secret, k, items[k]) for k in items}}
        payload = save({k: items[k] for k in sorted(items)}, metadata=metadata)
        atomic_write_bytes(final, payload)
        self._scanned.add(final.name)
        for k in items:
            self._index[k] = final
        self._stats.disk_writes += 1
        return final

    # ------------------------------------------------------------------ public
    def get(self, key: str) -> np.ndarray | None:
        """The cached array for ``key`` (memory first, then disk), or None; counts a hit or a miss."""
        _key_of(key)
        with self._lock:
            arr = self._mem.get(key)
            if arr is not None:
                self._mem.move_to_end(key)
                self._stats.hits += 1
                return arr
            if self.directory is not None:
                arr = self._load(key)
                if arr is not None:
                    self._remember(key, arr)
                    self._stats.hits += 1
                    self._stats.disk_hits += 1
                    return arr
            self._stats.misses += 1
            return None

    def get_many(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        """Look up many keys; returns only the hits (each key counted as a hit or a miss, as ``get`` would).

        Memory hits are taken under one lock acquisition; the rest go through ``get`` (disk, then a miss).
        """
        keys = [_key_of(k) for k in keys]
        found: dict[str, np.ndarray] = {}
        rest: list[str] = []
        with self._lock:
            mem = self._mem
            for k in keys:
                arr = mem.get(k)
                if arr is None:
                    rest.append(k)
                else:
                    mem.move_to_end(k)
                    found[k] = arr
            self._stats.hits += len(keys) - len(rest)
        for k in rest:
            arr = self.get(k)
            if arr is not None:
                found[k] = arr
        return found

    def put(self, key: str, array: np.ndarray) -> None:
        """Store a copy of ``array`` under ``key`` in memory and, if configured, on disk."""
        self.put_many({key: array})

    def put_many(self, items: Mapping[str, np.ndarray]) -> None:
        """Store many arrays; with a directory they go to disk together as one shard."""
        frozen = {_key_of(k): self._frozen(v) for k, v in items.items()}
        if not frozen:
            return
        with self._lock:
            for k, arr in frozen.items():
                self._remember(k, arr)
                self._stats.puts += 1
            if self.directory is not None:
                todo = {k: v for k, v in frozen.items() if k not in self._index}
                if todo:
                    self._write_shard(todo)

    def __contains__(self, key: object) -> bool:
        """True when ``key`` is in memory or on disk (does not touch the counters or the LRU order)."""
        if not isinstance(key, str):
            return False
        with self._lock:
            if key in self._mem:
                return True
            if self.directory is None:
                return False
            if key not in self._index:
                self._refresh_index()
            return key in self._index

    def __len__(self) -> int:
        """Number of entries held in memory."""
        return len(self._mem)

    @property
    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            s = CacheStats(**asdict(self._stats))
            s.entries = len(self._mem)
            s.bytes = self._bytes
            return s

    def clear(self, disk: bool = False) -> None:
        """Drop every in-memory entry (and, with ``disk=True``, every shard in the directory)."""
        with self._lock:
            self._mem.clear()
            self._bytes = 0
            if disk and self.directory is not None:
                for p in self.directory.glob(f"*{SHARD_SUFFIX}"):
                    p.unlink(missing_ok=True)
                self._index.clear()
                self._scanned.clear()
                self._dir_mtime = None

    def __repr__(self) -> str:
        s = self.stats
        where = f", directory={str(self.directory)!r}" if self.directory else ""
        return (f"TensorCache(entries={s.entries}, bytes={s.bytes}/{self.max_bytes}, hits={s.hits}, "
                f"misses={s.misses}{where})")
