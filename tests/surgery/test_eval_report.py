"""``hs.evaluate_programs`` (headsurgeon/surgery/measure/eval_report.py): both kinds of program measured side by side, KL(base ‖ hybrid)
beside ΔPPL in every measurement (headsurgeon/surgery/measure/divergence.py), the ΔPPL sweep order (headsurgeon/surgery/measure/sweep_order.py), the report
as text, JSON, HTML and a plot, on the embedded model (seconds)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import headsurgeon as hs
from headsurgeon.core import InputError
from headsurgeon.surgery.measure.eval_report import EvalReport, evaluate_programs
from headsurgeon.surgery.measure.divergence import BaseDistributions, summarize, window_costs
from headsurgeon.surgery.measure.evaluate import per_head_delta_ppl, window_losses
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.surgery.measure.sweep_order import cheapest, iou_split, order_heads
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.core import Head


def program_set() -> ProgramSet:
    """Three heads; two have a readable explanation different from their replacement, L1H2 has none."""
    ps = ProgramSet(model="tiny-stories")
    fitted = Program.parse("0.9*prev(1) + 0.1*uniform()")
    ps.add((0, 1), fitted, "hand", {"test": {"iou": 0.6, "jsd": 0.3}},
           explanation=ScoredProgram.of(Program.parse("first()"), "hand", {"test": {"iou": 0.5}}, budget=200))
    ps.add((1, 2), fitted, "hand", {"test": {"iou": 0.4, "jsd": 0.5}})
    ps.add((2, 0), Program.parse("prev(1)"), "hand", {"test": {"iou": 0.9, "jsd": 0.1}},
           explanation=ScoredProgram.of(Program.parse("self()"), "hand", {"test": {"iou": 0.3}}, budget=200))
    return ps


@pytest.fixture(scope="module")
def report(handle, splits) -> EvalReport:
    return evaluate_programs(handle, splits, program_set(), delta_ppl=True, sweep=True, order="both")


def test_both_kinds_are_measured_and_labelled(report):
    rep, exp = report.kinds["replacement"], report.kinds["explanation"]
    assert (rep.heads, rep.neural, exp.heads, exp.neural) == (3, [], 2, ["L1H2"])
    assert rep.hybrid_ppl != exp.hybrid_ppl
    assert {r["head"] for r in rep.per_head} == {"L0H1", "L1H2", "L2H0"}
    assert {r["head"]: r["program"] for r in exp.per_head} == {"L0H1": "first()", "L2H0": "self()"}
    for kr in (rep, exp):  # all of a kind's heads swapped: the sweep's last step is the headline
        assert kr.sweep[-1]["n_heads"] == kr.heads
        assert 100 * kr.sweep[-1]["delta"] == pytest.approx(kr.hybrid_delta_pct, rel=1e-9)
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["which"] == ["replacement", "explanation"] and doc["headline"] == "replacement"
    assert doc["kinds"]["explanation"]["neural"] == ["L1H2"] and doc["kinds"]["explanation"]["neural_count"] == 1
    assert doc["hybrid_ppl"] == doc["kinds"]["replacement"]["hybrid_ppl"]  # the top level repeats the headline kind
    text = report.format()
    assert "explanations, 2 of 3 program heads (1 without an explanation stays neural: L1H2)" in text
    assert "replacements, all 3 program heads" in text and "expl. ΔPPL %" in text and "cheapest order" in text


def test_the_delta_ppl_order_sorts_heads_by_their_per_head_cost_on_the_select_windows(report, handle, splits):
    assert report.order_on == "select" and report.order_sequences == len(splits.select)
    for kind, kr in report.kinds.items():
        measured = per_head_delta_ppl(handle, program_set().programs(kind), splits.select, progress=False)
        assert kr.order_delta_pct == pytest.approx({Head.label(h): 100 * d for h, d in measured.items()})
        assert kr.head_orders["delta_ppl"] == sorted(kr.order_delta_pct, key=kr.order_delta_pct.get)
        assert kr.head_orders["iou"] == [str(h) for h in order_heads(program_set(), "iou", which=kind)]


def test_each_sweep_step_names_the_cheaper_order(report):
    labels = {"delta": "IoU order", "delta_by_delta_ppl": "ΔPPL order", "delta_random_order": "random order"}
    for kr in report.kinds.values():
        for row in kr.sweep:
            assert row["cheapest"] == cheapest({label: row[key] for key, label in labels.items()})
        assert kr.sweep[0]["cheapest"] == kr.sweep[-1]["cheapest"] == "all equal"  # no head / every head


def test_measured_on_the_same_windows_the_first_delta_ppl_step_is_the_cheapest_single_head(handle, splits):
    ps = program_set()
    report = evaluate_programs(handle, splits.test, ps, which="replacement", delta_ppl=True, sweep=True,
                               order="both")  # a list of windows: the order is measured on them (in-sample)
    kr = report.kinds["replacement"]
    assert report.order_on == "test" and list(report.kinds) == ["replacement"]
    one = next(r for r in kr.sweep if r["n_heads"] == 1)
    cheapest_head = min(kr.per_head, key=lambda r: r["delta_pct"])
    assert kr.head_orders["delta_ppl"][0] == cheapest_head["head"]
    assert 100 * one["delta_by_delta_ppl"] == pytest.approx(cheapest_head["delta_pct"], rel=1e-9)
    assert one["delta_by_delta_ppl"] <= one["delta"] + 1e-12
    assert "in-sample" in report.format()


def test_order_heads_by_each_rule_and_its_errors():
    ps = program_set()
    assert order_heads(ps, "iou") == [(2, 0), (0, 1), (1, 2)] == ps.ranked("test")
    assert order_heads(ps, "iou", which="explanation") == [(0, 1), (2, 0)]  # the explanations' own IoU
    assert order_heads(ps, "delta_ppl", deltas={"L0H1": 0.3, "L1H2": -0.1, "L2H0": 0.2}) == [(1, 2), (2, 0), (0, 1)]
    assert sorted(order_heads(ps, "random", seed=3)) == sorted(ps.keys())
    with pytest.raises(InputError, match="per_head_delta_ppl"):
        order_heads(ps, "delta_ppl")
    with pytest.raises(InputError, match="L1H2"):
        order_heads(ps, "delta_ppl", deltas={"L0H1": 0.3, "L2H0": 0.2})
    with pytest.raises(InputError, match="by must be"):
        order_heads(ps, "size")


def test_the_iou_order_ranks_on_the_select_split_the_programs_were_chosen_on():
    ps = ProgramSet(model="tiny-stories")  # select and test disagree: test IoU must not order a sweep judged on test
    for head, select, test in (((0, 1), 0.9, 0.2), ((1, 2), 0.5, 0.8), ((2, 0), 0.7, 0.5)):
        ps.add(head, Program.parse("prev(1)"), "hand", {"select": {"iou": select}, "test": {"iou": test}})
    assert iou_split(ps) == "select" and iou_split(program_set()) == "test"  # hand-made sets carry no select scores
    assert order_heads(ps, "iou") == [(0, 1), (2, 0), (1, 2)]
    assert order_heads(ps, "iou", split="test") == [(1, 2), (2, 0), (0, 1)] == ps.ranked("test")


def test_the_plot_has_a_row_of_panels_per_kind(report, tmp_path, monkeypatch):
    from headsurgeon.surgery.measure import plots

    seen = {}
    real = plots.save_figure

    def keep(fig, out):
        seen["panels"] = [(ax.get_title(), ax.get_yscale(), len(ax.get_lines())) for ax in fig.axes]
        return real(fig, out)

    monkeypatch.setattr(plots, "save_figure", keep)
    png = report.plot(tmp_path / "sweep.png")
    assert seen["panels"] == [("replacements: ΔPPL (3 heads)", "symlog", 4), ("explanations: ΔPPL (2 heads)", "symlog", 4)]
    assert png.stat().st_size > 10_000 and report.to_json()["sweep_png"] == str(png)
    assert f"sweep plot: {png}" in report.format()


def test_the_api_is_public_and_refuses_bad_arguments(handle, splits):
    assert hs.evaluate_programs is evaluate_programs
    with pytest.raises(InputError, match="which"):
        evaluate_programs(handle, splits, program_set(), which="readable")
    with pytest.raises(InputError, match="sweep=True"):
        evaluate_programs(handle, splits, program_set(), order="delta_ppl")
    with pytest.raises(InputError, match="ProgramSet"):
        evaluate_programs(handle, splits, {"L0H1": "prev(1)"})
    base = evaluate_programs(handle, splits)  # no programs: the base alone
    assert base.kinds == {} and base.to_json()["ppl"] == base.ppl > 1


def test_a_set_without_explanations_says_so(handle, splits):
    ps = ProgramSet(model="tiny-stories")
    ps.add((0, 1), Program.parse("prev(1)"), "hand")
    report = evaluate_programs(handle, splits, ps)
    assert report.kinds["explanation"].heads == 0 and report.kinds["explanation"].neural == ["L0H1"]
    assert "explanations: none of the 1 program heads has an explanation" in report.format()
    assert report.to_json()["headline"] == "replacement"


def test_downstream_tasks_run_for_each_kind(handle, splits):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install 'headsurgeon[eval]'")
    from conftest import TASKS

    tasks = TASKS
    report = evaluate_programs(handle, splits, program_set(), tasks="hs_cloze", task_limit=4, include_path=str(tasks))
    rep, exp = (report.kinds[k].downstream for k in ("replacement", "explanation"))
    assert rep["hybrid_heads"] == 3 and exp["hybrid_heads"] == 2
    assert [r["base"] for r in rep["rows"]] == [r["base"] for r in exp["rows"]]  # the same examples, the same base
    text = report.format()
    assert "per task, seed 0; se = lm-eval's standard error), replacements (3 heads):" in text
    assert "per task, seed 0; se = lm-eval's standard error), explanations (2 heads):" in text


def old_delta_ppl(base: tuple, other: tuple, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The report's ΔPPL before KL joined it: window_losses' sums, the bootstrap taken over exp(ΔNLL) − 1."""
    (nll_a, count_a), (nll_b, count_b) = base, other
    point = math.exp(nll_b.sum() / count_b.sum() - nll_a.sum() / count_a.sum()) - 1
    idx = np.random.default_rng(seed).integers(0, len(nll_a), size=(n_boot, len(nll_a)))
    a = nll_a[idx].sum(1) / np.maximum(count_a[idx].sum(1), 1)
    b = nll_b[idx].sum(1) / np.maximum(count_b[idx].sum(1), 1)
    low, high = np.quantile(np.exp(b - a) - 1, [0.025, 0.975])
    return point, float(low), float(high)


