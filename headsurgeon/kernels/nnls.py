"""Non-negative least squares from the normal equations on a support of a Gram matrix, compiled.

The enumerative searcher's mixture beam (headsurgeon/synth/search/enumerative/mixtures.py) fits thousands of tiny
problems per head (a support of 1-6 components out of a library of a few hundred); in numpy each fit paid for fancy
indexing, a LAPACK call per active-set step and a dozen temporaries, more than the arithmetic. Here one call takes
the support's rows and columns, runs Lawson-Hanson with the same ridge, tolerances and choice of the entering component
as the numpy version it replaced (kept in tests/kernels/test_nnls.py) and returns the weights with their loss.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["nnls_support"]


@njit(cache=True)
def _solve(a, b):  # pragma: no cover - compiled
    """``a x = b`` for a small square ``a`` by Gaussian elimination with partial pivoting (a and b are overwritten)."""
    n = b.shape[0]
    for c in range(n):
        p = c
        best = abs(a[c, c])
        for r in range(c + 1, n):
            if abs(a[r, c]) > best:
                best, p = abs(a[r, c]), r
        if p != c:
            for j in range(n):
                a[c, j], a[p, j] = a[p, j], a[c, j]
            b[c], b[p] = b[p], b[c]
        piv = a[c, c]
        for r in range(c + 1, n):
            f = a[r, c] / piv
            if f != 0.0:
                for j in range(c + 1, n):
                    a[r, j] -= f * a[c, j]
                b[r] -= f * b[c]
    x = np.empty(n)
    for c in range(n - 1, -1, -1):
        acc = b[c]
        for j in range(c + 1, n):
            acc -= a[c, j] * x[j]
        x[c] = acc / a[c, c]
    return x


@njit(cache=True)
def nnls_support(gram, rhs, support, pp, ridge):  # pragma: no cover - compiled
    """``(w, loss)``: ``min_w w'Gw - 2 r'w, w >= 0`` on ``support`` (indices into ``gram`` [P, P] and ``rhs`` [P]),
    with ``ridge`` times the mean diagonal added (duplicate components stay solvable); ``loss`` is
    ``pp - 2 r'w + w'Gw`` on the unridged Gram."""
    k = support.shape[0]
    g = np.empty((k, k))
    r = np.empty(k)
    trace = 0.0
    rmax = 0.0
    for a in range(k):
        r[a] = rhs[support[a]]
        rmax = max(rmax, abs(r[a]))
        for b in range(k):
            g[a, b] = gram[support[a], support[b]]
        trace += g[a, a]
    lam = ridge * max(trace / max(k, 1), 1e-30)
    gr = g.copy()
    for a in range(k):
        gr[a, a] += lam
    w = np.zeros(k)
    passive = np.zeros(k, np.bool_)
    tol = 1e-12 * max(1.0, rmax)
    for _ in range(3 * k + 10):
        j, cand = -1, -np.inf
        for a in range(k):
            if not passive[a]:
                grad = r[a]
                for b in range(k):
                    grad -= gr[a, b] * w[b]
                if grad > cand:
                    cand, j = grad, a
        if j < 0 or cand <= tol:
            break
        passive[j] = True
        while True:
            m = 0
            for a in range(k):
                m += passive[a]
            idx = np.empty(m, np.int64)
            m = 0
            for a in range(k):
                if passive[a]:
                    idx[m] = a
                    m += 1
            sub = np.empty((m, m))
            sr = np.empty(m)
            for a in range(m):
                sr[a] = r[idx[a]]
                for b in range(m):
                    sub[a, b] = gr[idx[a], idx[b]]
            zs = _solve(sub, sr)
            z = np.zeros(k)
            positive = True
            for a in range(m):
                z[idx[a]] = zs[a]
                positive = positive and zs[a] > 0
            if positive:
                w = z
                break
            alpha = np.inf
            for a in range(m):
                i = idx[a]
                if z[i] <= 0:
                    alpha = min(alpha, w[i] / max(w[i] - z[i], 1e-300))
            for a in range(k):
                w[a] = w[a] + alpha * (z[a] - w[a])
                passive[a] = passive[a] and w[a] > 1e-15
                if not passive[a]:
                    w[a] = 0.0
    loss = pp
    for a in range(k):
        loss -= 2.0 * r[a] * w[a]
        for b in range(k):
            loss += w[a] * g[a, b] * w[b]
    return w, loss
