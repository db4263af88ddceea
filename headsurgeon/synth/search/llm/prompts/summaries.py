"""Pattern summaries for prompts: the strongest (query, key, weight) pairs, per-row JSD and a row's top keys."""
from __future__ import annotations

import math

import numpy as np
from .....core import InputError


def _visible(n: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)


def strongest_pairs(pattern: np.ndarray, causal: bool = True, frac: float = 0.025, max_pairs: int = 48,
                    mode: str = "top", max_query: int | None = None) -> list[tuple[int, int, float]]:
    """The (query, key, weight) pairs shown for one sequence, sorted by query then weight (descending).

    ``mode="top"``: the ``ceil(frac * visible cells)`` heaviest positive cells (ties: row-major order),
    at most ``max_pairs``. ``mode="stratified"``: ``max_pairs`` positive cells evenly spaced over the
    weight ranking, so light attention is shown as well as the peaks. Queries >= ``max_query`` are
    left out (they are not shown in the prompt).
    """
    p = np.asarray(pattern, dtype=np.float64)
    n = p.shape[0]
    vis = _visible(n, causal)
    if max_query is not None:
        vis[max_query:, :] = False
    flat = np.where(vis & (p > 0), p, 0.0).reshape(-1)
    pos = np.flatnonzero(flat > 0)
    if pos.size == 0:
        return []
    order = pos[np.argsort(-flat[pos], kind="stable")]  # heaviest first, row-major among ties
    if mode == "top":
        q = max(1, math.ceil(frac * int(_visible(n, causal).sum()) - 1e-9))
        chosen = order[: min(q, max_pairs)]
    elif mode == "stratified":
        k = min(max_pairs, order.size)
        chosen = order[np.unique(np.linspace(0, order.size - 1, k).round().astype(np.int64))]
    else:
        raise InputError(f"pair mode must be 'top' or 'stratified', got {mode!r}")
    pairs = [(int(c // n), int(c % n), float(flat[c])) for c in chosen]
    pairs.sort(key=lambda t: (t[0], -t[2], t[1]))
    return pairs


def row_jsd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon distance (natural log) per row of two [n, n] row-stochastic matrices."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kp = np.where(p > 0, p * np.log(p / np.where(m > 0, m, 1.0)), 0.0).sum(-1)
        kq = np.where(q > 0, q * np.log(q / np.where(m > 0, m, 1.0)), 0.0).sum(-1)
    return np.sqrt(np.clip(0.5 * kp + 0.5 * kq, 0.0, None))


def top_keys(row: np.ndarray, k: int = 3, min_weight: float = 0.01) -> list[tuple[int, float]]:
    """The ``k`` heaviest keys of one row with weight >= ``min_weight`` (at least the heaviest one)."""
    row = np.asarray(row, dtype=np.float64)
    if row.size == 0 or row.max() <= 0:
        return []
    order = np.argsort(-row, kind="stable")[:k]
    out = [(int(j), float(row[j])) for j in order if row[j] >= min_weight]
    return out or [(int(order[0]), float(row[order[0]]))]
