"""The local executor's process pool: explain's head tasks (task.py ``explain_heads``) on every core this process
may use, each worker pinned to its share of threads (headsurgeon/surgery/threads.py).

The pool is loky's: workers start as fresh interpreters (a fork of a process whose OpenMP pool has run can hang)
that never re-run the caller's script (so a script needs no ``if __name__ == "__main__"`` guard), and tasks travel
with cloudpickle (a searcher registered in a notebook or a script reaches them). Workers ignore Ctrl-C (the driver
stops them and keeps its journal) and report their peak memory with each task. A worker is never replaced for
growing (what it keeps is meant to be reused); a worker that dies (the out-of-memory killer, a kill -9) breaks the
pool, and the tasks it had not finished run again on a fresh pool.
"""
from __future__ import annotations

import os
import resource
import signal
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable

from loky import ProcessPoolExecutor

from ..surgery.threads import THREAD_ENV, pin_threads, usable_cores, worker_threads
from .task import HeadJob, explain_heads
from ..core import Head, HeadsurgeonError, InputError

__all__ = ["KEEP_GROWN_WORKERS", "WORKERS_ENV", "PoolReport", "WorkerLost", "default_workers", "describe", "peak_rss",
           "pool_map", "worker_pool"]

#: times a pool may break (a worker killed) before the run gives up
RESTARTS = 3
#: loky replaces a worker whose memory grew 300 MB past its size after its first task, which a worker's kept windows
#: and a large task's patterns pass by design: the new worker pays its imports, spaCy and the windows' features again.
#: Set in each worker's environment before loky loads, so only a worker that dies (the pool's restart path) is replaced
KEEP_GROWN_WORKERS = {"LOKY_MAX_MEMORY_LEAK_SIZE": str(2 ** 60)}
#: the environment variable that sets the default number of workers (e.g. 1 where the caller already fills the
#: cores with processes of its own, as tests/conftest.py does under pytest-xdist)
WORKERS_ENV = "HEADSURGEON_WORKERS"


class WorkerLost(HeadsurgeonError, RuntimeError):
    """Workers kept dying (out of memory, killed); the heads they held are named, the finished ones journaled."""


@dataclass
class PoolReport:
    """How the pool ran: its size, each worker's threads, every worker's peak memory, and how often it broke."""

    workers: int
    threads: int
    peak_rss: dict[int, int] = field(default_factory=dict)  # worker pid → peak resident bytes
    restarts: int = 0


def default_workers() -> int:
    """``$HEADSURGEON_WORKERS`` when set, else every core this process may use."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return usable_cores()
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"{WORKERS_ENV}={raw!r} is not a whole number >= 1; unset it or give e.g. 1 or 4")
    return int(raw)


def peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _init_worker(threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it stops every worker
    pin_threads(threads)


def worker_pool(workers: int, threads: int) -> ProcessPoolExecutor:
    """A loky pool of ``workers`` fresh interpreters, each pinned to ``threads`` threads, ignoring Ctrl-C, and kept
    however much its memory grows."""
    # the environment sizes each worker's native pools as its libraries load; _init_worker pins them again
    return ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(threads,),
                               env={**{k: str(threads) for k in THREAD_ENV}, **KEEP_GROWN_WORKERS})


def _task(job: HeadJob, chunk: list[tuple[int, int]]) -> tuple[list[dict], int, int]:
    return explain_heads(job, chunk), os.getpid(), peak_rss()


def _stop(executor: ProcessPoolExecutor) -> None:
    """Kill the workers now (their current tasks are lost; the journal keeps every finished one)."""
    executor.shutdown(wait=False, kill_workers=True)


def pool_map(job: HeadJob, chunks: list[list[tuple[int, int]]], finished: Callable[[list[dict]], None], *,
             workers: int, restarts: int = RESTARTS) -> PoolReport:
    """Run ``explain_heads(job, chunk)`` for every chunk on ``workers`` processes; ``finished(records)`` as each
    task completes (in completion order). A broken pool is replaced up to ``restarts`` times."""
    report = PoolReport(workers, worker_threads(workers))
    todo = list(chunks)
    while todo:
        executor = worker_pool(min(workers, len(todo)), report.threads)
        done: set[int] = set()
        try:
            pending: dict[Future, int] = {executor.submit(_task, job, chunk): i for i, chunk in enumerate(todo)}
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    i = pending.pop(future)
                    records, pid, rss = future.result()
                    report.peak_rss[pid] = max(rss, report.peak_rss.get(pid, 0))
                    finished(records)
                    done.add(i)
        except BrokenProcessPool:
            report.restarts += 1
            lost = [h for i, chunk in enumerate(todo) if i not in done for h in chunk]
            if report.restarts > restarts:
                _stop(executor)
                raise WorkerLost(f"explain's workers died {report.restarts} times (out of memory?); heads "
                                 f"{', '.join(map(Head.label, lost[:8]))}{' ...' if len(lost) > 8 else ''} are not "
                                 "done. The journal keeps the finished heads: rerun with fewer --workers (or "
                                 "--workers 1) to resume") from None
        except BaseException:  # an error in a task, or Ctrl-C: stop every worker, keep the journal
            _stop(executor)
            raise
        executor.shutdown(wait=True)
        todo = [chunk for i, chunk in enumerate(todo) if i not in done]
    return report


def describe(report: PoolReport, driver_rss: int) -> str:
    """One line: the pool's size and threads, restarts, and peak memory of the driver and the largest worker."""
    gib = 1024 ** 3
    worst = max(report.peak_rss.values(), default=0)
    line = (f"{report.workers} worker processes × {report.threads} thread{'s' if report.threads > 1 else ''}; "
            f"peak memory: this process {driver_rss / gib:.2f} GiB, each worker at most {worst / gib:.2f} GiB")
    if report.restarts:
        line += f"; the pool lost workers {report.restarts} time(s) and re-ran their heads"
    return line

