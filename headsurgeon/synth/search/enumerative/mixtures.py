"""Non-negative mixtures fitted on Gram statistics: NNLS from the normal equations, a beam over supports, and
readable rounded weights (``0.62*prev(1) + 0.38*first()``)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ....kernels.nnls import nnls_support
from ... import dsl


#: added to the Gram's diagonal, times its mean diagonal: duplicate components (``window(1, 1)`` and ``prev(1)``)
#: stay solvable
RIDGE = 1e-9


def nnls_gram(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Non-negative least squares ``min_w w'Gw - 2 r'w, w >= 0`` from the normal equations (Lawson-Hanson,
    compiled: headsurgeon/kernels/nnls.py). ``gram`` [K, K] symmetric positive semi-definite, ``rhs`` [K]; the
    solution is deterministic."""
    r = np.ascontiguousarray(rhs, dtype=np.float64)
    if r.shape[0] == 0:
        return np.zeros(0)
    support = np.arange(r.shape[0], dtype=np.int64)
    return nnls_support(np.ascontiguousarray(gram, dtype=np.float64), r, support, 0.0, RIDGE)[0]


@dataclass
class GramStats:
    """Sufficient statistics of one row group: Gram [P,P], inner products [H,P], sum p^2 [H]."""

    G: np.ndarray
    R: np.ndarray
    pp: np.ndarray

    def fit(self, h: int, support: tuple[int, ...]) -> tuple[np.ndarray, float]:
        """NNLS weights on ``support`` for head h and their least-squares loss (one compiled call)."""
        w, loss = nnls_support(self.G, self.R[h], np.asarray(support, dtype=np.int64), float(self.pp[h]), RIDGE)
        return w, float(loss)

    def __sub__(self, other: "GramStats") -> "GramStats":
        return GramStats(self.G - other.G, self.R - other.R, self.pp - other.pp)


#: losses closer than this share of the head's energy are one loss to the beam: supports of components that are
#: the same pattern on these rows (``self()`` and ``word_start()`` where every query starts a word) then rank by
#: their library order, not by the last bits of their solves
LOSS_TIE = 1e-7


def beam_mixtures(st: GramStats, h: int, allowed: np.ndarray, beam: int, max_terms: int,
                   expand: int) -> list[tuple[float, tuple[int, ...], np.ndarray]]:
    """Greedy beam over supports: every size's best ``beam`` states as (loss, support, weights), ranked by loss (in
    units of ``LOSS_TIE`` of the head's energy), then by support."""
    unit = LOSS_TIE * max(float(st.pp[h]), 1e-30)

    def rank(state: tuple[float, tuple[int, ...], np.ndarray]) -> tuple[int, tuple[int, ...]]:
        return round(state[0] / unit), state[1]

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
        states = sorted(fresh.values(), key=rank)[:beam]
        for stt in states:
            found[stt[1]] = stt
    return sorted(found.values(), key=rank)


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
