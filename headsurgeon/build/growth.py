"""Growing a head set under a head count or a ΔPPL budget, cheapest single-swap cost first, re-measured jointly.

Costs compound, so the set grows in chunks re-measured jointly on the select windows: a chunk whose joint cost exceeds
``COMPOUND_LIMIT`` times the sum of its heads' single costs is taken apart, and its heads that cost more together than
alone go to the back of the queue. A set fits a budget when the upper end of its ΔPPL interval is within it."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..core import Head

if TYPE_CHECKING:  # the measurement types load torch: named for the checker only
    from ..surgery.measure.divergence import CostSummary
    from ..surgery.models.handle import ModelHandle
    from ..synth.program import Program
    from ..synth.sequence import Sequence

__all__ = ["COMPOUND_LIMIT", "JointCosts", "grow", "within"]

#: a chunk whose joint cost passes this multiple of its heads' summed single costs is taken apart
COMPOUND_LIMIT = 2.0


class JointCosts:
    """Joint costs of head sets on fixed windows, as summaries: each distinct set is measured once
    (headsurgeon/surgery/measure/sweep.py ``SwapCosts``)."""

    def __init__(self, handle: ModelHandle, windows: list[Sequence], programs: dict[Head, Program]) -> None:
        from ..surgery.measure.sweep import SwapCosts

        self.costs, self.programs = SwapCosts(handle, windows), programs

    def measure(self, heads: list[Head]) -> CostSummary:
        from ..surgery.measure.divergence import summarize

        return summarize(self.costs.lm_costs({h: self.programs[h] for h in heads}))


def within(summary: CostSummary, budget: float | None) -> bool:
    """Whether a set fits the ΔPPL ``budget`` (a ratio): the upper end of its 95% interval, not its estimate, must be
    within it, so that a set grown on few windows, its heads kept because their cost there happened to be low, still
    fits on text it never saw."""
    return budget is None or summary.delta_ppl_ci95[1] <= budget


def grow(joint: JointCosts, order: list[Head], single: dict[Head, float], k_max: int, budget: float | None,
         chunk: int, steps: list[dict[str, Any]]) -> list[Head]:
    """Heads in ``order`` added chunk by chunk under ``k_max`` heads (and the ΔPPL ``budget``, a ratio, on the select
    windows), each chunk re-measured jointly; every measurement is appended to ``steps``."""
    chosen: list[Head] = []
    current = 0.0
    queue, deferred = list(order), []

    def record(heads: list[Head], summary: CostSummary, kept: bool) -> None:
        steps.append({"heads": len(chosen) + (len(heads) if kept else 0), "tried": [Head.label(h) for h in heads],
                      "kept": kept, **summary.to_json()})

    while queue and len(chosen) < k_max:
        take = queue[: min(chunk, k_max - len(chosen))]
        queue = queue[len(take):]
        summary = joint.measure(chosen + take)
        compounds = summary.kl - current > COMPOUND_LIMIT * sum(single[h] for h in take) + 1e-9
        if within(summary, budget) and not (compounds and len(take) > 1):
            record(take, summary, True)
            chosen += take
            current = summary.kl
            continue
        record(take, summary, False)
        for h in take:  # one at a time: keep the heads that fit and do not compound; the rest wait
            if len(chosen) >= k_max:
                break
            alone = joint.measure(chosen + [h])
            ok = within(alone, budget) and alone.kl - current <= COMPOUND_LIMIT * single[h] + 1e-9
            record([h], alone, ok)
            if ok:
                chosen.append(h)
                current = alone.kl
            elif within(alone, budget):
                deferred.append(h)
        if budget is not None and not within(summary, budget) and not any(s["kept"] for s in steps[-len(take):]):
            break  # nothing of the cheapest remaining chunk fits the budget: the rest costs more
        if not queue and deferred:
            queue, deferred = deferred, []  # compounding heads get a second chance once the cheap ones are in
            single = {**single, **{h: math.inf for h in queue}}  # ...accepted on budget alone
    return chosen
