"""explain measures both kinds of program as eval does (headsurgeon/explain_measure.py → headsurgeon/surgery/measure/eval_report.py):
the sweep at 0/10/25/50/100% per kind, per-head ΔPPL with Spearman and its interval, the ΔPPL order naming the
cheaper order, the held-out cloze, and timings whose total does not add nested phases. One small run on the
embedded model, shared by the tests."""
from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

import headsurgeon as hs
from headsurgeon.configs import MeasureConfig
from headsurgeon.explain_measure import measure_and_report, nest_timings, sweep_rows, total_seconds
from headsurgeon.report import words
from headsurgeon.surgery.measure.eval_report import SWEEP_STEPS
from headsurgeon.surgery.measure.sweep_order import ORDER_LABELS, cheapest

LM_EVAL = importlib.util.find_spec("lm_eval") is not None
KINDS = ("replacement", "explanation")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from headsurgeon.pipeline import explain

    out = tmp_path_factory.mktemp("explain-measures")
    result = explain("tiny-stories", hs.demo_corpus_path(), out, max_len=24, max_sequences=16,
                     searchers=["enumerative"], delta_ppl=True, order="delta_ppl", cloze=LM_EVAL, task_limit=4,
                     progress=False)
    summary = json.loads((out / "summary.json").read_text())
    return result, summary, (out / "report.html").read_text(encoding="utf-8")


@pytest.mark.e2e
def test_summary_and_report_carry_both_kinds_sweeps(run):
    result, summary, page = run
    ev = result.evaluation
    assert list(ev.kinds) == list(KINDS) and all(ev.kinds[k].heads for k in KINDS)
    assert summary["evaluation"] == json.loads(json.dumps(ev.to_json()))
    for kind in KINDS:
        kr = summary["evaluation"]["kinds"][kind]
        assert kr["sweep"][-1]["n_heads"] == kr["heads"] and "hybrid_delta_ci95_pct" in kr
        assert f"id='sweep-{kind}'" in page
    assert {r["which"] for r in result.sweep} == set(KINDS) and result.sweep == sweep_rows(ev)
    assert "id='sweep'" in page and "id='cost'" in page  # the plot, one panel per kind, and the headline table
    table = result.summary_table()
    assert "replacements, all" in table and "explanations, " in table
    assert table.count("replacements ") >= len(SWEEP_STEPS) and table.count("explanations ") >= len(SWEEP_STEPS)


@pytest.mark.e2e
def test_the_sweep_steps_are_the_papers_fractions(run):
    result, _, page = run
    assert SWEEP_STEPS == (0.0, 0.1, 0.25, 0.5, 1.0)
    for kind in KINDS:
        kr = result.evaluation.kinds[kind]
        assert [r["fraction"] for r in kr.sweep] == list(SWEEP_STEPS)
        assert [r["n_heads"] for r in kr.sweep] == [round(f * kr.heads) for f in SWEEP_STEPS]
    assert "<td>10% (2)</td>" in page


@pytest.mark.e2e
def test_per_head_delta_ppl_and_spearman_with_its_interval_for_each_kind(run):
    result, _, page = run
    ev = result.evaluation
    for kind in KINDS:
        sp = ev.kinds[kind].spearman
        assert sp["heads"] == ev.kinds[kind].heads
        low, high = sp["ci95"]
        assert -1 <= low <= sp["rho"] <= high <= 1
        assert f"Spearman(IoU, ΔPPL), {kind}s" in page and f"Spearman(IoU, ΔPPL), {kind}s" in result.summary_table()
    # the replacements' per-head ΔPPL is the search tasks' own measurement on the test windows, not a second one
    rep = {r["head"]: r["delta_pct"] / 100 for r in ev.kinds["replacement"].per_head}
    assert rep == {f"L{h[0]}H{h[1]}": d for h, d in result.delta_ppl.items()}
    assert "id='per-head-cost'" in page


@pytest.mark.e2e
def test_the_delta_ppl_order_names_the_cheaper_order(run):
    result, _, page = run
    ev = result.evaluation
    assert ev.order_on == "select" and ev.order_sequences == len(result.splits.select)
    for kind in KINDS:
        kr = ev.kinds[kind]
        assert kr.sweep_orders == ["delta_ppl"]
        assert kr.head_orders["delta_ppl"] == sorted(kr.order_delta_pct, key=lambda h: (kr.order_delta_pct[h], h))
        for row in kr.sweep:
            assert row["cheapest"] == cheapest({ORDER_LABELS["delta_ppl"]: row["delta"],
                                                ORDER_LABELS["random"]: row["delta_random_order"]})
    assert "cheaper order: <b>" in page and "ΔPPL · ΔPPL order" in page and "select windows" in page


