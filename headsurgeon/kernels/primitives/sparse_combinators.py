"""The combinators on compressed rows (headsurgeon/kernels/sparse.py): the same arithmetic as combinators.py, per stored key.

Each function mirrors its dense twin in headsurgeon/kernels/primitives/combinators.py operation for operation (float32
products, float64 row sums, the same fastmath flags), so ``to_dense()`` of the result equals the dense
result wherever a row's float64 sum is exact — always for indicator scores, and for any float32 weights
within 2**28 of each other in a row (a float64 sum of such values is exact in any order). Unions (mix,
sum) and intersections (mul) merge the ascending keys of two rows; fallback and gate pick whole rows.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..sparse import SparseRows
from ..specialise import specialised
from .combinators import _F32_MAX

__all__ = ["sparse_mix_scale", "sparse_mix_add", "sparse_raw_scale", "sparse_raw_add", "sparse_row_normalize",
           "sparse_fallback", "sparse_gate", "sparse_sharpen", "sparse_sharpen_by", "sparse_mul", "sparse_empty_rows"]

_FASTMATH = {"reassoc", "nsz", "arcp", "contract"}
_MIX, _RAW, _MUL = 0, 1, 2


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _total(vals, k0, k1):  # pragma: no cover - compiled
    total = 0.0
    for k in range(k0, k1):
        total += vals[k]
    return total


@njit(cache=True, fastmath=_FASTMATH)
def _mix_scale(rowptr, vals, weight):  # pragma: no cover - compiled
    for r in range(rowptr.shape[0] - 1):
        k0, k1 = rowptr[r], rowptr[r + 1]
        total = _total(vals, k0, k1)
        if total > 0.0:
            scale = np.float32(weight / total)
            for k in range(k0, k1):
                vals[k] *= scale


@njit(cache=True)
def _raw_scale(rowptr, vals, weight):  # pragma: no cover - compiled
    w = np.float64(weight)
    for r in range(rowptr.shape[0] - 1):
        for k in range(rowptr[r], rowptr[r + 1]):
            v = vals[k]
            if v != 0.0:
                vals[k] = np.float32(min(np.float64(v) * w, _F32_MAX))


def _merge(mode, fill):
    def _merge(ap, ac, av, bp, bc, bv, weight, op, oc, ov):  # pragma: no cover - compiled
        """Row-wise merge of a and b: union (mix: a + rownorm(b)*w; raw: a + b*w) or intersection (mul: a*b)."""
        w = np.float64(weight)
        for r in range(ap.shape[0] - 1):
            ka, ka1, kb, kb1 = ap[r], ap[r + 1], bp[r], bp[r + 1]
            scale = np.float32(0.0)
            if mode == _MIX:
                total = _total(bv, kb, kb1)
                if total > 0.0:
                    scale = np.float32(weight / total)
                else:
                    kb = kb1  # an empty row of b contributes nothing
            k = op[r] if fill else 0
            while ka < ka1 or kb < kb1:
                ja = ac[ka] if ka < ka1 else 1 << 30
                jb = bc[kb] if kb < kb1 else 1 << 30
                if mode == _MUL:
                    if ja == jb:
                        if fill:
                            oc[k] = ja
                            ov[k] = av[ka] * bv[kb]
                        k += 1
                        ka += 1
                        kb += 1
                    elif ja < jb:
                        ka += 1
                    else:
                        kb += 1
                    continue
                if fill:
                    if ja < jb:
                        oc[k] = ja
                        ov[k] = av[ka]
                    else:
                        oc[k] = jb
                        o = av[ka] if ja == jb else np.float32(0.0)
                        if mode == _MIX:
                            o += bv[kb] * scale
                        else:
                            o = np.float32(min(np.float64(o) + np.float64(bv[kb]) * w, _F32_MAX))
                        ov[k] = o
                if ja <= jb:
                    ka += 1
                if jb <= ja:
                    kb += 1
                k += 1
            if not fill:
                op[r + 1] = k
    return _merge


# mix_accumulate and multiply are fastmath kernels (a contracted float32 a + v*s), raw_accumulate is not: the same
# maker under two names, each with one build per (mode, count/fill pass) (headsurgeon/kernels/specialise.py).
_merge_fast = specialised("_merge_fast", fastmath=_FASTMATH)(_merge)
_merge_exact = specialised("_merge_exact")(_merge)


def _merged(mode: int, a: SparseRows, b: SparseRows, weight: float) -> SparseRows:
    merge = _merge_exact if mode == _RAW else _merge_fast
    rowptr = np.zeros_like(a.rowptr)
    merge(mode, False)(a.rowptr, a.cols, a.vals, b.rowptr, b.cols, b.vals, float(weight), rowptr, _NO_COLS,
                       _NO_VALS)
    np.cumsum(rowptr, out=rowptr)
    nnz = int(rowptr[-1])
    cols = np.empty(nnz, dtype=np.int32)
    vals = np.empty(nnz, dtype=np.float32)
    merge(mode, True)(a.rowptr, a.cols, a.vals, b.rowptr, b.cols, b.vals, float(weight), rowptr, cols, vals)
    return SparseRows(rowptr, cols, vals, a.lengths, a.n)


_NO_COLS, _NO_VALS = np.zeros(0, np.int32), np.zeros(0, np.float32)  # the count pass writes no keys


def sparse_mix_scale(a: SparseRows, weight: float) -> None:
    """a <- weight * rownorm(a) in place (``mix_scale``)."""
    _mix_scale(a.rowptr, a.vals, float(weight))


def sparse_mix_add(out: SparseRows, a: SparseRows, weight: float) -> SparseRows:
    """out + weight * rownorm(a) (``mix_accumulate``), a new batch."""
    return _merged(_MIX, out, a, weight)


def sparse_raw_scale(a: SparseRows, weight: float) -> None:
    """a <- weight * a in place, saturating at float32's max (``raw_scale``)."""
    _raw_scale(a.rowptr, a.vals, float(weight))


