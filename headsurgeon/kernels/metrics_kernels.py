"""Numba kernels behind ``headsurgeon.synth.metrics``: soft IoU, JSD distance and top-q IoU in one pass.

Why this shape: scoring H heads x P programs x B sequences densely costs H*P*B*n^2 log evaluations.
Program patterns are usually sparse (prev, first, same-token ... have a handful of non-zeros per row),
so candidates are turned into a row-compressed list of their visible non-zeros once, and every metric
is rewritten to touch only those entries:

* ``sum min(p, q)`` is zero wherever ``q`` is zero; ``sum max = sum p + sum q - sum min``.
* per JSD row, ``2 JSD^2 = sum_j [a log(2a/s) + b log(2b/s)]`` with ``s = a + b``, and each bracket is
  ``a ln2 + a log a + b log 2b - s log s``, which is just ``a ln2`` where ``b == 0``; so
  ``2 JSD^2 = ln2 * rowsum(p) + sum_{b > 0} (a log a + b log 2b - s log s)``. With ``a log a``
  precomputed once per real pattern and ``b log 2b`` once per candidate, each non-zero costs one log.
  All of it is accumulated in float64 (the identity cancels to ~1e-16 for identical rows).

Dense candidate rows (decay, uniform, ...) store their non-zeros on consecutive keys; such runs are
scored with contiguous loads and ``fast_log``, a branch-free float64 log that LLVM vectorizes
(libm's ``log`` is a scalar call), which makes dense rows about 2x cheaper than a scalar loop.

The work runs over (sequence, head) pairs so one real pattern (and its ``a log a``) is loaded once and
all programs of that sequence stream past it. float16 inputs are read through a
65,536-entry lookup table (numba has no CPU float16), so nothing is copied to float32 up front.
Only numpy and numba (and llvmlite, numba's own code generator, for two bit-cast intrinsics) are
imported here (the layering rule of docs/architecture.md).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

LN2 = math.log(2.0)
#: reassociation and contraction let LLVM vectorize the reductions; no nnan/ninf (never assumed).
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

@intrinsic
def _f64_bits(typingctx, x):
    """Reinterpret a float64 as int64 (a register bitcast, so loops using it still vectorize)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return sig, codegen