@pytest.mark.skipif(not LM_EVAL, reason="lm-eval is not installed: pip install 'headsurgeon[eval]'")
@pytest.mark.e2e
def test_the_held_out_cloze_is_scored_for_each_kind(run):
    result, summary, page = run
    for kind in KINDS:
        rows = result.evaluation.kinds[kind].downstream["rows"]
        assert {r["task"] for r in rows} == {"headsurgeon_cloze"} and {"base", "hybrid"} <= set(rows[0])
        assert f"id='downstream-{kind}'" in page
    assert (result.out / "cloze" / "headsurgeon_cloze.yaml").is_file()


@pytest.mark.e2e
def test_cloze_is_written_from_the_test_windows_and_added_to_the_tasks(run, monkeypatch, tmp_path):
    """Wiring only: a stand-in for headsurgeon/surgery/measure/cloze.py and for the measurement."""
    result = run[0]
    seen = {}

    def fake_cloze(documents, folder, *, name="headsurgeon_cloze", limit=None, seed=0):
        seen["documents"], seen["seed"] = documents, seed
        return "my_cloze", folder

    class Stop(Exception):
        pass

    def fake_evaluate(handle, splits, programs, config, **kw):
        seen.update(kw, tasks=config.tasks, include_path=config.include_path)
        raise Stop

    import headsurgeon.explain_measure as em
    import headsurgeon.surgery.measure.cloze as cloze

    monkeypatch.setattr(cloze, "write_cloze_task", fake_cloze)
    monkeypatch.setattr(em, "evaluate_programs", fake_evaluate)
    heads = SimpleNamespace(timings={}, delta_ppl={})
    with pytest.raises(Stop):
        measure_and_report(None, None, result.splits, None, tmp_path,
                           MeasureConfig(tasks=["hs_cloze"], include_path="tasks_here", cloze=True), heads=heads,
                           vocab=None, timings={}, notes=[], seed=3)
    assert seen["documents"] == [s.text for s in result.splits.test] and seen["seed"] == 3
    assert seen["tasks"] == ["hs_cloze", "my_cloze"]
    assert seen["include_path"] == ["tasks_here", str(tmp_path / "cloze")]
    assert seen["which"] == "both" and seen["sweep"] and seen["task_sweep"] is False


@pytest.mark.e2e
def test_the_total_time_is_the_runs_wall_not_the_sum_of_nested_phases(run):
    flat = {"load": 10.0, "capture": 20.0, "heads_wall": 300.0, "enumerative": 180.0, "learned": 120.0,
            "select": 10.0, "save": 1.0}
    nested = nest_timings(flat, ["heads_wall", "enumerative", "learned", "select"])
    assert nested["search"] == {"wall": 300.0, "enumerative": 180.0, "learned": 120.0, "select": 10.0}
    assert total_seconds(nested) == 331.0  # not 641, the sum of every number above
    sentence = words.timings_sentence({**nested, "total": total_seconds(nested)})
    assert sentence == ("load 10 s, capture 20 s, search 5 min (enumerative 3 min, learned 2 min, select 10 s), "
                        "save 1.0 s (total 5 min 31 s)")
    result, summary, page = run  # the real run: parts nested under their phase, the total their walls' sum
    timings = result.timings
    assert "enumerative" in timings["search"] and "select" in timings["search"] and "enumerative" not in timings
    walls = [v["wall"] if isinstance(v, dict) else v for k, v in timings.items() if k != "total"]
    assert timings["total"] == pytest.approx(sum(walls)) and summary["timings_s"] == json.loads(json.dumps(timings))
    before_report = total_seconds({k: v for k, v in timings.items() if k not in ("report", "total")})
    assert "report" in timings and f"(total {words.seconds(before_report)})" in page  # the page shows what preceded it


def test_the_stage_table_shows_each_phase_its_share_and_its_parts():
    from headsurgeon.explain_measure import format_timings

    table = format_timings({"load": 10.0, "capture": 5.0, "search": {"wall": 30.0, "enumerative": 50.0, "select": 8.0},
                            "measure": {"wall": 5.0, "sweep": 4.0}, "total": 50.0}).splitlines()
    assert table[1].split() == ["load", "10.0", "20%"]
    assert table[3].split()[:3] == ["search", "30.0", "60%"] and "enumerative 50.0, select 8.0" in table[3]
    assert table[-1].split() == ["total", "50.0"]
