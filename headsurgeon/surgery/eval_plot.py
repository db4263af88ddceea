"""The eval report's sweep figure: one row of panels per kind of program (replacements, explanations), its ΔPPL
panel on a symmetric log scale (the random-program baseline costs orders of magnitude more and would flatten
the real curves on a linear one), then one panel per lm-eval task when tasks were swept."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..kernels.core import InputError
from .eval_format import KIND_LABELS
from .evaluate import save_figure
from .sweep_order import ORDER_LABELS

__all__ = ["plot_report"]

_STYLES = ("-o", "-D", "--s", ":^")


def _panel(ax: Any, rows: list[dict], arms: list[tuple[str, str]], ylabel: str, title: str, scale: float,
           log: bool) -> None:
    """Curves of ``rows[key]`` against the fraction of heads swapped, one per (key, label) arm."""
    x = [100 * r["fraction"] for r in rows]
    for (key, label), style in zip(arms, _STYLES):
        ax.plot(x, [scale * r[key] for r in rows], style, label=label)
    if log:
        ax.set_yscale("symlog", linthresh=1.0)  # linear within ±1%, logarithmic beyond
    ax.set_xlabel("heads replaced (%)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def plot_report(report: Any, out_png: str | Path) -> Path:
    """Write the figure of ``report`` (an EvalReport with a sweep) to ``out_png``."""
    kinds = [kr for kr in report.kinds.values() if kr.sweep]
    if not kinds:
        raise InputError("this report has no sweep to plot: run evaluate_programs(..., sweep=True)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for kr in kinds for r in kr.downstream_sweep or []))
    fig, axes = plt.subplots(len(kinds), 1 + len(tasks), figsize=(5.5 * (1 + len(tasks)), 4 * len(kinds)),
                             dpi=110, squeeze=False)
    for row, kr in zip(axes, kinds):
        first, *rest = kr.sweep_orders
        label = KIND_LABELS[kr.kind]
        arms = [("delta", ORDER_LABELS[first])] + [(f"delta_by_{o}", ORDER_LABELS[o]) for o in rest]
        arms += [("delta_random_order", "random order"), ("delta_random_program", "random programs")]
        metric, unit = ("ΔPPL", "perplexity change") if report.lm_head else ("embedding distance", "1 − cos")
        _panel(row[0], kr.sweep, arms, f"{unit} (%, symlog)", f"{label}: {metric} ({kr.heads} heads)", 100.0, True)
        for ax, task in zip(row[1:], tasks):
            mine = [r for r in kr.downstream_sweep or [] if r["task"] == task]
            if not mine:
                ax.set_visible(False)
                continue
            _panel(ax, mine, [("value", ORDER_LABELS[first]), ("value_random_order", "random order"),
                              ("value_random_program", "random programs")], mine[0]["metric"], f"{label}: {task}",
                   1.0, False)
    fig.suptitle(f"{report.model}: heads swapped for programs, on {report.test_sequences} test windows")
    return save_figure(fig, out_png)
