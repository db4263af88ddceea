"""Downstream replacement sweep: task accuracy as 0 → 100% of heads are swapped for programs, in IoU order, in a
random order and with random programs (the arms of headsurgeon/surgery/measure/evaluate.py's ΔPPL sweep), all on the same examples."""
from __future__ import annotations

from typing import Any, Mapping, Sequence as Seq

from tqdm.auto import tqdm

from ...synth.programset import ProgramMap, ProgramSet
from ...synth.trust import TrustPrograms
from .downstream import evaluate_tasks, lm_for, reported_metrics
from .evaluate import sweep_arms, sweep_heads, trusted_programs
from ..models.loading import load_model
from ..swap.replace import replace_heads
from .scorable import require_lm_head

__all__ = ["downstream_sweep", "primary_metric"]


def primary_metric(result: dict, task: str) -> tuple[str, str]:
    """The (metric, filter) a task is judged by: ``acc`` where lm-eval reports it, else the first metric."""
    metrics = reported_metrics(result, task)
    return next((m for m in metrics if m[0] == "acc"), metrics[0])


def _scores(run: dict) -> dict[str, tuple[str, float, float | None]]:
    """task → (metric, value, lm-eval standard error) for every scored task (groups' summary rows left out)."""
    out = {}
    for task in run["results"]:
        if task not in run.get("samples", {}):
            continue
        metric, filt = primary_metric(run, task)
        res = run["results"][task]
        stderr = res.get(f"{metric}_stderr,{filt}")
        out[task] = (metric, float(res[f"{metric},{filt}"]),
                     float(stderr) if isinstance(stderr, (int, float)) else None)
    return out


def downstream_sweep(model: Any, programs: ProgramSet | ProgramMap, tasks: list[str] | str, *,
                     order: Seq[Any] | None = None, steps: Seq[float] = (0.0, 0.25, 0.5, 1.0), seed: int = 0,
                     limit: int | float | None = None, include_path: Any = None, batch_size: int = 16,
                     progress: bool = True, trust_programs: TrustPrograms = False) -> list[dict[str, Any]]:
    """Rows {fraction, n_heads, task, metric, value, value_random_order, value_random_program, stderr} per step
    and task: lm-eval's score of the model with that fraction of heads replaced (``order``: default as given)."""
    tasks = [t.strip() for t in tasks.split(",") if t.strip()] if isinstance(tasks, str) else list(tasks)
    handle = load_model(model)
    require_lm_head(handle)
    items, heads = sweep_heads(trusted_programs(programs, trust_programs), order)

    def run(chosen: Mapping[Any, Any]) -> dict[str, tuple[str, float, float | None]]:
        if not chosen:
            return _scores(evaluate_tasks(lm_for(handle, batch_size), tasks, limit, include_path, seed))
        with replace_heads(handle, chosen) as hybrid:
            return _scores(evaluate_tasks(lm_for(hybrid, batch_size), tasks, limit, include_path, seed))

    base = None
    rows: list[dict[str, Any]] = []
    for frac, k, arms in tqdm(list(sweep_arms(items, heads, steps, seed)), desc="downstream sweep",
                              disable=not progress):
        scored = {}
        for label, chosen in arms.items():
            if not chosen:
                base = base if base is not None else run(chosen)
                scored[label] = base
            else:
                scored[label] = run(chosen)
        for task, (metric, value, stderr) in scored[""].items():
            rows.append({"fraction": frac, "n_heads": k, "task": task, "metric": metric, "value": value,
                         "stderr": stderr, **{"value" + label: scored[label][task][1] for label in arms if label}})
    return rows
