"""Kernels of the structure primitives: scores read from word, sentence and dependency arrays."""
from __future__ import annotations

from numba import njit

from .buffers import per_token_kernel

__all__ = ["score_group_start", "score_same_group", "score_same_value", "score_dep_head", "score_dep_children"]


@njit(cache=True)
def _score_group_start(groups, lengths, causal, out):  # pragma: no cover - compiled
    """The first key with the query's group value (sentence start, word start)."""
    nb, n = groups.shape
    for b in range(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            g = groups[b, i]
            for j in range(i + 1):
                if groups[b, j] == g:
                    out[b, i, j] = 1.0
                    break


@njit(cache=True)
def _score_same_group(groups, lengths, causal, out):  # pragma: no cover - compiled
    """All visible keys sharing the query's group value, the query included (same word)."""
    nb, n = groups.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            g = groups[b, i]
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if groups[b, j] == g:
                    out[b, i, j] = 1.0


@njit(cache=True)
def _score_same_value(values, lengths, causal, out):  # pragma: no cover - compiled
    """Visible keys j != i whose value equals the query's, values < 0 (none) matching nothing (same lemma)."""
    nb, n = values.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            v = values[b, i]
            if v < 0:
                continue
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if j != i and values[b, j] == v:
                    out[b, i, j] = 1.0


@njit(cache=True)
def _score_dep_head(heads, lengths, causal, out):  # pragma: no cover - compiled
    """The token holding the query's dependency head (none for roots / -1)."""
    nb, n = heads.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            h = heads[b, i]
            if 0 <= h < length and (not causal or h <= i):
                out[b, i, h] = 1.0


@njit(cache=True)
def _score_dep_children(heads, lengths, causal, out):  # pragma: no cover - compiled
    """The visible tokens whose dependency head is the query."""
    nb, n = heads.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if heads[b, j] == i:
                    out[b, i, j] = 1.0


# Allocating wrappers (see headsurgeon/kernels/primitives/buffers.py for ``out``).

score_group_start = per_token_kernel(
    _score_group_start, "score_group_start",
    "The first key with the query's group value (sentence start, word start).")


score_same_group = per_token_kernel(
    _score_same_group, "score_same_group",
    "All visible keys sharing the query's group value, the query included (same word).")


score_same_value = per_token_kernel(
    _score_same_value, "score_same_value",
    "Visible keys j != i whose value equals the query's, values < 0 (none) matching nothing (same lemma).")


score_dep_head = per_token_kernel(
    _score_dep_head, "score_dep_head",
    "The token holding the query's dependency head (none for roots / -1).")


score_dep_children = per_token_kernel(
    _score_dep_children, "score_dep_children",
    "The visible tokens whose dependency head is the query.")
