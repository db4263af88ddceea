"""Sparse kernels of the positional and structure primitives of small support, and the two-pass driver they share.

The keys of each query row go straight into compressed rows (the token primitives: sparse_tokens.py).

Each ``_sp_*`` kernel runs twice over the same loops (``fill`` False: count the keys of every row, summed into the
row pointer after each sequence, ``_end`` and ``_close``; True: write them from ``rowptr[r]``), so the output is exactly sized and no dense
[B, N, N] array is touched. ``fill``, ``norm`` and the kernel's other flags (``causal``, ...) are compile-time
constants: each kernel is a maker with one build per flag combination (headsurgeon/kernels/specialise.py). Keys are written in ascending order with weight 1, on visible cells only
(the invariant of headsurgeon/kernels/primitives/__init__.py), so ``to_dense()`` equals the dense kernel's output.
With ``normalized=True`` the rows come out as attention directly (weights ``1/count``, an empty visible
row attending to key 0): ``normalize_scores`` of the dense output, without a separate pass, which is how a
program that is a single primitive is evaluated (headsurgeon/synth/dsl/sparse.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..sparse import RowsBuffer, SparseRows, empty_rows_like
from ..specialise import Specialised, specialised
from .buffers import clip_offset

__all__ = ["sparse_self", "sparse_prev", "sparse_next", "sparse_first", "sparse_window", "sparse_none",
           "sparse_group_start", "sparse_same_group", "sparse_same_value", "sparse_dep_head", "sparse_dep_children"]


@njit(inline="always")
def _put(fill, norm, rowptr, cols, vals, r, c, j):  # pragma: no cover - compiled
    """Record key ``j`` as the ``c``-th entry of row ``r`` (fill pass only; ``_end`` writes the weights); returns c + 1."""
    if fill:
        cols[rowptr[r] + c] = j
    return c + 1


@njit(inline="always")
def _end(fill, norm, rowptr, cols, vals, r, c):  # pragma: no cover - compiled
    """Close visible row ``r`` after ``c`` keys. The count pass records the count in ``rowptr[r + 1]`` (``_close``
    sums a sequence's counts into the row pointer); the fill pass writes the row's weights, 1 or with ``norm``
    ``1 / c`` (``normalize_scores`` of an indicator row, computed the same way: float32 of the float64 quotient), and
    with ``norm`` an empty row attends to key 0 (the empty-row rule).

    The weight is computed once per row, after its keys: computed per key inside ``_put`` (from the row
    pointer, which each key's store may alias) it kept the fill loops from being optimised, several times slower.
    """
    if not fill:
        rowptr[r + 1] = max(c, 1) if norm else c
    else:
        s = rowptr[r]
        if norm and c == 0:
            cols[s] = 0
            vals[s] = 1.0
        else:
            w = np.float32(1.0 / np.float64(c)) if norm else np.float32(1.0)
            for k in range(s, s + c):
                vals[k] = w


@njit(inline="always")
def _close(fill, rowptr, b, L, n):  # pragma: no cover - compiled
    """After sequence ``b``'s ``L`` visible rows, the count pass turns their counts into the row pointer (from
    ``rowptr[b * n]``, the sum of the sequences before) and gives its padded rows no keys: one running sum in a
    register over rows still in cache, where extending the pointer row by row waited on each previous store."""
    if not fill:
        acc = rowptr[b * n]
        for r in range(b * n, b * n + L):
            acc += rowptr[r + 1]
            rowptr[r + 1] = acc
        for r in range(b * n + L, (b + 1) * n):
            rowptr[r + 1] = acc


def _run(kernel: Specialised, flags: tuple, args: tuple, lengths: np.ndarray, n: int, normalized: bool,
         out: RowsBuffer | None = None) -> SparseRows:
    """Count, size and fill: the two passes of an ``_sp_*`` kernel, the builds ``kernel(fill, normalized, *flags)``
    (``normalized``: rows as attention; ``out``: a ``RowsBuffer`` the result is written into, else new arrays).

    The count pass writes the row pointer itself from ``rowptr[0] = 0``: no zeroed array, no separate prefix sum.
    """
    if lengths.dtype != np.int64 or not lengths.flags.c_contiguous:
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    B = lengths.shape[0]
    rowptr = np.empty(B * n + 1, dtype=np.int64) if out is None else out.array("rowptr", B * n + 1, np.int64)
    rowptr[0] = 0
    kernel(False, normalized, *flags)(*args, lengths, n, rowptr, _NO_COLS, _NO_VALS)  # the row pointer itself
    nnz = int(rowptr[-1])
    cols = np.empty(nnz, dtype=np.int32) if out is None else out.array("cols", nnz, np.int32)
    vals = np.empty(nnz, dtype=np.float32) if out is None else out.array("vals", nnz, np.float32)
    if nnz:
        kernel(True, normalized, *flags)(*args, lengths, n, rowptr, cols, vals)
    return SparseRows(rowptr, cols, vals, lengths, int(n), normalized)


_NO_COLS, _NO_VALS = np.zeros(0, np.int32), np.zeros(0, np.float32)  # the count pass writes no keys


# ------------------------------------------------------------------ positional

@specialised()
def _sp_offset(fill, norm, causal):
    def _sp_offset(k, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        """Key i - k (k > 0: prev, k < 0: next, k == 0: self), visible keys only."""
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                j = i - k
                c = 0
                if 0 <= j < L and (not causal or j <= i):
                    c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_offset


@specialised()
def _sp_first(fill, norm):
    def _sp_first(lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            for i in range(lengths[b]):
                _end(fill, norm, rowptr, cols, vals, b * n + i, _put(fill, norm, rowptr, cols, vals, b * n + i, 0, 0))
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_first


@specialised()
def _sp_window(fill, norm, causal):
    def _sp_window(lo, hi, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        """Keys i - d for lo <= d <= hi, clipped to the visible keys (ascending j = descending d)."""
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                dlo = max(lo, i - L + 1)
                if causal:
                    dlo = max(dlo, 0)
                dhi = min(hi, i)
                c = 0
                for d in range(dhi, dlo - 1, -1):
                    c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, i - d)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_window


def sparse_self(lengths, n, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Each query attends to itself."""
    return _run(_sp_offset, (causal,), (0,), lengths, n, normalized, out)


def sparse_prev(lengths, n, k, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Query i attends to key i-k."""
    return _run(_sp_offset, (causal,), (clip_offset(k, n),), lengths, n, normalized, out)


def sparse_next(lengths, n, k, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Query i attends to key i+k (empty under a causal mask for k > 0)."""
    return _run(_sp_offset, (causal,), (-clip_offset(k, n),), lengths, n, normalized, out)


def sparse_first(lengths, n, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Every query attends to position 0."""
    return _run(_sp_first, (), (), lengths, n, normalized, out)


def sparse_window(lengths, n, lo, hi, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Keys at relative offsets lo..hi behind the query."""
    return _run(_sp_window, (causal,), (clip_offset(lo, n), clip_offset(hi, n)), lengths, n, normalized, out)


@specialised()
def _sp_none(fill, norm):
    def _sp_none(lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            for i in range(lengths[b]):
                _end(fill, norm, rowptr, cols, vals, b * n + i, 0)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_none


def sparse_none(lengths, n, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """No keys at all (normalized: every visible row attends to key 0)."""
    return _run(_sp_none, (), (), lengths, n, normalized, out) if normalized else empty_rows_like(lengths, n)


# ------------------------------------------------------------------ structure

@specialised()
def _sp_group_start(fill, norm):
    def _sp_group_start(groups, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            for i in range(lengths[b]):
                g = groups[b, i]
                c = 0
                for j in range(i + 1):
                    if groups[b, j] == g:
                        c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                        break
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_group_start


@specialised()
def _sp_same_value(fill, norm, causal, skip_self):
    def _sp_same_value(values, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        """Keys sharing the query's value; ``skip_self``: not the query itself, and values < 0 match nothing."""
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                v = values[b, i]
                c = 0
                if not (skip_self and v < 0):
                    jmax = i + 1 if causal else L
                    for j in range(jmax):
                        if values[b, j] == v and not (skip_self and j == i):
                            c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_same_value


@specialised()
def _sp_dep_head(fill, norm, causal):
    def _sp_dep_head(heads, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                h = heads[b, i]
                c = 0
                if 0 <= h < L and (not causal or h <= i):
                    c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, h)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_dep_head


@specialised()
def _sp_dep_children(fill, norm, causal):
    def _sp_dep_children(heads, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                jmax = i + 1 if causal else L
                c = 0
                for j in range(jmax):
                    if heads[b, j] == i:
                        c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_dep_children


def sparse_group_start(groups, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """The first key with the query's group value."""
    return _run(_sp_group_start, (), (groups,), lengths, groups.shape[1], normalized, out)


def sparse_same_group(groups, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """All visible keys sharing the query's group value, the query included."""
    return _run(_sp_same_value, (causal, False), (groups,), lengths, groups.shape[1], normalized, out)


def sparse_same_value(values, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Visible keys j != i with the query's value (values < 0 match nothing)."""
    return _run(_sp_same_value, (causal, True), (values,), lengths, values.shape[1], normalized, out)


def sparse_dep_head(heads, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """The token holding the query's dependency head."""
    return _run(_sp_dep_head, (causal,), (heads,), lengths, heads.shape[1], normalized, out)


def sparse_dep_children(heads, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """The visible tokens whose dependency head is the query."""
    return _run(_sp_dep_children, (causal,), (heads,), lengths, heads.shape[1], normalized, out)
