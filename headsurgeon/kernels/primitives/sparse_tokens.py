"""Sparse kernels of the token primitives (same token, induction, key sets, recent, match): rows of keys.

Same conventions as headsurgeon/kernels/primitives/sparse_prims.py (two passes, ascending keys, ``normalized``, one build
per flag combination).
"""
from __future__ import annotations

import numpy as np

from ..sparse import RowsBuffer, SparseRows
from ..specialise import specialised
from .sparse_prims import _close, _end, _put, _run

__all__ = ["sparse_same_token", "sparse_same_token_recent", "sparse_induction", "sparse_ngram_induction", "sparse_keys",
           "sparse_recent", "sparse_match"]


@specialised()
def _sp_same_token(fill, norm, causal):
    def _sp_same_token(ids, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                t = ids[b, i]
                jmax = i if causal else L
                c = 0
                for j in range(jmax):
                    if j != i and ids[b, j] == t:
                        c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_same_token


@specialised()
def _sp_same_token_recent(fill, norm):
    def _sp_same_token_recent(ids, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            for i in range(lengths[b]):
                t = ids[b, i]
                c = 0
                for j in range(i - 1, -1, -1):
                    if ids[b, j] == t:
                        c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                        break
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_same_token_recent


@specialised()
def _sp_induction(fill, norm, causal):
    def _sp_induction(ids, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                t = ids[b, i]
                pmax = i if causal else L - 1
                c = 0
                for p in range(pmax):
                    if p != i and ids[b, p] == t:
                        j = p + 1
                        if j < L and (not causal or j <= i):
                            c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_induction


@specialised()
def _sp_ngram_induction(fill, norm, causal):
    def _sp_ngram_induction(ids, gram, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                c = 0
                if i >= gram - 1:
                    pmax = i if causal else L - 1
                    for p in range(gram - 1, pmax):
                        if p == i:
                            continue
                        k = 0
                        while k < gram and ids[b, p - k] == ids[b, i - k]:
                            k += 1
                        if k == gram:
                            c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, p + 1)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_ngram_induction


@specialised()
def _sp_keys(fill, norm, causal):
    def _sp_keys(mask, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                jmax = i + 1 if causal else L
                c = 0
                for j in range(jmax):
                    if mask[b, j]:
                        c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_keys


@specialised()
def _sp_recent(fill, norm):
    def _sp_recent(mask, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            last = -1
            for i in range(lengths[b]):
                if mask[b, i]:
                    last = i
                c = 0
                if last >= 0:
                    c = _put(fill, norm, rowptr, cols, vals, b * n + i, c, last)
                _end(fill, norm, rowptr, cols, vals, b * n + i, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_recent


@specialised()
def _sp_match(fill, norm, causal, closest):
    def _sp_match(qidx, kidx, table, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        for b in range(lengths.shape[0]):
            L = lengths[b]
            for i in range(L):
                r = b * n + i
                c = 0
                qa = qidx[b, i]
                if qa >= 0:
                    if not closest:
                        jmax = i + 1 if causal else L
                        for j in range(jmax):
                            kb = kidx[b, j]
                            if kb >= 0 and table[qa, kb]:
                                c = _put(fill, norm, rowptr, cols, vals, r, c, j)
                    elif causal:
                        for j in range(i, -1, -1):
                            kb = kidx[b, j]
                            if kb >= 0 and table[qa, kb]:
                                c = _put(fill, norm, rowptr, cols, vals, r, c, j)
                                break
                    else:
                        for d in range(L):
                            j = i - d
                            if j >= 0:
                                kb = kidx[b, j]
                                if kb >= 0 and table[qa, kb]:
                                    c = _put(fill, norm, rowptr, cols, vals, r, c, j)
                                    break
                            j = i + d
                            if d > 0 and j < L:
                                kb = kidx[b, j]
                                if kb >= 0 and table[qa, kb]:
                                    c = _put(fill, norm, rowptr, cols, vals, r, c, j)
                                    break
                            if i - d < 0 and i + d >= L:
                                break
                _end(fill, norm, rowptr, cols, vals, r, c)
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_match


@specialised()
def _sp_same_token_linked(fill, norm, causal):
    def _sp_same_token_linked(ids, vocab, lengths, n, rowptr, cols, vals):  # pragma: no cover - compiled
        """``_sp_same_token`` in O(n + nnz) per sequence. The count pass counts each token's occurrences (a table
        indexed by token id): a causal row's count is its token's occurrences before it, any other row's all but
        itself. The fill pass links each position to the previous occurrence of its token (a ``last`` table), and
        a row walks that chain from the query (causal: earlier occurrences) or from the token's last occurrence
        (all others), writing keys from the row's end so they come out ascending."""
        nb = lengths.shape[0]
        last = np.full(vocab, -1, dtype=np.int64)
        seen = np.zeros(vocab, dtype=np.int64)
        prev = np.empty(max(n, 1), dtype=np.int64)
        for b in range(nb):
            L = lengths[b]
            if not fill:
                for i in range(L):
                    t = ids[b, i]
                    if causal:
                        _end(fill, norm, rowptr, cols, vals, b * n + i, seen[t])
                    seen[t] += 1
                if not causal:
                    for i in range(L):
                        _end(fill, norm, rowptr, cols, vals, b * n + i, seen[ids[b, i]] - 1)
                for i in range(L):
                    seen[ids[b, i]] = 0
            else:
                for i in range(L):
                    t = ids[b, i]
                    prev[i] = last[t]
                    last[t] = i
                for i in range(L):
                    r = b * n + i
                    j = prev[i] if causal else last[ids[b, i]]
                    cnt = 0
                    k = rowptr[r + 1] - 1
                    while j >= 0:
                        if j != i:
                            cols[k] = j
                            k -= 1
                            cnt += 1
                        j = prev[j]
                    _end(fill, norm, rowptr, cols, vals, r, cnt)
                for i in range(L):
                    last[ids[b, i]] = -1
            _close(fill, rowptr, b, lengths[b], n)
    return _sp_same_token_linked


def sparse_same_token(ids, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Keys holding the query's token: earlier ones (causal) or all other ones."""
    vocab = int(ids.max()) + 1 if ids.size else 1
    if ids.size and (int(ids.min()) < 0 or vocab > 1 << 24):  # no id-indexed table: the quadratic scan
        return _run(_sp_same_token, (causal,), (ids,), lengths, ids.shape[1], normalized, out)
    return _run(_sp_same_token_linked, (causal,), (ids, vocab), lengths, ids.shape[1], normalized, out)


def sparse_same_token_recent(ids, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """The most recent earlier occurrence of the query's token."""
    return _run(_sp_same_token_recent, (), (ids,), lengths, ids.shape[1], normalized, out)


def sparse_induction(ids, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Keys right after an earlier (causal) or any other occurrence of the query's token."""
    return _run(_sp_induction, (causal,), (ids,), lengths, ids.shape[1], normalized, out)


def sparse_ngram_induction(ids, lengths, gram, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Keys right after an earlier (causal) or any other occurrence of the query's last ``gram`` tokens."""
    return _run(_sp_ngram_induction, (causal,), (ids, int(gram)), lengths, ids.shape[1], normalized, out)


def sparse_keys(mask, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """All visible keys whose mask is set."""
    return _run(_sp_keys, (causal,), (mask,), lengths, mask.shape[1], normalized, out)


def sparse_recent(mask, lengths, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """The most recent key j <= i whose mask is set."""
    return _run(_sp_recent, (), (mask,), lengths, mask.shape[1], normalized, out)


def sparse_match(qidx, kidx, table, lengths, closest, causal, normalized: bool = False,
        out: RowsBuffer | None = None) -> SparseRows:
    """Keys with table[qidx[i], kidx[j]] set (``closest``: the nearest one), as ``score_match``."""
    return _run(_sp_match, (causal, bool(closest)), (qidx, kidx, table), lengths, qidx.shape[1], normalized, out)
