"""The one replacement sweep: heads swapped in order, 0 → 100% in steps, beside a random order and random programs,
each arm's ΔPPL and KL(base ‖ hybrid) measured through :class:`SwapCosts` (or the embedding distance without an LM
head), and per step the cheaper order. ``evaluate_programs`` (headsurgeon/surgery/measure/eval_report.py) and
``sweep_programs`` below (for any head → program mapping) both build their rows here.
"""
from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence as Seq, TypeVar, cast

import numpy as np
from tqdm.auto import tqdm

from ...synth.trust import TrustPrograms
from ...kernels.cache import TensorCache
from ...core import Head
from ...synth.programset import ProgramMap, ProgramSet
from ...synth.sequence import Sequence
from .divergence import BaseDistributions, WindowCosts, base_costs, means, window_costs
from .embedding import EvaluationError, embedding_distance, sentence_embeddings
from ..models.loading import load_model
from ..swap.hybrid import HybridModel
from ..swap.replace import replace_heads
from .sweep_order import ORDER_LABELS, cheapest
from ..models.handle import ModelHandle

__all__ = ["SwapCosts", "sweep_rows", "sweep_programs", "sweep_arms", "sweep_heads", "trusted_programs", "order_label",
           "ppl"]


class SwapCosts:
    """What a set of swapped heads costs on ``sequences``: per-window KL and NLLs against one base pass
    (headsurgeon/surgery/measure/divergence.py), or the embedding distance without an LM head. Each distinct set (head → program) is
    measured once: the sweep's 100% step, its orders' shared steps, a one-head step and that head's per-head swap,
    and the headline are one measurement each. Nothing runs before a set is asked for."""

    def __init__(self, handle: ModelHandle, sequences: list[Sequence]) -> None:
        self.handle, self.sequences = handle, sequences
        self.base = BaseDistributions(handle, sequences) if handle.has_lm_head else None
        self.known: dict[frozenset, WindowCosts | float] = {}
        #: one pattern cache for every swap: a program (a sandboxed one above all) is evaluated once on these
        #: windows, not once per sweep step
        self.patterns = TensorCache(max_bytes=256 << 20)

    @staticmethod
    def key(chosen: Mapping[Any, Any]) -> frozenset:
        return frozenset((Head.parse(h), getattr(p, "hash", p)) for h, p in chosen.items())

    @cached_property
    def base_embeddings(self) -> Any:
        return sentence_embeddings(self.handle, self.sequences)

    def windows(self, chosen: Mapping[Any, Any], hybrid: HybridModel | None = None) -> WindowCosts | float:
        """Per-window costs with ``chosen`` swapped (the embedding distance without an LM head); ``hybrid``: that
        swap already installed (the headline's: replace_heads checks its ProgramSet against the tokenizer)."""
        key = self.key(chosen)
        if key not in self.known:
            if not chosen:
                self.known[key] = base_costs(self.base) if self.base is not None else 0.0
            elif hybrid is not None:
                self.known[key] = self._run(hybrid)
            else:
                with replace_heads(self.handle, dict(chosen), cache=self.patterns) as swapped:
                    self.known[key] = self._run(swapped)
        return self.known[key]

    def lm_costs(self, chosen: Mapping[Any, Any], hybrid: HybridModel | None = None) -> WindowCosts:
        """``windows`` of a model with an LM head: the per-window KL and NLLs."""
        costs = self.windows(chosen, hybrid)
        if not isinstance(costs, WindowCosts):
            raise EvaluationError(f"{self.handle.name} has no language-model head: its swaps have an embedding "
                                  "distance, not per-token costs")
        return costs

    def distance(self, chosen: Mapping[Any, Any], hybrid: HybridModel | None = None) -> float:
        """``windows`` of a model without an LM head: the embedding distance between base and hybrid."""
        costs = self.windows(chosen, hybrid)
        if isinstance(costs, WindowCosts):
            raise EvaluationError(f"{self.handle.name} has a language-model head: measure its swaps with lm_costs")
        return costs

    def _run(self, hybrid: HybridModel) -> WindowCosts | float:
        if self.base is None:
            return embedding_distance(self.base_embeddings, hybrid, self.sequences)
        return window_costs(self.base, hybrid)

    def measure(self, chosen: Mapping[Any, Any]) -> dict[str, float]:
        """``chosen``'s figures by name: {ppl, delta (ΔPPL), kl}, or {embedding_distance, delta} without an LM head."""
        costs = self.windows(chosen)
        if not isinstance(costs, WindowCosts):
            return {"embedding_distance": costs, "delta": costs}
        kl, delta_nll = means(costs)
        return {"ppl": ppl(costs), "delta": math.expm1(delta_nll), "kl": kl}


def ppl(costs: WindowCosts) -> float:
    """The perplexity of the measured model (the hybrid; the base for ``base_costs``), token-weighted."""
    return math.exp(costs.nll_other.sum() / costs.tokens.sum())


P = TypeVar("P")


