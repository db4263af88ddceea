"""The seconds a task spends warming numba up (compiling kernels or loading them from numba's disk cache).

A process's first task compiles every kernel it touches, so its pace says little about the tasks after it; the
run's time estimate (run.py) leaves this time out. numba holds its global compiler lock around every compile and
cache load and announces each hold as a ``numba:compiler_lock`` event (numba/core/compiler_lock.py); a timing
listener on that event sums the outermost holds.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["CompileClock", "compile_clock"]


class CompileClock:
    """Seconds this process held numba's compiler lock while the clock ran (``seconds``, read after the block)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def _add(self, seconds: float) -> None:
        self.seconds += seconds


@contextlib.contextmanager
def compile_clock() -> Iterator[CompileClock]:
    """Count numba's compile and cache-load time inside the block (zero when numba is not installed)."""
    clock = CompileClock()
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - numba is a dependency; nothing can compile without it
        yield clock
        return
    with event.install_timer("numba:compiler_lock", clock._add):
        yield clock
