"""normalize_scores (numba) against a plain-loop reference of the normalization contract (docs/architecture.md)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headsurgeon.kernels.normalize import normalize_scores, visible_mask


def reference(scores: np.ndarray, lengths: np.ndarray, causal: bool) -> np.ndarray:
    """Mask, clip, row-normalize; empty visible rows -> position 0; padded rows zero (loops, float64)."""
    nb, n, _ = scores.shape
    out = np.zeros((nb, n, n))
    for b in range(nb):
        length = int(lengths[b])
        for i in range(length):
            keys = range(i + 1) if causal else range(length)
            row = {j: max(float(scores[b, i, j]), 0.0) for j in keys}
            total = sum(row.values())
            if total > 0:
                for j, v in row.items():
                    out[b, i, j] = v / total
            else:
                out[b, i, 0] = 1.0
    return out


@st.composite
def score_batches(draw) -> tuple[np.ndarray, np.ndarray]:
    """Random scores with negatives, exact zeros, whole-zero rows and junk (incl. NaN) outside the mask."""
    nb = draw(st.integers(1, 4))
    n = draw(st.integers(1, 10))
    lengths = np.array(draw(st.lists(st.integers(0, n), min_size=nb, max_size=nb)), dtype=np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scores = rng.normal(size=(nb, n, n))
    scores[rng.random(size=scores.shape) < 0.4] = 0.0
    scores[rng.random(size=(nb, n)) < 0.2] = 0.0  # whole rows without mass
    scores *= 10.0 ** rng.integers(-3, 4)
    return scores, lengths


def _junk_outside(scores: np.ndarray, lengths: np.ndarray, causal: bool) -> np.ndarray:
    junk = scores.copy()
    hidden = ~visible_mask(lengths, scores.shape[1], causal)
    junk[hidden] = np.where(np.arange(hidden.sum()) % 2 == 0, np.nan, np.inf)
    return junk


@settings(max_examples=200, deadline=None)
@given(batch=score_batches(), causal=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]))
def test_numpy_matches_reference(batch, causal: bool, dtype) -> None:
    scores, lengths = batch
    scores = scores.astype(dtype)
    want = reference(scores, lengths, causal)
    got = normalize_scores(scores, lengths, causal)
    assert got.dtype == np.float32 and got.shape == scores.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    # anything outside the visible grid (NaN and inf included) is ignored
    got_junk = normalize_scores(_junk_outside(scores, lengths, causal), lengths, causal)
    np.testing.assert_array_equal(got_junk, got)


def test_hand_computed_case() -> None:
    scores = np.array([[[5.0, 9.0, 9.0], [-1.0, 3.0, 7.0], [2.0, -4.0, 2.0]],
                       [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0]]])
    lengths = np.array([3, 2])
    got = normalize_scores(scores, lengths, causal=True)
    want = np.array([[[1, 0, 0], [0, 1, 0], [0.5, 0, 0.5]],
                     [[1, 0, 0], [1, 0, 0], [0, 0, 0]]], dtype=np.float32)
    np.testing.assert_allclose(got, want)
    got_nc = normalize_scores(scores, lengths, causal=False)
    np.testing.assert_allclose(got_nc[0, 0], [5 / 23, 9 / 23, 9 / 23], rtol=1e-6)
    np.testing.assert_allclose(got_nc[0, 1], [0, 0.3, 0.7], rtol=1e-6)  # -1 clipped to 0


def test_zero_rows_attend_to_position_zero() -> None:
    got = normalize_scores(np.zeros((1, 4, 4)), np.array([3]), causal=False)
    np.testing.assert_array_equal(got[0, :3], [[1, 0, 0, 0]] * 3)
    assert not got[0, 3].any()  # padded query row stays zero


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_visible_score_raises(bad: float) -> None:
    scores = np.ones((2, 4, 4))
    scores[1, 2, 1] = bad
    fn = normalize_scores
    with pytest.raises(ValueError, match=r"non-finite.*sequence 1, query 2, key 1"):
        fn(scores, np.array([4, 4]), True)
    scores[1, 2, 1] = 1.0
    scores[1, 1, 2] = bad  # above the diagonal: masked when causal, visible otherwise
    fn(scores, np.array([4, 4]), True)
    with pytest.raises(ValueError, match="non-finite"):
        fn(scores, np.array([4, 4]), False)


def test_shape_errors() -> None:
    fn = normalize_scores
    with pytest.raises(ValueError, match=r"\[B, N, N\]"):
        fn(np.zeros((2, 3, 4)), np.array([3, 3]), True)
    with pytest.raises(ValueError, match="batch size"):
        fn(np.zeros((2, 3, 3)), np.array([3]), True)
    with pytest.raises(ValueError, match="lengths must lie"):
        fn(np.zeros((1, 3, 3)), np.array([4]), True)


def test_integer_and_empty_inputs() -> None:
    got = normalize_scores(np.ones((1, 2, 2), dtype=np.int64), np.array([2]), True)
    np.testing.assert_allclose(got[0], [[1, 0], [0.5, 0.5]])
    assert normalize_scores(np.zeros((0, 3, 3)), np.zeros(0, np.int64), True).shape == (0, 3, 3)


@settings(max_examples=100, deadline=None)
@given(batch=score_batches(), causal=st.booleans())
def test_masked_in_place_matches(batch, causal: bool) -> None:
    """masked=True (cells outside the grid already 0) in place gives the same result as the full path."""
    scores, lengths = batch
    scores = np.where(visible_mask(lengths, scores.shape[1], causal), scores, 0).astype(np.float32)
    want = normalize_scores(scores, lengths, causal)
    buf = scores.copy()
    got = normalize_scores(buf, lengths, causal, out=buf, masked=True)
    assert got is buf
    np.testing.assert_array_equal(got, want)
