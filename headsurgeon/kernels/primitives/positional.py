"""Kernels of the positional primitives: scores that depend only on query and key positions."""
from __future__ import annotations

import numpy as np
from numba import njit

from .buffers import clip_offset, out_buffer

__all__ = ["score_self", "score_prev", "score_next", "score_first", "score_window", "score_decay",
    "score_uniform", "score_none", "score_profile"]


@njit(cache=True)
def _score_self(lengths, n, causal, out):  # pragma: no cover - compiled
    """Each query attends to itself."""
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            out[b, i, i] = 1.0


@njit(cache=True)
def _score_prev(lengths, n, k, causal, out):  # pragma: no cover - compiled
    """Query i attends to key i-k (k >= 1)."""
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            j = i - k
            if 0 <= j < lengths[b]:
                out[b, i, j] = 1.0


@njit(cache=True)
def _score_next(lengths, n, k, causal, out):  # pragma: no cover - compiled
    """Query i attends to key i+k (encoders; empty under a causal mask)."""
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            j = i + k
            if 0 <= j < lengths[b] and (not causal or j <= i):
                out[b, i, j] = 1.0


@njit(cache=True)
def _score_first(lengths, n, causal, out):  # pragma: no cover - compiled
    """Every query attends to position 0 (BOS)."""
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            out[b, i, 0] = 1.0


@njit(cache=True)
def _score_window(lengths, n, lo, hi, causal, out):  # pragma: no cover - compiled
    """Keys at relative offsets lo..hi behind the query (j = i - d, lo <= d <= hi; d < 0 looks ahead).

    The offsets are clipped to the keys that exist (0 <= j < length, j <= i when causal), so a row
    costs at most ``length`` steps whatever ``lo`` and ``hi`` are.
    """
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            dlo = max(lo, i - length + 1)
            if causal:
                dlo = max(dlo, 0)
            dhi = min(hi, i)
            for d in range(dlo, dhi + 1):
                out[b, i, i - d] = 1.0


@njit(cache=True)
def _score_decay(lengths, n, rate, causal, out):  # pragma: no cover - compiled
    """Exponential decay rate**|i-j| over visible keys (the query itself scores 1)."""
    nb = lengths.shape[0]
    table = np.empty(max(n, 1), np.float32)
    for d in range(n):
        table[d] = rate ** d
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            for j in range(jmax):
                out[b, i, j] = table[abs(i - j)]


@njit(cache=True)
def _score_uniform(lengths, n, causal, out):  # pragma: no cover - compiled
    """Uniform over all visible keys."""
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            out[b, i, :jmax] = 1.0


@njit(cache=True)
def _score_none(lengths, n, causal, out):  # pragma: no cover - compiled
    """All-zero scores (every visible row falls back to position 0 after normalization)."""
    nb = lengths.shape[0]
    for b in range(nb):
        out[b] = 0.0


@njit(cache=True)
def _score_profile(lengths, n, w, tail, bos, causal, out):  # pragma: no cover - compiled
    """Key i-d scores w[d] (d < len(w)) or tail; key 0 scores bos when bos >= 0; keys ahead score 0."""
    nb = lengths.shape[0]
    nw = w.shape[0]
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            for j in range(i + 1):
                d = i - j
                v = w[d] if d < nw else tail
                if j == 0 and bos >= 0.0:
                    v = bos
                out[b, i, j] = v


# Allocating wrappers (see headsurgeon/kernels/primitives/buffers.py for ``out``).

def score_self(lengths, n, causal, out=None) -> np.ndarray:
    """Each query attends to itself."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_self(lengths, n, causal, out)
    return out


def score_prev(lengths, n, k, causal, out=None) -> np.ndarray:
    """Query i attends to key i-k (k >= 1)."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_prev(lengths, n, clip_offset(k, n), causal, out)
    return out


def score_next(lengths, n, k, causal, out=None) -> np.ndarray:
    """Query i attends to key i+k (encoders; empty under a causal mask)."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_next(lengths, n, clip_offset(k, n), causal, out)
    return out


def score_first(lengths, n, causal, out=None) -> np.ndarray:
    """Every query attends to position 0 (BOS)."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_first(lengths, n, causal, out)
    return out


def score_window(lengths, n, lo, hi, causal, out=None) -> np.ndarray:
    """Keys at relative offsets lo..hi behind the query (j = i - d, lo <= d <= hi; d < 0 looks ahead).

    Work per row is at most the sequence length, whatever the offsets.
    """
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_window(lengths, n, clip_offset(lo, n), clip_offset(hi, n), causal, out)
    return out


def score_decay(lengths, n, rate, causal, out=None) -> np.ndarray:
    """Exponential decay rate**|i-j| over visible keys (the query itself scores 1)."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_decay(lengths, n, rate, causal, out)
    return out


def score_uniform(lengths, n, causal, out=None) -> np.ndarray:
    """Uniform over all visible keys."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_uniform(lengths, n, causal, out)
    return out


def score_none(lengths, n, causal, out=None) -> np.ndarray:
    """All-zero scores (every visible row falls back to position 0 after normalization)."""
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_none(lengths, n, causal, out)
    return out


def score_profile(lengths, n, w, tail, bos, causal, out=None) -> np.ndarray:
    """Positional profile: key i-d scores w[d] (d < len(w)) else ``tail``; key 0 scores ``bos`` if >= 0.

    Only keys at or behind the query score (d >= 0), with or without a causal mask.
    """
    out = out_buffer(out, (lengths.shape[0], n, n))
    _score_profile(lengths, n, np.ascontiguousarray(w, dtype=np.float32), np.float32(tail), np.float32(bos),
                   causal, out)
    return out
