"""``evaluate_programs``: what swapping a ProgramSet in costs, for both kinds of program side by side.

Each head holds a replacement (its most faithful program, often a fitted table) and maybe an explanation (its
best readable one, synth/programset.py). Every measurement here (the headline perplexity, per-head ΔPPL, the
sweep, lm-eval tasks) is made for each kind asked, labelled by kind; heads without an explanation are counted
and named, since they stay neural when explanations are swapped in. ``headsurgeon eval`` prints this report.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence as Seq

from ..kernels.core import InputError, WHICHES
from ..synth.programset import ProgramSet
from ..synth.sequence import Sequence
from .corpus import Splits, load_corpus
from .evaluate import (delta_ppl_interval, per_head_delta_ppl, perplexity, replacement_sweep,
                       sweep_arms, sweep_heads, window_losses)
from .embedding import embedding_distance
from .eval_format import format_report
from .loading import load_model
from .replace import head_name, replace_heads
from .scorable import require_lm_head
from .sweep_order import ORDER_LABELS, cheapest, order_heads

__all__ = ["EvalReport", "KindReport", "evaluate_programs"]

WhichArg = Literal["both", "replacement", "explanation"]
OrderArg = Literal["iou", "delta_ppl", "both"]
_NEURAL_WARNING = r".* head\(s\) have no (replacement|explanation) and keep their neural attention"


@dataclass
class KindReport:
    """One kind of program (replacements or explanations): what swapping it in cost, measured every way asked."""

    kind: str
    heads: int  # heads holding a program of this kind (the ones swapped)
    neural: list[str] = field(default_factory=list)  # heads of the set without one: they stay neural
    hybrid_ppl: float | None = None
    hybrid_delta_pct: float | None = None
    hybrid_delta_ci95_pct: list[float] | None = None
    embedding_distance: float | None = None  # models without an LM head
    per_head: list[dict[str, Any]] | None = None  # {head, program, iou, delta_pct}
    sweep: list[dict[str, Any]] | None = None  # replacement_sweep rows, + the second order's arm and "cheapest"
    sweep_orders: list[str] = field(default_factory=list)  # the orders swept (the rows' "delta" arm first)
    head_orders: dict[str, list[str]] | None = None  # order → the heads in the order they were swapped
    order_delta_pct: dict[str, float] | None = None  # the per-head ΔPPL the ΔPPL order sorted by
    downstream: dict[str, Any] | None = None
    downstream_sweep: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """This kind's figures as JSON-able values (None fields left out)."""
        out = {k: v for k, v in self.__dict__.items() if v is not None and k != "kind"}
        out["neural_count"] = len(self.neural)
        return out


@dataclass
class EvalReport:
    """What ``evaluate_programs`` measured: the base, then one :class:`KindReport` per kind of program."""

    model: str
    test_sequences: int
    lm_head: bool
    ppl: float | None  # the base model's (None without an LM head)
    program_heads: int  # heads in the program set (0: no programs given)
    kinds: dict[str, KindReport] = field(default_factory=dict)
    order_on: str | None = None  # windows the ΔPPL order was measured on: "select" (disjoint from test) or "test"
    order_sequences: int = 0
    downstream: dict[str, Any] | None = None  # the base alone, when no programs were given
    tasks_limit: Any = None
    seed: int = 0
    sweep_png: str | None = None  # set by :meth:`plot`

    @property
    def headline(self) -> str | None:
        """The kind the top-level JSON fields describe: the first one measured that has heads."""
        measured = [k for k, r in self.kinds.items() if r.heads]
        return measured[0] if measured else next(iter(self.kinds), None)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON: every kind under ``kinds``; the top-level hybrid fields repeat the headline kind's."""
        out: dict[str, Any] = {"model": self.model, "test_sequences": self.test_sequences, "lm_head": self.lm_head}
        if self.ppl is not None:
            out["ppl"] = self.ppl
        if self.kinds:
            out.update(which=list(self.kinds), headline=self.headline,
                       kinds={k: r.to_json() for k, r in self.kinds.items()})
            if self.order_on is not None:
                out.update(order_on=self.order_on, order_sequences=self.order_sequences)
            headline = self.kinds[self.headline].to_json()  # type: ignore[index]
            out.update({k: v for k, v in headline.items() if k not in ("neural", "neural_count", "heads")})
        if self.downstream is not None:
            out["downstream"] = self.downstream
        if self.sweep_png is not None:
            out["sweep_png"] = self.sweep_png
        return out

    def format(self) -> str:
        """The report as text tables, kinds side by side (what ``headsurgeon eval`` prints)."""
        return format_report(self)

    def plot(self, out_png: str | Path) -> Path:
        """Write the sweep (one panel per kind, log-scaled; task panels beside) to ``out_png``."""
        from .eval_plot import plot_report

        path = plot_report(self, out_png)
        self.sweep_png = str(path)
        return path


def _kinds(which: str) -> tuple[str, ...]:
    if which == "both":
        return WHICHES
    if which not in WHICHES:
        raise InputError(f"which must be 'both', 'replacement' or 'explanation', not {which!r}")
    return (which,)


