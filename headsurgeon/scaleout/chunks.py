"""How explain's heads are cut into tasks: shared by the serial executor (run.py) and Ray's (ray_run.py)."""
from __future__ import annotations

from ..kernels.core import InputError

__all__ = ["MAX_HEADS_PER_TASK", "chunked"]

#: most heads per task by default: a task pays a fixed cost (the searchers' shared work: the enumerative
#: searcher's primitives on its fit set, sequence features) before its heads, so big tasks amortize it, while a
#: killed run loses at most one task's heads (benchmarks/scaleout.py measures both costs)
MAX_HEADS_PER_TASK = 64


def chunked(heads: list[tuple[int, int]], size: int) -> list[list[tuple[int, int]]]:
    """``heads`` in consecutive chunks of at most ``size`` (the unit of work a task gets)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"heads_per_task must be a whole number >= 1; got {size!r}")
    return [heads[i: i + size] for i in range(0, len(heads), size)]
