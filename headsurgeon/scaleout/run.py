"""Run explain's per-head work in this machine's processes or on Ray, journaled per head (journal.py) so a killed
run resumes.

Every executor runs the same task (task.py ``explain_heads``) and writes the same records, whatever the chunks, so
they select the same programs with the same scores. Locally, one worker runs the tasks in this process; more run on
a process pool (pool.py).
"""
from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tqdm.auto import tqdm

from .chunks import balanced, chunked
from .journal import HeadJournal
from .pool import default_workers, describe, peak_rss, pool_map
from .task import HeadJob, explain_heads
from ..core import InputError

if TYPE_CHECKING:  # surgery/models/handle.py imports torch, which this module does without
    from ..surgery.models.handle import ModelHandle

EXECUTORS = ("local", "ray")


def _estimate(seconds_per_head: float, left: int, workers: int) -> str:
    """The time the remaining heads will take at ``seconds_per_head``, the workers running side by side."""
    seconds = max(0.0, seconds_per_head) * left / max(1, workers)
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _pace(records: list[dict]) -> float:
    """Seconds per head of one task: its heads' own search, selection and ΔPPL time, less the numba warm-up it
    recorded (task.py ``explain_heads``)."""
    def total(value: Any) -> float:
        return sum(map(total, value.values())) if isinstance(value, dict) else float(value or 0.0)

    seconds = [rec.get("seconds") or {} for rec in records]
    spent = sum(total({k: v for k, v in s.items() if k != "warmup"}) - float(s.get("warmup") or 0.0) for s in seconds)
    return max(0.0, spent) / max(1, len(records))


def _picklable(job: HeadJob) -> bool:
    """Whether the job can travel to worker processes (as the pool sends it, by cloudpickle)."""
    import cloudpickle

    try:
        cloudpickle.dumps(job)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def run_heads(job: HeadJob, heads: list[tuple[int, int]], journal: str | Path, *, fingerprint: dict[str, Any],
              executor: str = "local", workers: int | None = None, address: str | None = None,
              heads_per_task: int | None = None, handle: ModelHandle | None = None, progress: bool = True,
              ray_options: dict[str, Any] | None = None,
              on_record: Callable[[dict], None] | None = None) -> tuple[dict[tuple[int, int], dict], int, list[str]]:
    """Explain every head not yet in ``journal``; return all heads' records (head → record), how many heads
    were already journaled (resumed, not redone) and notes on the run (the pool's size and peak memory).

    ``executor``: "local" (``workers`` processes, None: ``$HEADSURGEON_WORKERS`` or every core this process may
    use; 1: this process) or "ray"
    (``address``: a running cluster; None: a local runtime started here). ``heads_per_task``: heads per task (None:
    locally, tasks that shrink toward the end (chunks.py ``balanced``); on Ray, the heads spread evenly over the
    cluster's CPUs). ``on_record`` sees each record as it is journaled.
    """
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}; got {executor!r}")
    book = HeadJournal(journal)
    done = book.start(fingerprint)
    todo = [h for h in heads if h not in done]
    notes: list[str] = []
    workers = max(1, min(workers or default_workers(), len(todo) or 1))
    if workers > 1 and not _picklable(job):
        notes.append("the heads ran in this process: a searcher or option of this run cannot be pickled for worker "
                     "processes (it holds a lock, a file or a live model); pass picklable options to use every core")
        workers = 1
    with tqdm(total=len(heads), initial=len(heads) - len(todo), desc=f"explain heads ({executor})", unit="head",
              disable=not progress) as bar:
        t0 = time.perf_counter()
        count = [0, 0]  # heads journaled by this run, tasks finished

        def finished(records: list[dict]) -> None:
            for rec in records:
                book.write(rec)
                if on_record is not None:
                    on_record(rec)
            bar.update(len(records))
            count[0] += len(records)
            count[1] += 1
            left = len(todo) - count[0]
            # a worker's first task also starts its process, loads spaCy and reads the windows, so its pace overstates
            # the rest (benchmarks/RESULTS.md): the estimate waits for the first task after every worker's first
            if count[1] == workers + 1 and left and progress:
                pace = _pace(records)
                bar.write(f"explain heads: {count[0]} done in {time.perf_counter() - t0:.0f} s; at a later task's "
                          f"pace ({pace:.1f} s a head) the other {left} will take about "
                          f"{_estimate(pace, left, workers)}")

        if executor == "local" and todo:
            chunks = chunked(todo, heads_per_task) if heads_per_task else balanced(todo, workers)
            if workers == 1:
                for chunk in chunks:
                    finished(explain_heads(job, chunk, handle=handle))
            else:
                notes.append(describe(pool_map(job, chunks, finished, workers=workers), peak_rss()))
        elif todo:
            from .ray_run import ray_map

            ray_map(job, todo, finished, address=address, heads_per_task=heads_per_task, **(ray_options or {}))
    records = book.records()
    return {h: records[h] for h in heads}, len(heads) - len(todo), notes
