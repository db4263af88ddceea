"""One scored-program record (headsurgeon/synth/scored.py) and typed Scores (headsurgeon/core/scores.py) replace the five classes."""
from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from conftest import ROOT
from headsurgeon.core import InputError
from headsurgeon.core.scores import Scores
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import Entry, ProgramSet
from headsurgeon.synth.scored import TEXT_LIMIT, ScoredProgram

SCORES = {"select": {"iou": 0.8, "jsd": 0.1, "topq": 0.7}, "test": {"iou": 0.75, "jsd": 0.2, "topq": 0.6}}


def test_scores_read_like_the_dicts_they_replace_and_answer_none_when_not_measured():
    s = Scores.of(SCORES)
    assert s == SCORES and s["test"]["iou"] == 0.75 and json.loads(json.dumps(s)) == SCORES
    assert s.get("test", "jsd") == 0.2 and s.iou("select") == 0.8 and s.jsd() == 0.2
    assert s.get("synth", "iou") is None and s.iou("synth") is None and s.get("test") == SCORES["test"]
    assert list(s.to_json()) == ["select", "test"] and type(s.to_json()) is dict
    s.merge("test", {"iou": 0.5})
    assert s["test"] == {"iou": 0.5, "jsd": 0.2, "topq": 0.6} and SCORES["test"]["iou"] == 0.75  # a copy


def test_scores_refuse_a_default_where_a_metric_belongs_and_malformed_input():
    s = Scores.of(SCORES)
    with pytest.raises(InputError, match="takes a metric"):
        s.get("test", {})
    with pytest.raises(InputError, match="split to"):
        Scores.of({"test": 0.5})
    with pytest.raises(InputError, match="split to"):
        Scores.of([("test", {})])  # type: ignore[arg-type]


def test_scores_by_metric_round_trip_keeps_split_order():
    s = Scores.of({"test": {"iou": 0.5, "jsd": 0.3}, "select": {"iou": 0.6}})
    layout = s.by_metric()
    assert layout == {"iou": {"test": 0.5, "select": 0.6}, "jsd": {"test": 0.3}, "topq": {}}
    back = Scores.from_by_metric(layout)
    assert back == s and list(back) == ["test", "select"]
    with pytest.raises(InputError, match="'iou' must map"):
        Scores.from_by_metric({"iou": [0.5]})


def test_a_proposal_renders_lazily_and_a_kept_program_renders_with_its_vocabulary():
    p = Program.parse("0.7*prev(1) + 0.3*first()")
    proposal = ScoredProgram(p, "enumerative", SCORES, "mostly previous")
    assert not proposal.rendered and proposal.text == p.render() and proposal.chars == len(p.render())
    assert proposal.size == p.size and proposal.gloss == p.gloss() and proposal.budget is None
    assert proposal.iou("test") == 0.75 and proposal.jsd("select") == 0.1 and proposal.score("test", "topq") == 0.6
    assert isinstance(proposal.scores, Scores) and proposal.scores is not SCORES  # scores are copied
    kept = ScoredProgram.of(p, "enumerative", SCORES, None, "mostly previous", budget=200, digits=2)
    assert kept.rendered and kept.text == p.render() and kept.budget == 200 and kept.digits == 2


def test_record_json_round_trip_is_identical():
    p = Program.parse("0.7*prev(1) + 0.3*first()")
    kept = ScoredProgram.of(p, "llm", SCORES, None, "mostly previous", budget=200, digits=2)
    item = kept.to_json()
    assert item["iou"] == {"select": 0.8, "test": 0.75} and item["budget"] == 200 and item["digits"] == 2
    back = ScoredProgram.from_json(json.loads(json.dumps(item)), Program.from_json(item["program"]))
    assert back == kept and back.to_json() == item and json.dumps(back.to_json()) == json.dumps(item)


def test_a_long_text_is_stored_cut_and_keeps_its_length():
    p = Program.parse(" + ".join(f"0.01*prev({k})" for k in range(1, 120)))
    kept = ScoredProgram.of(p, "learned", SCORES)
    assert kept.chars > TEXT_LIMIT
    item = kept.to_json()
    back = ScoredProgram.from_json(item, p)
    assert back.text.endswith(" …") and len(back.text) == TEXT_LIMIT + 2 and back.chars == kept.chars


def test_an_entry_holds_three_records_and_reads_the_replacements_fields(tmp_path):
    p, q = Program.parse("0.7*prev(1) + 0.3*first()"), Program.parse("prev(1)")
    ps = ProgramSet(model="m")
    ex = ScoredProgram.of(q, "baseline", {"test": {"iou": 0.6}}, budget=200)
    ps.add("L0H1", p, "llm", SCORES, "mostly previous", explanation=ex, frontier=[ex])
    e = ps.entries[(0, 1)]
    assert isinstance(e.replacement, ScoredProgram) and e.program == p and e.source == "llm"
    assert e.scores == SCORES and e.hypothesis == "mostly previous" and e.iou() == 0.75 and e.size == p.size
    assert e.text == p.render() and e.chars == len(p.render())
    again = ProgramSet.load(ps.save(tmp_path / "programs.json"))
    e2 = again.entries[(0, 1)]
    assert e2.to_json((0, 1)) == e.to_json((0, 1)) and e2.explanation == ex and e2.frontier == [ex]
    assert (tmp_path / "programs.json").read_bytes() == again.save(tmp_path / "again.json").read_bytes()
    old = {"head": "L0H1", "program": q.to_json(), "text": "prev(1)", "scores": {"test": {"iou": 0.9}}}  # no chars
    assert not Entry.from_json(old).replacement.rendered


@pytest.mark.parametrize("module, name", [("headsurgeon.synth.candidate", "Candidate"),
                                          ("headsurgeon.synth.candidate", "Choice"),
                                          ("headsurgeon.synth.select", "_Option"),
                                          ("headsurgeon.report.heads", "Shown")])
def test_the_five_classes_are_gone(module, name):
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return
    assert not hasattr(mod, name)


def test_no_module_names_the_old_classes():
    pattern = ("Candidate(", "Choice(", "Choice.of", "_Option", "Shown", "replacement_choice", "synth.candidate")
    found = []
    for folder in ("headsurgeon", "tests", "benchmarks"):
        for f in (ROOT / folder).rglob("*.py"):
            if f.name == Path(__file__).name:
                continue
            text = f.read_text(encoding="utf-8")
            found += [f"{f.relative_to(ROOT)}: {p}" for p in pattern if p in text]
    assert found == []


def test_nan_scores_survive_the_record():
    p = Program.parse("prev(1)")
    kept = ScoredProgram.of(p, "library", {"select": {"iou": float("nan"), "jsd": float("nan")}})
    back = ScoredProgram.from_json(json.loads(json.dumps(kept.to_json())), p)
    assert math.isnan(back.iou("select"))
