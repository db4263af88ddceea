"""The folder of converted GGUF models (``cache_root()/gguf/``): private, keyed, and swept of dead writers' leftovers.

Whoever can write this folder could otherwise replace an entry's weights and rewrite the sizes and sha256s in its
``entry.json``. As the tensor cache does (headsurgeon/kernels/cache.py), the folder is created 0700 (with the cache root
above it), one that other users can write is warned about, and every entry carries an HMAC-SHA256 of its
``entry.json`` under a secret only this user can read (``.cache-key``, mode 0600). An entry is used only when its
digest verifies and it holds exactly the regular files it lists. A build writes into ``.build-<sha>-<pid>-<rand>``
while holding flock(2) on that folder; the kernel drops the lock when the writer dies, so the next build removes
the leftovers of killed writers and says how many bytes that freed.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import stat
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

from ...core.fileio import private_key, sha256_file

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks, so no leftover is ever judged dead
    fcntl = None  # type: ignore[assignment]  # no fcntl on Windows: the lock degrades to none

__all__ = ["ConversionCacheWarning", "private_folder", "entry_problem", "sign_entry", "building", "sweep_dead_builds",
           "KEY_FILE", "ENTRY", "BUILD_PREFIX"]

KEY_FILE = ".cache-key"
ENTRY = "entry.json"
MAC_FIELD = "hmac_sha256"
BUILD_PREFIX = ".build-"
OLD_LEFTOVER_AGE_S = 24 * 3600  # leftovers of versions that wrote no pid or lock: removed once a day old
_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class ConversionCacheWarning(UserWarning):
    """The GGUF conversion cache is shared with other users, held a changed or damaged entry, or was cleaned."""


def _writable_by_others(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o022) or (hasattr(os, "getuid") and st.st_uid != os.getuid())


def private_folder(root: Path, folder: Path) -> None:
    """Create ``root`` and ``folder`` (inside it) with mode 0700; warn about either one that others can write."""
    for d in (root, folder):
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(d)
        if _writable_by_others(st):
            warnings.warn(f"the GGUF conversion cache folder {d} can be written by other users; its entries are "
                          f"verified with your key and changed ones rebuilt, but give it mode 0700 (chmod 700 {d})",
                          ConversionCacheWarning, stacklevel=4)


def secret_of(folder: Path) -> bytes:
    """This user's key for entry digests (created once, mode 0600); a fresh one, with a warning, if it is not private.

    The same scheme as the tensor cache's key (headsurgeon/core/fileio.py ``private_key``), with this cache's wording.
    """
    path = folder / KEY_FILE
    return private_key(path, lambda why: _untrusted_key(path, why))


def _untrusted_key(path: Path, why: str) -> bytes:
    """A key for this process only: entries on disk will not verify and are rebuilt."""
    warnings.warn(f"the GGUF conversion cache key {path} cannot be used: {why}; cached conversions are rebuilt. "
                  "Delete the file (the cache makes a new one) or use another cache folder",
                  ConversionCacheWarning, stacklevel=7)
    return secrets.token_bytes(32)


def _mac(secret: bytes, entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != MAC_FIELD}
    return hmac.new(secret, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def sign_entry(secret: bytes, entry: dict[str, Any]) -> dict[str, Any]:
    """The entry record with its keyed digest added."""
    return {**entry, MAC_FIELD: _mac(secret, entry)}


def entry_problem(folder: Path, secret: bytes, want: dict[str, Any]) -> str | None:
    """Why the entry in ``folder`` cannot be used (None when it can): its digest, fields, file list and files.

    ``want`` holds the fields the entry must have as they are (the GGUF's sha256, the converting versions).
    """
    try:
        entry = json.loads((folder / ENTRY).read_text())
        if not isinstance(entry, dict) or not hmac.compare_digest(str(entry.get(MAC_FIELD, "")), _mac(secret, entry)):
            return "its digest does not verify under your key (it was changed, or written with another key)"
        if any(entry.get(k) != v for k, v in want.items()):
            return "it was written for another file or by other versions of transformers and gguf"
        files = entry["files"]
        names = {p.name for p in folder.iterdir()}
        if not files or names != set(files) | {ENTRY}:
            extra = sorted(names - set(files) - {ENTRY})
            return f"it holds files it does not list ({', '.join(extra)})" if extra else "files it lists are missing"
        for name, rec in files.items():
            st = os.lstat(folder / name)
            if not stat.S_ISREG(st.st_mode):
                return f"{name} is not a regular file"
            if st.st_size != rec["size"] or sha256_file(folder / name) != rec["sha256"]:
                return f"{name} does not match its size and sha256"
        return None
    except FileNotFoundError:
        return "it is incomplete"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"it cannot be read ({type(e).__name__})"


@contextlib.contextmanager
def building(folder: Path, sha256: str) -> Iterator[Path]:
    """A private temporary folder for one build, locked for as long as the block runs (and removed if it fails)."""
    tmp = folder / f"{BUILD_PREFIX}{sha256[:16]}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)
    fd = os.open(tmp, _O_DIR)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    finally:
        os.close(fd)  # releases the lock; a renamed (published) folder is no longer a build folder
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _dead(path: Path) -> bool:
    """Whether a build folder's writer is gone: nobody holds its lock and, when it ran on this host, its pid is gone."""
    parts = path.name[len(BUILD_PREFIX):].split("-")
    if len(parts) < 4 or fcntl is None:
        return False
    host, pid = "-".join(parts[1:-2]), parts[-2]
    try:
        fd = os.open(path, _O_DIR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live writer holds it
    finally:
        os.close(fd)
    # the lock was free: dead, unless a writer on this host is between mkdir and flock (its pid is then alive)
    return not (host == socket.gethostname() and pid.isdigit() and _pid_alive(int(pid)))


def _old_leftover(path: Path) -> bool:
    """A temporary folder of an earlier version (``.<sha16>.<random>``, no lock), untouched for a day."""
    name = path.name
    return (len(name) > 18 and name[17:18] == "." and all(c in "0123456789abcdef" for c in name[1:17])
            and time.time() - path.stat().st_mtime > OLD_LEFTOVER_AGE_S)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for f in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def sweep_dead_builds(folder: Path) -> tuple[int, int]:
    """Remove the build folders of writers that died (kill -9, power loss); returns (folders removed, bytes freed)."""
    removed = freed = 0
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(".") and p.is_dir() and not p.is_symlink()]
    except OSError:
        return 0, 0
    for path in candidates:
        try:
            if path.name.startswith(BUILD_PREFIX) and _dead(path) or _old_leftover(path):
                size = _size(path)
                shutil.rmtree(path)
                removed, freed = removed + 1, freed + size
        except OSError:
            continue
    if removed:
        warnings.warn(f"removed {removed} unfinished GGUF cache build{'s' if removed > 1 else ''} left in {folder} "
                      f"by writers that died; {freed} bytes ({freed / 2**20:.1f} MiB) freed", ConversionCacheWarning,
                      stacklevel=4)
    return removed, freed
