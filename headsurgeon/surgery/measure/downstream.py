"""Downstream tasks through lm-evaluation-harness: base and hybrid on the same examples, with a paired bootstrap."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..models.loading import load_model
from .scorable import require_lm_head
from .task_data import hub_data
from ..swap.hybrid import HybridModel
from ...core import InputError
from ..models.handle import ModelHandle
from ...synth.programset import ProgramMap, ProgramSet

__all__ = ["downstream", "base_run", "BaseRun", "paired_bootstrap", "TASKS_DIR", "task_folders", "task_list",
           "evaluate_tasks", "reported_metrics", "lm_for", "task_manager", "check_tasks"]

#: lm-eval task YAML files shipped with headsurgeon (the ``eaps6`` group); always on the include path
TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"


def task_folders(include_path: str | Path | list[str | Path] | None = None) -> list[str]:
    """headsurgeon's task folder followed by the user's folders, as lm-eval's TaskManager takes them."""
    extra = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    return [str(TASKS_DIR)] + [str(p) for p in extra]


def _folder_stamp(folder: str) -> tuple[str, float]:
    """A folder with the newest modification time of its YAML files, so an edited task file is seen again."""
    times = [f.stat().st_mtime for f in Path(folder).rglob("*.yaml")] if Path(folder).is_dir() else []
    return folder, max(times, default=0.0)


@functools.lru_cache(maxsize=8)
def _cached_task_manager(stamps: tuple[tuple[str, float], ...], lm_evals_own: bool) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[folder for folder, _ in stamps], include_defaults=lm_evals_own)


def task_manager(include_path: str | Path | list[str | Path] | None = None, tasks: list[str] | None = None) -> Any:
    """lm-eval's TaskManager over ``task_folders(include_path)``, built once per folders and their YAML files.

    When those folders define every one of ``tasks`` (as tasks: a group's members may be lm-eval's own), the
    manager indexes only them, in milliseconds; otherwise it indexes every lm-eval task too, 10–15 s, which each
    ``--tasks`` call would otherwise pay again.
    """
    stamps = tuple(_folder_stamp(f) for f in task_folders(include_path))
    if tasks:
        local = _cached_task_manager(stamps, False)
        if all(t in local.all_subtasks for t in tasks):
            return local
    return _cached_task_manager(stamps, True)


def lm_for(model: Any, batch_size: int, **options: Any) -> Any:
    """The lm-eval model (headsurgeon/surgery/measure/lm_eval_model.py) for a handle, hybrid or spec."""
    from .lm_eval_model import HeadsurgeonLM

    return HeadsurgeonLM(model=model, batch_size=batch_size, **options)


def _aggregation(metric: str) -> Callable[[list[Any]], float]:
    """lm-eval's aggregation for a metric (mean for accuracies, weighted perplexity, bits per byte, ...)."""
    from lm_eval.api.registry import get_metric_aggregation

    try:
        found = get_metric_aggregation(metric)
    except (KeyError, ValueError):
        found = None
    return found or (lambda values: float(np.mean(values)))


def paired_bootstrap(base: list[Any], other: list[Any], aggregate: Callable[[list[Any]], float],
                     n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """aggregate(other) − aggregate(base) and its percentile interval, resampling examples (pairs) with ``seed``."""
    if len(base) != len(other) or not base:
        raise InputError(f"paired bootstrap needs two equally long, non-empty lists ({len(base)} vs {len(other)})")
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(base), len(base))
        deltas.append(aggregate([other[i] for i in idx]) - aggregate([base[i] for i in idx]))
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(deltas, [tail, 100 - tail])
    return aggregate(other) - aggregate(base), float(low), float(high)


def check_tasks(tasks: list[str], include_path: Any = None) -> Any:
    """lm-eval's task manager, after checking that it knows every name in ``tasks`` (callers check before long
    work: ``explain`` before capture and search); an unknown name is a ValueError naming it and the fix."""
    manager = task_manager(include_path, tasks)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise InputError(f"lm-eval knows no task {', '.join(map(repr, unknown))}: check the name (lm-eval ls "
                         "tasks lists them) or give the folder of its YAML file with include_path / --include-path")
    return manager


def evaluate_tasks(lm: Any, tasks: list[str], limit: int | float | None, include_path: Any, seed: int,
                   num_fewshot: int | None = None) -> dict:
    """lm-eval's ``simple_evaluate`` of ``lm`` on ``tasks`` with every seed fixed and per-example samples kept."""
    import lm_eval

    manager = check_tasks(tasks, include_path)
    with hub_data(tasks):  # offline: one clear TaskDataError in seconds, not retries and a traceback
        return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit, task_manager=manager,
                                       log_samples=True, num_fewshot=num_fewshot, random_seed=seed,
                                       numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
                                       bootstrap_iters=1000)


def reported_metrics(result: dict, task: str) -> list[tuple[str, str]]:
    """(metric, filter) pairs lm-eval reported for a task, e.g. ("acc", "none")."""
    keys = [k for k in result["results"][task] if "," in k and "_stderr," not in k]
    return [tuple(k.split(",", 1)) for k in keys]  # each key holds one comma: pairs of two


