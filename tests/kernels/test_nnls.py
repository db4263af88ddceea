"""The compiled NNLS on a support (headsurgeon/kernels/nnls.py) against the numpy Lawson-Hanson it replaced."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.kernels.nnls import nnls_support
from headsurgeon.synth.search.enumerative.mixtures import RIDGE, GramStats


def numpy_nnls(gram: np.ndarray, rhs: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """The numpy version the kernel replaced, as it was."""
    G, r = np.asarray(gram, dtype=np.float64), np.asarray(rhs, dtype=np.float64)
    k = r.shape[0]
    if k == 0:
        return np.zeros(0)
    G = G + ridge * max(float(np.trace(G)) / k, 1e-30) * np.eye(k)
    w, passive = np.zeros(k), np.zeros(k, dtype=bool)
    for _ in range(3 * k + 10):
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


def numpy_fit(stats: GramStats, h: int, support: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """``GramStats.fit`` as it was, on the numpy NNLS (benchmarks/searcher_passes.py times the two)."""
    s = np.asarray(support, dtype=np.int64)
    w = numpy_nnls(stats.G[np.ix_(s, s)], stats.R[h, s])
    return w, float(stats.pp[h] - 2.0 * stats.R[h, s] @ w + w @ stats.G[np.ix_(s, s)] @ w)


def _problem(rng: np.random.Generator, components: int, duplicate: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """A Gram, inner products and sum of squares of sparse non-negative patterns against a target, as the fit set
    builds them (headsurgeon/synth/search/enumerative/fitset.py ``stats``)."""
    X = rng.random((components, 300)) * (rng.random((components, 300)) < 0.3)
    if duplicate:
        X[-1] = X[0]  # window(1, 1) and prev(1): the ridge keeps the pair solvable
    target = rng.random(300) * (rng.random(300) < 0.4)
    return X @ X.T, X @ target, float(target @ target)


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_fit_matches_the_numpy_one_on_every_support(seed: int) -> None:
    rng = np.random.default_rng(seed)
    duplicate = seed % 4 == 0
    G, R, pp = _problem(rng, 12, duplicate)
    # with two equal components only the ridge (1e-9) splits their weight: a condition number near 1e9 turns
    # rounding into relative differences near 1e-7 there, and their sum and the loss still agree closely
    rtol = 1e-5 if duplicate else 1e-9
    stats = GramStats(G, R[None], np.array([pp]))
    for size in (1, 2, 3, 5, 8):
        support = tuple(sorted(rng.choice(12, size, replace=False).tolist()))
        want, want_loss = numpy_fit(stats, 0, support)
        w, loss = stats.fit(0, support)
        assert (w >= 0).all()
        np.testing.assert_allclose(w, want, rtol=rtol, atol=1e-12)
        assert ((w > 0) == (want > 0)).all()  # the same active set: the beam keeps the same supports
        assert loss == pytest.approx(want_loss, rel=1e-9, abs=1e-12)


def test_an_unreachable_target_gives_zero_weights_and_its_own_energy_as_loss() -> None:
    G = np.array([[2.0, 0.5], [0.5, 1.0]])
    w, loss = nnls_support(G, np.array([-1.0, -0.2]), np.array([0, 1]), 3.0, RIDGE)
    assert (w == 0).all() and loss == 3.0
    w, loss = nnls_support(G, np.zeros(2), np.zeros(0, dtype=np.int64), 3.0, RIDGE)
    assert w.shape == (0,) and loss == 3.0
