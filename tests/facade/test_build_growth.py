"""The growth of a build's head set (headsurgeon/build/growth.py ``grow``) on costs given as numbers, no model: chunks
re-measured jointly, a chunk that compounds taken apart, its compounding head deferred and then accepted on the budget
alone, and the growth stopping at the first chunk of which nothing fits."""
from __future__ import annotations

from headsurgeon.build.growth import COMPOUND_LIMIT, grow
from headsurgeon.surgery.measure.divergence import CostSummary

SINGLE = {"L0H0": 0.01, "L0H1": 0.02, "L0H2": 0.03, "L0H3": 0.04, "L0H4": 0.05, "L0H5": 0.06}
A, B, C, D, E, F = SINGLE


class TableCosts:
    """Joint KL = the sum of single costs, times ``boost`` for a set holding both heads of ``pair``; ΔPPL = KL, its
    interval ± ``half`` around it. Counts the measurements."""

    def __init__(self, pair: tuple[str, str] = (B, C), boost: float = 1.0, half: float = 0.0) -> None:
        self.pair, self.boost, self.half, self.calls = pair, boost, half, 0

    def measure(self, heads: list[str]) -> CostSummary:
        self.calls += 1
        kl = sum(SINGLE[h] for h in heads)
        if set(self.pair) <= set(heads):
            kl *= self.boost
        return CostSummary(kl, (kl, kl), kl, (kl, kl), kl, (kl - self.half, kl + self.half), 100, 10)


def test_heads_are_added_chunk_by_chunk_in_order_up_to_the_count():
    steps: list = []
    joint = TableCosts()
    assert grow(joint, list(SINGLE), SINGLE, 5, None, 2, steps) == [A, B, C, D, E]
    assert [s["heads"] for s in steps] == [2, 4, 5] and all(s["kept"] for s in steps)
    assert joint.calls == 3
    assert {"kl", "kl_ci95", "delta_ppl_pct", "delta_ppl_ci95_pct", "tokens", "windows"} <= set(steps[0])
    assert steps[1]["tried"] == [C, D]


def test_a_compounding_chunk_is_taken_apart_and_its_head_waits_for_the_cheap_ones():
    steps: list = []
    # with A and B in, adding C costs far more than C's single cost: the chunk [C, D] compounds
    boost = 1 + 2 * COMPOUND_LIMIT
    chosen = grow(TableCosts((B, C), boost), [A, B, C, D], SINGLE, 4, None, 2, steps)
    assert chosen == [A, B, D, C]  # C deferred behind D, then accepted once nothing cheap is left
    tried = [(s["tried"], s["kept"]) for s in steps]
    assert tried == [([A, B], True), ([C, D], False), ([C], False), ([D], True), ([C], True)]


def test_a_budget_bounds_the_upper_end_and_stops_the_growth():
    steps: list = []
    joint = TableCosts(half=0.02)
    chosen = grow(joint, list(SINGLE), SINGLE, len(SINGLE), 0.085, 2, steps)
    assert chosen == [A, B, C]  # A+B+C = 0.06, upper end 0.08; with D 0.12, with E or F alone 0.13 or more
    assert all(s["delta_ppl_ci95_pct"][1] <= 8.5 for s in steps if s["kept"])
    assert [s["tried"] for s in steps][-2:] == [[E], [F]]  # nothing of the chunk [E, F] fits: the growth stops
    assert not steps[-1]["kept"] and joint.calls == len(steps)
