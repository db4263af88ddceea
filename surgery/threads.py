"""How many threads a process may use, and pinning torch, numba and BLAS to a share of them.

Oversubscribed thread pools are the slow path on a small machine: OpenMP workers spin at barriers, so a forward with
more threads than free cores can run many times slower than with one. Every stage sizes its pools from
:func:`usable_cores` (the CPUs this process may run on, not the machine's count), and a worker process of the
explain pool (headsurgeon/scaleout/pool.py) pins all three libraries to its share with :func:`pin_threads`.
"""
from __future__ import annotations

import os

__all__ = ["THREAD_ENV", "pin_threads", "usable_cores", "worker_threads"]

#: environment variables that size the native pools of subprocesses (read once when each library loads)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


def usable_cores() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; a container's or ``taskset``'s limit counts)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API on this platform
        return max(1, os.cpu_count() or 1)


def worker_threads(workers: int, cores: int | None = None) -> int:
    """Threads each of ``workers`` processes gets so that together they fill, and never exceed, the cores."""
    return max(1, (cores or usable_cores()) // max(1, workers))


def pin_threads(threads: int) -> None:
    """Size torch's intra-op pool, numba's parallel kernels and the BLAS/OpenMP pools to ``threads`` for the rest
    of this process (numba cannot grow past the pool it started with)."""
    import numba
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, int(numba.config.NUMBA_NUM_THREADS)))
    threadpool_limits(threads)
