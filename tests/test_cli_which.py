"""`headsurgeon eval --which explanation` swaps in the readable explanations instead of the replacements."""
from __future__ import annotations

import json
import warnings

from headsurgeon.cli import main
from headsurgeon.hub.zoo import demo_corpus_path
from headsurgeon.synth.candidate import Choice
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet


def test_eval_which_explanation(tmp_path, capsys):
    ps = ProgramSet(model="tiny-stories")
    replacement = Program.parse("0.9*prev(1) + 0.1*uniform()")
    explanation = Program.parse("first()")
    ps.add((0, 1), replacement, source="hand",
           explanation=Choice.of(explanation, "hand", 200, {"test": {"iou": 0.5}}, None))
    ps.add((1, 2), replacement, source="hand")  # no explanation: stays neural under --which explanation
    path = ps.save(tmp_path / "programs.json")
    common = ["eval", "tiny-stories", str(demo_corpus_path()), "--programs", str(path), "--max-sequences", "40",
              "--json"]
    results = {}
    for which in ("replacement", "explanation"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(common + ["--which", which]) == 0
        results[which] = json.loads(capsys.readouterr().out)
        if which == "explanation":
            assert any("L1H2" in str(w.message) for w in caught)
    assert results["replacement"]["ppl"] == results["explanation"]["ppl"]  # the same base
    assert results["replacement"]["hybrid_ppl"] != results["explanation"]["hybrid_ppl"]
