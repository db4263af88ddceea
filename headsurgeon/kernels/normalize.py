"""Scores -> attention: the one normalization every program output goes through (the contract in docs/architecture.md).

The framework, not the program, owns the mask and the normalization, so that every program (DSL or
Python) becomes a pattern by exactly the same rule:

1. keys beyond each sequence's length are masked, and (``causal=True``) so are keys ``j > i``;
2. a visible score that is NaN or +-inf is an error (``ValueError`` naming the position), never
   silently repaired;
3. negative scores are clipped to 0;
4. each visible query row is divided by its sum;
5. a visible row whose mass is zero attends fully to position 0 (the BOS / attention-sink default,
   as in Transformer Programs);
6. padded query rows (``i >= length``) are all zero.

``normalize_scores`` is the numpy/numba implementation the whole library uses; ``normalize_rows`` applies
the same rules to the sparse form (headsurgeon/kernels/sparse.py) without densifying it.
"""
from __future__ import annotations


import numpy as np
from numba import njit

from .sparse import RowsBuffer, SparseRows
from .specialise import specialised
from ..core import InputError

__all__ = ["normalize_scores", "normalize_rows", "visible_mask"]


def _check_inputs(shape: tuple[int, ...], lengths: np.ndarray) -> np.ndarray:
    """Validate a [B,N,N] score shape against lengths [B]; return lengths as int64."""
    if len(shape) != 3 or shape[1] != shape[2]:
        raise InputError(f"scores must have shape [B, N, N]; got {tuple(shape)}")
    lengths = np.asarray(lengths).astype(np.int64, copy=False).reshape(-1)
    if lengths.shape[0] != shape[0]:
        raise InputError(
            f"lengths has {lengths.shape[0]} entries but scores has batch size {shape[0]}; "
            "pass one length per sequence"
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > shape[1]):
        raise InputError(
            f"lengths must lie in [0, N={shape[1]}]; got min {lengths.min()}, max {lengths.max()}"
        )
    return lengths


