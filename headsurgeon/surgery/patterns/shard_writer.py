"""shard_writer: writes a capture's finished shards (and the manifest after each) in a background thread.

capture() hands a shard over as soon as its last batch is converted and goes on with the next batch while this thread
serializes, hashes and fsyncs it (file I/O, sha256 and torch all release the GIL). The manifest is rewritten only at
shard boundaries, after the shard's file is in place, so a crash leaves a manifest that lists only sound shards and the
capture resumes from there (headsurgeon/surgery/patterns/capture.py ``_resume``).
"""
from __future__ import annotations

import queue
import threading
from types import TracebackType
from typing import Iterable

import numpy as np

from .store import AttentionStore, StoreError
from ...core import InputError

__all__ = ["ShardWriter", "ShardWriteError"]

_STOP = None


class ShardWriteError(StoreError):
    """The background writer could not write a shard or the manifest; the message names the file and the fix."""


class ShardWriter:
    """One writer thread fed with finished shards, at most ``depth`` of them waiting while one is written.

    The caller's memory thus stays bounded by ``depth + 2`` shards (one being built); the default 0 makes that two
    (one being built, one being written), and lets a caller run ahead by a shard only while its last one is written.
    A failure in the thread is re-raised in the caller by the next :meth:`submit` or by :meth:`close`. Leaving
    the ``with`` block (normally or by an exception) writes every shard already handed over before the thread stops,
    so no computed shard is lost.
    """

    def __init__(self, store: AttentionStore, done: Iterable[int] = (), depth: int = 0) -> None:
        if store.directory is None:
            raise InputError("ShardWriter needs a store with a directory; an in-memory store keeps its entries itself")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise InputError(f"depth must be a whole number of shards >= 0, got {depth!r}")
        self.store = store
        self.done: set[int] = set(done)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.Semaphore(depth + 1)  # shards in the writer's hands: the one written + those waiting
        self._error: ShardWriteError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"headsurgeon shard writer {store.directory}",
                                        daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- caller side
    def submit(self, shard: int, entries: dict[str, np.ndarray]) -> None:
        """Hand a finished shard over (blocks while the writer holds ``depth + 1``); raises its earlier failure, if any."""
        if self._closed:
            raise RuntimeError("this ShardWriter is closed; start a new one")
        self._raise_failure()
        self._slots.acquire()
        self._queue.put((int(shard), entries))

    def close(self) -> None:
        """Write what is queued, stop the thread and raise its failure, if any."""
        self._stop()
        self._raise_failure()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        self._stop()  # the caller failed: still write the shards it finished, then let its exception through
        if self._error is not None and exc is not self._error and hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(f"also: {self._error}")

    def _stop(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    # ----------------------------------------------------------------- writer thread
    def _run(self) -> None:
        """Write queued shards in order, the manifest after each; after a failure only drain the queue."""
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if self._error is None:  # after a failure only drain, so the caller never waits for a slot
                    self._write(*item)
            finally:
                del item
                self._slots.release()

    def _write(self, shard: int, entries: dict[str, np.ndarray]) -> None:
        """Write one shard, then the manifest that lists it; a failure is kept for the caller."""
        try:
            self.store.write_shard(shard, entries)
            self.store.save_manifest(self.done | {shard})
            self.done.add(shard)
        except BaseException as e:  # noqa: BLE001 - any failure goes to the caller (a dead thread would hang it)
            self._error = ShardWriteError(
                f"writing {self.store.shard_path(shard)} (or its manifest entry) failed: {type(e).__name__}: {e}; "
                "fix the cause (disk space, permissions) and re-run the same capture to resume: the "
                f"{len(self.done)} shards written before it are kept")
            self._error.__cause__ = e