@intrinsic
def _bits_f64(typingctx, x):
    """Reinterpret an int64 as float64 (register bitcast)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return sig, codegen


@njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def fast_log(x):
    """Natural log of a positive normal float64, |error| < 2 ulp-ish (about 4e-16 relative).

    Exponent split, mantissa folded into [sqrt(2)/2, sqrt(2)), then ``2 atanh(t)`` as an odd series in
    ``t = (m-1)/(m+1)`` (|t| < 0.172, 11 terms). Unlike libm's ``log`` it is branch-free, so LLVM
    vectorizes loops that call it (AVX2/AVX-512), which is what makes the dense JSD path fast.
    ``fast_log(0.0)`` returns -1023 ln 2 (finite), so ``x * fast_log(x)`` is 0 at x == 0.
    """
    bits = _f64_bits(x)
    e = ((bits >> 52) & 0x7FF) - 1023
    m = _bits_f64((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)
    big = m > 1.4142135623730951
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    t = (m - 1.0) / (m + 1.0)
    t2 = t * t
    p = 1.0 / 21.0
    p = p * t2 + 1.0 / 19.0
    p = p * t2 + 1.0 / 17.0
    p = p * t2 + 1.0 / 15.0
    p = p * t2 + 1.0 / 13.0
    p = p * t2 + 1.0 / 11.0
    p = p * t2 + 1.0 / 9.0
    p = p * t2 + 1.0 / 7.0
    p = p * t2 + 1.0 / 5.0
    p = p * t2 + 1.0 / 3.0
    p = p * t2 + 1.0
    return 2.0 * t * p + np.float64(e) * LN2


#: float16 bit pattern -> float64 value, used to read float16 tensors passed as a uint16 view.
F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
#: placeholder lookup table for float32/float64 inputs (never indexed).
NO_LUT = np.zeros(1, dtype=np.float64)


def _read(row, lut, j):  # pragma: no cover - replaced by the overload inside numba
    """Read ``row[j]`` of a 1-D pattern row as float64 (float16 arrives as uint16 bits decoded by ``lut``)."""
    raise NotImplementedError


@overload(_read, inline="always")
def _read_ol(row, lut, j):
    if isinstance(row, types.Array) and row.dtype == types.uint16:
        def impl(row, lut, j):
            return lut[row[j]]
        return impl

    def impl(row, lut, j):
        return np.float64(row[j])
    return impl


@njit(cache=True)
def scan_rows(x, lut, lengths, causal, p0, p1, b0, b1, N):
    """One pass over x[p0:p1, b0:b1]: visible positive entries per row and invalid entries per pattern.

    Returns (rows int64 [b1-b0, p1-p0, N] in (b, p, i) order, bad int64 [p1-p0, b1-b0]) where "bad"
    counts visible entries that are negative, NaN or infinite.
    """
    Pc = p1 - p0
    Bc = b1 - b0
    rows = np.zeros((Bc, Pc, N), dtype=np.int64)
    bad = np.zeros((Pc, Bc), dtype=np.int64)
    for pp in range(Pc):
        for bb in range(Bc):
            b = b0 + bb
            L = lengths[b]
            nbad = 0
            for i in range(L):
                jmax = i + 1 if causal else L
                row = x[p0 + pp, b, i]
                c = 0
                for j in range(jmax):
                    v = _read(row, lut, j)
                    if v > 0.0:
                        if v == np.inf:
                            nbad += 1
                        c += 1
                    elif not (v == 0.0):
                        nbad += 1
                rows[bb, pp, i] = c
            bad[pp, bb] = nbad
    return rows, bad


@njit(cache=True)
def fill_csr(x, lut, lengths, causal, p0, p1, b0, b1, N, rowptr, cidx, cval, cwlog, ctot):
    """Fill the row-compressed visible positives of x[p0:p1, b0:b1] (value, ``v log 2v``, key index).

    ``ctot[bb, pp]`` receives the visible mass. Values are float16/float32 inputs, so float32 is exact.
    """
    Pc = p1 - p0
    Bc = b1 - b0
    for pp in range(Pc):
        for bb in range(Bc):
            b = b0 + bb
            L = lengths[b]
            tot = 0.0
            for i in range(L):
                jmax = i + 1 if causal else L
                k = rowptr[(bb * Pc + pp) * N + i]
                row = x[p0 + pp, b, i]
                for j in range(jmax):
                    v = _read(row, lut, j)
                    if v > 0.0:
                        cidx[k] = j
                        cval[k] = v
                        cwlog[k] = v * math.log(2.0 * v)
                        tot += v
                        k += 1
            ctot[bb, pp] = tot


@njit(inline="always")
def _sift_down(hv, hp, size, i):
    """Restore the heap below ``i``; the root is the *worst* kept cell (smallest value, latest position)."""
    while True:
        l = 2 * i + 1
        if l >= size:
            return
        w = l
        r = l + 1
        if r < size and (hv[r] < hv[l] or (hv[r] == hv[l] and hp[r] > hp[l])):
            w = r
        if hv[w] < hv[i] or (hv[w] == hv[i] and hp[w] > hp[i]):
            tv = hv[i]
            tp = hp[i]
            hv[i] = hv[w]
            hp[i] = hp[w]
            hv[w] = tv
            hp[w] = tp
            i = w
        else:
            return


@njit(inline="always")
def _sift_up(hv, hp, i):
    """Move entry ``i`` up while it is worse than its parent."""
    while i > 0:
        par = (i - 1) // 2
        if hv[i] < hv[par] or (hv[i] == hv[par] and hp[i] > hp[par]):
            tv = hv[i]
            tp = hp[i]
            hv[i] = hv[par]
            hp[i] = hp[par]
            hv[par] = tv
            hp[par] = tp
            i = par
        else:
            return


@njit(cache=True)
def topq_sets(x, lut, lengths, causal, p0, p1, b0, b1, qs, qmax):
    """Top-q visible positive cells of each x[p, b] as sorted flat indices ``i*L + j``.

    Ties at the threshold are broken by row-major position (earlier first); zero-weight cells are
    never selected, so a pattern with fewer than q positive cells yields a smaller set. One pass in
    row-major order keeps a size-q heap whose root is the worst kept cell; a later cell enters only
    if strictly larger than the root, which is exactly the earlier-wins tie rule.
    Returns (idx int32 [p1-p0, b1-b0, qmax], count int32 [p1-p0, b1-b0]).
    """
    Pc = p1 - p0
    Bc = b1 - b0
    qm = max(qmax, 1)
    idx = np.zeros((Pc, Bc, qm), dtype=np.int32)
    cnt = np.zeros((Pc, Bc), dtype=np.int32)
    for pp in range(Pc):
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
                    row = x[p0 + pp, b, i]
                    for j in range(jmax):
                        v = _read(row, lut, j)
                        if v > 0.0:
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
                idx[pp, bb, k] = kept[k]
            cnt[pp, bb] = size
    return idx, cnt


@njit(inline="always")
def _set_iou(a, na, c, nc):
    """IoU of two sorted int sets given as prefixes of ``a`` and ``c``; two empty sets -> 1."""
    i = 0
    j = 0
    inter = 0
    while i < na and j < nc:
        if a[i] == c[j]:
            inter += 1
            i += 1
            j += 1
        elif a[i] < c[j]:
            i += 1
        else:
            j += 1
    union = na + nc - inter
    if union == 0:
        return 1.0
    return inter / union


@njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _run_terms(a_buf, alog, i, cval, cwlog, k0, j0, n, do_jsd):
    """(sum min, JSD row sum) of real row ``a_buf[i]`` against q's non-zeros k0..k0+n on keys j0..j0+n.

    Contiguous loads and the branch-free ``fast_log`` let this loop vectorize (dense candidates).
    """
    mn = 0.0
    acc = 0.0
    if do_jsd:
        for d in range(n):
            a = np.float64(a_buf[i, j0 + d])
            v = np.float64(cval[k0 + d])
            mn += a if a < v else v
            s = a + v
            acc += alog[i, j0 + d] + cwlog[k0 + d] - s * fast_log(s)
    else:
        for d in range(n):
            a = np.float64(a_buf[i, j0 + d])
            v = np.float64(cval[k0 + d])
            mn += a if a < v else v
    return mn, acc


@njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _scattered_terms(a_buf, alog, i, cidx, cval, cwlog, k0, k1, do_jsd):
    """(sum min, JSD row sum) of real row ``a_buf[i]`` against q's non-zeros k0..k1 at keys ``cidx[k]``."""
    mn = 0.0
    acc = 0.0
    for k in range(k0, k1):
        j = cidx[k]
        a = np.float64(a_buf[i, j])
        v = np.float64(cval[k])
        mn += a if a < v else v
        if do_jsd:
            s = a + v
            acc += alog[i, j] + cwlog[k] - s * fast_log(s)
    return mn, acc


