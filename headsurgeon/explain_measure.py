"""explain after selection: both kinds of program measured as ``headsurgeon eval`` measures them
(headsurgeon/surgery/measure/eval_report.py ``evaluate_programs`` on the run's own Splits), then OUT/sweep.png, OUT/report.html and
OUT/summary.json, with the run's timings nested where phases nest.

Replacements (the most faithful programs) and explanations (the best readable ones) each get the headline ΔPPL and
KL(base ‖ hybrid) with bootstrap intervals and the test tokens counted, the sweep (each arm's ΔPPL and KL) in IoU
and/or ΔPPL order beside a random order and random programs, and, when asked, per-head ΔPPL and KL with
Spearman(IoU, ΔPPL) and Spearman(IoU / JSD, KL), and lm-eval tasks (the held-out cloze, headsurgeon/surgery/measure/cloze.py, among
them). summary.json's "evaluation" is ``EvalReport.to_json()``, so it carries every one of these fields.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from headsurgeon.surgery.configs import MeasureConfig
from headsurgeon.surgery.measure.eval_report import EvalReport, evaluate_programs
from .core import Head
from .explain_costs import compact_costs, measure_head_costs
from .core.vocabulary import TokenVocabulary
from .surgery.models.handle import ModelHandle
from .surgery.corpus import Splits
from .synth.programset import ProgramSet

if TYPE_CHECKING:  # the search stage's result and the searchers' protocol: pipeline.py imports both packages first
    from .scaleout.stage import HeadsResult
    from .synth.search.base import PatternReader

__all__ = ["measure_and_report", "nest_timings", "format_timings", "cloze_documents", "sweep_rows"]

#: how the search stage's per-head parts are keyed in explain's timings (headsurgeon/scaleout/stage.py sums them)
SEARCH = "search"


def nest_timings(timings: dict[str, float], parts: Iterable[str]) -> dict[str, Any]:
    """explain's flat timings with the search stage's per-head ``parts`` (per searcher, select, per-head ΔPPL: sums
    over heads, which on Ray run in parallel) nested under ``"search"``, whose own ``"wall"`` is the stage's wall
    time ("heads_wall", headsurgeon/scaleout/stage.py), so no second counts twice in a total."""
    parts = set(parts) - {"heads_wall"}
    out: dict[str, Any] = {}
    for key, value in timings.items():
        if key == "heads_wall":
            out[SEARCH] = {"wall": float(value), **{k: float(timings[k]) for k in timings if k in parts}}
        elif key not in parts:
            out[key] = value
    return out


def total_seconds(timings: dict[str, Any]) -> float:
    """The run's wall time: its phases run one after another, so the sum of their walls, nested parts left out."""
    return sum(float(v["wall"]) if isinstance(v, dict) else float(v) for k, v in timings.items() if k != "total")


def format_timings(timings: dict[str, Any]) -> str:
    """explain's stages as a table: each phase's wall seconds and share of the run, then its parts (per searcher,
    selection, ...: sums over heads, which run in parallel on several workers, so they may exceed the wall)."""
    total = float(timings.get("total") or total_seconds(timings)) or 1.0
    lines = ["stage          wall s   share  parts (s, summed over the heads' workers)"]
    for key, value in timings.items():
        if key == "total":
            continue
        wall = float(value["wall"]) if isinstance(value, dict) else float(value)
        parts = ", ".join(f"{k} {float(v):.1f}" for k, v in value.items() if k != "wall") \
            if isinstance(value, dict) else ""
        lines.append(f"{key:<12} {wall:>8.1f} {wall / total:>7.0%}  {parts}".rstrip())
    lines.append(f"{'total':<12} {total:>8.1f}")
    return "\n".join(lines)


def cloze_documents(splits: Splits) -> list[str]:
    """The held-out texts for the cloze: each test window's text (the document span it covers), as the model saw it
    and never searched or selected on (headsurgeon/surgery/corpus.py; Splits keep windows, not whole documents)."""
    return [s.text for s in splits.test if s.text and s.text.strip()]


