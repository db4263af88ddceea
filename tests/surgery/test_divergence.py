"""headsurgeon/surgery/measure/divergence.py: per-window KL(base ‖ other) and NLLs from one base pass, checked against torch written out
per window, against window_losses' perplexity (pseudo-perplexity for a masked LM), and its intervals' wide flags;
on the embedded model (seconds)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headsurgeon.surgery.measure.divergence import (BaseDistributions, WindowCosts, base_costs, means, summarize,
                                            window_costs)
from headsurgeon.surgery.measure.evaluate import window_losses
from headsurgeon.surgery.swap.replace import replace_heads


@pytest.fixture(scope="module")
def windows(splits):
    return splits.test


@pytest.fixture(scope="module")
def base(handle, windows):
    return BaseDistributions(handle, windows)


def swapped(handle, base, heads, program="first()"):
    """Per-window costs of the hybrid with ``program`` in every head of ``heads``."""
    with replace_heads(handle, {h: program for h in heads}) as hybrid:
        return window_costs(base, hybrid, hybrid.register_sequences)


def part(costs: WindowCosts, rows: slice) -> WindowCosts:
    return WindowCosts(costs.kl[rows], costs.nll_base[rows], costs.nll_other[rows], costs.tokens[rows])


def test_the_base_against_itself_costs_exactly_nothing(handle, windows, base):
    itself = window_costs(base, lambda ids, attention_mask=None: handle.forward(ids, attention_mask))
    s = summarize(itself)
    assert np.all(itself.kl == 0.0) and s.kl == 0.0 and s.kl_ci95 == (0.0, 0.0)
    assert s.delta_ppl == 0.0 and s.delta_ppl_ci95 == (0.0, 0.0) and not (s.kl_wide or s.delta_wide)
    nll, count = window_losses(handle, windows, progress=False)  # the perplexity path: the same sums, bit for bit
    own = base_costs(base)
    assert np.array_equal(own.nll_base, nll) and np.array_equal(itself.nll_other, nll)
    assert np.array_equal(own.tokens, count) and s.tokens == count.sum() == sum(w.n - 1 for w in windows)


def test_kl_and_nll_are_torch_written_out_per_window(handle, windows, base):
    costs = swapped(handle, base, [(1, 2)], "prev(1)")
    with replace_heads(handle, {(1, 2): "prev(1)"}) as hybrid, torch.no_grad():
        hybrid.register_sequences(windows)
        for i, w in enumerate(windows):  # one window at a time, no padding: the definition
            ids = torch.from_numpy(w.ids).long()[None]
            p = torch.log_softmax(handle.forward(ids)[0, :-1].double(), -1)
            q = torch.log_softmax(hybrid(ids)[0, :-1].double(), -1)
            kl = float((p.exp() * (p - q)).sum())
            target = ids[0, 1:]
            assert costs.kl[i] == pytest.approx(kl, rel=1e-4, abs=1e-6)
            assert costs.nll_base[i] == pytest.approx(float(-p[torch.arange(w.n - 1), target].sum()), rel=1e-5)
            assert costs.nll_other[i] == pytest.approx(float(-q[torch.arange(w.n - 1), target].sum()), rel=1e-5)
            assert costs.tokens[i] == w.n - 1
    kl, delta_nll = means(costs)
    s = summarize(costs)
    assert (s.kl, s.delta_nll) == (kl, delta_nll) and s.kl_ci95[0] <= kl <= s.kl_ci95[1]
    t = costs.tokens.sum()
    assert s.delta_ppl == pytest.approx(math.exp(costs.nll_other.sum() / t) / math.exp(costs.nll_base.sum() / t) - 1,
                                        rel=1e-9)  # ΔPPL: the ratio of the two perplexities


def test_swapping_more_heads_raises_kl(handle, base):
    nested = [[(0, 0)], [(0, 0), (1, 1), (2, 2), (3, 3)], [(layer, h) for layer in range(4) for h in range(4)]]
    kls = [means(swapped(handle, base, heads))[0] for heads in nested]
    assert 0 < kls[0] < kls[1] < kls[2]


def test_a_one_or_two_window_measurement_is_wider_than_its_effect_and_a_large_effect_is_not(handle, base):
    small = swapped(handle, base, [(0, 0)], "uniform()")  # a small effect: ΔPPL within a fraction of a percent
    one, two = summarize(part(small, slice(0, 1))), summarize(part(small, slice(0, 2)))
    assert one.windows == 1 and one.kl_ci95[0] == one.kl_ci95[1] and one.kl_wide and one.delta_wide  # no spread
    assert two.windows == 2 and two.delta_wide
    large = summarize(swapped(handle, base, [(layer, h) for layer in range(4) for h in range(4)]))
    assert large.delta_ppl > 1 and not large.delta_wide and not large.kl_wide
    assert "wider than the effect" in two.describe() and "wider" not in large.describe()


def test_a_masked_lm_is_measured_as_pseudo_perplexity(random_models, documents):
    from headsurgeon.surgery.corpus import make_sequences

    bert = random_models["bert"]
    seqs = make_sequences(bert, documents[:3], max_len=12)[:3]
    base = BaseDistributions(bert, seqs, batch_size=4)
    nll, count = window_losses(bert, seqs, batch_size=4, progress=False)
    own = base_costs(base)
    assert np.array_equal(own.tokens, count) and own.nll_base == pytest.approx(nll, rel=1e-6)
    itself = window_costs(base, lambda ids, attention_mask=None: bert.forward(ids, attention_mask))
    assert np.all(itself.kl == 0.0)
    with replace_heads(bert, {(1, 2): "uniform()"}) as hybrid:
        costs = window_costs(base, hybrid, hybrid.register_sequences)
        swapped_nll, _ = window_losses(hybrid, seqs, batch_size=4, progress=False)
    assert costs.nll_other == pytest.approx(swapped_nll, rel=1e-6) and means(costs)[0] > 0
