"""Benchmark: evaluating a hybrid vs its base through lm-evaluation-harness on the local tasks (goal ≤ 1.10× wall).

Workload: the local tasks of tests/lm_eval_tasks/ (``hs_cloze``: 100 four-way next-word questions, 400
loglikelihood requests; ``hs_rolling``: rolling loglikelihood of long passages) through
``headsurgeon/surgery/measure/downstream.py``'s ``evaluate_tasks`` (lm-eval's ``simple_evaluate``, seeds fixed), on stories260K
(../shared/data/models/stories260K) and on the embedded tiny-stories model. Hybrids replace 25% and 100% of the
heads (chosen with seed 0) with ``prev(1)``, ``first()``, ``0.5*prev(1) + 0.5*first()``, ``same_token_recent()``
and ``fallback(induction(), first())`` in turn.

Warm cache: every model runs the tasks once untimed (numba compilation, the hybrid's tensor cache), then
``--repeats`` timed rounds alternate base and hybrids. Figures are medians of wall and CPU time
(``time.process_time``) per round; the ratio is hybrid / base measured in the same process.

Run: ``python benchmarks/downstream.py [--repeats 3] [--limit N]``. Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
import warnings
from pathlib import Path

import torch

from headsurgeon.surgery.measure.downstream import evaluate_tasks, lm_for
from headsurgeon.surgery.models.loading import load_model
from headsurgeon.surgery.swap.replace import replace_heads

ROOT = Path(__file__).resolve().parents[1]
TASKS_DIR = ROOT / "tests" / "lm_eval_tasks"
STORIES = ROOT.parent / "shared" / "data" / "models" / "stories260K"
TASKS = ["hs_cloze", "hs_rolling"]
PROGRAMS = ["prev(1)", "first()", "0.5*prev(1) + 0.5*first()", "same_token_recent()", "fallback(induction(), first())"]


def hybrid_programs(heads: list[tuple[int, int]], fraction: float) -> dict:
    """``fraction`` of the heads (seed 0), each given the next program of PROGRAMS in turn."""
    chosen = random.Random(0).sample(heads, max(1, round(fraction * len(heads))))
    return {h: PROGRAMS[i % len(PROGRAMS)] for i, h in enumerate(sorted(chosen))}


def timed(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench(name: str, handle, repeats: int, limit: int | None) -> list[tuple[str, float, float]]:
    """(label, median wall s, median CPU s) for the base and each hybrid, warm, alternating per round."""
    models = {"base": handle}
    for fraction in (0.25, 1.0):
        models[f"hybrid {fraction:.0%}"] = replace_heads(handle, hybrid_programs(handle.heads, fraction))
    lms = {label: lm_for(model, batch_size=16) for label, model in models.items()}

    def run(lm):
        return lambda: evaluate_tasks(lm, TASKS, limit, TASKS_DIR, seed=0)

    for lm in lms.values():  # warm: numba, tensor caches, lm-eval's dataset objects
        run(lm)()
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in lms}
    for r in range(repeats):
        order = list(lms) if r % 2 == 0 else list(reversed(lms))
        for label in order:
            times[label].append(timed(run(lms[label])))
    out = []
    for label, values in times.items():
        out.append((label, statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)))
    base_wall, base_cpu = out[0][1], out[0][2]
    print(f"\n{name} ({len(handle.heads)} heads), tasks {', '.join(TASKS)}, limit {limit}, {repeats} warm rounds")
    print(f"{'model':<14} {'wall s':>8} {'CPU s':>8} {'wall ×':>7} {'CPU ×':>7}")
    for label, wall, cpu in out:
        print(f"{label:<14} {wall:>8.2f} {cpu:>8.2f} {wall / base_wall:>7.3f} {cpu / base_cpu:>7.3f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="examples per task (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    os.environ.setdefault("TQDM_DISABLE", "1")
    print(f"load average {os.getloadavg()}, torch threads {args.threads}")
    with torch.no_grad():
        stories = load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=str(STORIES / "tok512.model"))
        bench("stories260K", stories, args.repeats, args.limit)
        bench("tiny-stories (embedded)", load_model("tiny-stories"), args.repeats, args.limit)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
