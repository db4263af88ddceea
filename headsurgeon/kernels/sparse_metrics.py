"""Metric kernels for sparse program tensors (headsurgeon/kernels/sparse.py) against dense real patterns: O(nnz + n) per triple.

Soft IoU needs ``Σ min(p, q)`` only where q is non-zero, and ``Σ max = Σ p + Σ q - Σ min`` with the real
pattern's row sums ``Σ p`` computed once per (head, sequence) and shared by every program. The JSD row identity of
headsurgeon/kernels/metrics_kernels.py, ``2 JSD² = ln2 · rowsum(p) + Σ_{q_j > 0} (p log p + q log 2q - s log s)``
(``s = p + q``), likewise needs the real row sums and q's non-zeros only; a stored key of weight 0 adds
nothing (its bracket is ``p log p - p log p``), so it is skipped. Top-q sets of a sparse pattern come from
its stored keys (the same heap and tie rule as ``metrics_kernels.topq_sets``). numpy and numba only.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .metrics_kernels import _read, _sift_down, _sift_up, fast_log

__all__ = ["entry_terms", "score_sparse_block", "topq_sets_sparse", "sparse_totals"]

LN2 = math.log(2.0)
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True)
def sparse_totals(rowptr, cols, vals, lengths, causal, N, b0, b1):  # pragma: no cover - compiled
    """(visible mass float64 [P, b1-b0], invalid visible entries int64 [P, b1-b0]) of P stacked programs.

    ``rowptr`` [P, B*N + 1] points into the shared ``cols``/``vals``; "invalid" counts negative, NaN or
    infinite weights on visible keys.
    """
    P = rowptr.shape[0]
    Bc = b1 - b0
    tot = np.zeros((P, Bc), dtype=np.float64)
    bad = np.zeros((P, Bc), dtype=np.int64)
    for p in range(P):
        for bb in range(Bc):
            b = b0 + bb
            L = lengths[b]
            s = 0.0
            nbad = 0
            for i in range(L):
                jmax = i + 1 if causal else L
                r = b * N + i
                for k in range(rowptr[p, r], rowptr[p, r + 1]):
                    if cols[k] < jmax:
                        v = np.float64(vals[k])
                        if v > 0.0 and v != np.inf:
                            s += v
                        elif not (v == 0.0):
                            nbad += 1
            tot[p, bb] = s
            bad[p, bb] = nbad
    return tot, bad


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def entry_terms(vals):  # pragma: no cover - compiled
    """``v log 2v`` of every stored weight (0 for v <= 0), shared by every head a program is scored against."""
    out = np.zeros(vals.shape[0], dtype=np.float64)
    for k in range(vals.shape[0]):
        v = np.float64(vals[k])
        if v > 0.0:
            out[k] = v * fast_log(2.0 * v)
    return out


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def score_sparse_block(real, lut, lengths, causal, b0, b1, N, rowptr, cols, vals, vlog, ctot,
                       do_iou, do_jsd, out_iou, out_jsd):  # pragma: no cover - compiled
    """Soft IoU and mean row JSD of every head of ``real`` x the P stacked sparse programs, b in [b0, b1).

    ``vlog`` is ``entry_terms(vals)``, ``ctot`` [P, b1-b0] the programs' masses; writes ``out_*[h, p, b - b0]``.
    Per (sequence, head): the real pattern is decoded once into a float32 block with its row
    sums, then every program's stored keys look it up (two logs per key: ``a log a`` and ``s log s``).
    """
    H = real.shape[0]
    P = rowptr.shape[0]
    Bc = b1 - b0
    for bb in range(Bc):
        for h in range(H):
            b = b0 + bb
            L = lengths[b]
            ra = np.zeros((L, L), dtype=np.float32)
            rsum = np.zeros(L, dtype=np.float64)
            atot = 0.0
            for i in range(L):
                jmax = i + 1 if causal else L
                row = real[h, b, i]
                s = 0.0
                for j in range(jmax):
                    a = _read(row, lut, j)
                    ra[i, j] = a
                    s += a
                rsum[i] = s
                atot += s
            for p in range(P):
                mn = 0.0
                jsd = 0.0
                for i in range(L):
                    jmax = i + 1 if causal else L
                    r = b * N + i
                    acc = 0.0
                    for k in range(rowptr[p, r], rowptr[p, r + 1]):
                        j = cols[k]
                        v = np.float64(vals[k])
                        if j < jmax and v > 0.0:
                            a = np.float64(ra[i, j])
                            mn += a if a < v else v
                            if do_jsd:
                                s = a + v
                                acc += a * fast_log(a) + vlog[k] - s * fast_log(s)
                    if do_jsd:
                        acc += LN2 * rsum[i]
                        if acc > 0.0:
                            jsd += math.sqrt(0.5 * acc)
                if do_iou:
                    den = atot + ctot[p, bb] - mn
                    out_iou[h, p, bb] = mn / den if den > 0.0 else 1.0
                if do_jsd:
                    out_jsd[h, p, bb] = jsd / L


@njit(cache=True)
def topq_sets_sparse(rowptr, cols, vals, lengths, causal, N, b0, b1, qs, qmax):  # pragma: no cover - compiled
    """Top-q visible positive cells of P stacked sparse programs, as ``metrics_kernels.topq_sets`` returns them.

    Stored keys ascend within a row, so rows in order visit cells in row-major order: the heap's
    earlier-wins tie rule gives the same sets as the dense scan.
    """
    P = rowptr.shape[0]
    Bc = b1 - b0
    qm = max(qmax, 1)
    idx = np.zeros((P, Bc, qm), dtype=np.int32)
    cnt = np.zeros((P, Bc), dtype=np.int32)
    for p in range(P):
        for bb in range(Bc):
            b = b0 + bb
            L = lengths[b]
            q = qs[b]
            hv = np.empty(qm, dtype=np.float64)
            hp = np.empty(qm, dtype=np.int32)
            size = 0
            if q > 0:
                for i in range(L):
                    jmax = i + 1 if causal else L
                    r = b * N + i
                    for k in range(rowptr[p, r], rowptr[p, r + 1]):
                        j = cols[k]
                        v = np.float64(vals[k])
                        if j < jmax and v > 0.0:
                            if size < q:
                                hv[size] = v
                                hp[size] = i * L + j
                                _sift_up(hv, hp, size)
                                size += 1
                            elif v > hv[0]:
                                hv[0] = v
                                hp[0] = i * L + j
                                _sift_down(hv, hp, size, 0)
            kept = np.sort(hp[:size])
            for k in range(size):
                idx[p, bb, k] = kept[k]
            cnt[p, bb] = size
    return idx, cnt
