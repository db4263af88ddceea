"""Run small BLAS products single-threaded: the search's Gram products are small, and OpenBLAS threads on busy
machines make them many times slower (benchmarks/RESULTS.md); a no-op where OpenBLAS is not found."""
from __future__ import annotations

from typing import Any

import numpy as np

_BLAS_HOOKS: list | None = None


def blas_hooks() -> list:
    """(get, set) thread-count functions of the OpenBLAS libraries numpy/scipy loaded (may be empty)."""
    global _BLAS_HOOKS
    if _BLAS_HOOKS is not None:
        return _BLAS_HOOKS
    import ctypes
    import glob
    import os

    paths: set[str] = set()
    try:
        with open("/proc/self/maps") as f:
            paths |= {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        pass
    paths |= set(glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*")))
    hooks = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", "_64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype = ctypes.c_int
                    put.argtypes = [ctypes.c_int]
                    hooks.append((get, put))
                    break
            else:
                continue
            break
    _BLAS_HOOKS = hooks
    return hooks


class single_thread_blas:
    """Run BLAS calls single-threaded: the Gram products here are small and OpenBLAS threads on busy
    machines make them many times slower (benchmarks/RESULTS.md); a no-op where OpenBLAS is not found."""

    def __enter__(self) -> None:
        self.saved = []
        for get, put in blas_hooks():
            try:
                self.saved.append((put, int(get())))
                put(1)
            except Exception:  # noqa: BLE001 - best effort only
                pass

    def __exit__(self, *exc: Any) -> None:
        for put, n in self.saved:
            try:
                put(n)
            except Exception:  # noqa: BLE001 - restoring thread counts is best effort
                pass


def row_products(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``rows @ cols.T`` ([H, C] x [P, C] -> [H, P]), one row at a time from one buffer: a row's result is the same
    bits however many rows (a task's heads) come with it and wherever it sits among them.

    OpenBLAS picks its kernel, and so the rounding, by the matrices' shapes and a row's place in its tile: a head's
    statistics computed among 2 heads and among 40 differed in the last bits, and a run split into other tasks
    (more worker processes, Ray) chose other programs among near-tied candidates."""
    out = np.empty((rows.shape[0], cols.shape[0]), dtype=np.result_type(rows, cols))
    row = np.empty(rows.shape[1], dtype=rows.dtype)
    for h in range(rows.shape[0]):
        row[:] = rows[h]
        out[h] = cols @ row
    return out
