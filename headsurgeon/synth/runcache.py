"""One run's cache of sandboxed programs' patterns: a library program runs once per run, not once per head task.

``explain`` searches and selects per task of heads (headsurgeon/scaleout/task.py), possibly in several worker
processes; a library program's patterns do not depend on the head, so they are computed by the first task and
read back by the others from ``OUT/pattern-cache`` (headsurgeon/kernels/cache.py: content-addressed by program hash,
window and mask policy, every entry HMAC'd under a key only you can read). :class:`RoutedCache` sends the
sandboxed (Python) programs there and keeps every other program's patterns in the in-memory cache.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..kernels.cache import TensorCache

__all__ = ["RoutedCache", "PatternCache", "run_cache", "routed_cache"]

RUN_CACHE_DIR = "pattern-cache"
_CACHES: dict[str, TensorCache] = {}
_LOCK = threading.Lock()


def run_cache(out: str | Path | None, max_bytes: int = 256 << 20) -> TensorCache | None:
    """The run's on-disk cache under ``out`` (one object per folder and process); None without ``out``."""
    if out is None:
        return None
    path = str(Path(out) / RUN_CACHE_DIR)
    with _LOCK:
        cache = _CACHES.get(path)
        if cache is None:
            cache = _CACHES[path] = TensorCache(max_bytes=max_bytes, directory=path)
        return cache


class RoutedCache:
    """A cache per program: sandboxed programs to the run's disk cache, the others to memory (``for_program``)."""

    def __init__(self, memory: TensorCache, disk: TensorCache | None) -> None:
        self.memory, self.disk = memory, disk

    def for_program(self, program: Any) -> TensorCache:
        """Where ``program``'s patterns are kept."""
        return self.disk if self.disk is not None and getattr(program, "sandboxed", False) else self.memory

    # the TensorCache calls made without a program (none in headsurgeon/synth/tensors.py): the memory cache answers them
    def get_many(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        """Memory hits of ``keys``."""
        return self.memory.get_many(keys)

    def put_many(self, items: Mapping[str, np.ndarray]) -> None:
        """Store in memory."""
        self.memory.put_many(items)


#: what the scoring paths take as a pattern cache (headsurgeon/synth/tensors.py ``program_rows``)
PatternCache = Union[TensorCache, RoutedCache]


def routed_cache(out: str | Path | None, max_bytes: int = 512 << 20) -> RoutedCache:
    """A memory cache of ``max_bytes`` for DSL programs beside the run's disk cache under ``out``."""
    return RoutedCache(TensorCache(max_bytes=max_bytes), run_cache(out))
