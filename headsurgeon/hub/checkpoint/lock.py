"""Checkpoint locks: a save swaps its folder into place under an exclusive lock, a load reads under a shared one.

The lock is flock(2) on the folder that *holds* the checkpoint (the checkpoint folder itself is replaced by
each save, so it cannot carry the lock, and a lock file beside it would be left behind). Saves into one
folder therefore take turns at the swap: the last one wins and every one leaves a complete checkpoint. A
load waits while a swap is in progress, so it never reads one save's manifest with another save's files;
after ``LOCK_WAIT_S`` it fails with an error saying the checkpoint is being written. The kernel releases the
lock when its process dies, so a killed save never leaves it held; a save holds it only for the swap itself.
Where flock is missing (not POSIX) or the holding folder cannot be opened for reading, nothing is locked.
One holding folder has one lock, so saves of different checkpoints in it also take turns at their swaps.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

from .errors import CheckpointError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # no fcntl on Windows: the lock degrades to none

__all__ = ["LOCK_WAIT_S", "folder_lock"]

LOCK_WAIT_S = 300.0
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def folder_lock(target: str | Path, *, exclusive: bool, wait: float | None = None) -> Iterator[None]:
    """Hold the lock of checkpoint folder ``target`` (exclusive to swap it, shared to read it) for the block.

    A shared lock waits at most ``wait`` seconds (default ``LOCK_WAIT_S``) for a save's swap; an exclusive one
    waits for the loads in progress, which always end.
    """
    parent = Path(target).expanduser().absolute().parent
    fd = _open_folder(parent) if fcntl is not None else None
    if fd is None:
        yield
        return
    try:
        if exclusive:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocking: woken the moment the readers leave (a polling writer starves)
        else:
            _wait_shared(fd, target, parent, LOCK_WAIT_S if wait is None else wait)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _open_folder(parent: Path) -> int | None:
    """A read-only descriptor of the holding folder; None where it is missing (nothing to lock) or unreadable."""
    try:
        return os.open(parent, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        return None


def _wait_shared(fd: int, target: str | Path, parent: Path, wait: float) -> None:
    """Take the shared lock, polling, or fail after ``wait`` seconds with an error that says why."""
    deadline = time.monotonic() + wait
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"{target} is being written by another process (it has held the lock on {parent} for over "
                    f"{wait:g} s); try again when that save has finished"
                ) from None
            time.sleep(delay)
            delay = min(2 * delay, 0.02)