@pytest.mark.filterwarnings("ignore:.*keep their neural attention")
def test_delta_ppl_is_unchanged_and_kl_is_divergence_on_the_same_windows(report, handle, splits):
    base = window_losses(handle, splits.test, progress=False)
    assert report.ppl == pytest.approx(math.exp(base[0].sum() / base[1].sum()), rel=1e-12)
    assert report.test_tokens == base[1].sum() == sum(s.n - 1 for s in splits.test)
    dists = BaseDistributions(handle, splits.test)
    for kind, kr in report.kinds.items():
        with replace_heads(handle, program_set(), which=kind) as hybrid:
            other = window_losses(hybrid, splits.test, progress=False)
            direct = summarize(window_costs(dists, hybrid, hybrid.register_sequences))
        delta, low, high = old_delta_ppl(base, other)
        assert kr.hybrid_ppl == pytest.approx(math.exp(other[0].sum() / other[1].sum()), rel=1e-12)
        assert kr.hybrid_delta_pct == pytest.approx(100 * delta, rel=1e-9)
        # the interval's ends: expm1 of the ΔNLL quantile, where the old code took the quantile of exp − 1
        assert kr.hybrid_delta_ci95_pct == pytest.approx([100 * low, 100 * high], abs=1e-4)
        assert (kr.kl, kr.kl_ci95, kr.delta_nll, kr.tokens) == (direct.kl, list(direct.kl_ci95), direct.delta_nll,
                                                                 direct.tokens)
        measured = per_head_delta_ppl(handle, program_set().programs(kind), splits.test, progress=False)
        assert {r["head"]: r["delta_pct"] for r in kr.per_head} == pytest.approx(
            {Head.label(h): 100 * d for h, d in measured.items()}, rel=1e-9)