def visible_mask(lengths: np.ndarray, n: int, causal: bool) -> np.ndarray:
    """Boolean [B,N,N] mask of visible (query, key) cells: both inside the length, and j <= i if causal."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    pos = np.arange(n)
    inside = pos[None, :] < lengths[:, None]
    mask = inside[:, :, None] & inside[:, None, :]
    if causal:
        mask &= pos[None, None, :] <= pos[None, :, None]
    return mask


# Reassociation lets LLVM vectorize the row sums; NaN/inf semantics are kept (no nnan/ninf flags),
# since detecting them is part of the contract.
_FASTMATH = {"reassoc", "nsz", "arcp", "contract"}


@njit(cache=True, fastmath=_FASTMATH)
def _normalize_kernel(scores, lengths, causal, masked, out, bad, bad_value):  # pragma: no cover - compiled
    """Fill ``out`` (may be ``scores`` itself) with normalized rows; record the first bad cell (i*N+j)."""
    nb, n, _ = scores.shape
    for b in range(nb):
        length = lengths[b]
        bad[b] = -1
        for i in range(n):
            orow = out[b, i]
            if i >= length:
                if not masked:
                    orow[:] = 0.0
                continue
            srow = scores[b, i]
            jmax = i + 1 if causal else length
            raw = 0.0
            total = 0.0
            for j in range(jmax):
                v = np.float64(srow[j])
                raw += v
                total += max(v, 0.0)
            scale = 1.0
            if not (np.isfinite(raw) and np.isfinite(total)):
                # rare path: a NaN/inf (an error), or finite float64 scores whose sum overflows
                peak = 0.0
                for j in range(jmax):
                    v = srow[j]
                    if not np.isfinite(v):
                        if bad[b] < 0:
                            bad[b] = i * n + j
                            bad_value[b] = v
                    elif v > peak:
                        peak = v
                if bad[b] >= 0:
                    orow[:] = 0.0
                    continue
                scale = 1.0 / peak
                total = 0.0
                for j in range(jmax):
                    total += max(np.float64(srow[j]) * scale, 0.0)
            if total > 0.0:
                inv = scale / total
                for j in range(jmax):
                    orow[j] = np.float32(max(np.float64(srow[j]), 0.0) * inv)
            else:
                orow[:jmax] = 0.0
                orow[0] = 1.0
            if not masked:
                orow[jmax:] = 0.0


def normalize_scores(scores: np.ndarray, lengths: np.ndarray, causal: bool,
                     out: np.ndarray | None = None, masked: bool = False) -> np.ndarray:
    """Mask, validate, clip and row-normalize raw scores [B,N,N] into attention patterns (float32).

    ``out`` (optional) receives the result; it may be ``scores`` itself when that is a C-contiguous
    float32 array the caller owns (in place: saves one [B,N,N] allocation; on error it is left
    partly written). ``masked=True`` with ``out is scores`` promises that every cell outside the
    visible grid is already 0 (the DSL kernels guarantee it), so those cells are not rewritten:
    a speed-up only, the result is the same.
    """
    scores = np.asarray(scores)
    lengths = _check_inputs(scores.shape, lengths)
    if scores.dtype not in (np.float32, np.float64):
        if not (np.issubdtype(scores.dtype, np.number) or scores.dtype == np.bool_):
            raise InputError(f"scores must be numeric; got dtype {scores.dtype}")
        scores = scores.astype(np.float64)
    scores = np.ascontiguousarray(scores)
    if out is None:
        out = np.empty(scores.shape, dtype=np.float32)
    elif out.shape != scores.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise InputError(f"out must be a C-contiguous float32 array of shape {scores.shape}")
    masked = bool(masked) and out is scores
    bad = np.empty(scores.shape[0], dtype=np.int64)
    bad_value = np.zeros(scores.shape[0], dtype=np.float64)
    if scores.shape[0] == 0 or scores.shape[1] == 0:
        return out
    _normalize_kernel(scores, lengths, bool(causal), masked, out, bad, bad_value)
    hit = np.flatnonzero(bad >= 0)
    if hit.size:
        b = int(hit[0])
        i, j = divmod(int(bad[b]), scores.shape[1])
        raise InputError(
            f"scores contain a non-finite value ({float(bad_value[b])!r}) at sequence {b}, query {i}, "
            f"key {j} ({hit.size} sequence(s) affected); a program must return finite scores "
            "(NaN/inf are errors, not masks: return 0 for keys it should ignore)"
        )
    return out


@specialised()
def _normalize_rows_kernel(causal, fill):
    def _normalize_rows_kernel(rowptr, cols, vals, lengths, n, optr, ocols, ovals, bad,
                               bad_value):  # pragma: no cover - compiled
        """The rules of ``_normalize_kernel`` per stored key: count (``fill`` False) or write the normalized rows."""
        nb = lengths.shape[0]
        for b in range(nb):
            length = lengths[b]
            if not fill:
                bad[b] = -1
            for i in range(length):
                r = b * n + i
                jmax = i + 1 if causal else length
                raw = 0.0
                total = 0.0
                m = 0
                for k in range(rowptr[r], rowptr[r + 1]):
                    if cols[k] < jmax:
                        v = np.float64(vals[k])
                        raw += v
                        total += max(v, 0.0)
                        m += 1
                scale = 1.0
                if not (np.isfinite(raw) and np.isfinite(total)):
                    peak = 0.0
                    for k in range(rowptr[r], rowptr[r + 1]):
                        if cols[k] < jmax:
                            v = vals[k]
                            if not np.isfinite(v):
                                if bad[b] < 0 and not fill:
                                    bad[b] = i * n + cols[k]
                                    bad_value[b] = v
                            elif v > peak:
                                peak = v
                    if bad[b] >= 0:
                        continue
                    scale = 1.0 / peak
                    total = 0.0
                    for k in range(rowptr[r], rowptr[r + 1]):
                        if cols[k] < jmax:
                            total += max(np.float64(vals[k]) * scale, 0.0)
                if not fill:
                    optr[r + 1] = m if total > 0.0 else 1
                    continue
                d = optr[r]
                if total > 0.0:
                    inv = scale / total
                    for k in range(rowptr[r], rowptr[r + 1]):
                        if cols[k] < jmax:
                            ocols[d] = cols[k]
                            ovals[d] = np.float32(max(np.float64(vals[k]), 0.0) * inv)
                            d += 1
                else:
                    ocols[d] = 0
                    ovals[d] = 1.0
    return _normalize_rows_kernel


def normalize_rows(rows: SparseRows, causal: bool, out: RowsBuffer | None = None) -> SparseRows:
    """``normalize_scores`` on compressed rows (headsurgeon/kernels/sparse.py): the same six rules, a new ``SparseRows``.

    Keys outside the visible grid are dropped, an empty visible row becomes the single key 0 with weight
    1, padded rows stay empty; ``to_dense()`` of the result equals ``normalize_scores`` of the dense scores.
    ``out``: a ``RowsBuffer`` the result is written into (valid until its next use), else new arrays.
    """
    lengths = _check_inputs(rows.shape, rows.lengths)
    B, n = rows.shape[0], rows.n
    optr = np.zeros(B * n + 1, dtype=np.int64) if out is None else out.zeros("rowptr", B * n + 1, np.int64)
    bad = np.full(B, -1, dtype=np.int64)
    bad_value = np.zeros(B, dtype=np.float64)
    none_i, none_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    if B and n:
        _normalize_rows_kernel(bool(causal), False)(rows.rowptr, rows.cols, rows.vals, lengths, n, optr, none_i,
                                                    none_f, bad, bad_value)
    hit = np.flatnonzero(bad >= 0)
    if hit.size:
        b = int(hit[0])
        i, j = divmod(int(bad[b]), n)
        raise InputError(
            f"scores contain a non-finite value ({float(bad_value[b])!r}) at sequence {b}, query {i}, "
            f"key {j} ({hit.size} sequence(s) affected); a program must return finite scores "
            "(NaN/inf are errors, not masks: return 0 for keys it should ignore)"
        )
    np.cumsum(optr, out=optr)
    nnz = int(optr[-1])
    ocols = np.empty(nnz, dtype=np.int32) if out is None else out.array("cols", nnz, np.int32)
    ovals = np.empty(nnz, dtype=np.float32) if out is None else out.array("vals", nnz, np.float32)
    if nnz:
        _normalize_rows_kernel(bool(causal), True)(rows.rowptr, rows.cols, rows.vals, lengths, n, optr, ocols,
                                                   ovals, bad, bad_value)
    return SparseRows(optr, ocols, ovals, lengths, n, True)
