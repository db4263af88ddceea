"""Downstream evaluation through lm-evaluation-harness on local tasks (tests/lm_eval_tasks/), offline."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install 'headsurgeon[eval]' (or .[test])")

from conftest import CORPUS, need  # noqa: E402

TASKS = Path(__file__).resolve().parent / "lm_eval_tasks"
PROGRAMS = ["prev(7)", "prev(13)", "first()", "prev(5)"]  # far from what the heads do


@pytest.fixture(scope="module")
def handle():
    from headsurgeon.surgery.loading import load_model

    return load_model("tiny-stories")


@pytest.fixture(scope="module")
def random_programs(handle, tmp_path_factory) -> Path:
    """programs.json giving every head of the embedded model a program drawn at random (seed 0)."""
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.programset import ProgramSet

    rng = random.Random(0)
    programs = ProgramSet(model=handle.name)
    for head in handle.heads:
        programs.add(head, Program.parse(rng.choice(PROGRAMS)), source="random")
    return programs.save(tmp_path_factory.mktemp("random") / "programs.json")


def test_loglikelihood_equals_the_library_forward(handle):
    """lm-eval's scores for a pair and a rolling text equal a direct computation with handle.forward."""
    from headsurgeon.surgery.lm_eval_model import HeadsurgeonLM

    lm = HeadsurgeonLM(model=handle, batch_size=3)
    pairs = [("Once upon a time, there was a little", " girl"), ("Lily saw a big", " dog"), ("Tom", " ran away")]
    got = lm.loglikelihood([SimpleNamespace(args=p) for p in pairs])
    text = "Once upon a time, there was a cat. The cat liked to play."
    rolled = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))])[0]
    with torch.no_grad():
        for (context, cont), (ll, _) in zip(pairs, got):
            ctx = [handle.bos_id] + handle.tokenizer.encode(context, add_special_tokens=False)
            whole = [handle.bos_id] + handle.tokenizer.encode(context + cont, add_special_tokens=False)
            logp = torch.log_softmax(handle.forward(torch.tensor([whole[:-1]])).float()[0], -1)
            direct = sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole)))
            assert ll == pytest.approx(direct, abs=1e-4)
        ids = [handle.bos_id] + handle.tokenizer.encode(text, add_special_tokens=False)
        logp = torch.log_softmax(handle.forward(torch.tensor([ids[:-1]])).float()[0], -1)
        assert rolled == pytest.approx(sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids))), abs=1e-3)


def test_generation_is_greedy_and_stops_at_until(handle):
    """generate_until continues greedily, batched prompts of different lengths agree with one-at-a-time runs."""
    from headsurgeon.surgery.lm_eval_model import HeadsurgeonLM

    lm = HeadsurgeonLM(model=handle, batch_size=4)
    reqs = [SimpleNamespace(args=(p, {"until": ["."], "max_gen_toks": 12}))
            for p in ["Once upon a time, there was a", "Tom and Lily went to the park. They", "The sun"]]
    batched = lm.generate_until(reqs)
    lm.batch_size = 1
    assert batched == lm.generate_until(reqs)
    assert all("." not in out and out for out in batched)


def test_downstream_base_above_chance_random_hybrid_lower(handle, random_programs):
    """Cloze (chance 25%): the base scores well above chance; every head on a random program scores lower."""
    import headsurgeon as hs

    result = hs.downstream(handle, ["hs_cloze"], programs=str(random_programs), include_path=TASKS)
    (row,) = result["rows"]
    assert row["task"] == "hs_cloze" and row["metric"] == "acc" and row["n"] == 100
    assert row["base"] >= 0.6 and row["base_stderr"] > 0  # 0.76 measured
    assert row["hybrid"] < row["base"]  # 0.66 measured, paired interval -0.18 .. -0.04
    low, high = row["delta_ci95"]
    assert low <= row["delta"] <= high < 0


def test_downstream_rolling_and_generate_tasks(handle):
    import headsurgeon as hs

    result = hs.downstream(handle, "hs_rolling,hs_generate", limit=4, include_path=TASKS)
    metrics = {(r["task"], r["metric"]): r for r in result["rows"]}
    assert 1 < metrics["hs_rolling", "word_perplexity"]["base"] < 500
    assert 0 <= metrics["hs_generate", "exact_match"]["base"] <= 1
    assert all("hybrid" not in r for r in result["rows"])


def test_cli_eval_tasks_prints_base_and_hybrid_with_intervals(capsys, random_programs):
    from headsurgeon.cli import main

    assert main(["eval", "tiny-stories", str(need(CORPUS)), "--max-sequences", "4", "--programs",
                 str(random_programs), "--tasks", "hs_cloze", "--limit", "20", "--include-path", str(TASKS)]) == 0
    out = capsys.readouterr().out
    assert "downstream (lm-eval, 20 examples per task" in out and "95% paired bootstrap" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("hs_cloze"))
    assert len(line.split()) >= 10 and " .. " in line  # task metric n base se hybrid se Δ low .. high


def test_python_programs_need_trust(tmp_path):
    from headsurgeon.surgery.lm_eval_model import HeadsurgeonLM
    from headsurgeon.synth.errors import ProgramError
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.programset import ProgramSet

    programs = ProgramSet()
    programs.add((0, 0), Program.python("def f(seq):\n    return seq.n\n"))
    path = programs.save(tmp_path / "programs.json")
    with pytest.raises(ProgramError, match="trust"):
        HeadsurgeonLM(model="tiny-stories", programs=str(path))


def test_lm_eval_command_line_runs_the_headsurgeon_model(tmp_path):
    """lm-eval's own CLI, with the model registered (lm-eval 0.4 has no entry point for model plugins)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "headsurgeon.surgery.lm_eval_model", "--model", "headsurgeon",
                           "--model_args", "model=tiny-stories", "--tasks", "hs_cloze", "--include_path", str(TASKS),
                           "--limit", "8", "--batch_size", "4"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(l for l in proc.stdout.splitlines() if "hs_cloze" in l)
    cells = [c.strip() for c in row.split("|")]
    assert "acc" in cells and 0 <= float(cells[cells.index("acc") + 2]) <= 1