def _with_cloze(tasks: list[str], include_path: Any, splits: Splits, out: Path, seed: int) -> tuple[list[str], Any]:
    """``tasks`` plus the held-out cloze written under OUT/cloze, and the include path that finds it."""
    from headsurgeon.surgery.measure.cloze import write_cloze_task

    name, folder = write_cloze_task(cloze_documents(splits), out / "cloze", seed=seed)
    given = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    return tasks + [name], given + [str(folder)]


def sweep_rows(evaluation: EvalReport | None) -> list[dict[str, Any]]:
    """Every kind's sweep rows, each labelled with its kind under ``"which"`` (replacements first)."""
    if evaluation is None:
        return []
    return [{"which": kind, **row} for kind, kr in evaluation.kinds.items() for row in kr.sweep or []]


def measure_and_report(handle: ModelHandle, programs: ProgramSet, splits: Splits, store: PatternReader, out: Path,
                       measure: MeasureConfig | None = None, *, heads: HeadsResult, vocab: TokenVocabulary | None, timings: dict[str, Any],
                       notes: list[str], seed: int = 0,
                       progress: bool = True) -> tuple[EvalReport, dict[str, Any], dict[str, Any]]:
    """Measure ``programs`` (both kinds), plot, write report.html and summary.json; return (the EvalReport, the
    nested timings, the summary written).

    ``measure``: explain's MeasureConfig (headsurgeon/surgery/configs.py), whole: its sweep, per-head ΔPPL and task
    settings go to ``evaluate_programs``, ``cloze`` adds the held-out cloze to its tasks, ``head_costs`` measures
    each head's causal cost on the select windows (headsurgeon/explain_costs.py) into summary.json, programs.json's
    meta and the report. ``heads``: the search stage's HeadsResult: its timings nest under "search", and its per-head
    ΔPPL (measured on the test windows when ``measure.delta_ppl``) is the replacements' per-head ΔPPL here, not
    measured again (so their per-head KL is missing: measuring it would repeat every head's swap).
    """
    from headsurgeon.report import write_report

    measure = measure or MeasureConfig()
    timings = nest_timings(timings, heads.timings)
    tasks, include_path = measure.task_names(), measure.include_path
    t0 = time.perf_counter()
    if measure.cloze:
        tasks, include_path = _with_cloze(tasks, include_path, splits, out, seed)
    asked = replace(measure, tasks=tasks or None, include_path=include_path, cloze=False, head_costs=False)
    evaluation = evaluate_programs(handle, splits, programs, asked, which="both", sweep=True, task_sweep=False,
                                   seed=seed, progress=progress,
                                   known_per_head={"replacement": heads.delta_ppl} if measure.delta_ppl else None)
    png = out / "sweep.png"
    if any(kr.sweep for kr in evaluation.kinds.values()):
        evaluation.plot(png)
    timings["measure"] = {"wall": time.perf_counter() - t0, **evaluation.seconds}
    costs = None
    if measure.head_costs:
        t0 = time.perf_counter()
        measured = measure_head_costs(handle, programs, splits, out, seed=seed, progress=progress)
        costs = measured.to_json()
        programs.meta["head_costs"] = compact_costs(measured)  # ProgramSet.table() and report.html read it
        programs.save(out / "programs.json")
        timings["head costs"] = time.perf_counter() - t0
    timings["total"] = total_seconds(timings)
    t0 = time.perf_counter()
    write_report(out / "report.html", programs, store, splits.indices, png, title=f"headsurgeon: {handle.name}",
                 timings=timings, notes=notes, vocab=vocab, evaluation=evaluation)
    timings["report"] = time.perf_counter() - t0  # after the report, which shows the stages before it
    timings["total"] = total_seconds(timings)
    summary: dict[str, Any] = {"summary": programs.summary("test"), "evaluation": evaluation.to_json(),
                               "timings_s": timings, "notes": notes}
    if costs is not None:
        summary["head_costs"] = costs
    if measure.delta_ppl:  # the search tasks' own figures (headsurgeon/scaleout/task.py), as the journal holds them
        summary["delta_ppl"] = {Head.label(h): d for h, d in heads.delta_ppl.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return evaluation, timings, summary