class RealRows(NamedTuple):
    """The heads' real patterns as the kernels read them: ``x`` [H, B, N, N] (float32, or float16 as uint16 bits that
    ``lut`` decodes), each sequence's length, and whether keys after the query are masked."""

    x: np.ndarray
    lut: np.ndarray
    lengths: np.ndarray
    causal: bool


class PackedRows(NamedTuple):
    """``programs`` candidates' visible non-zeros on sequences [b0, b1), row-compressed in (b - b0, p, i) order with
    ``width`` rows per sequence: keys ``cidx``, values ``cval``, ``cwlog = v log(2v)``, and each (sequence,
    candidate)'s visible mass ``ctot`` [b1 - b0, programs]."""

    programs: int
    width: int
    rowptr: np.ndarray
    cidx: np.ndarray
    cval: np.ndarray
    cwlog: np.ndarray
    ctot: np.ndarray


class Wanted(NamedTuple):
    """Which metrics a block scores."""

    iou: bool
    jsd: bool
    topq: bool


class TopqSets(NamedTuple):
    """Top-q cell sets (``topq_sets``) of the heads, [H, b1 - b0, q] with counts [H, b1 - b0], and of the candidates,
    [programs, b1 - b0, q] with counts [programs, b1 - b0]."""

    real_idx: np.ndarray
    real_cnt: np.ndarray
    cand_idx: np.ndarray
    cand_cnt: np.ndarray


