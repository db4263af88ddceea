"""The order a replacement sweep swaps heads in: by IoU on the select split (most faithful first), by measured
per-head ΔPPL (cheapest first) or at random, for either kind of program; and, per step, which order was cheaper.

IoU alone predicts cost poorly (benchmarks/RESULTS.md), so ``eval --order delta_ppl`` orders heads by what one swap
costs (headsurgeon/surgery/measure/evaluate.py ``per_head_delta_ppl``).
"""
from __future__ import annotations

from typing import Any, Literal, Mapping, get_args

import numpy as np

from ...core import Head, InputError, Split, Which, WHICHES
from ...synth.programset import ProgramSet

__all__ = ["Order", "ORDERS", "ORDER_LABELS", "iou_split", "order_heads", "cheapest"]

Order = Literal["iou", "delta_ppl", "random"]
ORDERS: tuple[Order, ...] = get_args(Order)
#: how tables and plots name each order
ORDER_LABELS = {"iou": "IoU order", "delta_ppl": "ΔPPL order", "random": "random order"}


def _kind_iou(programs: ProgramSet, head: Head, which: Which, split: Split) -> float | None:
    """The IoU on ``split`` of the head's program of kind ``which`` (the explanation has its own scores)."""
    entry = programs.entries[head]
    scores = entry.scores if which == "replacement" else entry.explanation.scores  # type: ignore[union-attr]  # the caller asks only for heads with an explanation
    return scores.iou(split)


def iou_split(programs: ProgramSet, which: Which = "replacement") -> Split:
    """The split an IoU order ranks ``which`` programs on: "select" when every one has a select IoU (explain's
    programs do), else "test" (a set scored only on test, e.g. one built by hand)."""
    heads = list(programs.programs(which))
    selected = heads and all(_kind_iou(programs, h, which, "select") is not None for h in heads)
    return "select" if selected else "test"


def order_heads(programs: ProgramSet, by: Order = "iou", *, which: Which = "replacement",
                deltas: Mapping[Any, float] | None = None, split: Split | None = None, seed: int = 0) -> list[Head]:
    """The heads holding a program of kind ``which``, in sweep order.

    ``by="iou"``: IoU on ``split`` descending (heads without a score last; ties by head), as
    ``ProgramSet.ranked`` orders replacements. By default the split is ``iou_split``'s: the select split the programs
    were chosen on, so the test windows a sweep is measured on play no part in its order. ``by="delta_ppl"``:
    ``deltas`` (head → per-head ΔPPL, e.g. ``per_head_delta_ppl``'s result) ascending, cheapest first; every head must
    have one. ``by="random"``: a permutation seeded by ``seed``.
    """
    if not isinstance(programs, ProgramSet):
        raise InputError(f"order_heads needs a ProgramSet, got {type(programs).__name__}")
    if by not in ORDERS:
        raise InputError(f"by must be one of {', '.join(ORDERS)}, not {by!r}")
    if which not in WHICHES:
        raise InputError(f"which must be one of {', '.join(WHICHES)}, not {which!r}")
    heads = [Head(*h) for h in programs.programs(which)]
    if by == "random":
        return [heads[i] for i in np.random.default_rng(seed).permutation(len(heads))]
    if by == "iou":
        on = split or iou_split(programs, which)

        def iou_key(h: Head) -> tuple[float, Head]:
            iou = _kind_iou(programs, h, which, on)
            return (-iou if iou is not None else float("inf"), h)

        return sorted(heads, key=iou_key)
    if deltas is None:
        raise InputError("by='delta_ppl' needs deltas: pass deltas=per_head_delta_ppl(model, programs, sequences)")
    measured = {Head.parse(k): float(v) for k, v in deltas.items()}
    missing = [str(h) for h in heads if h not in measured]
    if missing:
        raise InputError(f"deltas has no per-head ΔPPL for {', '.join(missing[:20])}; measure every head of the "
                         "sweep with per_head_delta_ppl")
    return sorted(heads, key=lambda h: (measured[h], h))


def cheapest(costs: Mapping[str, float], tolerance: float = 1e-12) -> str:
    """The label of the lowest cost; labels within ``tolerance`` of it joined by " = " ("all equal" when every
    order swapped the same heads, as at 0% and 100%)."""
    if not costs:
        return "-"
    low = min(costs.values())
    best = [label for label, cost in costs.items() if cost - low <= tolerance]
    return "all equal" if len(best) == len(costs) > 1 else " = ".join(best)