def _orders(order: str) -> tuple[str, ...]:
    if order == "both":
        return ("iou", "delta_ppl")
    if order not in ("iou", "delta_ppl"):
        raise InputError(f"order must be 'iou', 'delta_ppl' or 'both', not {order!r}")
    return (order,)


def _program_set(programs: Any, trust_programs: Any) -> ProgramSet | None:
    if programs is None:
        return None
    if isinstance(programs, (str, Path)):
        programs = ProgramSet.load(programs)
    if not isinstance(programs, ProgramSet):
        raise InputError(f"programs must be a ProgramSet or a programs.json path, got {type(programs).__name__}; "
                         "build one with hs.ProgramSet() and .add(head, program)")
    return programs.trusted(trust_programs)


def _windows(handle: Any, corpus: Any, max_len: int, max_sequences: int | None,
             seed: int) -> tuple[list[Sequence], list[Sequence], str]:
    """(test windows, windows the ΔPPL order is measured on, their split's name)."""
    if isinstance(corpus, (str, Path)):
        corpus = load_corpus(handle, corpus, max_len=max_len, max_sequences=max_sequences, seed=seed)
    if isinstance(corpus, Splits):
        if not corpus.test:
            raise InputError("the corpus has no test windows; give more documents or raise max_sequences")
        return (corpus.test, corpus.select, "select") if corpus.select else (corpus.test, corpus.test, "test")
    sequences = list(corpus)
    if not sequences or not all(isinstance(s, Sequence) for s in sequences):
        raise InputError("corpus must be a text file, a Splits (load_corpus) or a non-empty list of Sequences")
    return sequences, sequences, "test"


def _ppl_with(handle: Any, chosen: dict, sequences: list[Sequence], base: float) -> tuple[float, float]:
    """(perplexity, ΔPPL) with ``chosen`` heads swapped (the base when none)."""
    if not chosen:
        return base, 0.0
    with replace_heads(handle, chosen) as hybrid:
        ppl = perplexity(hybrid, sequences, progress=False)
    return ppl, ppl / base - 1.0


def _sweep(handle: Any, programs: ProgramSet, kind: str, report: KindReport, orders: tuple[str, ...],
           test: list[Sequence], order_seqs: list[Sequence], base: float, seed: int, progress: bool) -> None:
    """The kind's sweep in ``orders[0]`` with its baselines, plus the second order's arm and the cheaper order."""
    chosen = programs.programs(kind)
    heads = {}
    for order in orders:
        deltas = None
        if order == "delta_ppl":
            if order_seqs is test and report.per_head is not None:
                deltas = {r["head"]: r["delta_pct"] / 100 for r in report.per_head}
            else:
                deltas = per_head_delta_ppl(handle, chosen, order_seqs, progress=progress)
            report.order_delta_pct = {head_name(h): 100 * d for h, d in deltas.items()}
        heads[order] = order_heads(programs, order, which=kind, deltas=deltas, seed=seed)
    first, *rest = orders
    rows = replacement_sweep(handle, chosen, test, order=heads[first], seed=seed, progress=progress)
    items, _ = sweep_heads(chosen, None)
    for order in rest:
        for row, (_frac, _k, arms) in zip(rows, sweep_arms(items, heads[order], [r["fraction"] for r in rows], seed)):
            row[f"ppl_by_{order}"], row[f"delta_by_{order}"] = _ppl_with(handle, arms[""], test, base)
    for row in rows:
        costs = {ORDER_LABELS[first]: row["delta"], **{ORDER_LABELS[o]: row[f"delta_by_{o}"] for o in rest},
                 ORDER_LABELS["random"]: row["delta_random_order"]}
        row["cheapest"] = cheapest(costs)
    report.sweep, report.sweep_orders = rows, list(orders)
    report.head_orders = {order: [head_name(h) for h in hs] for order, hs in heads.items()}


def _measure_kind(handle: Any, programs: ProgramSet, kind: str, test: list[Sequence], base_losses: Any,
                  base: float, seed: int, per_head: bool, progress: bool) -> KindReport:
    """The headline (all heads of this kind swapped, with a bootstrap interval) and the per-head table."""
    chosen = programs.programs(kind)
    report = KindReport(kind, len(chosen), [head_name(h) for h in programs.keys() if h not in chosen])
    if not chosen:
        return report
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEURAL_WARNING)  # the report names them
        with replace_heads(handle, programs, which=kind) as hybrid:  # checks the tokenizer's fingerprint
            losses = window_losses(hybrid, test, progress=False)
    delta, low, high = delta_ppl_interval(base_losses, losses, seed=seed)
    report.hybrid_ppl = math.exp(losses[0].sum() / losses[1].sum())
    report.hybrid_delta_pct, report.hybrid_delta_ci95_pct = 100 * delta, [100 * low, 100 * high]
    if per_head:
        deltas = per_head_delta_ppl(handle, chosen, test, base_ppl=base, progress=progress)
        report.per_head = [{"head": head_name(h), "program": _text(programs, h, kind),
                            "iou": _iou(programs, h, kind), "delta_pct": 100 * d} for h, d in deltas.items()]
    return report


