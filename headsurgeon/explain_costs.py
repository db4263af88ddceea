"""explain's ``head_costs`` option: each head's causal cost (headsurgeon/surgery/measure/head_costs.py) on the select windows, for its
replacement, its explanation and its mean pattern (mean ablation), kept in OUT/head_costs.json so a rerun goes on
from it, then folded into summary.json (the whole ``HeadCosts.to_json()``) and into the ProgramSet's meta (a compact
per-head form that ``ProgramSet.table()`` and report.html read).

Off by default: it costs three swaps per head on every select window, beyond explain's time budget (docs/architecture.md
"Faithfulness"); ``headsurgeon build`` measures the same costs for its own choice.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headsurgeon.surgery.measure.head_costs import HeadCosts, head_costs
from .surgery.models.handle import ModelHandle
from .surgery.corpus import Splits
from .synth.programset import ProgramSet

__all__ = ["COSTS_NAME", "measure_head_costs", "compact_costs", "format_costs"]

#: the progress and result file under OUT (headsurgeon/surgery/measure/head_costs.py COSTS_FILE format)
COSTS_NAME = "head_costs.json"


def measure_head_costs(handle: ModelHandle, programs: ProgramSet, splits: Splits, out: Path, *, seed: int = 0,
                       progress: bool = True) -> HeadCosts:
    """Every head of ``programs`` swapped alone for each kind it has and for its mean pattern over the synth windows,
    measured on the select windows (never the test windows that report the result)."""
    kinds = ("replacement", "explanation") if programs.programs("explanation") else ("replacement",)
    return head_costs(handle, programs, splits.select, which=kinds, reference=splits.synth, seed=seed,
                      progress=progress, path=Path(out) / COSTS_NAME)


def compact_costs(costs: HeadCosts) -> dict[str, Any]:
    """What the ProgramSet keeps of the costs (its ``meta["head_costs"]``): per head and variant the KL with its
    interval and the ΔNLL, and each program's KL over the mean ablation's, plus the windows and tokens measured."""
    full = costs.to_json()
    heads: dict[str, Any] = {}
    for label, row in full["heads"].items():
        kept: dict[str, Any] = {}
        for variant in ("replacement", "explanation", "mean"):
            if variant in row:
                s = row[variant]
                kept[variant] = {"kl": s["kl"], "kl_ci95": s["kl_ci95"], "delta_nll": s["delta_nll"],
                                 "kl_wide": s["kl_wide"]}
        for kind in ("replacement", "explanation"):
            if f"{kind}_over_mean" in row:
                kept[kind]["over_mean"] = row[f"{kind}_over_mean"]
        heads[label] = kept
    return {"split": "select", "windows": full["windows"], "tokens": full["tokens"], "heads": heads}


def format_costs(compact: dict[str, Any]) -> str:
    """``compact_costs``' record as text lines, costliest head first: each kind's KL with its interval and its ratio
    to the mean ablation (explain's summary table)."""
    heads = compact.get("heads", {})
    lines = [f"per-head causal cost, each head swapped alone: KL(base ‖ swapped) nats/token over {compact['tokens']} "
             f"predicted tokens in {compact['windows']} select windows [95% interval]; ratio: over mean ablation"]

    def kl(label: str) -> float:
        row = heads[label]
        return row.get("explanation", row.get("replacement", {})).get("kl", 0.0)

    for label in sorted(heads, key=lambda h: (-kl(h), h)):
        parts = []
        for kind in ("explanation", "replacement", "mean"):
            cell = heads[label].get(kind)
            if cell:
                lo, hi = cell["kl_ci95"]
                ratio = f", ratio {cell['over_mean']:.2f}" if "over_mean" in cell else ""
                parts.append(f"{kind} {cell['kl']:.4f} [{lo:.4f}, {hi:.4f}]{ratio}")
        lines.append(f"{label:<7} " + "; ".join(parts))
    return "\n".join(lines)
