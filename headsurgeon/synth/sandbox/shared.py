"""The process-wide pool: started lazily with default settings, closed at interpreter exit."""
from __future__ import annotations

import atexit
import os
import threading

from .pool import SandboxPool


_SHARED: SandboxPool | None = None
_SHARED_LOCK = threading.Lock()


def get_pool() -> SandboxPool:
    """The process-wide pool (started lazily with default settings, closed at interpreter exit)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.closed or _SHARED._pid != os.getpid():
            _SHARED = SandboxPool()
        return _SHARED


def shutdown_pool() -> None:
    """Close the shared pool (a later :func:`get_pool` starts a new one)."""
    global _SHARED
    with _SHARED_LOCK:
        pool, _SHARED = _SHARED, None
    if pool is not None and pool._pid == os.getpid():
        pool.close()


atexit.register(shutdown_pool)
