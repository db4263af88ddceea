"""How explain's heads are cut into tasks: shared by the local executor (run.py, pool.py) and Ray's (ray_run.py)."""
from __future__ import annotations

from ..core import InputError

__all__ = ["FIRST_TASK_HEADS", "MAX_HEADS_PER_TASK", "balanced", "chunked"]

#: most heads per task: a task pays a fixed cost (the searchers' shared work: the enumerative searcher's
#: primitives on its fit set; the windows' features in a process's first task only, headstore.py) before its heads,
#: so big tasks amortize it, while a killed run loses at most one task's heads (benchmarks/scaleout.py measures both
#: costs)
MAX_HEADS_PER_TASK = 64
#: heads in each worker's first task: small, since that task also starts the worker (its process, spaCy, the
#: windows' features) and its pace says little about the rest (run.py's estimate waits for the task after it)
FIRST_TASK_HEADS = 2


def chunked(heads: list[tuple[int, int]], size: int) -> list[list[tuple[int, int]]]:
    """``heads`` in consecutive chunks of at most ``size`` (the unit of work a task gets)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"heads_per_task must be a whole number >= 1; got {size!r}")
    return [heads[i: i + size] for i in range(0, len(heads), size)]


def balanced(heads: list[tuple[int, int]], workers: int) -> list[list[tuple[int, int]]]:
    """``heads`` in tasks for ``workers`` processes: a small first task each, then tasks that shrink as the work
    left shrinks (each a ``1 / (2 * workers)`` share of it, at most ``MAX_HEADS_PER_TASK``), so no worker is
    left with a long task while the others idle at the end, and the progress bar moves steadily."""
    if workers <= 1:  # nothing to balance: one small task to start, then the largest
        first = heads[:FIRST_TASK_HEADS]
        return chunked(first, FIRST_TASK_HEADS) + chunked(heads[FIRST_TASK_HEADS:], MAX_HEADS_PER_TASK)
    chunks: list[list[tuple[int, int]]] = []
    i = 0
    while i < len(heads):
        size = min(MAX_HEADS_PER_TASK, max(1, -(-(len(heads) - i) // (2 * workers))))
        if len(chunks) < workers:
            size = min(size, FIRST_TASK_HEADS)
        chunks.append(heads[i: i + size])
        i += size
    return chunks
