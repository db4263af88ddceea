"""A convex quadratic on the probability simplex, minimized exactly, and weights rounded to whole units: the solver
behind refit_mixtures (headsurgeon/surgery/swap/refit.py)."""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import nnls

__all__ = ["solve_simplex", "whole_units"]


def solve_simplex(q: np.ndarray) -> np.ndarray:
    """argmin wᵀQw over w >= 0, Σw = 1 for a symmetric positive semi-definite Q, exactly.

    With Q = LᵀL, the non-negative least squares min_{u>=0} ‖Lu‖² + (Σu − 1)² is minimized by u = t·w*, t > 0, where
    w* minimizes ‖Lw‖² on the simplex (for fixed w the best t gives a value increasing in ‖Lw‖²), so w* = u/Σu;
    the result is then solved again on its support, exactly.
    """
    q = np.asarray(q, dtype=np.float64)
    k = q.shape[0]
    if k == 1:
        return np.ones(1)
    scale = float(np.trace(q)) / k
    if not math.isfinite(scale) or scale <= 0.0:
        return np.full(k, 1.0 / k)  # nothing moves the output: every point is a minimum
    values, vectors = np.linalg.eigh((q + q.T) / (2.0 * scale))
    root = np.sqrt(np.clip(values, 0.0, None))[:, None] * vectors.T  # LᵀL = Q / scale
    u, _ = nnls(np.vstack([root, np.ones((1, k))]), np.concatenate([np.zeros(k), [1.0]]), maxiter=50 * k)
    w = u / u.sum() if u.sum() > 0 else np.full(k, 1.0 / k)
    polished = _on_support(q, w > 0)
    if polished is not None and polished @ q @ polished <= w @ q @ w:
        return polished
    return w


def _on_support(q: np.ndarray, support: np.ndarray) -> np.ndarray | None:
    """The minimum of wᵀQw with Σw = 1 on the components in ``support`` (KKT by least squares), if it is >= 0."""
    idx = np.flatnonzero(support)
    n = len(idx)
    kkt = np.zeros((n + 1, n + 1))
    kkt[:n, :n] = q[np.ix_(idx, idx)]
    kkt[:n, n] = kkt[n, :n] = 1.0
    rhs = np.zeros(n + 1)
    rhs[n] = 1.0
    solution = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:n]
    if not np.all(np.isfinite(solution)) or solution.min() < -1e-12:
        return None
    w = np.zeros(q.shape[0])
    w[idx] = np.clip(solution, 0.0, None)
    return w / w.sum() if w.sum() > 0 else None


def whole_units(weights: np.ndarray, digits: int) -> np.ndarray:
    """``weights`` (summing to 1) as whole units of 10**-digits summing to 10**digits (largest remainders first)."""
    whole = 10 ** digits
    exact = weights * whole
    units = np.floor(exact).astype(np.int64)
    short = whole - int(units.sum())
    for i in np.argsort(-(exact - units), kind="stable")[:short]:
        units[i] += 1
    return units
