"""Kernels of the combinators: in place on whole [B, N, N] batches (no Python loop over tokens)."""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["mix_scale", "mix_accumulate", "raw_scale", "raw_accumulate", "fallback_rows", "gate_rows", "sharpen_rows",
           "sharpen_rows_by",
           "multiply", "row_normalize", "empty_rows"]

# Row sums may be reassociated (vectorized); scores here are finite by construction.
_FASTMATH = {"reassoc", "nsz", "arcp", "contract"}


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _row_sum(row):  # pragma: no cover - compiled
    total = 0.0
    for j in range(row.shape[0]):
        total += row[j]
    return total


@njit(cache=True, fastmath=_FASTMATH)
def mix_scale(a, weight):  # pragma: no cover - compiled
    """a <- weight * rownorm(a) in place (the first term of a mix); empty rows stay empty."""
    nb, n, _ = a.shape
    for b in range(nb):
        for i in range(n):
            row = a[b, i]
            total = _row_sum(row)
            if total > 0.0:
                scale = np.float32(weight / total)
                for j in range(n):
                    row[j] *= scale


@njit(cache=True, fastmath=_FASTMATH)
def mix_accumulate(out, a, weight):  # pragma: no cover - compiled
    """out += weight * rownorm(a): each non-empty row of ``a`` contributes ``weight`` of mass."""
    nb, n, _ = a.shape
    for b in range(nb):
        for i in range(n):
            row = a[b, i]
            total = _row_sum(row)
            if total > 0.0:
                scale = np.float32(weight / total)
                orow = out[b, i]
                for j in range(n):
                    orow[j] += row[j] * scale


# float32's largest finite value: raw weighted sums saturate there instead of overflowing to inf
_F32_MAX = np.float32(np.finfo(np.float32).max)


@njit(cache=True)
def raw_scale(a, weight):  # pragma: no cover - compiled
    """a <- weight * a in place, no row normalization (the first term of ``sum``), saturating at float32's max."""
    nb, n, _ = a.shape
    w = np.float64(weight)
    for b in range(nb):
        for i in range(n):
            row = a[b, i]
            for j in range(n):
                v = row[j]
                if v != 0.0:
                    row[j] = np.float32(min(np.float64(v) * w, _F32_MAX))


@njit(cache=True)
def raw_accumulate(out, a, weight):  # pragma: no cover - compiled
    """out += weight * a, raw scores (a term of ``sum``), saturating at float32's max."""
    nb, n, _ = a.shape
    w = np.float64(weight)
    for b in range(nb):
        for i in range(n):
            row, orow = a[b, i], out[b, i]
            for j in range(n):
                v = row[j]
                if v != 0.0:
                    orow[j] = np.float32(min(np.float64(orow[j]) + np.float64(v) * w, _F32_MAX))


@njit(cache=True, fastmath=_FASTMATH)
def fallback_rows(a, alt):  # pragma: no cover - compiled
    """Rows of ``a`` with zero mass are replaced by the same rows of ``alt`` (in place on ``a``)."""
    nb, n, nk = a.shape
    for b in range(nb):
        for i in range(n):
            if _row_sum(a[b, i]) <= 0.0:
                for j in range(nk):  # an element loop: a slice copy compiles numpy's shape-error path (seconds)
                    a[b, i, j] = alt[b, i, j]


@njit(cache=True)
def gate_rows(qmask, a, alt):  # pragma: no cover - compiled
    """Rows whose query mask is unset take ``alt``'s row (in place on ``a``)."""
    nb, n, nk = a.shape
    for b in range(nb):
        for i in range(n):
            if not qmask[b, i]:
                for j in range(nk):
                    a[b, i, j] = alt[b, i, j]


@njit(cache=True, fastmath=_FASTMATH)
def _sharpen_rows(a, t, ti):  # pragma: no cover - compiled
    nb, n, _ = a.shape
    for b in range(nb):
        for i in range(n):
            row = a[b, i]
            total = 0.0
            for j in range(n):
                v = row[j]
                if v > 0.0:
                    if ti > 0:  # integer exponent: repeated squaring, no pow() call
                        base = np.float64(v)
                        acc = 1.0
                        e = ti
                        while e > 0:
                            if e & 1:
                                acc *= base
                            base *= base
                            e >>= 1
                        row[j] = np.float32(acc)
                    else:
                        row[j] = np.float32(np.float64(v) ** t)
                else:
                    row[j] = 0.0
                total += row[j]
            if total > 0.0:
                inv = np.float32(1.0 / total)
                for j in range(n):
                    row[j] *= inv


def sharpen_rows(a: np.ndarray, t: float) -> None:
    """a <- rownorm(a ** t) for rows with mass (in place); empty rows stay empty."""
    ti = int(t) if float(t).is_integer() and 1 <= t <= 64 else 0
    _sharpen_rows(a, float(t), ti)


@njit(cache=True, fastmath=_FASTMATH)
def sharpen_rows_by(a, texp):  # pragma: no cover - compiled
    """a <- rownorm(a ** texp[b, i]) per query row (in place); empty rows stay empty."""
    nb, n, _ = a.shape
    for b in range(nb):
        for i in range(n):
            row = a[b, i]
            t = texp[b, i]
            total = 0.0
            for j in range(n):
                v = row[j]
                if v > 0.0:
                    row[j] = np.float32(np.float64(v) ** t)
                else:
                    row[j] = 0.0
                total += row[j]
            if total > 0.0:
                inv = np.float32(1.0 / total)
                for j in range(n):
                    row[j] *= inv


@njit(cache=True)
def multiply(a, other):  # pragma: no cover - compiled
    """a <- a * other, elementwise (in place)."""
    nb, n, _ = a.shape
    for b in range(nb):
        for i in range(n):
            row, orow = a[b, i], other[b, i]
            for j in range(n):
                row[j] *= orow[j]


@njit(cache=True, fastmath=_FASTMATH)
def row_normalize(a):  # pragma: no cover - compiled
    """Divide every row with positive mass by its sum (in place); empty rows stay empty."""
    nb, n, _ = a.shape
    for b in range(nb):
        for i in range(n):
            row = a[b, i]
            total = _row_sum(row)
            if total > 0.0:
                inv = np.float32(1.0 / total)
                for j in range(n):
                    row[j] *= inv


@njit(cache=True, fastmath=_FASTMATH)
def empty_rows(a):  # pragma: no cover - compiled
    """Boolean [B,N]: rows of ``a`` with no positive mass."""
    nb, n, _ = a.shape
    res = np.empty((nb, n), np.bool_)
    for b in range(nb):
        for i in range(n):
            res[b, i] = _row_sum(a[b, i]) <= 0.0
    return res
