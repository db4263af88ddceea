"""Numba kernels for the DSL primitives and combinators (DESIGN section 2).

Every primitive ``score_*`` takes padded arrays (token ids or feature arrays ``[B, N]`` int64,
boolean masks ``[B, N]``), ``lengths [B]`` int64, the width ``n`` where no array gives it, and a
``causal`` flag, and returns a float32 score matrix ``[B, N, N]`` (a new array, or ``out=`` when a
reusable buffer is passed; every cell is overwritten). Invariant: a kernel writes non-zero scores
only on *visible* cells (query and key inside the length, and ``j <= i`` when causal), so that "this
row is empty" means the same thing before and after normalization (``fallback`` relies on it).
Scores are raw (0/1 indicators or decay weights); ``headsurgeon.kernels.normalize.normalize_scores``
turns them into attention.

Combinators work in place on whole batches (no Python loop over tokens): ``mix_scale`` /
``mix_accumulate`` add row-normalized components with weights, ``fallback_rows`` / ``gate_rows``
replace rows, ``sharpen_rows`` / ``sharpen_rows_by`` (an exponent per query row) power and
renormalize, ``multiply`` takes elementwise products.

All kernels are ``@njit(parallel=True, cache=True)`` with ``prange`` over sequences; batches below
``SMALL_WORK`` cells run single-threaded (``threads_for``).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
from numba import njit, prange

__all__ = [
    "score_self", "score_prev", "score_next", "score_first", "score_window", "score_decay",
    "score_uniform", "score_none", "score_same_token", "score_same_token_recent", "score_induction",
    "score_keys", "score_class_table", "score_recent", "score_group_start", "score_same_group", "score_dep_head",
    "score_dep_children", "score_match", "value_index", "score_profile",
    "mix_scale", "mix_accumulate", "fallback_rows", "gate_rows", "sharpen_rows", "sharpen_rows_by", "multiply",
    "row_normalize",
    "empty_rows", "threads_for", "SMALL_WORK",
]

# Below this many score cells (B*N*N) a kernel runs on one thread: on small batches the cost of
# waking the OpenMP team (milliseconds on busy, oversubscribed machines) exceeds the work.
SMALL_WORK = 1 << 16


@contextmanager
def threads_for(cells: int) -> Iterator[None]:
    """Run the enclosed kernels single-threaded when the batch is small (numba's setting is thread-local)."""
    if cells >= SMALL_WORK:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


# --------------------------------------------------------------------------------------------
# primitives
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def _score_self(lengths, n, causal, out):  # pragma: no cover - compiled
    """Each query attends to itself."""
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            out[b, i, i] = 1.0


@njit(parallel=True, cache=True)
def _score_prev(lengths, n, k, causal, out):  # pragma: no cover - compiled
    """Query i attends to key i-k (k >= 1)."""
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            j = i - k
            if 0 <= j < lengths[b]:
                out[b, i, j] = 1.0


@njit(parallel=True, cache=True)
def _score_next(lengths, n, k, causal, out):  # pragma: no cover - compiled
    """Query i attends to key i+k (encoders; empty under a causal mask)."""
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            j = i + k
            if 0 <= j < lengths[b] and (not causal or j <= i):
                out[b, i, j] = 1.0


@njit(parallel=True, cache=True)
def _score_first(lengths, n, causal, out):  # pragma: no cover - compiled
    """Every query attends to position 0 (BOS)."""
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            out[b, i, 0] = 1.0


@njit(parallel=True, cache=True)
def _score_window(lengths, n, lo, hi, causal, out):  # pragma: no cover - compiled
    """Keys at relative offsets lo..hi behind the query (j = i - d, lo <= d <= hi; d < 0 looks ahead).

    The offsets are clipped to the keys that exist (0 <= j < length, j <= i when causal), so a row
    costs at most ``length`` steps whatever ``lo`` and ``hi`` are.
    """
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            dlo = max(lo, i - length + 1)
            if causal:
                dlo = max(dlo, 0)
            dhi = min(hi, i)
            for d in range(dlo, dhi + 1):
                out[b, i, i - d] = 1.0


@njit(parallel=True, cache=True)
def _score_decay(lengths, n, rate, causal, out):  # pragma: no cover - compiled
    """Exponential decay rate**|i-j| over visible keys (the query itself scores 1)."""
    nb = lengths.shape[0]
    table = np.empty(max(n, 1), np.float32)
    for d in range(n):
        table[d] = rate ** d
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            for j in range(jmax):
                out[b, i, j] = table[abs(i - j)]


@njit(parallel=True, cache=True)
def _score_uniform(lengths, n, causal, out):  # pragma: no cover - compiled
    """Uniform over all visible keys."""
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            out[b, i, :jmax] = 1.0


@njit(parallel=True, cache=True)
def _score_none(lengths, n, causal, out):  # pragma: no cover - compiled
    """All-zero scores (every visible row falls back to position 0 after normalization)."""
    nb = lengths.shape[0]
    for b in prange(nb):
        out[b] = 0.0


@njit(parallel=True, cache=True)
def _score_same_token(ids, lengths, causal, out):  # pragma: no cover - compiled
    """Keys holding the query's token: earlier ones (causal) or all other ones (non-causal)."""
    nb, n = ids.shape
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            t = ids[b, i]
            jmax = i if causal else length
            for j in range(jmax):
                if j != i and ids[b, j] == t:
                    out[b, i, j] = 1.0


@njit(parallel=True, cache=True)
def _score_same_token_recent(ids, lengths, causal, out):  # pragma: no cover - compiled
    """The most recent earlier occurrence (j < i) of the query's token."""
    nb, n = ids.shape
    for b in prange(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            t = ids[b, i]
            for j in range(i - 1, -1, -1):
                if ids[b, j] == t:
                    out[b, i, j] = 1.0
                    break


@njit(parallel=True, cache=True)
def _score_induction(ids, lengths, causal, out):  # pragma: no cover - compiled
    """Keys right after an earlier (causal) or any other (non-causal) occurrence p of the query's token."""
    nb, n = ids.shape
    for b in prange(nb):
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


@njit(parallel=True, cache=True)
def _score_keys(mask, lengths, causal, out):  # pragma: no cover - compiled
    """All visible keys whose mask is set (key_in_set and other key predicates)."""
    nb, n = mask.shape
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if mask[b, j]:
                    out[b, i, j] = 1.0


@njit(parallel=True, cache=True)
def _score_recent(mask, lengths, causal, out):  # pragma: no cover - compiled
    """The most recent key j <= i whose mask is set."""
    nb, n = mask.shape
    for b in prange(nb):
        out[b] = 0.0
        last = -1
        for i in range(lengths[b]):
            if mask[b, i]:
                last = i
            if last >= 0:
                out[b, i, last] = 1.0


@njit(parallel=True, cache=True)
def _score_group_start(groups, lengths, causal, out):  # pragma: no cover - compiled
    """The first key with the query's group value (sentence start, word start)."""
    nb, n = groups.shape
    for b in prange(nb):
        out[b] = 0.0
        for i in range(lengths[b]):
            g = groups[b, i]
            for j in range(i + 1):
                if groups[b, j] == g:
                    out[b, i, j] = 1.0
                    break


@njit(parallel=True, cache=True)
def _score_same_group(groups, lengths, causal, out):  # pragma: no cover - compiled
    """All visible keys sharing the query's group value, the query included (same word)."""
    nb, n = groups.shape
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            g = groups[b, i]
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if groups[b, j] == g:
                    out[b, i, j] = 1.0


@njit(parallel=True, cache=True)
def _score_dep_head(heads, lengths, causal, out):  # pragma: no cover - compiled
    """The token holding the query's dependency head (none for roots / -1)."""
    nb, n = heads.shape
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            h = heads[b, i]
            if 0 <= h < length and (not causal or h <= i):
                out[b, i, h] = 1.0


@njit(parallel=True, cache=True)
def _score_dep_children(heads, lengths, causal, out):  # pragma: no cover - compiled
    """The visible tokens whose dependency head is the query."""
    nb, n = heads.shape
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            jmax = i + 1 if causal else length
            for j in range(jmax):
                if heads[b, j] == i:
                    out[b, i, j] = 1.0


@njit(parallel=True, cache=True)
def _score_match(qidx, kidx, table, lengths, closest, causal, out):  # pragma: no cover - compiled
    """Fill ``out`` for ``score_match``."""
    nb, n = qidx.shape
    for b in prange(nb):
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


@njit(parallel=True, cache=True)
def _score_profile(lengths, n, w, tail, bos, causal, out):  # pragma: no cover - compiled
    """Key i-d scores w[d] (d < len(w)) or tail; key 0 scores bos when bos >= 0; keys ahead score 0."""
    nb = lengths.shape[0]
    nw = w.shape[0]
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            for j in range(i + 1):
                d = i - j
                v = w[d] if d < nw else tail
                if j == 0 and bos >= 0.0:
                    v = bos
                out[b, i, j] = v


@njit(parallel=True, cache=True)
def _score_class_table(qc, kc, table, lengths, causal, out):  # pragma: no cover - compiled
    """Every visible key j scores table[qc[b, i], kc[b, j]] (query class x key class)."""
    nb, n = qc.shape
    for b in prange(nb):
        out[b] = 0.0
        length = lengths[b]
        for i in range(length):
            row = table[qc[b, i]]
            jmax = i + 1 if causal else length
            for j in range(jmax):
                out[b, i, j] = row[kc[b, j]]


# Allocating wrappers. ``out`` may pass a reusable float32 [B,N,N] buffer (every cell is
# overwritten); otherwise numpy allocates it, not the kernel: numpy puts large arrays on transparent
# huge pages, which made first-touch page faults of a [1000,128,128] float32 batch ~5x cheaper than
# numba-allocated memory on the VMs this was measured on (20 ms vs 110 ms). Fresh memory is the
# dominant cost of a simple primitive, so callers evaluating trees recycle buffers.


def _buffer(out, shape) -> np.ndarray:
    """Return ``out`` after checking it fits, or a new float32 array of ``shape``."""
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}; got {out.dtype} {out.shape}")
    return out


def _clip_offset(offset: int, n: int) -> int:
    """``offset`` clipped to [-(n+1), n+1]: offsets past the sequence select nothing either way, and the
    kernels then never see a value outside int64."""
    return max(-(n + 1), min(int(offset), n + 1))


def score_self(lengths, n, causal, out=None) -> np.ndarray:
    """Each query attends to itself."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_self(lengths, n, causal, out)
    return out


def score_prev(lengths, n, k, causal, out=None) -> np.ndarray:
    """Query i attends to key i-k (k >= 1)."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_prev(lengths, n, _clip_offset(k, n), causal, out)
    return out


def score_next(lengths, n, k, causal, out=None) -> np.ndarray:
    """Query i attends to key i+k (encoders; empty under a causal mask)."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_next(lengths, n, _clip_offset(k, n), causal, out)
    return out


def score_first(lengths, n, causal, out=None) -> np.ndarray:
    """Every query attends to position 0 (BOS)."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_first(lengths, n, causal, out)
    return out


def score_window(lengths, n, lo, hi, causal, out=None) -> np.ndarray:
    """Keys at relative offsets lo..hi behind the query (j = i - d, lo <= d <= hi; d < 0 looks ahead).

    Work per row is at most the sequence length, whatever the offsets.
    """
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_window(lengths, n, _clip_offset(lo, n), _clip_offset(hi, n), causal, out)
    return out


def score_decay(lengths, n, rate, causal, out=None) -> np.ndarray:
    """Exponential decay rate**|i-j| over visible keys (the query itself scores 1)."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_decay(lengths, n, rate, causal, out)
    return out


def score_uniform(lengths, n, causal, out=None) -> np.ndarray:
    """Uniform over all visible keys."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_uniform(lengths, n, causal, out)
    return out


def score_none(lengths, n, causal, out=None) -> np.ndarray:
    """All-zero scores (every visible row falls back to position 0 after normalization)."""
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_none(lengths, n, causal, out)
    return out


def score_same_token(ids, lengths, causal, out=None) -> np.ndarray:
    """Keys holding the query's token: earlier ones (causal) or all other ones (non-causal)."""
    out = _buffer(out, (ids.shape[0], ids.shape[1], ids.shape[1]))
    _score_same_token(ids, lengths, causal, out)
    return out


def score_same_token_recent(ids, lengths, causal, out=None) -> np.ndarray:
    """The most recent earlier occurrence (j < i) of the query's token."""
    out = _buffer(out, (ids.shape[0], ids.shape[1], ids.shape[1]))
    _score_same_token_recent(ids, lengths, causal, out)
    return out


def score_induction(ids, lengths, causal, out=None) -> np.ndarray:
    """Keys right after an earlier (causal) or any other (non-causal) occurrence p of the query's token."""
    out = _buffer(out, (ids.shape[0], ids.shape[1], ids.shape[1]))
    _score_induction(ids, lengths, causal, out)
    return out


def score_keys(mask, lengths, causal, out=None) -> np.ndarray:
    """All visible keys whose mask is set (key_in_set and other key predicates)."""
    out = _buffer(out, (mask.shape[0], mask.shape[1], mask.shape[1]))
    _score_keys(mask, lengths, causal, out)
    return out


def score_recent(mask, lengths, causal, out=None) -> np.ndarray:
    """The most recent key j <= i whose mask is set."""
    out = _buffer(out, (mask.shape[0], mask.shape[1], mask.shape[1]))
    _score_recent(mask, lengths, causal, out)
    return out


def score_group_start(groups, lengths, causal, out=None) -> np.ndarray:
    """The first key with the query's group value (sentence start, word start)."""
    out = _buffer(out, (groups.shape[0], groups.shape[1], groups.shape[1]))
    _score_group_start(groups, lengths, causal, out)
    return out


def score_same_group(groups, lengths, causal, out=None) -> np.ndarray:
    """All visible keys sharing the query's group value, the query included (same word)."""
    out = _buffer(out, (groups.shape[0], groups.shape[1], groups.shape[1]))
    _score_same_group(groups, lengths, causal, out)
    return out


def score_dep_head(heads, lengths, causal, out=None) -> np.ndarray:
    """The token holding the query's dependency head (none for roots / -1)."""
    out = _buffer(out, (heads.shape[0], heads.shape[1], heads.shape[1]))
    _score_dep_head(heads, lengths, causal, out)
    return out


def score_dep_children(heads, lengths, causal, out=None) -> np.ndarray:
    """The visible tokens whose dependency head is the query."""
    out = _buffer(out, (heads.shape[0], heads.shape[1], heads.shape[1]))
    _score_dep_children(heads, lengths, causal, out)
    return out


def score_match(qidx, kidx, table, lengths, closest, causal, out=None) -> np.ndarray:
    """Categorical predicate: keys with table[qidx[i], kidx[j]] set; ``closest`` keeps the nearest one.

    ``qidx``/``kidx`` map each position's feature value to a row/column of ``table`` (-1: value not
    mentioned, never matches). Closest = largest j <= i under a causal mask; otherwise the smallest
    |i - j|, ties to the left.
    """
    out = _buffer(out, (qidx.shape[0], qidx.shape[1], qidx.shape[1]))
    _score_match(qidx, kidx, table, lengths, closest, causal, out)
    return out


def score_profile(lengths, n, w, tail, bos, causal, out=None) -> np.ndarray:
    """Positional profile: key i-d scores w[d] (d < len(w)) else ``tail``; key 0 scores ``bos`` if >= 0.

    Only keys at or behind the query score (d >= 0), with or without a causal mask.
    """
    out = _buffer(out, (lengths.shape[0], n, n))
    _score_profile(lengths, n, np.ascontiguousarray(w, dtype=np.float32), np.float32(tail), np.float32(bos),
                   causal, out)
    return out


def score_class_table(qclass, kclass, table, lengths, causal, out=None) -> np.ndarray:
    """Every visible key j of query i scores ``table[qclass[b, i], kclass[b, j]]`` (int64 [B, N] class
    indices into a float32 [Cq, Ck] table: a categorical query-class x key-class attention)."""
    out = _buffer(out, (qclass.shape[0], qclass.shape[1], qclass.shape[1]))
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


# --------------------------------------------------------------------------------------------
# combinators (in place, vectorized over whole batches)
# --------------------------------------------------------------------------------------------

# Row sums may be reassociated (vectorized); scores here are finite by construction.
_FASTMATH = {"reassoc", "nsz", "arcp", "contract"}


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _row_sum(row):  # pragma: no cover - compiled
    total = 0.0
    for j in range(row.shape[0]):
        total += row[j]
    return total


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def mix_scale(a, weight):  # pragma: no cover - compiled
    """a <- weight * rownorm(a) in place (the first term of a mix); empty rows stay empty."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            row = a[b, i]
            total = _row_sum(row)
            if total > 0.0:
                scale = np.float32(weight / total)
                for j in range(n):
                    row[j] *= scale


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def mix_accumulate(out, a, weight):  # pragma: no cover - compiled
    """out += weight * rownorm(a): each non-empty row of ``a`` contributes ``weight`` of mass."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            row = a[b, i]
            total = _row_sum(row)
            if total > 0.0:
                scale = np.float32(weight / total)
                orow = out[b, i]
                for j in range(n):
                    orow[j] += row[j] * scale


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def fallback_rows(a, alt):  # pragma: no cover - compiled
    """Rows of ``a`` with zero mass are replaced by the same rows of ``alt`` (in place on ``a``)."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            if _row_sum(a[b, i]) <= 0.0:
                a[b, i, :] = alt[b, i, :]


@njit(parallel=True, cache=True)
def gate_rows(qmask, a, alt):  # pragma: no cover - compiled
    """Rows whose query mask is unset take ``alt``'s row (in place on ``a``)."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            if not qmask[b, i]:
                a[b, i, :] = alt[b, i, :]


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def _sharpen_rows(a, t, ti):  # pragma: no cover - compiled
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            row = a[b, i]
            total = 0.0
            for j in range(n):
                v = row[j]
                if v > 0.0:
                    if ti > 0:  # integer exponent: repeated squaring, no pow() call
                        base = np.float64(v)
                        acc = 1.0
                        e = ti
                        while e > 0:
                            if e & 1:
                                acc *= base
                            base *= base
                            e >>= 1
                        row[j] = np.float32(acc)
                    else:
                        row[j] = np.float32(np.float64(v) ** t)
                else:
                    row[j] = 0.0
                total += row[j]
            if total > 0.0:
                inv = np.float32(1.0 / total)
                for j in range(n):
                    row[j] *= inv


def sharpen_rows(a: np.ndarray, t: float) -> None:
    """a <- rownorm(a ** t) for rows with mass (in place); empty rows stay empty."""
    ti = int(t) if float(t).is_integer() and 1 <= t <= 64 else 0
    _sharpen_rows(a, float(t), ti)


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def sharpen_rows_by(a, texp):  # pragma: no cover - compiled
    """a <- rownorm(a ** texp[b, i]) per query row (in place); empty rows stay empty."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            row = a[b, i]
            t = texp[b, i]
            total = 0.0
            for j in range(n):
                v = row[j]
                if v > 0.0:
                    row[j] = np.float32(np.float64(v) ** t)
                else:
                    row[j] = 0.0
                total += row[j]
            if total > 0.0:
                inv = np.float32(1.0 / total)
                for j in range(n):
                    row[j] *= inv


@njit(parallel=True, cache=True)
def multiply(a, other):  # pragma: no cover - compiled
    """a <- a * other, elementwise (in place)."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            row, orow = a[b, i], other[b, i]
            for j in range(n):
                row[j] *= orow[j]


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def row_normalize(a):  # pragma: no cover - compiled
    """Divide every row with positive mass by its sum (in place); empty rows stay empty."""
    nb, n, _ = a.shape
    for b in prange(nb):
        for i in range(n):
            row = a[b, i]
            total = _row_sum(row)
            if total > 0.0:
                inv = np.float32(1.0 / total)
                for j in range(n):
                    row[j] *= inv


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def empty_rows(a):  # pragma: no cover - compiled
    """Boolean [B,N]: rows of ``a`` with no positive mass."""
    nb, n, _ = a.shape
    res = np.empty((nb, n), np.bool_)
    for b in prange(nb):
        for i in range(n):
            res[b, i] = _row_sum(a[b, i]) <= 0.0
    return res