def trusted_programs(programs: P, trust_programs: TrustPrograms = False) -> P:
    """``programs`` past the one trust gate (headsurgeon/synth/trust.py) when it is a ProgramSet read from someone else."""
    return cast(P, programs.trusted(trust_programs)) if isinstance(programs, ProgramSet) else programs


def sweep_heads(programs: ProgramSet | ProgramMap, order: Seq[Any] | None) -> tuple[dict, list]:
    """(head → program, heads in sweep order); every head in ``order`` must have a program."""
    items = {Head.parse(k): v for k, v in programs.items()}
    heads = [Head.parse(h) for h in order] if order is not None else list(items)
    missing = [h for h in heads if h not in items]
    if missing:
        raise EvaluationError(f"sweep order names heads without programs: {[Head.label(h) for h in missing][:20]}")
    return items, heads


def sweep_arms(items: Mapping[Any, Any], heads: list, steps: Seq[float],
               seed: int) -> Iterator[tuple[float, int, dict[str, dict]]]:
    """Per step: (fraction, heads replaced, {"": the first k heads in order, "_random_order": k heads in a seeded
    random order, "_random_program": the first k heads, each given another head's program on a random cycle})."""
    rng = np.random.default_rng(seed)
    random_order = [heads[i] for i in rng.permutation(len(heads))]
    cycle = rng.permutation(len(heads))  # each head takes the program of the next head on a random cycle
    random_program = {heads[cycle[i]]: items[heads[cycle[(i + 1) % len(heads)]]] for i in range(len(heads))}
    for frac in steps:
        k = int(round(frac * len(heads)))
        yield float(frac), k, {"": {h: items[h] for h in heads[:k]},
                               "_random_order": {h: items[h] for h in random_order[:k]},
                               "_random_program": {h: random_program[h] for h in heads[:k]}}


def order_label(order: str) -> str:
    """How tables name a sweep order (headsurgeon/surgery/measure/sweep_order.py ``ORDER_LABELS``; "given order" otherwise)."""
    return ORDER_LABELS.get(order, f"{order} order")


def sweep_rows(costs: SwapCosts, items: Mapping[Any, Any], orders: Mapping[str, list], steps: Seq[float], seed: int,
               *, desc: str = "replacement sweep", progress: bool = True) -> list[dict[str, Any]]:
    """The sweep's rows: per step, ``fraction`` and ``n_heads``, then each arm's figures (``ppl``, ``delta``, ``kl``,
    or ``embedding_distance``/``delta`` without an LM head) for the first order of ``orders`` (order name → heads),
    a seeded random order (``_random_order``) and random programs (``_random_program``), each further order's arm
    (``_by_<order>``), and ``cheapest``: the order with the lowest ΔPPL at that step."""
    first, *rest = orders
    rows = []
    for frac, k, arms in tqdm(list(sweep_arms(items, orders[first], steps, seed)), desc=desc, disable=not progress):
        row: dict[str, Any] = {"fraction": frac, "n_heads": k}
        for label, chosen in arms.items():
            row.update({name + label: value for name, value in costs.measure(chosen).items()})
        rows.append(row)
    for order in rest:  # the same steps of another order: its first-k arm only (the baselines are shared)
        for row, (_frac, _k, arms) in zip(rows, sweep_arms(items, orders[order], [r["fraction"] for r in rows],
                                                           seed)):
            row.update({f"{name}_by_{order}": value for name, value in costs.measure(arms[""]).items()})
    for row in rows:
        row["cheapest"] = cheapest({order_label(first): row["delta"],
                                    **{order_label(o): row[f"delta_by_{o}"] for o in rest},
                                    ORDER_LABELS["random"]: row["delta_random_order"]})
    return rows


def sweep_programs(model: Any, programs: ProgramSet | ProgramMap, sequences: list[Sequence],
                   order: Seq[Any] | None = None, steps: Seq[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
                   seed: int = 0, out_png: str | Path | None = None, progress: bool = True,
                   title: str = "", trust_programs: TrustPrograms = False) -> list[dict[str, Any]]:
    """Swap ``programs`` (head → program) in ``order`` (default: as given), 0 → 100% in ``steps``, on ``sequences``:
    :func:`sweep_rows` (each arm's ``ppl``, ``delta`` and ``kl``; ``embedding_distance`` and ``delta`` without an
    LM head) and, with ``out_png``, a plot. For a ProgramSet's two kinds and ΔPPL order, ``evaluate_programs``
    (headsurgeon/surgery/measure/eval_report.py) sweeps the same way."""
    handle = load_model(model)
    items, heads = sweep_heads(trusted_programs(programs, trust_programs), order)
    rows = sweep_rows(SwapCosts(handle, sequences), items, {"given": heads}, steps, seed, progress=progress)
    if out_png is not None:
        from .plots import plot_sweep

        plot_sweep(rows, out_png, title or f"{handle.name}: replacement sweep",
                   ylabel="perplexity change (%)" if handle.has_lm_head else "embedding distance (1 − cos, %)")
    return rows
