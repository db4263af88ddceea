"""Every figure the library draws with matplotlib (headless, Agg): sweep curves (the replacement sweep, the eval
report's), and the head finders' layer × head heatmap.

The eval report's ΔPPL panels use a symmetric log scale: the random-program baseline costs orders of magnitude more
and would flatten the real curves on a linear one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...core import InputError
from .eval_format import KIND_LABELS
from .sweep_order import ORDER_LABELS

__all__ = ["pyplot", "save_figure", "draw_curves", "plot_sweep", "plot_report",
           "head_heatmap"]

_STYLES = ("-o", "-D", "--s", ":^")
#: a sweep's chosen order and its two baselines, as replacement_sweep and downstream_sweep write their rows
BASELINE_ARMS = (("", "by IoU (chosen order)"), ("_random_order", "random order"),
                 ("_random_program", "random programs"))


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out_png: str | Path) -> Path:
    """Write a matplotlib figure to ``out_png`` (parents created) and close it."""
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, bbox_inches="tight")  # tight_layout leaves a suptitle out: the box takes it in
    pyplot().close(fig)
    return out_png


def draw_curves(ax: Any, rows: list[dict], arms: list[tuple[str, str]], ylabel: str, title: str = "",
                scale: float = 100.0, log: bool = False) -> None:
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


def _sweep_arms(key: str) -> list[tuple[str, str]]:
    return [(key + suffix, label) for suffix, label in BASELINE_ARMS]


def plot_sweep(rows: list[dict[str, float]], out_png: str | Path, title: str = "",
               ylabel: str = "perplexity change (%)") -> Path:
    """ΔPPL (or embedding distance) against the fraction replaced, for the chosen order and both baselines."""
    fig, ax = pyplot().subplots(figsize=(6, 4), dpi=110)
    draw_curves(ax, rows, _sweep_arms("delta"), ylabel, title)
    return save_figure(fig, out_png)


def plot_report(report: Any, out_png: str | Path) -> Path:
    """The eval report's figure (an EvalReport with a sweep): one row of panels per kind of program, its ΔPPL panel
    on a symlog scale, then one panel per lm-eval task when tasks were swept."""
    kinds = [kr for kr in report.kinds.values() if kr.sweep]
    if not kinds:
        raise InputError("this report has no sweep to plot: run evaluate_programs(..., sweep=True)")
    tasks = list(dict.fromkeys(r["task"] for kr in kinds for r in kr.downstream_sweep or []))
    fig, axes = pyplot().subplots(len(kinds), 1 + len(tasks), figsize=(5.5 * (1 + len(tasks)), 4 * len(kinds)),
                                  dpi=110, squeeze=False)
    for row, kr in zip(axes, kinds):
        first, *rest = kr.sweep_orders
        label = KIND_LABELS[kr.kind]
        arms = [("delta", ORDER_LABELS[first])] + [(f"delta_by_{o}", ORDER_LABELS[o]) for o in rest]
        arms += [("delta_random_order", "random order"), ("delta_random_program", "random programs")]
        metric, unit = ("ΔPPL", "perplexity change") if report.lm_head else ("embedding distance", "1 − cos")
        draw_curves(row[0], kr.sweep, arms, f"{unit} (%, symlog)", f"{label}: {metric} ({kr.heads} heads)", 100.0,
                    True)
        for ax, task in zip(row[1:], tasks):
            mine = [r for r in kr.downstream_sweep or [] if r["task"] == task]
            if not mine:
                ax.set_visible(False)
                continue
            draw_curves(ax, mine, [("value", ORDER_LABELS[first]), ("value_random_order", "random order"),
                                   ("value_random_program", "random programs")], mine[0]["metric"],
                        f"{label}: {task}", 1.0, False)
    fig.suptitle(f"{report.model}: heads swapped for programs, on {report.test_sequences} test windows")
    return save_figure(fig, out_png)


def head_heatmap(scores: np.ndarray, title: str, path: str | Path | None = None) -> Any:
    """A layer × head heatmap of scores in [0, 1] (a matplotlib Figure), saved to ``path`` when given."""
    layers, heads = scores.shape
    fig, ax = pyplot().subplots(figsize=(1.2 + 0.45 * heads, 1.0 + 0.3 * layers))
    im = ax.imshow(scores, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