class BlockScores(NamedTuple):
    """Where a block's per-sequence metrics go, each float64 [H, programs, b1 - b0] (a metric not wanted: any array)."""

    iou: np.ndarray
    jsd: np.ndarray
    topq: np.ndarray


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def score_block(real, b0, b1, packed, wanted, topq, out):
    """Per-sequence metrics of every head of ``real`` (:class:`RealRows`) x the ``packed`` candidates
    (:class:`PackedRows`) on sequences [b0, b1), the ``wanted`` ones (:class:`Wanted`) written into ``out``
    (:class:`BlockScores`) at ``[h, p, b - b0]``; ``topq``: the :class:`TopqSets` of both sides.

    Within a sequence the loop is tiled by query row: row i of every head (decoded once, with its
    ``a log a``) and row i of every program stay in L1/L2 while all (head, program) pairs use them.

    Per row, ``2 JSD^2 = sum_j [a log(2a/s) + v log(2v/s)] = sum_j [a ln2 + a log a + v log 2v - s log s]``
    (``s = a + v``); where ``v == 0`` the bracket is ``a ln2``, so only q's non-zeros need a log.
    """
    x, lut, lengths, causal = real.x, real.lut, real.lengths, real.causal
    Pc, N = packed.programs, packed.width
    rowptr, cidx, cval, cwlog, ctot = packed.rowptr, packed.cidx, packed.cval, packed.cwlog, packed.ctot
    do_iou, do_jsd, do_topq = wanted.iou, wanted.jsd, wanted.topq
    r_tq_idx, r_tq_cnt, c_tq_idx, c_tq_cnt = topq.real_idx, topq.real_cnt, topq.cand_idx, topq.cand_cnt
    out_iou, out_jsd, out_tq = out.iou, out.jsd, out.topq
    H = x.shape[0]
    Bc = b1 - b0
    need_dense = do_iou or do_jsd
    Nd = N if need_dense else 0
    ra = np.zeros((H, Nd), dtype=np.float32)
    ralog = np.zeros((H, Nd), dtype=np.float64)
    rsum = np.zeros(H, dtype=np.float64)
    atot = np.zeros(H, dtype=np.float64)
    minsum = np.zeros((H, Pc), dtype=np.float64)
    jsd = np.zeros((H, Pc), dtype=np.float64)
    for bb in range(Bc):
        b = b0 + bb
        L = lengths[b]
        if need_dense:
            atot[:] = 0.0
            minsum[:, :] = 0.0
            jsd[:, :] = 0.0
            for i in range(L):
                jmax = i + 1 if causal else L
                for h in range(H):
                    row = x[h, b, i]
                    rs = 0.0
                    for j in range(jmax):
                        a = _read(row, lut, j)
                        ra[h, j] = a
                        rs += a
                    for j in range(jmax):
                        av = np.float64(ra[h, j])
                        ralog[h, j] = av * fast_log(av)
                    rsum[h] = rs
                    atot[h] += rs
                for p in range(Pc):
                    base = (bb * Pc + p) * N
                    k0 = rowptr[base + i]
                    k1 = rowptr[base + i + 1]
                    run = k1 > k0 and cidx[k1 - 1] - cidx[k0] == k1 - k0 - 1
                    for h in range(H):
                        if run:
                            mn, acc = _run_terms(ra, ralog, h, cval, cwlog, k0, cidx[k0], k1 - k0, do_jsd)
                        else:
                            mn, acc = _scattered_terms(ra, ralog, h, cidx, cval, cwlog, k0, k1, do_jsd)
                        minsum[h, p] += mn
                        if do_jsd:
                            acc += LN2 * rsum[h]
                            if acc > 0.0:
                                jsd[h, p] += math.sqrt(0.5 * acc)
            for h in range(H):
                for p in range(Pc):
                    if do_iou:
                        den = atot[h] + ctot[bb, p] - minsum[h, p]
                        out_iou[h, p, bb] = minsum[h, p] / den if den > 0.0 else 1.0
                    if do_jsd:
                        out_jsd[h, p, bb] = jsd[h, p] / L
        if do_topq:
            for h in range(H):
                for p in range(Pc):
                    out_tq[h, p, bb] = _set_iou(r_tq_idx[h, bb], r_tq_cnt[h, bb],
                                                c_tq_idx[p, bb], c_tq_cnt[p, bb])

