"""Every setting given to ``explain`` reaches the stage that uses it (headsurgeon/pipeline.py passes each stage its
config whole): one small real run on the embedded model with a non-default value in every stage, each stage's
call recorded on the way through and its effect read from the outputs."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

import headsurgeon as hs
import headsurgeon.explain_measure as em
import headsurgeon.pipeline as pipeline
from headsurgeon.configs import ExplainConfig, MeasureConfig, ScaleoutConfig, SearchConfig
from headsurgeon.core import Head
from headsurgeon.surgery.configs import CaptureConfig, CorpusConfig, HeadsConfig
from headsurgeon.synth.splits import StoreSplits

CONFIG = ExplainConfig(
    corpus=CorpusConfig(max_len=20, max_sequences=18, seed=4),
    capture=CaptureConfig(batch_size=5, shard_size=7),
    subset=HeadsConfig(heads=("L0H1", "L2H3")),
    search=SearchConfig(searchers=("library",), library=("prev(1)", "first()"), select_by="jsd"),
    scaleout=ScaleoutConfig(workers=1),
    measure=MeasureConfig(sweep_steps=(0.0, 0.5, 1.0), order="both", delta_ppl=True, task_limit=3),
    progress=False,
)


def _spy(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls[name] = (args, kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    calls: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        for module, name in ((pipeline, "preflight"), (pipeline, "load_corpus"), (pipeline, "capture"),
                             (pipeline, "explain_store"), (pipeline, "measure_and_report"),
                             (em, "evaluate_programs")):
            _spy(mp, module, name, calls)
        out = tmp_path_factory.mktemp("explain-configs")
        result = hs.explain("tiny-stories", hs.demo_corpus_path(), out, config=CONFIG)
    return result, calls, json.loads((out / "summary.json").read_text())


def test_each_stage_gets_its_config_whole(run):
    result, calls, _ = run
    assert calls["preflight"][0] == (CONFIG.scaleout,)
    assert calls["load_corpus"][1]["config"] == CONFIG.corpus
    assert {k: calls["capture"][1][k] for k in asdict(CONFIG.capture)} == asdict(CONFIG.capture)
    args, kw = calls["explain_store"]
    assert args[2] == result.splits.indices and isinstance(args[2], StoreSplits)
    assert (kw["scaleout"], kw["delta_ppl"], kw["select_by"], kw["seed"]) == (CONFIG.scaleout, True, "jsd", 4)
    assert kw["options"]["library"] and args[3] == ["library"]
    assert calls["measure_and_report"][0][5] == CONFIG.measure
    given = calls["evaluate_programs"][0][3]
    assert (given.sweep_steps, given.order, given.delta_ppl, given.task_limit) == ((0.0, 0.5, 1.0), "both", True, 3)


def test_each_setting_shows_in_what_its_stage_made(run):
    result, _, summary = run
    meta = result.programs.meta
    assert (meta["max_len"], meta["seed"], meta["selected_by"]) == (20, 4, "jsd")  # corpus, search
    assert max(s.n for s in result.splits.all) <= 20 and len(result.splits.all) <= 18
    assert result.splits.sizes() == hs.load_corpus(hs.load_model("tiny-stories"), hs.demo_corpus_path(),
                                                   config=CONFIG.corpus).sizes()
    assert sorted(Head.label(h) for h in result.programs.keys()) == ["L0H1", "L2H3"]  # subset
    assert {e.source for e in result.programs.entries.values()} <= {"library", "baseline"}  # search
    assert len(list(result.store.directory.glob("**/*shard*"))) >= 3  # capture: 7 windows a shard
    replacement = summary["evaluation"]["kinds"]["replacement"]  # measure
    assert [r["fraction"] for r in replacement["sweep"]] == [0.0, 0.5, 1.0]
    assert replacement["sweep_orders"] == ["iou", "delta_ppl"] and replacement["per_head"]
    assert set(summary["delta_ppl"]) == {"L0H1", "L2H3"}