def sparse_raw_add(out: SparseRows, a: SparseRows, weight: float) -> SparseRows:
    """out + weight * a, raw scores (``raw_accumulate``), a new batch."""
    return _merged(_RAW, out, a, weight)


def sparse_mul(a: SparseRows, other: SparseRows) -> SparseRows:
    """a * other elementwise: the keys both hold (``multiply``)."""
    return _merged(_MUL, a, other, 1.0)


@njit(cache=True, fastmath=_FASTMATH)
def _row_normalize(rowptr, vals):  # pragma: no cover - compiled
    for r in range(rowptr.shape[0] - 1):
        k0, k1 = rowptr[r], rowptr[r + 1]
        total = _total(vals, k0, k1)
        if total > 0.0:
            inv = np.float32(1.0 / total)
            for k in range(k0, k1):
                vals[k] *= inv


def sparse_row_normalize(a: SparseRows) -> None:
    """Divide every row with positive mass by its sum, in place (``row_normalize``)."""
    _row_normalize(a.rowptr, a.vals)


@njit(cache=True, fastmath=_FASTMATH)
def _empty(rowptr, vals, out):  # pragma: no cover - compiled
    for r in range(rowptr.shape[0] - 1):
        out[r] = _total(vals, rowptr[r], rowptr[r + 1]) <= 0.0


def sparse_empty_rows(a: SparseRows) -> np.ndarray:
    """Boolean [B, N]: rows with no positive mass (``empty_rows``)."""
    out = np.empty(a.rowptr.shape[0] - 1, dtype=np.bool_)
    _empty(a.rowptr, a.vals, out)
    return out.reshape(a.shape[0], a.n)


@specialised()
def _pick(fill):
    def _pick(take_b, ap, ac, av, bp, bc, bv, op, oc, ov):  # pragma: no cover - compiled
        """Row r from b where take_b[r], else from a."""
        for r in range(ap.shape[0] - 1):
            if take_b[r]:
                p, c, v = bp, bc, bv
            else:
                p, c, v = ap, ac, av
            k0, k1 = p[r], p[r + 1]
            if fill:
                d = op[r]
                for k in range(k0, k1):
                    oc[d + k - k0] = c[k]
                    ov[d + k - k0] = v[k]
            else:
                op[r + 1] = k1 - k0
    return _pick


def _picked(take_b: np.ndarray, a: SparseRows, b: SparseRows) -> SparseRows:
    take_b = np.ascontiguousarray(take_b, dtype=np.bool_).reshape(-1)
    rowptr = np.zeros_like(a.rowptr)
    _pick(False)(take_b, a.rowptr, a.cols, a.vals, b.rowptr, b.cols, b.vals, rowptr, _NO_COLS, _NO_VALS)
    np.cumsum(rowptr, out=rowptr)
    nnz = int(rowptr[-1])
    cols = np.empty(nnz, dtype=np.int32)
    vals = np.empty(nnz, dtype=np.float32)
    _pick(True)(take_b, a.rowptr, a.cols, a.vals, b.rowptr, b.cols, b.vals, rowptr, cols, vals)
    return SparseRows(rowptr, cols, vals, a.lengths, a.n)


def sparse_fallback(a: SparseRows, alt: SparseRows) -> SparseRows:
    """Rows of ``a`` with zero mass replaced by ``alt``'s (``fallback_rows``)."""
    return _picked(sparse_empty_rows(a), a, alt)


def sparse_gate(qmask: np.ndarray, a: SparseRows, alt: SparseRows) -> SparseRows:
    """Rows whose query mask is unset take ``alt``'s row (``gate_rows``)."""
    return _picked(~np.asarray(qmask, dtype=np.bool_), a, alt)


@njit(cache=True, fastmath=_FASTMATH)
def _sharpen(rowptr, vals, texp, ti):  # pragma: no cover - compiled
    """Per row r: v <- v ** texp[r] (repeated squaring when ti > 0), then rownorm (``_sharpen_rows``)."""
    for r in range(rowptr.shape[0] - 1):
        k0, k1 = rowptr[r], rowptr[r + 1]
        t = texp[r]
        total = 0.0
        for k in range(k0, k1):
            v = vals[k]
            if v > 0.0:
                if ti > 0:
                    base = np.float64(v)
                    acc = 1.0
                    e = ti
                    while e > 0:
                        if e & 1:
                            acc *= base
                        base *= base
                        e >>= 1
                    vals[k] = np.float32(acc)
                else:
                    vals[k] = np.float32(np.float64(v) ** t)
            else:
                vals[k] = 0.0
            total += vals[k]
        if total > 0.0:
            inv = np.float32(1.0 / total)
            for k in range(k0, k1):
                vals[k] *= inv


def sparse_sharpen(a: SparseRows, t: float) -> None:
    """a <- rownorm(a ** t) in place (``sharpen_rows``)."""
    ti = int(t) if float(t).is_integer() and 1 <= t <= 64 else 0
    _sharpen(a.rowptr, a.vals, np.full(a.rowptr.shape[0] - 1, float(t)), ti)


def sparse_sharpen_by(a: SparseRows, texp: np.ndarray) -> None:
    """a <- rownorm(a ** texp[b, i]) per query row, in place (``sharpen_rows_by``)."""
    _sharpen(a.rowptr, a.vals, np.ascontiguousarray(texp, dtype=np.float64).reshape(-1), 0)