def test_every_measurement_carries_kl_beside_delta_ppl(report):
    from scipy.stats import spearmanr

    for kr in report.kinds.values():
        assert kr.tokens == report.test_tokens > 0 and 0 < kr.kl_ci95[0] <= kr.kl <= kr.kl_ci95[1]
        assert kr.hybrid_delta_pct == pytest.approx(100 * math.expm1(kr.delta_nll), rel=1e-12)
        assert kr.delta_nll_ci95[0] <= kr.delta_nll <= kr.delta_nll_ci95[1]
        assert not kr.delta_wide and not kr.kl_wide  # a large effect on 8 windows: the intervals are narrower
        for row in kr.sweep:
            assert all(row["kl" + arm] >= 0 for arm in ("", "_random_order", "_random_program", "_by_delta_ppl"))
        assert kr.sweep[0]["kl"] == 0.0 and kr.sweep[-1]["kl"] == kr.kl  # no head swapped; every head: the headline
        per_head = {r["head"]: r for r in kr.per_head}
        for row in (r for r in kr.sweep if r["n_heads"] == 1):  # a one-head step is that head's per-head swap
            assert row["kl"] == per_head[kr.head_orders["iou"][0]]["kl"]
        for r in kr.per_head:
            assert r["kl_ci95"][0] <= r["kl"] <= r["kl_ci95"][1] and r["kl"] > 0
            assert r["delta_ci95_pct"][0] <= r["delta_pct"] <= r["delta_ci95_pct"][1]
    rep = report.kinds["replacement"]
    assert set(rep.spearman_kl) == {"iou", "jsd"} and {sp["heads"] for sp in rep.spearman_kl.values()} == {3}
    for measure in ("iou", "jsd"):
        want = spearmanr([r[measure] for r in rep.per_head], [r["kl"] for r in rep.per_head]).statistic
        assert rep.spearman_kl[measure]["rho"] == pytest.approx(want)
    assert report.kinds["explanation"].spearman_kl is None  # two heads with an explanation: too few to rank


