"""A worker that measures per-head ΔPPL itself (a Ray task: no driver handle) loads the model in the driver's
dtype and device type (headsurgeon/scaleout/task.py ``DeltaJob``), so its perplexities compare with the base."""
from __future__ import annotations

import pytest
import torch

from conftest import CORPUS, STORIES, need
from headsurgeon.synth.splits import StoreSplits


@pytest.fixture(scope="module")
def store(tmp_path_factory, stories):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import load_corpus

    seqs = load_corpus(stories, need(CORPUS), max_len=16, max_sequences=8, seed=0).all[:6]
    return capture(stories, seqs, out=tmp_path_factory.mktemp("store"), progress=False)


def test_the_driver_hands_its_dtype_and_device_to_the_workers(store, tmp_path, monkeypatch):
    import headsurgeon.scaleout.stage as stage
    import headsurgeon.surgery.measure.evaluate as evaluate
    from headsurgeon.scaleout.task import DeltaJob
    from headsurgeon.surgery.models.loading import load_model

    half = load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model", dtype="bfloat16")
    monkeypatch.setattr(evaluate, "per_head_delta_ppl", lambda model, programs, seqs, **kw: {h: 0.0 for h in programs})
    jobs = []
    monkeypatch.setattr(stage, "DeltaJob", lambda *a, **kw: jobs.append(DeltaJob(*a, **kw)) or jobs[-1])
    stage.explain_store(store, half, {"synth": [0, 1], "select": [2, 3], "test": [4, 5]}, ["library"],
                        options={"library": ["prev(1)"]}, seed=0, vocab=None, out=tmp_path / "out", delta_ppl=True,
                        progress=False)
    assert [(j.dtype, j.device) for j in jobs] == [("bfloat16", "cpu")]


def test_a_worker_loads_the_model_as_the_job_says(store, monkeypatch):
    from headsurgeon.scaleout import task
    from headsurgeon.synth.search.base import searcher_factory

    loaded = {}
    import headsurgeon.surgery.models.loading as loading
    import headsurgeon.surgery.measure.evaluate as evaluate

    real_load = loading.load_model

    def load(spec, **kw):
        loaded.update(kw)
        return real_load(spec, **kw)

    def delta(model, programs, seqs, **kw):
        loaded["model_dtype"] = next(model.model.parameters()).dtype
        return {h: 0.0 for h in programs}

    monkeypatch.setattr(loading, "load_model", load)
    monkeypatch.setattr(evaluate, "per_head_delta_ppl", delta)
    job = task.HeadJob(str(store.directory), StoreSplits((0, 1), (2, 3), (4, 5)), (("library", searcher_factory("library")),),
                       options={"library": ["prev(1)"]}, model=store.model_name,
                       delta=task.DeltaJob(f"llama2c:{STORIES / 'stories260K.bin'}", str(STORIES / "tok512.model"),
                                           1.0, dtype="bfloat16", device="cpu"))
    records = task.explain_heads(job, [(0, 1)])
    assert loaded["dtype"] == "bfloat16" and loaded["device"] == "cpu" and loaded["model_dtype"] == torch.bfloat16
    assert records[0]["delta_ppl"] == 0.0
