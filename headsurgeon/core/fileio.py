"""Durable file primitives every layer shares: atomic writes, fsync, sha256, JSON encoding, document splitting.

It sits in the bottom layer (standard library only) so that the tensor cache, the attention store,
program sets, checkpoints and the embedded model's files all write the same way: into a temporary
file beside the target, flushed and fsynced, then renamed over it (atomic on POSIX), so a reader
sees either the old file or the whole new one and a killed writer leaves no torn file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from . import HeadsurgeonError

__all__ = [
    "atomic_file", "atomic_path", "atomic_write_bytes", "atomic_write_json", "fsync_file", "fsync_dir", "sha256_file",
    "sha256_bytes", "json_default", "json_bytes", "split_documents", "UnsafeFileError", "read_bounded", "named_file",
    "SYSTEM_FOLDERS", "private_key",
]

_CHUNK = 1 << 20
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def fsync_file(path: str | Path) -> None:
    """Flush a file's data to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry (a rename into it) to disk; best effort where directories have no descriptors."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask: from /proc where it is readable, else by setting it and putting it back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; on a clean exit fsync it and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for writers that take a file name (safetensors' ``save_file``);
    on a clean exit the file is fsynced and renamed over ``path``, as :func:`atomic_file` does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)


def json_default(obj: Any) -> Any:
    """JSON for what numpy, torch and the standard library hand us: scalars, arrays, sets, paths, counters."""
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        return obj.item()  # numpy / torch scalars
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, dict):  # dict subclasses such as Counter
        return dict(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable; use numbers, strings, lists and dicts")


def _finite(x: Any) -> Any:
    """NaN and infinities are not JSON: they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def json_bytes(obj: Any, indent: int | None = 1, sort_keys: bool = True) -> bytes:
    """Strict JSON (non-finite floats as null) with :func:`json_default` for numpy/torch values."""
    plain = json.loads(json.dumps(obj, default=json_default))
    return json.dumps(_finite(plain), indent=indent, sort_keys=sort_keys, allow_nan=False).encode()


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1, sort_keys: bool = True) -> None:
    """Replace ``path`` with ``obj`` as JSON, atomically."""
    atomic_write_bytes(path, json_bytes(obj, indent=indent, sort_keys=sort_keys))


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a regular file, read in 1 MiB chunks and never past the size it had when opened, so a file
    that grows without end (a procfs or device file, refused by ``named_file``) cannot keep the hash running."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = os.fstat(f.fileno()).st_size
        while left > 0:
            chunk = f.read(min(left, _CHUNK))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


#: folders whose files are views of the kernel or devices, never model files, whatever their stat says
SYSTEM_FOLDERS = (Path("/proc"), Path("/sys"), Path("/dev"))


def named_file(path: str | Path, what: str) -> Path:
    """``path`` resolved, if it is a regular, non-empty file outside /proc, /sys and /dev: the rule for every file a
    checkpoint or a programs file names (a base model, its tokenizer), whose name a stranger chose.

    A missing file raises FileNotFoundError; anything else that is not such a file is an UnsafeFileError.
    """
    resolved = Path(path).resolve()
    for top in SYSTEM_FOLDERS:
        if resolved == top or top in resolved.parents:
            raise UnsafeFileError(f"{path} is under {top}, not a file on disk; {what} must be a regular file")
    st = os.stat(resolved)
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
        raise UnsafeFileError(f"{path} is not a regular file ({kind}); {what} must be a regular file")
    if st.st_size == 0:
        raise UnsafeFileError(f"{path} is empty; {what} cannot be an empty file (it was truncated, or it is not one)")
    return resolved


class UnsafeFileError(HeadsurgeonError, ValueError):
    """A file that must not be read: a symbolic link, not a regular file, or larger than its cap."""


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _refuse(path: Path, st: os.stat_result, limit: int, what: str) -> None:
    """Raise UnsafeFileError unless ``st`` is a regular file of at most ``limit`` bytes."""
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(f"{path} is a symbolic link; {what} is read only from a regular file, never through a "
                              "link: replace the link by a copy of the file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
        raise UnsafeFileError(f"{path} is not a regular file ({kind}); {what} must be a regular file")
    if st.st_size > limit:
        raise UnsafeFileError(f"{path} is {st.st_size} bytes; {what} may hold at most {limit} bytes, so this is not "
                              "one (or it is damaged)")


def read_bounded(path: str | Path, limit: int, what: str = "this file") -> bytes:
    """The bytes of a file that may be hostile: symlinks and non-regular files refused, the size checked against
    ``limit`` before a byte is read (lstat, then fstat of a descriptor opened with O_NOFOLLOW), never read past it.

    A missing file raises FileNotFoundError; every other refusal is an UnsafeFileError naming the file and why.
    """
    path = Path(path)
    _refuse(path, os.lstat(path), limit, what)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as e:
        if e.errno in (getattr(os, "ELOOP", -1), getattr(os, "EMLINK", -1)):  # swapped for a link since lstat
            raise UnsafeFileError(f"{path} is a symbolic link; {what} is read only from a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        _refuse(path, st, limit, what)
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, _CHUNK))
            if not chunk:
                break  # the file shrank while we read it: what is there is what we return
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def split_documents(text: str) -> list[str]:
    """Documents of a corpus text: split at blank lines, each stripped, empty ones dropped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return [d.strip() for d in _BLANK_LINE.split(text) if d.strip()]


def private_key(path: Path, refuse: Callable[[str], bytes], size: int = 32) -> bytes:
    """This user's secret in ``path``: created once (mode 0600, linked into place whole, so a concurrent creator's
    key wins), then read back only if it is a private regular file of this user holding ``size`` bytes; otherwise
    ``refuse(why)`` gives the caller's fallback (the caches warn and use a key for this process only)."""
    for _ in range(2):
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            tmp = path.with_name(f".tmp-key-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                try:
                    os.write(fd, secrets.token_bytes(size))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, path)
                os.unlink(tmp)
            except OSError as e:
                return refuse(f"it cannot be created ({e.strerror})")
            continue
        except OSError as e:
            return refuse(f"it cannot be opened ({e.strerror})")
        try:
            st, data = os.fstat(fd), os.read(fd, size + 1)
        finally:
            os.close(fd)
        mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
        if not stat.S_ISREG(st.st_mode) or not mine or st.st_mode & 0o077 or len(data) != size:
            return refuse(f"it is not a private {size}-byte file of yours (mode 0600)")
        return data
    return refuse("it could not be created")
