"""How many threads a process may use, and pinning torch, numba and BLAS to a share of them.

OpenMP threads that reach a barrier spin before they sleep, so with more runnable threads than cores a spinning
thread burns the time slice its descheduled sibling needs; threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``)
lose only their share (benchmarks/threads_load.py, figures in benchmarks/RESULTS.md). So importing headsurgeon asks OpenMP for passive waits
(:func:`prefer_passive_waits`, unless the user chose a policy), and where they are in force every forward stage takes
all the cores this process may use (:func:`usable_cores`, not the machine's count); where they are not (torch was
loaded first), it takes only the cores free when it starts. A worker process of the explain pool
(headsurgeon/scaleout/pool.py) pins all three libraries to its share with :func:`pin_threads`.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..core import InputError

__all__ = ["THREADS_ENV", "THREAD_ENV", "WAIT_POLICY_ENV", "busy_elsewhere", "fit_threads", "passive_waits",
           "pin_threads", "prefer_passive_waits", "threads_for", "usable_cores", "worker_threads"]

#: the environment variable that fixes the thread count of explain's and build's forwards
THREADS_ENV = "HEADSURGEON_THREADS"
#: environment variables that size the native pools of subprocesses (read once when each library loads)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")
#: OpenMP's wait policy, read once, when torch loads its OpenMP runtime
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"

_passive: bool | None = None  # whether this process's OpenMP runtime waits passively, once prefer_passive_waits ran


def passive_waits(policy: str | None, torch_loaded: bool) -> bool:
    """Whether OpenMP waits passively in a process whose ``OMP_WAIT_POLICY`` was ``policy`` (None: unset) when
    headsurgeon asked for passive waits: an unset policy becomes PASSIVE only for a runtime that loads afterwards."""
    if policy is None:
        return not torch_loaded
    return policy.strip().upper() == "PASSIVE"


def prefer_passive_waits() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user set a policy (processes started later inherit it), and return
    whether this process's OpenMP runtime waits passively (the setting counts only if torch loads after it)."""
    global _passive
    if _passive is None:
        policy = os.environ.get(WAIT_POLICY_ENV)
        _passive = passive_waits(policy, "torch" in sys.modules)
        os.environ.setdefault(WAIT_POLICY_ENV, "PASSIVE")
    return _passive


def usable_cores() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; a container's or ``taskset``'s limit counts)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API on this platform
        return max(1, os.cpu_count() or 1)


def worker_threads(workers: int, cores: int | None = None) -> int:
    """Threads each of ``workers`` processes gets so that together they fill, and never exceed, the cores."""
    return max(1, (cores or usable_cores()) // max(1, workers))


def busy_elsewhere(samples: int = 5, gap: float = 0.02) -> int:
    """How many other threads are running or runnable on this machine now (the median of a few reads of
    /proc/loadavg's running count, less this reading thread); 0 where /proc is missing."""
    counts = []
    for i in range(samples):
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0
        counts.append(max(0, running - 1))
        if i + 1 < samples:
            time.sleep(gap)
    return sorted(counts)[len(counts) // 2]


def threads_for(cores: int, busy: int) -> int:
    """Threads for a forward on ``cores`` while ``busy`` other threads run: the free cores, at least one."""
    return max(1, min(cores, cores - busy))


def fit_threads() -> int:
    """Size torch, numba and BLAS for the forwards about to run to every usable core when OpenMP waits passively, else
    to the cores free now (:func:`threads_for`), or to ``$HEADSURGEON_THREADS`` when set (a fixed count: runs whose
    floats must not depend on the machine), and return the count. explain and build call it before each stage of
    forwards."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw and (not raw.isdigit() or int(raw) < 1):
        raise InputError(f"{THREADS_ENV}={raw!r} is not a whole number >= 1; unset it or give e.g. 1 or 4")
    if raw:
        threads = int(raw)
    else:
        threads = usable_cores() if prefer_passive_waits() else threads_for(usable_cores(), busy_elsewhere())
    pin_threads(threads)
    return threads


def pin_threads(threads: int) -> None:
    """Size torch's intra-op pool, numba's parallel kernels and the BLAS/OpenMP pools to ``threads`` for the rest
    of this process (numba cannot grow past the pool it started with)."""
    import numba
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, int(numba.config.NUMBA_NUM_THREADS)))
    threadpool_limits(threads)
