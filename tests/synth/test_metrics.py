"""Metrics (docs/architecture.md) against a literal, looping transcription of the formulas and hand cases."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headsurgeon.synth import metrics as M
from headsurgeon.synth.metrics import jsd_distance, score_many, soft_iou, topq_iou

SQRT_LN2 = math.sqrt(math.log(2.0))


# --------------------------------------------------------------------------- reference (plain Python)
def ref_sequence(p, q, L, causal, frac=0.025, count=None):
    """(soft IoU, JSD distance, top-q IoU) of one sequence, written straight from the definitions in docs/architecture.md."""
    cells = [(i, j) for i in range(L) for j in range(L) if (j <= i or not causal)]
    val_p = {c: float(p[c]) for c in cells}
    val_q = {c: float(q[c]) for c in cells}
    num = sum(min(val_p[c], val_q[c]) for c in cells)
    den = sum(max(val_p[c], val_q[c]) for c in cells)
    iou = num / den if den > 0 else 1.0

    dists = []
    for i in range(L):
        keys = [j for j in range(L) if (j <= i or not causal)]
        if not keys:
            continue
        kl_p = kl_q = 0.0
        for j in keys:
            a, b = val_p[(i, j)], val_q[(i, j)]
            m = (a + b) / 2
            if a > 0:
                kl_p += a * math.log(a / m)
            if b > 0:
                kl_q += b * math.log(b / m)
        dists.append(math.sqrt(max(0.0, 0.5 * kl_p + 0.5 * kl_q)))
    jsd = sum(dists) / len(dists)

    if count is None:
        k = max(1, math.ceil(frac * len(cells) - 1e-9))
    else:
        k = min(count, len(cells))

    def top(vals):
        ranked = sorted((c for c in cells if vals[c] > 0), key=lambda c: (-vals[c], c[0], c[1]))
        return set(ranked[:k])

    sa, sb = top(val_p), top(val_q)
    union = sa | sb
    tq = len(sa & sb) / len(union) if union else 1.0
    return iou, jsd, tq


def ref_many(real, cand, lengths, causal, **kw):
    """[3, H, P, B] of reference values by a plain loop over every (head, program, sequence)."""
    H, B = real.shape[:2]
    P = cand.shape[0]
    out = np.zeros((3, H, P, B))
    for h in range(H):
        for p in range(P):
            for b in range(B):
                out[:, h, p, b] = ref_sequence(real[h, b], cand[p, b], int(lengths[b]), causal, **kw)
    return out


# --------------------------------------------------------------------------- pattern makers
def random_patterns(rng, shape, lengths, causal, sparsity=0.5, normalize=True, dtype=np.float32):
    """Random attention-like patterns; zeros outside the grid, some cells exactly zero."""
    x = rng.random(shape) ** 3
    x[rng.random(shape) < sparsity] = 0.0
    n = shape[-1]
    pos = np.arange(n)
    for b, L in enumerate(lengths):
        vis = (pos[:, None] < L) & (pos[None, :] < L)
        if causal:
            vis &= pos[None, :] <= pos[:, None]
        x[..., b, :, :] *= vis
        if normalize:
            rows = x[..., b, :L, :L].sum(-1, keepdims=True)
            empty = rows[..., 0] == 0
            x[..., b, :L, 0][empty] = 1.0
            x[..., b, :L, :L] /= np.where(rows == 0, 1.0, rows)
    return x.astype(dtype)


# --------------------------------------------------------------------------- hand cases
@pytest.mark.parametrize("causal", [True, False])
def test_identical_patterns(causal):
    rng = np.random.default_rng(0)
    lengths = np.array([7, 3, 1])
    p = random_patterns(rng, (3, 7, 7), lengths, causal)
    np.testing.assert_allclose(soft_iou(p, p, lengths, causal), 1.0, atol=1e-12)
    np.testing.assert_allclose(jsd_distance(p, p, lengths, causal), 0.0, atol=1e-6)
    np.testing.assert_allclose(topq_iou(p, p, lengths, causal), 1.0)


def test_disjoint_one_hot_rows():
    # bidirectional: every row of p attends to key 0, every row of q to key 1 -> nothing shared
    L = 5
    p = np.zeros((1, L, L), np.float32)
    q = np.zeros((1, L, L), np.float32)
    p[0, :, 0] = 1.0
    q[0, :, 1] = 1.0
    assert soft_iou(p, q, [L], causal=False)[0] == 0.0
    assert jsd_distance(p, q, [L], causal=False)[0] == pytest.approx(SQRT_LN2, abs=1e-12)
    assert topq_iou(p, q, [L], causal=False)[0] == 0.0


def test_causal_first_vs_self():
    # causal: p = first(), q = self(); row 0 agrees, rows 1.. are disjoint one-hots
    L = 6
    p = np.zeros((1, L, L), np.float32)
    q = np.zeros((1, L, L), np.float32)
    p[0, :, 0] = 1.0
    q[0, np.arange(L), np.arange(L)] = 1.0
    assert soft_iou(p, q, [L], True)[0] == pytest.approx(1.0 / (2 * L - 1), abs=1e-12)
    assert jsd_distance(p, q, [L], True)[0] == pytest.approx((L - 1) / L * SQRT_LN2, abs=1e-12)


def test_two_token_hand_computed():
    p = np.array([[[1.0, 0.0], [0.5, 0.5]]], np.float32)
    q = np.array([[[1.0, 0.0], [1.0, 0.0]]], np.float32)
    # sum min = 1 + 0.5 + 0 = 1.5; sum max = 1 + 1 + 0.5 = 2.5
    assert soft_iou(p, q, [2], True)[0] == pytest.approx(0.6, abs=1e-12)
    # row 1: m = (.75, .25); KL(p||m) = .5 ln(4/3); KL(q||m) = ln(4/3); JSD^2 = .75 ln(4/3)
    expected = (0.0 + math.sqrt(0.75 * math.log(4.0 / 3.0))) / 2
    assert jsd_distance(p, q, [2], True)[0] == pytest.approx(expected, abs=1e-12)
    # 3 visible cells -> q = 1: p's top cell is (0,0) (ties with nothing: 1.0 > 0.5), q's is (0,0) too
    assert topq_iou(p, q, [2], True)[0] == 1.0
    # with q = 2: p keeps {(0,0), (1,0)} (0.5 tie -> earlier cell), q keeps {(0,0), (1,0)}
    assert topq_iou(p, q, [2], True, count=2)[0] == 1.0
    # with q = 3: p keeps all three, q only its two positive cells -> 2/3
    assert topq_iou(p, q, [2], True, count=3)[0] == pytest.approx(2 / 3)


def test_masked_and_padded_entries_do_not_count():
    rng = np.random.default_rng(1)
    lengths = np.array([5, 3])
    p = random_patterns(rng, (2, 6, 6), lengths, True)
    q = random_patterns(rng, (2, 6, 6), lengths, True)
    base = [f(p, q, lengths, True) for f in (soft_iou, jsd_distance, topq_iou)]
    p2, q2 = p.copy(), q.copy()
    upper = np.triu(np.ones((6, 6), bool), 1)
    p2[:, upper] = 7.0                 # above the diagonal: masked for a decoder
    q2[:, upper] = 3.0
    p2[1, 3:, :] = 5.0                 # padding rows / columns of the short sequence
    q2[1, :, 3:] = np.nan              # even NaN in padding is ignored
    got = [f(p2, q2, lengths, True) for f in (soft_iou, jsd_distance, topq_iou)]
    for a, b in zip(base, got):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- against the reference
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_score_many_matches_reference(causal, dtype):
    rng = np.random.default_rng(2 if causal else 3)
    lengths = np.array([9, 4, 1, 7, 9])
    H, P, B, N = 3, 4, 5, 9
    real = random_patterns(rng, (H, B, N, N), lengths, causal, sparsity=0.1, dtype=dtype)
    cand = random_patterns(rng, (P, B, N, N), lengths, causal, sparsity=0.7, dtype=dtype)
    cand[1] = real[0]  # one exact match
    # float64 is documented to be read as float32: the reference sees the values the kernels see
    as_read = (lambda x: x.astype(np.float32)) if dtype == np.float64 else (lambda x: x)
    ref = ref_many(as_read(real), as_read(cand), lengths, causal)
    got = score_many(real, cand, lengths, causal, per_sequence=True)
    for k, name in enumerate(M.METRICS):
        assert got[name].shape == (H, P, B)
        np.testing.assert_allclose(got[name], ref[k], rtol=1e-9, atol=1e-7, err_msg=name)
    means = score_many(real, cand, lengths, causal)
    for k, name in enumerate(M.METRICS):
        assert means[name].shape == (H, P)
        np.testing.assert_allclose(means[name], ref[k].mean(axis=2), rtol=1e-9, atol=1e-7, err_msg=name)


def test_float16_reads_same_values_as_float32():
    rng = np.random.default_rng(4)
    lengths = np.array([8, 5])
    real = random_patterns(rng, (2, 2, 8, 8), lengths, True, dtype=np.float16)
    cand = random_patterns(rng, (3, 2, 8, 8), lengths, True, dtype=np.float32)
    a = score_many(real, cand, lengths, True, per_sequence=True)
    b = score_many(real.astype(np.float32), cand.astype(np.float16).astype(np.float32), lengths, True,
                   per_sequence=True)
    c = score_many(real, cand.astype(np.float16), lengths, True, per_sequence=True)
    for name in M.METRICS:
        np.testing.assert_allclose(b[name], c[name], rtol=1e-12, atol=1e-12)
        assert np.isfinite(a[name]).all()


def test_blocking_does_not_change_results(monkeypatch):
    rng = np.random.default_rng(5)
    lengths = np.array([6, 6, 2, 5])
    real = random_patterns(rng, (2, 4, 6, 6), lengths, True, sparsity=0.2)
    cand = random_patterns(rng, (5, 4, 6, 6), lengths, True, sparsity=0.6)
    whole = score_many(real, cand, lengths, True, per_sequence=True)
    monkeypatch.setattr(M, "_BLOCK_CELLS", 40)  # forces several sequence and program blocks
    blocked = score_many(real, cand, lengths, True, per_sequence=True, max_nnz=10)
    blocked_means = score_many(real, cand, lengths, True, max_nnz=10)
    for name in M.METRICS:
        np.testing.assert_allclose(blocked[name], whole[name], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(blocked_means[name], whole[name].mean(axis=2), rtol=1e-12, atol=1e-12)


def test_metric_subset_and_topq_count():
    rng = np.random.default_rng(6)
    lengths = np.array([6, 4])
    real = random_patterns(rng, (2, 2, 6, 6), lengths, False, sparsity=0.0)
    cand = random_patterns(rng, (2, 2, 6, 6), lengths, False, sparsity=0.3)
    only = score_many(real, cand, lengths, False, metrics=("jsd",))
    assert set(only) == {"jsd"}
    ref = ref_many(real, cand, lengths, False, count=4)
    got = score_many(real, cand, lengths, False, metrics=["topq"], topq_q=4, per_sequence=True)
    np.testing.assert_allclose(got["topq"], ref[2])
    np.testing.assert_allclose(only["jsd"], ref[1].mean(axis=2), atol=1e-7)


def test_uniform_ties_follow_row_major_order():
    # uniform-causal: all cells of row i equal 1/(i+1); ties must go to earlier cells in both patterns
    L = 12
    u = np.tril(np.ones((L, L))) / np.arange(1, L + 1)[:, None]
    p = u[None].astype(np.float32)
    q = p.copy()
    q[0, L - 1] = 0.0
    q[0, L - 1, L - 1] = 1.0
    ref = ref_sequence(p[0], q[0], L, True)
    assert topq_iou(p, q, [L], True)[0] == pytest.approx(ref[2])
    assert soft_iou(p, q, [L], True)[0] == pytest.approx(ref[0], abs=1e-12)


# --------------------------------------------------------------------------- property tests
@st.composite
def pattern_pairs(draw):
    causal = draw(st.booleans())
    B = draw(st.integers(1, 3))
    N = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, N), min_size=B, max_size=B))
    cell = st.one_of(st.just(0.0), st.floats(0.0, 1.0, allow_subnormal=False), st.sampled_from([0.25, 0.5]))
    p = np.array(draw(st.lists(cell, min_size=B * N * N, max_size=B * N * N)), np.float32).reshape(B, N, N)
    q = np.array(draw(st.lists(cell, min_size=B * N * N, max_size=B * N * N)), np.float32).reshape(B, N, N)
    return p, q, np.array(lengths), causal


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern_pairs())
def test_property_matches_reference_and_is_symmetric(case):
    p, q, lengths, causal = case
    got = score_many(p[None], q[None], lengths, causal, per_sequence=True)
    swapped = score_many(q[None], p[None], lengths, causal, per_sequence=True)
    for b in range(len(lengths)):
        ref = ref_sequence(p[b], q[b], int(lengths[b]), causal)
        for k, name in enumerate(M.METRICS):
            assert got[name][0, 0, b] == pytest.approx(ref[k], abs=1e-7), name
    for name in M.METRICS:
        np.testing.assert_allclose(got[name], swapped[name], atol=1e-7)
    assert np.all((got["iou"] >= 0) & (got["iou"] <= 1 + 1e-12))
    assert np.all((got["topq"] >= 0) & (got["topq"] <= 1))


def normalize_rows(x, lengths, causal):
    """Mask to the grid and row-normalize; empty rows attend to key 0 (as the framework does)."""
    x = x.copy()
    pos = np.arange(x.shape[-1])
    for b, L in enumerate(lengths):
        vis = (pos[:, None] < L) & (pos[None, :] < L)
        if causal:
            vis &= pos[None, :] <= pos[:, None]
        x[b] *= vis
        rows = x[b, :L].sum(-1)
        x[b, :L][rows == 0, 0] = 1.0
        x[b, :L] /= x[b, :L].sum(-1, keepdims=True)
    return x


@settings(max_examples=20, deadline=None)
@given(pattern_pairs())
def test_property_jsd_bounded_for_distributions(case):
    p, q, lengths, causal = case
    pn, qn = normalize_rows(p, lengths, causal), normalize_rows(q, lengths, causal)
    d = jsd_distance(pn, qn, lengths, causal)
    assert np.all(d >= 0) and np.all(d <= SQRT_LN2 + 1e-7)  # disjoint rows reach sqrt(ln 2) up to float rounding
    iou = soft_iou(pn, qn, lengths, causal)
    assert np.all((iou >= 0) & (iou <= 1 + 1e-12))


# --------------------------------------------------------------------------- errors
def test_errors_are_clear():
    p = np.zeros((1, 3, 3), np.float32)
    p[0, :, 0] = 1
    with pytest.raises(ValueError, match="negative or non-finite"):
        bad = p.copy()
        bad[0, 2, 1] = -0.5
        soft_iou(bad, p, [3], True)
    with pytest.raises(ValueError, match="negative or non-finite"):
        bad = p.copy()
        bad[0, 1, 0] = np.inf
        jsd_distance(p, bad, [3], True)
    with pytest.raises(ValueError, match="unknown metrics"):
        score_many(p[None], p[None], [3], True, metrics=("ppl",))
    with pytest.raises(ValueError, match="length >= 1"):
        soft_iou(p, p, [0], True)
    with pytest.raises(ValueError, match="exceeds the padded"):
        soft_iou(p, p, [4], True)
    with pytest.raises(ValueError, match="batch sizes disagree"):
        soft_iou(p, p, [3, 3], True)
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        soft_iou(p.astype(np.int32), p, [3], True)
    with pytest.raises(ValueError, match=r"\[H,B,N,N\]"):
        score_many(p, p, [3], True)


def test_fast_log_matches_math_log():
    from numba import njit

    from headsurgeon.kernels.metrics_kernels import fast_log

    @njit
    def logs(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = fast_log(x[i])
        return out

    rng = np.random.default_rng(8)
    x = np.concatenate([rng.random(20000) * 2, 10.0 ** rng.uniform(-45, 0.3, 20000),
                        np.float16(rng.random(2000)).astype(np.float64), [1.0, 2.0, 0.5, np.sqrt(2.0)]])
    x = x[x > 0]
    np.testing.assert_allclose(logs(x), np.log(x), rtol=1e-15, atol=4e-15)
    assert 0.0 * logs(np.array([0.0]))[0] == 0.0


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_real_patterns_reused_across_candidate_blocks(cache_bytes):
    rng = np.random.default_rng(9)
    lengths = np.array([7, 5, 2])
    real = random_patterns(rng, (2, 3, 7, 7), lengths, True, sparsity=0.1, dtype=np.float16)
    blocks = [random_patterns(rng, (P, 3, 7, 7), lengths, True, sparsity=0.6) for P in (3, 1, 2)]
    prepared = M.RealPatterns(real, lengths, True, topq_cache_bytes=cache_bytes)
    for cand in blocks:
        got = prepared.score(cand, per_sequence=True)
        ref = ref_many(real, cand, lengths, True)
        for k, name in enumerate(M.METRICS):
            np.testing.assert_allclose(got[name], ref[k], rtol=1e-9, atol=1e-7, err_msg=name)
    assert (prepared._topq is not None) == (cache_bytes > 0)
    bad = real.copy()
    bad[1, 2, 1, 0] = -1
    with pytest.raises(ValueError, match=r"real\[1\] sequence 2"):
        M.RealPatterns(bad, lengths, True)
