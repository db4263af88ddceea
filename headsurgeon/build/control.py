"""The control a build is judged beside: the same number of heads taken in select-IoU order (the order a pattern
metric gives), measured on the same windows."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import Head, Which

if TYPE_CHECKING:  # the model and measurement types load torch: named for the checker only
    from ..surgery.measure.divergence import BaseDistributions
    from ..surgery.models.handle import ModelHandle
    from ..synth.programset import ProgramSet

__all__ = ["iou_control"]


def iou_control(programs: ProgramSet, which: Which, k: int, base: BaseDistributions,
                handle: ModelHandle) -> dict[str, Any]:
    """The first ``k`` heads of ``programs`` by select IoU, swapped for their ``which`` programs and measured against
    ``base``."""
    from ..surgery.measure.divergence import summarize, window_costs
    from ..surgery.measure.sweep_order import order_heads
    from ..surgery.swap.replace import replace_heads

    heads = order_heads(programs, "iou", which=which, split="select")[:k]
    with replace_heads(handle, programs.subset(heads), which=which) as hybrid:
        test = summarize(window_costs(base, hybrid)).to_json()
    return {"order": "select IoU", "heads": [Head.label(h) for h in heads], "test": test}

