"""`headsurgeon eval --which` chooses the programs every measurement swaps in (headline, per-head ΔPPL, sweep);
the default, both, measures replacements and readable explanations side by side, labelled."""
from __future__ import annotations

import json

import pytest

from headsurgeon.cli import main
from headsurgeon.hub.zoo import demo_corpus_path
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    ps = ProgramSet(model="tiny-stories")
    replacement = Program.parse("0.9*prev(1) + 0.1*uniform()")
    ps.add((0, 1), replacement, source="hand", scores={"test": {"iou": 0.6}},
           explanation=ScoredProgram.of(Program.parse("first()"), "hand", {"test": {"iou": 0.5}}, budget=200))
    ps.add((1, 2), replacement, source="hand", scores={"test": {"iou": 0.4}})  # no explanation: stays neural
    return ps.save(tmp_path_factory.mktemp("which") / "programs.json")


def run(capsys, programs, tmp_path, *extra: str) -> dict:
    argv = ["eval", "tiny-stories", str(demo_corpus_path()), "--programs", str(programs), "--max-sequences", "30",
            "--max-len", "32", "--per-head", "--sweep", str(tmp_path / "sweep.png"), "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_which_explanation_changes_the_headline_the_per_head_rows_and_the_sweep(capsys, programs, tmp_path):
    rep = run(capsys, programs, tmp_path, "--which", "replacement")
    exp = run(capsys, programs, tmp_path, "--which", "explanation")
    assert rep["ppl"] == exp["ppl"]  # the same base
    assert rep["hybrid_ppl"] != exp["hybrid_ppl"]
    assert {r["head"] for r in rep["per_head"]} == {"L0H1", "L1H2"}
    assert [(r["head"], r["program"]) for r in exp["per_head"]] == [("L0H1", "first()")]  # L1H2 has no explanation
    assert exp["per_head"][0]["delta_pct"] != next(r for r in rep["per_head"] if r["head"] == "L0H1")["delta_pct"]
    for doc in (rep, exp):  # every head of the kind swapped: the sweep's last step is the headline's hybrid
        assert doc["sweep"][-1]["ppl"] == pytest.approx(doc["hybrid_ppl"], rel=1e-9)
    assert exp["sweep"][-1]["n_heads"] == 1 and rep["sweep"][-1]["n_heads"] == 2
    assert exp["kinds"]["explanation"]["neural"] == ["L1H2"] and list(exp["kinds"]) == ["explanation"]


def test_both_kinds_by_default_labelled_side_by_side(capsys, programs, tmp_path):
    doc = run(capsys, programs, tmp_path)
    assert doc["which"] == ["replacement", "explanation"] and doc["headline"] == "replacement"
    rep, exp = doc["kinds"]["replacement"], doc["kinds"]["explanation"]
    assert (rep["heads"], exp["heads"], exp["neural_count"]) == (2, 1, 1)
    assert rep["hybrid_ppl"] != exp["hybrid_ppl"] and rep["sweep"] != exp["sweep"]
    assert {r["head"] for r in exp["per_head"]} == {"L0H1"}
    argv = ["eval", "tiny-stories", str(demo_corpus_path()), "--programs", str(programs), "--max-sequences", "30",
            "--max-len", "32"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "replacements, all 2 program heads: perplexity" in text
    assert "explanations, 1 of 2 program heads (1 without an explanation stays neural: L1H2): perplexity" in text
