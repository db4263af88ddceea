"""``hs.evaluate_programs`` (surgery/eval_report.py): both kinds of program measured side by side, the ΔPPL
sweep order (surgery/sweep_order.py), the report as text, JSON and a plot, on the embedded model (seconds)."""
from __future__ import annotations

import json

import pytest

import headsurgeon as hs
from headsurgeon.kernels.core import InputError
from headsurgeon.surgery.eval_report import EvalReport, evaluate_programs
from headsurgeon.surgery.evaluate import per_head_delta_ppl
from headsurgeon.surgery.replace import head_name
from headsurgeon.surgery.sweep_order import cheapest, order_heads
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet


def program_set() -> ProgramSet:
    """Three heads; two have a readable explanation different from their replacement, L1H2 has none."""
    ps = ProgramSet(model="tiny-stories")
    fitted = Program.parse("0.9*prev(1) + 0.1*uniform()")
    ps.add((0, 1), fitted, "hand", {"test": {"iou": 0.6}},
           explanation=ScoredProgram.of(Program.parse("first()"), "hand", {"test": {"iou": 0.5}}, budget=200))
    ps.add((1, 2), fitted, "hand", {"test": {"iou": 0.4}})
    ps.add((2, 0), Program.parse("prev(1)"), "hand", {"test": {"iou": 0.9}},
           explanation=ScoredProgram.of(Program.parse("self()"), "hand", {"test": {"iou": 0.3}}, budget=200))
    return ps


@pytest.fixture(scope="module")
def handle():
    return hs.load_model("tiny-stories")


@pytest.fixture(scope="module")
def splits(handle):
    return hs.load_corpus(handle, hs.demo_corpus_path(), max_len=32, max_sequences=40)


@pytest.fixture(scope="module")
def report(handle, splits) -> EvalReport:
    return evaluate_programs(handle, splits, program_set(), per_head=True, sweep=True, order="both")


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
        assert kr.order_delta_pct == pytest.approx({head_name(h): 100 * d for h, d in measured.items()})
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
    report = evaluate_programs(handle, splits.test, ps, which="replacement", per_head=True, sweep=True,
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


def test_the_plot_has_a_row_of_panels_per_kind(report, tmp_path, monkeypatch):
    from headsurgeon.surgery import eval_plot

    seen = {}
    real = eval_plot.save_figure

    def keep(fig, out):
        seen["panels"] = [(ax.get_title(), ax.get_yscale(), len(ax.get_lines())) for ax in fig.axes]
        return real(fig, out)

    monkeypatch.setattr(eval_plot, "save_figure", keep)
    png = report.plot(tmp_path / "sweep.png")
    assert seen["panels"] == [("replacements: ΔPPL (3 heads)", "symlog", 4), ("explanations: ΔPPL (2 heads)", "symlog", 4)]
    assert png.stat().st_size > 10_000 and report.to_json()["sweep_png"] == str(png)
    assert f"sweep plot: {png}" in report.format()


def test_the_api_is_public_and_refuses_bad_arguments(handle, splits):
    assert hs.evaluate_programs is evaluate_programs and hs.EvalReport is EvalReport
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
    from pathlib import Path

    tasks = Path(__file__).resolve().parent / "lm_eval_tasks"
    report = evaluate_programs(handle, splits, program_set(), tasks="hs_cloze", limit=4, include_path=str(tasks))
    rep, exp = (report.kinds[k].downstream for k in ("replacement", "explanation"))
    assert rep["hybrid_heads"] == 3 and exp["hybrid_heads"] == 2
    assert [r["base"] for r in rep["rows"]] == [r["base"] for r in exp["rows"]]  # the same examples, the same base
    text = report.format()
    assert "per task, seed 0; se = lm-eval's standard error), replacements (3 heads):" in text
    assert "per task, seed 0; se = lm-eval's standard error), explanations (2 heads):" in text
