"""Compiled passes over compact cells: flat arrays whose query rows are contiguous segments ``[row_start[r],
row_start[r+1])`` and whose sequences are runs of rows (the enumerative searcher's fit set,
headsurgeon/synth/search/enumerative/fitset.py).

Each kernel is one serial pass that does what several numpy passes with ``reduceat`` and temporaries did:
row sums and normalization, the soft IoU and the row JSD per sequence, and the softmax tables' logits,
normalization and per-parameter mass (headsurgeon/synth/search/enumerative/tables.py). Elementwise work keeps the numpy
code's float32 rounding (float32 operations, float64 sums) except the JSD, which takes the row identity of
headsurgeon/kernels/metrics_kernels.py in float64, so results move by float rounding only;
tests/kernels/test_cell_kernels.py compares every kernel with the numpy passes it replaced. An empty segment
sums to 0 (``np.add.reduceat`` would repeat the next element); the fit set has none.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .metrics_kernels import LN2, fast_log

__all__ = ["segment_sums", "rownorm_segments", "softmax_segments", "cell_scores", "table_mass", "table_l1",
           "saturating_add"]

_F32_MAX = float(np.finfo(np.float32).max)
#: reassociation lets LLVM vectorize the metric sums (as headsurgeon/kernels/metrics_kernels.py); no nnan/ninf
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True)
def segment_sums(v, starts, out):  # pragma: no cover - compiled
    """``out[k, r]`` = sum of ``v[k, starts[r]:starts[r+1]]`` (float64 accumulation, stored in out's dtype)."""
    for k in range(v.shape[0]):
        for r in range(starts.shape[0] - 1):
            acc = 0.0
            for j in range(starts[r], starts[r + 1]):
                acc += v[k, j]
            out[k, r] = acc


@njit(cache=True)
def rownorm_segments(v, starts, inv):  # pragma: no cover - compiled
    """Divide each segment of ``v`` [K, C] by its sum in place (segments summing to <= 0 are multiplied by 0).

    ``inv`` [1] of v's dtype: the reciprocal is rounded to v's precision before the products, as numpy's
    ``v *= 1 / s`` does (a float64 quotient rounded to float32 is the float32 quotient).
    """
    for k in range(v.shape[0]):
        for r in range(starts.shape[0] - 1):
            acc = 0.0
            for j in range(starts[r], starts[r + 1]):
                acc += v[k, j]
            inv[0] = acc  # the sum, rounded to v's precision
            inv[0] = 1.0 / inv[0] if inv[0] > 0 else 0.0
            scale = inv[0]
            for j in range(starts[r], starts[r + 1]):
                v[k, j] = v[k, j] * scale


@njit(cache=True)
def softmax_segments(logits, starts, out):  # pragma: no cover - compiled
    """``out`` = exp(logits - segment max), divided by its segment sum (float64)."""
    for r in range(starts.shape[0] - 1):
        lo, hi = starts[r], starts[r + 1]
        if hi <= lo:
            continue
        mx = -np.inf
        for j in range(lo, hi):
            mx = max(mx, logits[j])
        s = 0.0
        for j in range(lo, hi):
            e = math.exp(logits[j] - mx)
            out[j] = e
            s += e
        inv = 1.0 / s if s > 0 else 0.0
        for j in range(lo, hi):
            out[j] = out[j] * inv


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def cell_scores(q, p, plogp, row_start, seq_row_start, do_iou, do_jsd, iou, jsd):  # pragma: no cover - compiled
    """Per candidate k and sequence s: soft IoU ``Σmin(p,q)/Σmax(p,q)`` (1 where Σmax is 0) into ``iou[k, s]``
    and the mean over the sequence's rows of the Jensen-Shannon distance (natural log) into ``jsd[k, s]``.

    ``q`` [K, C] float32 candidates, ``p`` [C] float32 real pattern, ``plogp`` [C] its ``p log p`` (0 where
    p is 0), shared by the candidates. Per row, as headsurgeon/kernels/metrics_kernels.py ``score_block``:
    ``2 JSD² = Σ_j [p log p + q log q - s log s + s ln2]`` (``s = p + q``) in float64 with the branch-free
    ``fast_log``, so the row loop vectorizes.
    """
    for k in range(q.shape[0]):
        for s in range(seq_row_start.shape[0] - 1):
            mn = 0.0
            mx = 0.0
            tot = 0.0
            for r in range(seq_row_start[s], seq_row_start[s + 1]):
                row = 0.0
                lo, hi = row_start[r], row_start[r + 1]
                if do_iou:
                    for j in range(lo, hi):
                        a = np.float64(q[k, j])
                        b = np.float64(p[j])
                        mn += a if a < b else b
                        mx += b if a < b else a
                if do_jsd:
                    for j in range(lo, hi):
                        a = np.float64(q[k, j])
                        t = a + np.float64(p[j])
                        row += plogp[j] + a * fast_log(a) - t * fast_log(t) + t * LN2
                    tot += math.sqrt(max(0.5 * row, 0.0))
            n_rows = seq_row_start[s + 1] - seq_row_start[s]
            if do_iou:
                iou[k, s] = mn / mx if mx > 0 else 1.0
            if do_jsd:
                jsd[k, s] = tot / n_rows if n_rows > 0 else 0.0


@njit(inline="always")
def _table_row(lo, hi, behind, b, f_off, a, f_key, c, f_cls, temp, buf):  # pragma: no cover - compiled
    """Row softmax of ``temp * (b[f_off] + a[f_key] + c[f_cls])`` (-60 where the key is not behind) into buf."""
    mx = -np.inf
    for j in range(lo, hi):
        x = temp * ((b[f_off[j]] + a[f_key[j]] + c[f_cls[j]]) if behind[j] else -60.0)
        buf[j - lo] = x
        mx = max(mx, x)
    s = 0.0
    for j in range(hi - lo):
        e = math.exp(buf[j] - mx)
        buf[j] = e
        s += e
    inv = 1.0 / s
    for j in range(hi - lo):
        buf[j] = buf[j] * inv


@njit(cache=True)
def _widest(row_start):  # pragma: no cover - compiled
    """The most cells any row holds (the size of a reused row buffer)."""
    width = 0
    for r in range(row_start.shape[0] - 1):
        width = max(width, row_start[r + 1] - row_start[r])
    return width


@njit(cache=True)
def table_mass(row_start, behind, f_off, f_key, f_cls, eb, ea, ec, e_out, index, counts):  # pragma: no cover
    """The softmax table's rows at temperature 1, their mass added into ``counts[index[j]]`` in cell order
    (``np.bincount(index, weights=q)``).

    exp of a sum is the product of the exps, so the caller passes ``eb = exp(b - max b)`` (likewise ``ea``,
    ``ec``) and ``e_out = exp(-60 - max b - max a - max c)``: each cell costs two products instead of an exp.
    Every factor is <= 1, so nothing overflows; a row whose every cell underflows (logits more than ~700
    below the maxima) has mass 0 instead of its softmax, which the IPF's clipped logits never reach.
    """
    buf = np.empty(_widest(row_start), dtype=np.float64)
    for r in range(row_start.shape[0] - 1):
        lo, hi = row_start[r], row_start[r + 1]
        s = 0.0
        for j in range(lo, hi):
            e = eb[f_off[j]] * ea[f_key[j]] * ec[f_cls[j]] if behind[j] else e_out
            buf[j - lo] = e
            s += e
        if not s > 0:
            continue
        inv = 1.0 / s
        for j in range(lo, hi):
            counts[index[j]] += buf[j - lo] * inv


@njit(cache=True)
def table_l1(row_start, behind, b, f_off, a, f_key, c, f_cls, temp, p, out):  # pragma: no cover - compiled
    """``out[r]`` = L1 distance between row r of the tempered softmax table and ``p`` (float64)."""
    buf = np.empty(_widest(row_start), dtype=np.float64)
    for r in range(row_start.shape[0] - 1):
        lo, hi = row_start[r], row_start[r + 1]
        acc = 0.0
        if hi > lo:
            _table_row(lo, hi, behind, b, f_off, a, f_key, c, f_cls, temp, buf)
            for j in range(lo, hi):
                acc += abs(buf[j - lo] - p[j])
        out[r] = acc


@njit(cache=True)
def saturating_add(acc, w, raw):  # pragma: no cover - compiled
    """``acc = float32(min(acc + w * raw, float32 max))`` in float64, in place (the kernels' raw ``sum``)."""
    for j in range(acc.shape[0]):
        acc[j] = min(acc[j] + w * np.float64(raw[j]), _F32_MAX)
