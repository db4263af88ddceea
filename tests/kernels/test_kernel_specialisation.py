"""Specialised sparse kernels (headsurgeon/kernels/specialise.py): every flag combination of each kernel equals a plain numpy
reference on random inputs, so a build whose constant flags were wired wrong (count vs fill pass, normalized rows,
causal mask, skip-self, closest, merge mode) fails here."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from headsurgeon.kernels import primitives as K
from headsurgeon.kernels.cache import TensorCache
from headsurgeon.kernels.normalize import normalize_rows
from headsurgeon.kernels.primitives.sparse_prims import _sp_offset
from headsurgeon.kernels.sparse import from_dense, from_packed, pack_sequences, packed_valid
from headsurgeon.kernels.specialise import specialised

B, N = 5, 11
FLAGS = list(itertools.product((False, True), (False, True)))  # (causal, normalized)


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, N + 1, B).astype(np.int64)
    lengths[0] = N
    ids = rng.integers(0, 4, (B, N)).astype(np.int64)
    groups = np.sort(rng.integers(0, 4, (B, N)), axis=1).astype(np.int64)
    values = rng.integers(-1, 3, (B, N)).astype(np.int64)
    heads = rng.integers(-1, N, (B, N)).astype(np.int64)
    mask = rng.random((B, N)) < 0.3
    return rng, lengths, ids, groups, values, heads, mask


def _reference(keys_of, lengths: np.ndarray, causal: bool) -> np.ndarray:
    """Dense float32 [B, N, N] indicator of ``keys_of(b, i, L)`` on visible cells only."""
    out = np.zeros((B, N, N), dtype=np.float32)
    for b, L in enumerate(lengths):
        for i in range(L):
            for j in keys_of(b, i, int(L)):
                if 0 <= j < L and (not causal or j <= i):
                    out[b, i, j] = 1.0
    return out


def _normalized(dense: np.ndarray, lengths: np.ndarray, causal: bool) -> np.ndarray:
    """The normalization rules in numpy: rows divided by their sums, an empty visible row attends to key 0."""
    out = np.zeros_like(dense)
    for b, L in enumerate(lengths):
        for i in range(L):
            row = dense[b, i, : (i + 1 if causal else L)].astype(np.float64)
            total = row.sum()
            if total > 0:
                out[b, i, : row.size] = (row / total).astype(np.float32)
            else:
                out[b, i, 0] = 1.0
    return out


def _check(rows, want: np.ndarray, lengths: np.ndarray, causal: bool, normalized: bool, what: str) -> None:
    expect = _normalized(want, lengths, causal) if normalized else want
    assert rows.normalized == normalized
    np.testing.assert_array_equal(rows.to_dense(), expect, err_msg=f"{what} causal={causal} normalized={normalized}")


def _primitive_cases(ids, groups, values, heads, mask, table, qidx, kidx):
    """(name, call(lengths, causal, normalized), keys_of(b, i, L)) for every sparse primitive kernel."""

    def match_keys(closest: bool, causal: bool):
        def keys(b, i, L):
            hit = [j for j in range(L) if qidx[b, i] >= 0 and kidx[b, j] >= 0 and table[qidx[b, i], kidx[b, j]]
                   and (not causal or j <= i)]
            if not closest or not hit:
                return hit
            return [min(hit, key=lambda j: (abs(i - j), j))]
        return keys

    def induction(b, i, L, causal):
        pmax = i if causal else L - 1
        return [p + 1 for p in range(pmax) if p != i and ids[b, p] == ids[b, i]]

    return [
        ("self", lambda lg, c, nz: K.sparse_self(lg, N, c, nz), lambda c: lambda b, i, L: [i]),
        ("prev(2)", lambda lg, c, nz: K.sparse_prev(lg, N, 2, c, nz), lambda c: lambda b, i, L: [i - 2]),
        ("next(1)", lambda lg, c, nz: K.sparse_next(lg, N, 1, c, nz), lambda c: lambda b, i, L: [i + 1]),
        ("first", lambda lg, c, nz: K.sparse_first(lg, N, c, nz), lambda c: lambda b, i, L: [0]),
        ("window(-1, 2)", lambda lg, c, nz: K.sparse_window(lg, N, -1, 2, c, nz),
         lambda c: lambda b, i, L: [i - d for d in range(-1, 3)]),
        ("none", lambda lg, c, nz: K.sparse_none(lg, N, c, nz), lambda c: lambda b, i, L: []),
        ("group_start", lambda lg, c, nz: K.sparse_group_start(groups, lg, c, nz),
         lambda c: lambda b, i, L: [next(j for j in range(i + 1) if groups[b, j] == groups[b, i])]),
        ("same_group", lambda lg, c, nz: K.sparse_same_group(groups, lg, c, nz),
         lambda c: lambda b, i, L: [j for j in range(L) if groups[b, j] == groups[b, i]]),
        ("same_value", lambda lg, c, nz: K.sparse_same_value(values, lg, c, nz),
         lambda c: lambda b, i, L: [j for j in range(L) if j != i and values[b, i] >= 0 and values[b, j] == values[b, i]]),
        ("dep_head", lambda lg, c, nz: K.sparse_dep_head(heads, lg, c, nz), lambda c: lambda b, i, L: [heads[b, i]]),
        ("dep_children", lambda lg, c, nz: K.sparse_dep_children(heads, lg, c, nz),
         lambda c: lambda b, i, L: [j for j in range(L) if heads[b, j] == i]),
        ("same_token (linked)", lambda lg, c, nz: K.sparse_same_token(ids, lg, c, nz),
         lambda c: lambda b, i, L: [j for j in range(L) if j != i and ids[b, j] == ids[b, i]]),
        ("same_token (scan)", lambda lg, c, nz: K.sparse_same_token(ids - 1, lg, c, nz),  # a negative id: the scan
         lambda c: lambda b, i, L: [j for j in range(L) if j != i and ids[b, j] == ids[b, i]]),
        ("same_token_recent", lambda lg, c, nz: K.sparse_same_token_recent(ids, lg, c, nz),
         lambda c: lambda b, i, L: [max([j for j in range(i) if ids[b, j] == ids[b, i]], default=-1)]),
        ("induction", lambda lg, c, nz: K.sparse_induction(ids, lg, c, nz),
         lambda c: lambda b, i, L: induction(b, i, L, c)),
        ("ngram_induction(2)", lambda lg, c, nz: K.sparse_ngram_induction(ids, lg, 2, c, nz),
         lambda c: lambda b, i, L: [p + 1 for p in range(1, i if c else L - 1) if p != i and i >= 1
                                    and ids[b, p] == ids[b, i] and ids[b, p - 1] == ids[b, i - 1]]),
        ("keys", lambda lg, c, nz: K.sparse_keys(mask, lg, c, nz), lambda c: lambda b, i, L: list(np.flatnonzero(mask[b]))),
        ("recent", lambda lg, c, nz: K.sparse_recent(mask, lg, c, nz),
         lambda c: lambda b, i, L: [max([j for j in range(i + 1) if mask[b, j]], default=-1)]),
        ("match(all)", lambda lg, c, nz: K.sparse_match(qidx, kidx, table, lg, False, c, nz),
         lambda c: match_keys(False, c)),
        ("match(closest)", lambda lg, c, nz: K.sparse_match(qidx, kidx, table, lg, True, c, nz),
         lambda c: match_keys(True, c)),
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_flag_combination_of_every_sparse_primitive_matches_numpy(seed: int) -> None:
    rng, lengths, ids, groups, values, heads, mask = _inputs(seed)
    table = rng.random((3, 3)) < 0.5
    qidx = rng.integers(-1, 3, (B, N)).astype(np.int64)
    kidx = rng.integers(-1, 3, (B, N)).astype(np.int64)
    for name, call, keys in _primitive_cases(ids, groups, values, heads, mask, table, qidx, kidx):
        for causal, normalized in FLAGS:
            want = _reference(keys(causal), lengths, causal)
            _check(call(lengths, causal, normalized), want, lengths, causal, normalized, name)


def test_normalize_rows_matches_numpy_causal_or_not() -> None:
    rng, lengths, *_ = _inputs(3)
    dense = (rng.random((B, N, N)) * (rng.random((B, N, N)) < 0.4)).astype(np.float32)
    dense[1, 2] = 0.0  # an empty row
    full = from_dense(dense, np.full(B, N))  # keys outside the visible grid too: normalization drops them
    full = type(full)(full.rowptr, full.cols, full.vals, lengths, N)
    for causal in (False, True):
        got = normalize_rows(full, causal).to_dense()
        np.testing.assert_allclose(got, _normalized(dense, lengths, causal), rtol=1e-6, atol=0)


def test_merge_and_pick_builds_match_numpy() -> None:
    rng, lengths, *_ = _inputs(4)
    lengths[:] = N

    def rand_rows():
        d = (rng.random((B, N, N)) * (rng.random((B, N, N)) < 0.3)).astype(np.float32)
        return d, from_dense(d, lengths)

    (da, a), (db, b) = rand_rows(), rand_rows()
    rowsum = db.astype(np.float64).sum(-1, keepdims=True)
    norm_b = np.divide(db, rowsum, out=np.zeros_like(db), where=rowsum > 0)
    np.testing.assert_allclose(K.sparse_mix_add(a, b, 0.3).to_dense(), da + 0.3 * norm_b, rtol=1e-6)
    np.testing.assert_allclose(K.sparse_raw_add(a, b, 2.0).to_dense(), da + 2.0 * db, rtol=1e-6)
    np.testing.assert_array_equal(K.sparse_mul(a, b).to_dense(), da * db)
    empty = da.sum(-1) <= 0
    np.testing.assert_array_equal(K.sparse_fallback(a, b).to_dense(), np.where(empty[..., None], db, da))
    gate = rng.random((B, N)) < 0.5
    np.testing.assert_array_equal(K.sparse_gate(gate, a, b).to_dense(), np.where(gate[..., None], da, db))


def test_a_specialised_kernel_has_one_build_per_flag_combination() -> None:
    assert _sp_offset(True, False, True) is _sp_offset(np.bool_(True), np.bool_(False), np.bool_(True))
    builds = {_sp_offset(f, nz, c) for f, nz, c in itertools.product((False, True), repeat=3)}
    assert len(builds) == 8
    for (fill, norm, causal), build in _sp_offset.builds.items():  # the flags are the build's closure constants
        assert [cell.cell_contents for cell in build.py_func.__closure__] == [causal, fill, norm]

    @specialised()
    def scale(double):
        def scale(x):
            return x * 2 if double else x
        return scale

    assert scale(True)(3) == 6 and scale(False)(3) == 3


def test_packed_sequences_round_trip_and_damaged_ones_are_refused() -> None:
    rng, lengths, ids, *_ = _inputs(5)
    for rows in (K.sparse_window(lengths, N, 0, 2, True, True), K.sparse_same_token(ids, lengths, False, True)):
        packed = pack_sequences(rows)
        assert packed_valid(packed, lengths).all()
        np.testing.assert_array_equal(from_packed(packed, N).to_dense(), rows.to_dense())
        bad = [p.copy() for p in packed]
        bad[1][4 + 1] = -7  # a row pointer that goes down
        bad[2] = bad[2][:-1]  # truncated
        assert packed_valid(bad, lengths).tolist() == [True, False, False] + [True] * (B - 3)
        assert not packed_valid(packed, lengths + 1).any()  # the wrong length is a miss
        with pytest.raises(ValueError, match="not a packed sparse sequence"):
            from_packed(bad, N)


def test_get_many_counts_like_get() -> None:
    cache = TensorCache()
    cache.put_many({"a": np.zeros(2), "b": np.ones(2)})
    got = cache.get_many(["a", "x", "b", "a"])
    assert sorted(got) == ["a", "b"]
    stats = cache.stats
    assert (stats.hits, stats.misses) == (3, 1)
