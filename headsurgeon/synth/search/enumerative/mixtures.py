"""Non-negative mixtures fitted on Gram statistics: NNLS from the normal equations, a beam over supports, and
readable rounded weights (``0.62*prev(1) + 0.38*first()``)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ... import dsl


def nnls_gram(gram: np.ndarray, rhs: np.ndarray, ridge: float = 1e-9, iters: int = 0) -> np.ndarray:
    """Non-negative least squares ``min_w w'Gw - 2 r'w, w >= 0`` from the normal equations (Lawson-Hanson).

    ``gram`` [K, K] symmetric positive semi-definite, ``rhs`` [K]. A tiny ridge keeps duplicate
    components (e.g. ``window(1, 1)`` and ``prev(1)``) solvable; the solution is deterministic.
    """
    G = np.asarray(gram, dtype=np.float64)
    r = np.asarray(rhs, dtype=np.float64)
    k = r.shape[0]
    if k == 0:
        return np.zeros(0)
    G = G + ridge * max(float(np.trace(G)) / k, 1e-30) * np.eye(k)
    w = np.zeros(k)
    passive = np.zeros(k, dtype=bool)
    max_iter = iters or 3 * k + 10
    for _ in range(max_iter):
        grad = r - G @ w
        cand = np.where(~passive, grad, -np.inf)
        j = int(np.argmax(cand))
        if cand[j] <= 1e-12 * max(1.0, float(np.abs(r).max())):
            break
        passive[j] = True
        while True:
            idx = np.flatnonzero(passive)
            z = np.zeros(k)
            z[idx] = np.linalg.solve(G[np.ix_(idx, idx)], r[idx])
            if (z[idx] > 0).all():
                w = z
                break
            neg = idx[z[idx] <= 0]
            alpha = np.min(w[neg] / np.maximum(w[neg] - z[neg], 1e-300))
            w = w + alpha * (z - w)
            passive &= w > 1e-15
            w[~passive] = 0.0
    return w


@dataclass
class GramStats:
    """Sufficient statistics of one row group: Gram [P,P], inner products [H,P], sum p^2 [H]."""

    G: np.ndarray
    R: np.ndarray
    pp: np.ndarray

    def loss(self, h: int, support: tuple[int, ...], w: np.ndarray) -> float:
        """Least-squares loss of head h's fit with ``w`` on ``support``."""
        s = np.asarray(support, dtype=np.int64)
        return float(self.pp[h] - 2.0 * self.R[h, s] @ w + w @ self.G[np.ix_(s, s)] @ w)

    def fit(self, h: int, support: tuple[int, ...]) -> tuple[np.ndarray, float]:
        """NNLS weights on ``support`` for head h and their loss."""
        s = np.asarray(support, dtype=np.int64)
        w = nnls_gram(self.G[np.ix_(s, s)], self.R[h, s])
        return w, self.loss(h, support, w)

    def __sub__(self, other: "GramStats") -> "GramStats":
        return GramStats(self.G - other.G, self.R - other.R, self.pp - other.pp)


def beam_mixtures(st: GramStats, h: int, allowed: np.ndarray, beam: int, max_terms: int,
                   expand: int) -> list[tuple[float, tuple[int, ...], np.ndarray]]:
    """Greedy beam over supports: every size's best ``beam`` states as (loss, support, weights)."""
    states: list[tuple[float, tuple[int, ...], np.ndarray]] = [(float(st.pp[h]), (), np.zeros(0))]
    found: dict[tuple[int, ...], tuple[float, tuple[int, ...], np.ndarray]] = {}
    for _size in range(max_terms):
        fresh: dict[tuple[int, ...], tuple[float, tuple[int, ...], np.ndarray]] = {}
        for _loss, sup, w in states:
            s = np.asarray(sup, dtype=np.int64)
            grad = st.R[h] - (st.G[:, s] @ w if len(sup) else 0.0)
            grad = np.where(allowed, grad, -np.inf)
            if len(sup):
                grad[s] = -np.inf
            order = np.argsort(-grad, kind="stable")[:expand]
            for j in order:
                if not np.isfinite(grad[j]) or grad[j] <= 0:
                    break
                new = tuple(sorted(sup + (int(j),)))
                if new in fresh or new in found:
                    continue
                w2, loss2 = st.fit(h, new)
                keep = w2 > 1e-9
                if not keep.all():  # the new term made another redundant: keep the reduced support
                    new = tuple(int(x) for x, k in zip(new, keep) if k)
                    w2 = w2[keep]
                    if not new or new in fresh or new in found:
                        continue
                fresh[new] = (loss2, new, w2)
        if not fresh:
            break
        states = sorted(fresh.values(), key=lambda x: (x[0], x[1]))[:beam]
        for stt in states:
            found[stt[1]] = stt
    return sorted(found.values(), key=lambda x: (x[0], x[1]))


def round_weights(weights: Sequence[float], decimals: int = 2) -> list[float]:
    """Normalize to sum 1 and round to ``decimals`` (largest remainders keep the sum at 1); zeros stay."""
    w = np.asarray(weights, dtype=np.float64)
    w = np.where(w > 0, w, 0.0)
    if w.sum() <= 0:
        return [0.0] * len(w)
    scale = 10 ** decimals
    x = w / w.sum() * scale
    base = np.floor(x)
    rest = int(round(scale - base.sum()))
    order = np.argsort(-(x - base), kind="stable")
    base[order[:rest]] += 1
    return [float(v / scale) for v in base]


def mix_node(terms: list[tuple[float, dsl.Node]]) -> dsl.Node | None:
    """A mix node with weights rounded to 2 decimals (terms rounding to 0 dropped), or its only term."""
    if not terms:
        return None
    ws = round_weights([w for w, _ in terms])
    kept = [(w, n) for w, (_, n) in zip(ws, terms) if w > 0]
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0][1]
    kept.sort(key=lambda t: (-t[0], dsl.to_text(t[1])))
    return dsl.Mix(tuple(kept))