def _text(programs: ProgramSet, head: Any, kind: str) -> str:
    """The program as rendered at selection time (token strings), cut to 60 characters."""
    entry = programs.entries[head]
    text = (entry.text or entry.program.text) if kind == "replacement" else entry.explanation.text  # type: ignore
    return text if len(text) <= 60 else text[:59] + "…"


def _iou(programs: ProgramSet, head: Any, kind: str) -> float | None:
    entry = programs.entries[head]
    return entry.iou("test") if kind == "replacement" else entry.explanation.iou("test")  # type: ignore[union-attr]


def _headless(handle: Any, programs: ProgramSet | None, kinds: tuple[str, ...], test: list[Sequence]) -> EvalReport:
    """A model without an LM head: the embedding distance between base and hybrid, per kind."""
    report = EvalReport(handle.name, len(test), False, None, len(programs) if programs is not None else 0)
    for kind in kinds if programs is not None else ():
        chosen = programs.programs(kind)
        kr = KindReport(kind, len(chosen), [head_name(h) for h in programs.keys() if h not in chosen])
        if chosen:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NEURAL_WARNING)
                with replace_heads(handle, programs, which=kind) as hybrid:
                    kr.embedding_distance = embedding_distance(handle, hybrid, test)
        report.kinds[kind] = kr
    return report


def evaluate_programs(model: Any, corpus: Any, programs: Any = None, *, which: WhichArg = "both",
                      per_head: bool = False, sweep: bool = False, order: OrderArg = "iou",
                      tasks: str | Seq[str] | None = None, limit: int | float | None = None,
                      include_path: Any = None, batch_size: int = 16, seed: int = 0, trust_programs: Any = False,
                      max_len: int = 128, max_sequences: int | None = None, progress: bool = False) -> EvalReport:
    """Measure the base model and the hybrid with ``programs`` swapped in, for each kind ``which`` names.

    ``corpus``: a text file (read with ``max_len``/``max_sequences``), a ``Splits`` (its test windows are
    measured; the ΔPPL order is measured on its select windows, so the order is not fitted to the windows that
    judge it) or a list of Sequences (used for both). ``which``: "both" (default), "replacement" or
    "explanation". ``per_head``: ΔPPL with one head swapped at a time. ``sweep``: 0 → 100% of heads swapped in
    ``order`` ("iou": best test IoU first; "delta_ppl": cheapest per-head ΔPPL first; "both": side by side),
    beside a random order and random programs; each row names the cheaper order. ``tasks``: lm-eval tasks on the
    base and each kind's hybrid (with ``sweep``: also at 0/25/50/100%). Returns an :class:`EvalReport`
    (``.format()``, ``.to_json()``, ``.plot(png)``).
    """
    kinds, orders = _kinds(which), _orders(order)
    if order != "iou" and not sweep:
        raise InputError(f"order={order!r} orders the sweep: pass sweep=True too (on the command line, --sweep PNG)")
    programs = _program_set(programs, trust_programs)
    handle = load_model(model)
    test, order_seqs, order_on = _windows(handle, corpus, max_len, max_sequences, seed)
    if tasks:
        require_lm_head(handle)  # before minutes of perplexity: lm-eval cannot score this model
    if not handle.has_lm_head:
        return _headless(handle, programs, kinds, test)
    base_losses = window_losses(handle, test, progress=False)
    base = math.exp(base_losses[0].sum() / base_losses[1].sum())
    report = EvalReport(handle.name, len(test), True, base, len(programs) if programs is not None else 0,
                        tasks_limit=limit, seed=seed)
    task_kw = dict(limit=limit, include_path=include_path, batch_size=batch_size, seed=seed)
    if programs is None:
        if tasks:
            from .downstream import downstream

            report.downstream = downstream(handle, tasks, **task_kw)
        return report
    if sweep and "delta_ppl" in orders:
        report.order_on, report.order_sequences = order_on, len(order_seqs)
    for kind in kinds:
        kr = _measure_kind(handle, programs, kind, test, base_losses, base, seed, per_head, progress)
        report.kinds[kind] = kr
        if not kr.heads:
            continue
        if sweep:
            _sweep(handle, programs, kind, kr, orders, test, order_seqs, base, seed, progress)
        if tasks:
            _downstream(handle, programs, kind, kr, tasks, sweep, task_kw, progress)
    return report


def _downstream(handle: Any, programs: ProgramSet, kind: str, report: KindReport, tasks: Any, sweep: bool,
                task_kw: dict, progress: bool) -> None:
    """lm-eval tasks on the base and this kind's hybrid (surgery/downstream.py); with ``sweep`` also per step."""
    from .downstream import downstream
    from .downstream_sweep import downstream_sweep

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEURAL_WARNING)
        report.downstream = downstream(handle, tasks, programs, which=kind, **task_kw)
    if sweep:
        order = report.head_orders[report.sweep_orders[0]]  # type: ignore[index]  # the ΔPPL sweep's order
        report.downstream_sweep = downstream_sweep(handle, programs.programs(kind), tasks, order=order,
                                                   progress=progress, **task_kw)

