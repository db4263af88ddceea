"""Value-weighted fidelity: compare patterns by what they move, not where their mass sits.

A head adds Σ_j α_ij v_j W_O to the residual stream, so mass on a key whose ‖v_j W_O‖ is small (the first-token sink)
moves little; raw IoU/JSD still reward matching it. Here each row becomes α_ij·w_j / Σ_k α_ik·w_k, with w_j the key's
value norm through the head (headsurgeon/surgery/patterns/value_norms.py, kept by the store), for the head's pattern and the program's
alike, and soft IoU and JSD (headsurgeon/synth/metrics.py) compare those rows. A row whose weighted mass is 0 (all of it on
zero-norm keys) stays all-zero: it moves nothing. The scores are ``vw_iou`` and ``vw_jsd``
(headsurgeon/core/__init__.py ``WEIGHTED_METRICS``).

Row-normalizing forgets how much a row moves in all, so ``vw_r2`` keeps it: 1 - Σ w_j²(α_ij - β_ij)² / Σ w_j²(α_ij - μ_ij)²,
μ the head's mean pattern by position over the same windows (what mean ablation puts in its place,
headsurgeon/surgery/measure/head_costs.py). With orthogonal value vectors the sums are the squared output errors of swapping the
head for the program and for its mean, so 1 - vw_r2 stands for the swap's cost over mean ablation's (1: as costly).
"""
from __future__ import annotations

from typing import Any, Sequence as Seq

import numpy as np

from ..core import InputError, Metric, WeightedMetric
from ..kernels.sparse import SparseRows
from .metrics import score_many

__all__ = ["weigh_dense", "weigh_rows", "score_weighted", "moved_r2", "WEIGHTED"]

#: the value-weighted metrics, named after the raw ones they reuse
WEIGHTED: dict[WeightedMetric, Metric] = {"vw_iou": "iou", "vw_jsd": "jsd"}


def _check_norms(norms: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
    w = np.asarray(norms, dtype=np.float32)
    if w.shape != shape:
        raise InputError(f"value norms for {what} have shape {w.shape}, expected {shape}; read them with the same "
                         "indices and heads as the patterns (store.norm_batch)")
    if not np.isfinite(w).all() or (w < 0).any():
        raise InputError(f"value norms for {what} must be finite and >= 0 (they are vector norms); recapture the store")
    return w


def weigh_dense(patterns: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Rows ``α_ij·w_j / Σ_k α_ik·w_k`` of patterns [..., B, N, N] under norms [..., B, N] (float32; zero rows stay 0)."""
    p = np.asarray(patterns, dtype=np.float32)
    w = _check_norms(norms, p.shape[:-1], "dense patterns")
    out = p * w[..., None, :]
    total = out.sum(axis=-1, keepdims=True, dtype=np.float64)
    np.divide(out, total, out=out, where=total > 0)
    return out


def weigh_rows(rows: SparseRows, norms: np.ndarray) -> SparseRows:
    """A sparse program's rows weighed by norms [B, N'] (N' >= its width): the same keys, new weights."""
    B, n = rows.shape[0], rows.n
    w = np.asarray(norms, dtype=np.float32)
    if w.ndim != 2 or w.shape[0] != B or w.shape[1] < n:
        raise InputError(f"value norms have shape {w.shape}, expected [{B}, >= {n}] for these program rows")
    counts = np.diff(rows.rowptr)
    row_of = np.repeat(np.arange(B * n), counts)
    vals = rows.vals * w[row_of // n, rows.cols]
    total = np.bincount(row_of, weights=vals, minlength=B * n)
    scale = np.divide(1.0, total, out=np.zeros_like(total), where=total > 0)
    vals = (vals * scale[row_of]).astype(np.float32)
    return SparseRows(rows.rowptr.copy(), rows.cols.copy(), vals, rows.lengths.copy(), n, True)


def _width(w: np.ndarray, n: int) -> np.ndarray:
    """Norms [B, N] cut or zero-padded to width ``n`` (keys past a sequence's length never count)."""
    if w.shape[1] >= n:
        return w[:, :n]
    return np.pad(w, ((0, 0), (0, n - w.shape[1])))


def _dense(c: Any, n: int) -> np.ndarray:
    """A candidate's patterns as dense float32 [B, n, n] (sparse rows densified, cut or padded to width n)."""
    d = c.to_dense() if isinstance(c, SparseRows) else np.asarray(c, dtype=np.float32)
    if d.shape[-1] >= n:
        return d[..., :n, :n]
    pad = n - d.shape[-1]
    return np.pad(d, ((0, 0), (0, pad), (0, pad)))


def moved_r2(real: np.ndarray, cand: Seq[Any] | np.ndarray, lengths: Any, causal: bool, norms: np.ndarray,
             ) -> np.ndarray:
    """``vw_r2`` [H, P] of real [H,B,N,N] against candidates (as :func:`score_weighted`): one minus the norm-weighted
    squared error of each program over that of the heads' mean patterns on these windows (row 0 left out: every
    causal pattern puts it on key 0); NaN for a head whose rows never depart from its mean."""
    real = np.asarray(real)
    H, N = real.shape[0], real.shape[-1]
    w = _check_norms(norms, real.shape[:-1], "the real patterns")
    lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
    ar = np.arange(N)
    rows = ((ar[None, :] < lens[:, None]) & (ar[None, :] > 0))[:, :, None]  # [B, N, 1] query rows that count
    count = np.maximum(rows.sum(axis=0), 1)  # [N, 1] windows holding each query position
    dense = [_dense(c, N) for c in cand]
    out = np.full((H, len(dense)), np.nan)
    for h in range(H):
        r = real[h].astype(np.float32)
        w2 = (w[h] * w[h])[:, None, :] * rows  # [B, N, N]: each counted row's keys, by squared norm
        sst = float((((r - (r * rows).sum(axis=0) / count) ** 2) * w2).sum(dtype=np.float64))
        if sst <= 0:
            continue
        for p, d in enumerate(dense):
            out[h, p] = 1.0 - float((((r - d) ** 2) * w2).sum(dtype=np.float64)) / sst
    return out


def score_weighted(real: np.ndarray, cand: Seq[Any] | np.ndarray, lengths: Any, causal: bool, norms: np.ndarray,
                   ) -> dict[str, np.ndarray]:
    """``{"vw_iou", "vw_jsd", "vw_r2"}`` → [H, P] of real [H,B,N,N] against candidates (dense [P,B,N,N] or a list of
    dense / SparseRows), each weighed by the head's value norms [H,B,N] (one head at a time: the weights differ per
    head; ``vw_r2``: :func:`moved_r2`)."""
    real = np.asarray(real)
    H, P = real.shape[0], len(cand)
    w = _check_norms(norms, real.shape[:-1], "the real patterns")
    out: dict[str, np.ndarray] = {m: np.zeros((H, P)) for m in WEIGHTED}
    for h in range(H):
        mine = [weigh_rows(c, _width(w[h], c.n)) if isinstance(c, SparseRows)
                else weigh_dense(c, _width(w[h], np.shape(c)[-1])) for c in cand]
        got = score_many(weigh_dense(real[h: h + 1], w[h: h + 1]), mine, lengths, causal, tuple(WEIGHTED.values()),
                         check=False)
        for m, raw in WEIGHTED.items():
            out[m][h] = got[raw][0]
    out["vw_r2"] = moved_r2(real, cand, lengths, causal, w)
    return out
