"""Kernels of the token primitives: scores read from token ids, key masks and value tables."""
from __future__ import annotations

import numpy as np
from numba import njit

from .buffers import out_buffer, per_token_kernel

__all__ = ["score_same_token", "score_same_token_recent", "score_induction", "score_ngram_induction", "score_keys",
    "score_recent",
    "score_match", "score_class_table", "value_index"]


@njit(cache=True)
def _score_same_token(ids, lengths, causal, out):  # pragma: no cover - compiled
    """Keys holding the query's token: earlier ones (causal) or all other ones (non-causal)."""
    nb, n = ids.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            t = ids[b, i]
            jmax = i if causal else length
            for j in range(jmax):
                if j != i and ids[b, j] == t:
                    out[b, i, j] = 1.0


@njit(cache=True)
def _score_same_token_recent(ids, lengths, causal, out):  # pragma: no cover - compiled
    """The most recent earlier occurrence (j < i) of the query's token."""
    nb, n = ids.shape
    for b in range(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            t = ids[b, i]
            for j in range(i - 1, -1, -1):
                if ids[b, j] == t:
                    out[b, i, j] = 1.0
                    break


@njit(cache=True)
def _score_induction(ids, lengths, causal, out):  # pragma: no cover - compiled
    """Keys right after an earlier (causal) or any other (non-causal) occurrence p of the query's token."""
    nb, n = ids.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            t = ids[b, i]
            pmax = i if causal else length - 1
            for p in range(pmax):
                if p != i and ids[b, p] == t:
                    j = p + 1
                    if j < length and (not causal or j <= i):
                        out[b, i, j] = 1.0


@njit(cache=True)
def _score_ngram_induction(ids, lengths, gram, causal, out):  # pragma: no cover - compiled
    """Keys p+1 right after an earlier (causal) or any other (non-causal) occurrence p of the query's last ``gram``
    tokens: ids[p-k] == ids[i-k] for k < gram (a query with fewer than ``gram`` tokens has none)."""
    nb, n = ids.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(gram - 1, length):
            pmax = i if causal else length - 1
            for p in range(gram - 1, pmax):
                if p == i:
                    continue
                k = 0
                while k < gram and ids[b, p - k] == ids[b, i - k]:
                    k += 1
                if k == gram:
                    out[b, i, p + 1] = 1.0


@njit(cache=True)
def _score_keys(mask, lengths, causal, out):  # pragma: no cover - compiled
    """All visible keys whose mask is set (key_in_set and other key predicates)."""
    nb, n = mask.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if mask[b, j]:
                    out[b, i, j] = 1.0


@njit(cache=True)
def _score_recent(mask, lengths, causal, out):  # pragma: no cover - compiled
    """The most recent key j <= i whose mask is set."""
    nb, n = mask.shape
    for b in range(nb):
        out[b] = 0.0
        last = -1
        for i in range(lengths[b]):
            if mask[b, i]:
                last = i
            if last >= 0:
                out[b, i, last] = 1.0


@njit(cache=True)
def _score_match(qidx, kidx, table, lengths, closest, causal, out):  # pragma: no cover - compiled
    """Fill ``out`` for ``score_match``."""
    nb, n = qidx.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            qa = qidx[b, i]
            if qa < 0:
                continue
            if not closest:
                jmax = i + 1 if causal else length
                for j in range(jmax):
                    kb = kidx[b, j]
                    if kb >= 0 and table[qa, kb]:
                        out[b, i, j] = 1.0
            elif causal:
                for j in range(i, -1, -1):
                    kb = kidx[b, j]
                    if kb >= 0 and table[qa, kb]:
                        out[b, i, j] = 1.0
                        break
            else:
                for d in range(length):
                    j = i - d
                    if j >= 0:
                        kb = kidx[b, j]
                        if kb >= 0 and table[qa, kb]:
                            out[b, i, j] = 1.0
                            break
                    j = i + d
                    if d > 0 and j < length:
                        kb = kidx[b, j]
                        if kb >= 0 and table[qa, kb]:
                            out[b, i, j] = 1.0
                            break
                    if i - d < 0 and i + d >= length:
                        break


@njit(cache=True)
def _score_class_table(qc, kc, table, lengths, causal, out):  # pragma: no cover - compiled
    """Every visible key j scores table[qc[b, i], kc[b, j]] (query class x key class)."""
    nb, n = qc.shape
    for b in range(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            row = table[qc[b, i]]
            jmax = i + 1 if causal else length
            for j in range(jmax):
                out[b, i, j] = row[kc[b, j]]


# Allocating wrappers (see headsurgeon/kernels/primitives/buffers.py for ``out``).

score_same_token = per_token_kernel(
    _score_same_token, "score_same_token",
    "Keys holding the query's token: earlier ones (causal) or all other ones (non-causal).")


score_same_token_recent = per_token_kernel(
    _score_same_token_recent, "score_same_token_recent",
    "The most recent earlier occurrence (j < i) of the query's token.")


score_induction = per_token_kernel(
    _score_induction, "score_induction",
    "Keys right after an earlier (causal) or any other (non-causal) occurrence p of the query's token.")


def score_ngram_induction(ids, lengths, gram, causal, out=None) -> np.ndarray:
    """Keys right after an earlier (causal) or any other occurrence of the query's last ``gram`` tokens."""
    out = out_buffer(out, (ids.shape[0], ids.shape[1], ids.shape[1]))
    _score_ngram_induction(ids, lengths, int(gram), causal, out)
    return out


score_keys = per_token_kernel(
    _score_keys, "score_keys",
    "All visible keys whose mask is set (key_in_set and other key predicates).")


score_recent = per_token_kernel(
    _score_recent, "score_recent",
    "The most recent key j <= i whose mask is set.")


def score_match(qidx, kidx, table, lengths, closest, causal, out=None) -> np.ndarray:
    """Categorical predicate: keys with table[qidx[i], kidx[j]] set; ``closest`` keeps the nearest one.

    ``qidx``/``kidx`` map each position's feature value to a row/column of ``table`` (-1: value not
    mentioned, never matches). Closest = largest j <= i under a causal mask; otherwise the smallest
    |i - j|, ties to the left.
    """
    out = out_buffer(out, (qidx.shape[0], qidx.shape[1], qidx.shape[1]))
    _score_match(qidx, kidx, table, lengths, closest, causal, out)
    return out


def score_class_table(qclass, kclass, table, lengths, causal, out=None) -> np.ndarray:
    """Every visible key j of query i scores ``table[qclass[b, i], kclass[b, j]]`` (int64 [B, N] class
    indices into a float32 [Cq, Ck] table: a categorical query-class x key-class attention)."""
    out = out_buffer(out, (qclass.shape[0], qclass.shape[1], qclass.shape[1]))
    _score_class_table(np.ascontiguousarray(qclass, dtype=np.int64), np.ascontiguousarray(kclass, dtype=np.int64),
                       np.ascontiguousarray(table, dtype=np.float32), lengths, causal, out)
    return out


def value_index(values: np.ndarray, vocabulary: np.ndarray) -> np.ndarray:
    """Map each entry of ``values`` to its index in the sorted unique ``vocabulary`` (-1 if absent)."""
    values = np.asarray(values, dtype=np.int64)
    vocabulary = np.asarray(vocabulary, dtype=np.int64)
    if vocabulary.size == 0:
        return np.full(values.shape, -1, dtype=np.int64)
    pos = np.searchsorted(vocabulary, values)
    pos_c = np.minimum(pos, vocabulary.size - 1)
    return np.where(vocabulary[pos_c] == values, pos_c, -1).astype(np.int64)
