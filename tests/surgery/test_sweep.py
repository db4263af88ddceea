"""The one replacement sweep (headsurgeon/surgery/measure/sweep.py): ``sweep_programs`` and ``evaluate_programs``' sweep build
the same rows, every arm matches a perplexity measured on its own (headsurgeon/surgery/measure/evaluate.py), and
``evaluate_programs`` takes MeasureConfig's names (the old keyword names warn), on the embedded model (seconds)."""
from __future__ import annotations

import math

import pytest

from headsurgeon.core import Head, InputError
from headsurgeon.surgery.configs import MeasureConfig
from headsurgeon.surgery.measure.divergence import BaseDistributions, means, window_costs
from headsurgeon.surgery.measure.eval_report import evaluate_programs
from headsurgeon.surgery.measure.evaluate import perplexity, replacement_sweep, sweep_arms
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.surgery.measure.sweep import sweep_programs
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet

PROGRAMS = {"L0H1": "0.9*prev(1) + 0.1*uniform()", "L1H2": "first()", "L2H0": "prev(1)", "L3H3": "self()"}
ORDER = ["L2H0", "L0H1", "L3H3", "L1H2"]
STEPS = (0.0, 0.25, 0.5, 1.0)


@pytest.fixture(scope="module")
def rows(handle, splits):
    return sweep_programs(handle, PROGRAMS, splits.test, order=ORDER, steps=STEPS, seed=3, progress=False)


def test_every_arm_is_the_perplexity_and_kl_of_its_own_swap(handle, splits, rows):
    """The rows as the sweep in headsurgeon/surgery/measure/evaluate.py measured them before there was one sweep (perplexity of
    each arm's hybrid over the base's), with KL from headsurgeon/surgery/measure/divergence.py beside them."""
    test = splits.test
    base_ppl = perplexity(handle, test, progress=False)
    base = BaseDistributions(handle, test)
    items = {Head.parse(h): p for h, p in PROGRAMS.items()}
    arms = list(sweep_arms(items, [Head.parse(h) for h in ORDER], STEPS, 3))
    assert [(r["fraction"], r["n_heads"]) for r in rows] == [(f, k) for f, k, _ in arms]
    for row, (_frac, _k, chosen_by_arm) in zip(rows, arms):
        for label, chosen in chosen_by_arm.items():
            if not chosen:
                ppl, kl = base_ppl, 0.0
            else:
                with replace_heads(handle, chosen) as hybrid:
                    ppl = perplexity(hybrid, test, progress=False)
                with replace_heads(handle, chosen) as hybrid:
                    kl = means(window_costs(base, hybrid, hybrid.register_sequences))[0]
            assert math.isclose(row["ppl" + label], ppl, rel_tol=1e-9)
            assert math.isclose(row["delta" + label], ppl / base_ppl - 1, rel_tol=1e-6, abs_tol=1e-12)
            assert math.isclose(row["kl" + label], kl, rel_tol=1e-9, abs_tol=1e-15)
    assert rows[-1]["ppl_random_program"] != rows[-1]["ppl"]  # the baseline arm is another swap


def test_evaluate_programs_sweeps_with_the_same_rows(handle, splits, rows):
    ps = ProgramSet(model="tiny-stories")
    for rank, head in enumerate(ORDER):  # test IoU falls along ORDER: the IoU order is ORDER
        ps.add(Head.parse(head), Program.parse(PROGRAMS[head]), "hand", {"test": {"iou": 0.9 - 0.1 * rank}})
    report = evaluate_programs(handle, splits.test, ps, which="replacement", sweep=True, sweep_steps=STEPS, seed=3)
    kr = report.kinds["replacement"]
    assert kr.head_orders == {"iou": ORDER}
    got = [{k: v for k, v in r.items() if k != "cheapest"} for r in kr.sweep]
    assert got == [{k: v for k, v in r.items() if k != "cheapest"} for r in rows]
    assert [r["cheapest"].replace("IoU order", "given order") for r in kr.sweep] == [r["cheapest"] for r in rows]


def test_replacement_sweep_is_a_deprecated_alias(handle, splits, rows):
    with pytest.warns(DeprecationWarning, match="sweep_programs"):
        again = replacement_sweep(handle, PROGRAMS, splits.test, order=ORDER, steps=STEPS, seed=3, progress=False)
    assert again == rows


def test_evaluate_programs_takes_measure_config_names(handle, splits):
    ps = ProgramSet(model="tiny-stories")
    ps.add((0, 1), Program.parse("prev(1)"), "hand", {"test": {"iou": 0.5}})
    ps.add((2, 0), Program.parse("first()"), "hand", {"test": {"iou": 0.4}})
    steps = (0.0, 0.5, 1.0)
    by_config = evaluate_programs(handle, splits, ps, MeasureConfig(sweep_steps=steps, delta_ppl=True),
                                  which="replacement", sweep=True)
    by_name = evaluate_programs(handle, splits, ps, which="replacement", sweep=True, sweep_steps=steps, delta_ppl=True)
    with pytest.warns(DeprecationWarning, match="deprecated"):  # per_head, steps
        old = evaluate_programs(handle, splits, ps, which="replacement", sweep=True, steps=steps, per_head=True)
    for report in (by_config, by_name, old):
        kr = report.kinds["replacement"]
        assert [r["fraction"] for r in kr.sweep] == list(steps) and kr.per_head is not None
    untimed = [{k: v for k, v in r.to_json().items() if k != "seconds"} for r in (by_config, by_name, old)]
    assert untimed[0] == untimed[1] == untimed[2]
    with pytest.raises(InputError, match="config= and keyword"):
        evaluate_programs(handle, splits, ps, MeasureConfig(), delta_ppl=True)
    with pytest.raises(InputError, match="one setting twice"), pytest.warns(DeprecationWarning):
        evaluate_programs(handle, splits, ps, steps=steps, sweep_steps=steps)
    with pytest.raises(InputError, match="did you mean 'sweep_steps'"):
        evaluate_programs(handle, splits, ps, sweep_step=steps)
    with pytest.raises(InputError, match="cloze"):
        evaluate_programs(handle, splits, ps, cloze=True)