def test_json_and_text_carry_kl_its_interval_and_the_tokens(report):
    doc = json.loads(json.dumps(report.to_json()))
    rep = doc["kinds"]["replacement"]
    for key in ("kl", "kl_ci95", "delta_nll", "delta_nll_ci95", "tokens", "delta_wide", "kl_wide", "spearman_kl"):
        assert doc[key] == rep[key]  # the top level repeats the headline kind's
    assert doc["test_tokens"] == report.test_tokens and rep["delta_wide"] is False
    assert {"kl", "kl_random_order", "kl_random_program", "kl_by_delta_ppl"} <= set(rep["sweep"][-1])
    assert {"iou", "jsd", "delta_pct", "delta_ci95_pct", "kl", "kl_ci95"} <= set(rep["per_head"][0])
    kr, text = report.kinds["replacement"], report.format()
    assert (f"KL(base ‖ hybrid) {kr.kl:.4g} nats/token ({kr.kl_ci95[0]:.4g} .. {kr.kl_ci95[1]:.4g}) over "
            f"{report.test_tokens} predicted test tokens") in text
    assert f"on {report.test_sequences} test windows ({report.test_tokens} predicted tokens)" in text
    assert "KL (IoU order)" in text and "KL (ΔPPL order)" in text and "repl. KL" in text and "expl. KL" in text
    assert "Spearman(IoU, KL), replacements: rho" in text and "Spearman(JSD, KL), replacements: rho" in text
    assert "wider than the effect" not in text


def test_the_html_cost_section_shows_kl_beside_delta_ppl(report):
    from headsurgeon.report.cost import cost_html

    page = cost_html(report)
    kr = report.kinds["replacement"]
    assert "KL(base ‖ hybrid), nats/token" in page and f"<td class='num'>{kr.kl:.3g}</td>" in page
    assert f"<td class='num'>{kr.kl_ci95[0]:.3g} … {kr.kl_ci95[1]:.3g}</td>" in page
    assert f"({report.test_tokens} predicted tokens)" in page
    assert "KL · IoU order" in page and "KL · random programs" in page and "replacements KL" in page
    assert "Spearman(IoU, KL), replacements" in page and "Spearman(JSD, KL), replacements" in page
    assert "class='wide'" not in page


def test_a_one_window_measurement_says_more_test_windows_are_needed(handle, splits):
    from headsurgeon.report.cost import cost_html

    report = evaluate_programs(handle, splits.test[:1], program_set(), which="replacement")
    kr = report.kinds["replacement"]
    assert kr.delta_wide and kr.kl_wide and report.test_tokens == kr.tokens == splits.test[0].n - 1
    assert report.to_json()["kl_wide"] is True
    note = "ΔPPL and KL intervals wider than the effect: more test windows needed"
    assert note in report.format() and f"<p class='wide'>replacements: {note}.</p>" in cost_html(report)


def test_known_per_head_delta_ppl_is_kept_unmeasured_and_its_kl_left_missing(handle, splits):
    report = evaluate_programs(handle, splits, program_set(), which="replacement", delta_ppl=True,
                               known_per_head={"replacement": {"L0H1": 0.5}})
    rows = {r["head"]: r for r in report.kinds["replacement"].per_head}
    assert rows["L0H1"]["delta_pct"] == 50.0 and rows["L0H1"]["kl"] is None and rows["L0H1"]["kl_ci95"] is None
    assert rows["L2H0"]["kl"] > 0 and rows["L1H2"]["kl"] > 0
    assert report.kinds["replacement"].spearman_kl is None  # two heads with a KL: too few to rank
    line = next(x for x in report.format().splitlines() if x.startswith("L0H1"))
    assert "+50.00" in line and " - " in line


def test_a_program_is_evaluated_once_across_the_swaps_of_a_sweep(handle, splits):
    """Every swap of one measurement shares a pattern cache: the sweep's steps re-use a program's patterns (a
    sandboxed library program would otherwise run again at every step)."""
    from headsurgeon.surgery.measure.eval_report import SwapCosts

    costs = SwapCosts(handle, splits.test[:3])
    costs.measure({(0, 1): Program.parse("prev(1)")})
    first = costs.patterns.stats
    assert first.misses > 0 and first.hits == 0
    costs.measure({(0, 1): Program.parse("prev(1)"), (1, 0): Program.parse("first()")})
    second = costs.patterns.stats
    assert second.hits >= first.misses, "the second swap evaluated prev(1) again"