def _stderr(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def task_list(tasks: list[str] | str) -> list[str]:
    """Task names from a list or a comma-separated string; none is an InputError."""
    names = [t.strip() for t in tasks.split(",") if t.strip()] if isinstance(tasks, str) else list(tasks)
    if not names:
        raise InputError("no tasks given: name lm-eval tasks, e.g. tasks=['eaps6'] or --tasks hellaswag,piqa")
    return names


def _settings(tasks: list[str], limit: Any, include_path: Any, num_fewshot: Any, seed: int) -> tuple:
    return (("tasks", tuple(tasks)), ("limit", limit), ("include_path", tuple(task_folders(include_path))),
            ("num_fewshot", num_fewshot), ("seed", seed))


@dataclass(frozen=True)
class BaseRun:
    """The base model's lm-eval run on some tasks (:func:`base_run`): ``downstream(..., base=)`` compares hybrids
    with it instead of evaluating the base again."""

    model: str
    settings: tuple  # (name, value) pairs: tasks, limit, include_path, num_fewshot, seed
    result: dict[str, Any]


def base_run(handle: ModelHandle, tasks: list[str] | str, *, limit: int | float | None = None,
             include_path: str | Path | list[str | Path] | None = None, batch_size: int = 16,
             num_fewshot: int | None = None, seed: int = 0) -> BaseRun:
    """lm-eval's run of the base model ``handle`` (a ModelHandle with an LM head) on ``tasks``, for ``downstream``."""
    require_lm_head(handle)
    tasks = task_list(tasks)
    result = evaluate_tasks(lm_for(handle, batch_size), tasks, limit, include_path, seed, num_fewshot)
    return BaseRun(handle.name, _settings(tasks, limit, include_path, num_fewshot, seed), result)


def downstream(model: Any, tasks: list[str] | str, programs: ProgramSet | ProgramMap | str | Path | None = None, *, which: str = "replacement",
               trust_programs: bool = False, limit: int | float | None = None,
               include_path: str | Path | list[str | Path] | None = None, batch_size: int = 16,
               num_fewshot: int | None = None, n_boot: int = 1000, seed: int = 0,
               tokenizer: Any = None, device: str = "cpu", base: "BaseRun | None" = None) -> dict[str, Any]:
    """Per task and metric: base and hybrid scores with lm-eval's standard errors, and their difference with a
    paired bootstrap interval over the same examples.

    ``model`` is a spec or ModelHandle (with ``programs``: a ProgramSet, mapping or programs.json) or a
    HybridModel (its base is the handle it was built on). Without programs only the base is evaluated.
    ``base``: the base model's run from :func:`base_run` with the same tasks and settings, reused instead of
    evaluating the base again (``evaluate_programs`` measures two kinds against one base).
    """
    tasks = task_list(tasks)
    if isinstance(model, HybridModel):
        if programs is not None:
            raise InputError("pass either a HybridModel or programs, not both")
        handle, hybrid = model.handle, model
    else:
        handle = load_model(model, tokenizer=tokenizer, device=device)
        hybrid = None
    require_lm_head(handle)
    lm = None
    if hybrid is not None or programs is not None:  # built first: the trust gate refuses before any task runs
        lm = (lm_for(hybrid, batch_size) if hybrid is not None
              else lm_for(handle, batch_size, programs=programs, which=which, trust_programs=trust_programs))
        hybrid = lm.model
    settings = _settings(tasks, limit, include_path, num_fewshot, seed)
    if base is None:
        base_result = evaluate_tasks(lm_for(handle, batch_size), tasks, limit, include_path, seed, num_fewshot)
    elif (base.model, base.settings) != (handle.name, settings):
        differ = [f"{name} {a!r} there, {b!r} here" for (name, a), (_, b) in
                  zip((("model", base.model), *base.settings), (("model", handle.name), *settings)) if a != b]
        raise InputError(f"base= was run with other settings ({'; '.join(differ)}): pass base_run() of the same "
                         "model, tasks and settings, or no base")
    else:
        base_result = base.result
    runs = {"base": base_result}
    if lm is not None:
        runs["hybrid"] = evaluate_tasks(lm, tasks, limit, include_path, seed, num_fewshot)
    rows = []
    for task in base_result["results"]:
        if task not in base_result.get("samples", {}):
            continue  # a group's summary row: its member tasks have their own rows
        for metric, filt in reported_metrics(base_result, task):
            row: dict[str, Any] = {"task": task, "metric": metric if filt == "none" else f"{metric},{filt}"}
            for label, run in runs.items():
                res = run["results"][task]
                row[label] = float(res[f"{metric},{filt}"])
                row[f"{label}_stderr"] = _stderr(res.get(f"{metric}_stderr,{filt}"))
            samples = {label: sorted((s for s in run["samples"][task] if s.get("filter", filt) == filt),
                                     key=lambda s: s["doc_id"]) for label, run in runs.items()}
            row["n"] = len(samples["base"])
            if "hybrid" in runs:
                if [s["doc_id"] for s in samples["base"]] != [s["doc_id"] for s in samples["hybrid"]]:
                    raise RuntimeError(f"{task}: base and hybrid were scored on different examples")
                delta, low, high = paired_bootstrap([s[metric] for s in samples["base"]],
                                                    [s[metric] for s in samples["hybrid"]],
                                                    _aggregation(metric), n_boot=n_boot, seed=seed)
                row.update(delta=delta, delta_ci95=[low, high])
            rows.append(row)
    return {"model": handle.name, "tasks": tasks, "limit": limit, "seed": seed,
            "hybrid_heads": len(hybrid.replaced) if hybrid is not None else None, "rows": rows}
