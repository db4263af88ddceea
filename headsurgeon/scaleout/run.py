"""Run explain's per-head work serially or on Ray, journaled per head (journal.py) so a killed run resumes.

Both executors run the same task (task.py ``explain_heads``) over the same chunks of heads and write the same
records, so they select the same programs with the same scores.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from .chunks import MAX_HEADS_PER_TASK, chunked
from .journal import HeadJournal
from .task import HeadJob, explain_heads
from ..kernels.core import InputError

EXECUTORS = ("serial", "ray")


def run_heads(job: HeadJob, heads: list[tuple[int, int]], journal: str | Path, *, fingerprint: dict[str, Any],
              executor: str = "serial", address: str | None = None, heads_per_task: int | None = None,
              handle: Any = None, progress: bool = True, ray_options: dict[str, Any] | None = None,
              on_record: Callable[[dict], None] | None = None) -> tuple[dict[tuple[int, int], dict], int]:
    """Explain every head not yet in ``journal``; return all heads' records (head → record) and how many heads
    were already journaled (resumed, not redone).

    ``executor``: "serial" (in this process) or "ray" (``address``: a running cluster; None: a local
    runtime started here). ``heads_per_task``: heads per task (None: ``MAX_HEADS_PER_TASK`` serially; on Ray, the heads
    spread evenly over the cluster's CPUs, at most ``MAX_HEADS_PER_TASK`` a task). ``on_record`` sees each record as
    it is journaled.
    """
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}; got {executor!r}")
    book = HeadJournal(journal)
    done = book.start(fingerprint)
    todo = [h for h in heads if h not in done]
    with tqdm(total=len(heads), initial=len(heads) - len(todo), desc=f"explain heads ({executor})", unit="head",
              disable=not progress) as bar:
        def finished(records: list[dict]) -> None:
            for rec in records:
                book.write(rec)
                if on_record is not None:
                    on_record(rec)
            bar.update(len(records))

        if executor == "serial":
            for chunk in chunked(todo, heads_per_task or MAX_HEADS_PER_TASK):
                finished(explain_heads(job, chunk, handle=handle))
        elif todo:
            from .ray_run import ray_map

            ray_map(job, todo, finished, address=address, heads_per_task=heads_per_task, **(ray_options or {}))
    records = book.records()
    return {h: records[h] for h in heads}, len(heads) - len(todo)
