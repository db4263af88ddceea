"""``evaluate_programs``: what swapping a ProgramSet in costs, for both kinds of program side by side.

Each head holds a replacement (its most faithful program, often a fitted table) and maybe an explanation (its
best readable one, synth/programset.py). Every measurement here (the headline perplexity, per-head ΔPPL, the
sweep, Spearman(IoU, ΔPPL), lm-eval tasks) is made for each kind asked, labelled by kind; heads without an
explanation are counted and named, since they stay neural when explanations are swapped in. ``headsurgeon eval``
prints this report and ``explain`` measures with it (headsurgeon/explain_measure.py). Each distinct set of swapped
heads is measured once (the headline is the sweep's last step), so nothing is computed twice.
"""
from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence as Seq

from tqdm.auto import tqdm

from ..kernels.core import InputError, WHICHES
from ..synth.programset import ProgramSet
from ..synth.sequence import Sequence
from .configs import CorpusConfig, MeasureConfig
from .corpus import Splits, load_corpus
from .evaluate import (delta_ppl_interval, per_head_delta_ppl, spearman_ci, sweep_arms, sweep_heads,
                       window_losses)
from .embedding import embedding_distance, sentence_embeddings
from .eval_format import format_report
from .loading import load_model
from .replace import head_name, parse_head, replace_heads
from .scorable import require_lm_head
from .sweep_order import ORDER_LABELS, cheapest, order_heads

__all__ = ["EvalReport", "KindReport", "evaluate_programs", "SWEEP_STEPS"]

#: the fractions of heads a sweep swaps: the seed paper's 0/10/25/50/100% (explain's and eval's one default)
SWEEP_STEPS: tuple[float, ...] = MeasureConfig.sweep_steps  # surgery/configs.py: the one default

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
    spearman: dict[str, Any] | None = None  # Spearman(test IoU, per-head ΔPPL): {rho, ci95, heads}, with per_head
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
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per measurement (perplexity, sweep, ...)

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
        if self.seconds:
            out["seconds"] = self.seconds
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


@contextmanager
def _timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    """Add the wall time of the block to ``seconds[phase]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - t0


class _Costs:
    """What a set of swapped heads costs on ``sequences`` (ΔPPL, or embedding distance without an LM head), each
    distinct set (head → program) measured once: the sweep's 100% step, its orders' shared steps and the headline
    are one measurement."""

    def __init__(self, handle: Any, sequences: list[Sequence], base_ppl: float | None) -> None:
        self.handle, self.sequences, self.base_ppl = handle, sequences, base_ppl
        self.base_embeddings = sentence_embeddings(handle, sequences) if base_ppl is None else None
        self.known: dict[frozenset, tuple[float | None, float]] = {frozenset(): (base_ppl, 0.0)}

    @staticmethod
    def key(chosen: Mapping[Any, Any]) -> frozenset:
        return frozenset((parse_head(h), getattr(p, "hash", p)) for h, p in chosen.items())

    def remember(self, chosen: Mapping[Any, Any], ppl: float | None, delta: float) -> None:
        self.known[self.key(chosen)] = (ppl, delta)

    def measure(self, chosen: Mapping[Any, Any]) -> tuple[float | None, float]:
        """(perplexity or None, ΔPPL or embedding distance) with ``chosen`` swapped."""
        key = self.key(chosen)
        if key not in self.known:
            with replace_heads(self.handle, dict(chosen)) as hybrid:
                if self.base_ppl is None:
                    self.known[key] = (None, embedding_distance(self.base_embeddings, hybrid, self.sequences))
                else:
                    nll, count = window_losses(hybrid, self.sequences, progress=False)
                    ppl = math.exp(nll.sum() / count.sum())
                    self.known[key] = (ppl, ppl / self.base_ppl - 1.0)
        return self.known[key]


def _sweep_rows(costs: _Costs, items: dict, heads: list, steps: Seq[float], seed: int, desc: str,
                progress: bool) -> list[dict[str, Any]]:
    """surgery/evaluate.py ``replacement_sweep``'s rows (the order, a random order, random programs per step),
    each arm measured through ``costs``."""
    headless = costs.base_ppl is None
    rows = []
    for frac, k, arms in tqdm(list(sweep_arms(items, heads, steps, seed)), desc=desc, disable=not progress):
        row: dict[str, Any] = {"fraction": frac, "n_heads": k}
        for label, chosen in arms.items():
            ppl, delta = costs.measure(chosen)
            if headless:
                row["embedding_distance" + label] = delta
            else:
                row["ppl" + label] = ppl
            row["delta" + label] = delta
        rows.append(row)
    return rows


def _check_steps(steps: Seq[float]) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in steps)
    except (TypeError, ValueError):
        out = ()
    if not out or any(not 0.0 <= x <= 1.0 for x in out):
        raise InputError(f"steps must be fractions of heads between 0 and 1, e.g. {SWEEP_STEPS}; got {steps!r}")
    return out


def _sweep(handle: Any, programs: ProgramSet, kind: str, report: KindReport, orders: tuple[str, ...],
           costs: _Costs, order_seqs: list[Sequence], steps: Seq[float], seed: int, progress: bool,
           seconds: dict[str, float]) -> None:
    """The kind's sweep in ``orders[0]`` with its baselines, plus the second order's arm and the cheaper order."""
    chosen = programs.programs(kind)
    heads = {}
    for order in orders:
        deltas = None
        if order == "delta_ppl":
            if order_seqs is costs.sequences and report.per_head is not None:
                deltas = {r["head"]: r["delta_pct"] / 100 for r in report.per_head}
            else:
                with _timed(seconds, "ΔPPL order"):
                    deltas = per_head_delta_ppl(handle, chosen, order_seqs, progress=progress)
            report.order_delta_pct = {head_name(h): 100 * d for h, d in deltas.items()}
        heads[order] = order_heads(programs, order, which=kind, deltas=deltas, seed=seed)
    first, *rest = orders
    items, _ = sweep_heads(chosen, None)
    with _timed(seconds, "sweep"):
        rows = _sweep_rows(costs, items, heads[first], steps, seed, f"sweep ({kind}s)", progress)
        for order in rest:
            for row, (_frac, _k, arms) in zip(rows, sweep_arms(items, heads[order], [r["fraction"] for r in rows],
                                                               seed)):
                row[f"ppl_by_{order}"], row[f"delta_by_{order}"] = costs.measure(arms[""])
    for row in rows:
        costs_by = {ORDER_LABELS[first]: row["delta"], **{ORDER_LABELS[o]: row[f"delta_by_{o}"] for o in rest},
                    ORDER_LABELS["random"]: row["delta_random_order"]}
        row["cheapest"] = cheapest(costs_by)
    report.sweep, report.sweep_orders = rows, list(orders)
    report.head_orders = {order: [head_name(h) for h in hs] for order, hs in heads.items()}


def _spearman(per_head: list[dict[str, Any]], seed: int) -> dict[str, Any] | None:
    """Spearman's rho between the heads' test IoU and their per-head ΔPPL, with a 95% bootstrap interval over heads
    (surgery/evaluate.py ``spearman_ci``); None below 3 heads with an IoU."""
    pairs = [(r["iou"], r["delta_pct"]) for r in per_head if r.get("iou") is not None]
    if len(pairs) < 3:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: rho is undefined (NaN, shown as missing)
        rho, low, high = spearman_ci([a for a, _ in pairs], [b for _, b in pairs], seed=seed)

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {"rho": finite(rho), "ci95": [finite(low), finite(high)], "heads": len(pairs)}


def _measure_kind(handle: Any, programs: ProgramSet, kind: str, costs: _Costs, base_losses: Any, seed: int,
                  per_head: bool, known: Mapping[Any, float] | None, progress: bool,
                  seconds: dict[str, float]) -> KindReport:
    """The headline (all heads of this kind swapped, with a bootstrap interval) and the per-head table."""
    chosen = programs.programs(kind)
    report = KindReport(kind, len(chosen), [head_name(h) for h in programs.keys() if h not in chosen])
    if not chosen:
        return report
    test = costs.sequences
    with _timed(seconds, "perplexity"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEURAL_WARNING)  # the report names them
        with replace_heads(handle, programs, which=kind) as hybrid:  # checks the tokenizer's fingerprint
            losses = window_losses(hybrid, test, progress=False)
    delta, low, high = delta_ppl_interval(base_losses, losses, seed=seed)
    report.hybrid_ppl = math.exp(losses[0].sum() / losses[1].sum())
    report.hybrid_delta_pct, report.hybrid_delta_ci95_pct = 100 * delta, [100 * low, 100 * high]
    costs.remember(chosen, report.hybrid_ppl, report.hybrid_ppl / costs.base_ppl - 1.0)  # type: ignore[operator]
    if per_head:
        given = {parse_head(h): float(d) for h, d in (known or {}).items()}
        missing = {h: p for h, p in chosen.items() if h not in given}
        with _timed(seconds, "per-head ΔPPL"):
            measured = per_head_delta_ppl(handle, missing, test, base_ppl=costs.base_ppl,
                                          progress=progress) if missing else {}
        deltas = {h: given[h] if h in given else measured[h] for h in chosen}
        report.per_head = [{"head": head_name(h), "program": _text(programs, h, kind),
                            "iou": _iou(programs, h, kind), "delta_pct": 100 * d} for h, d in deltas.items()]
        report.spearman = _spearman(report.per_head, seed)
    return report


def _text(programs: ProgramSet, head: Any, kind: str) -> str:
    """The program as rendered at selection time (token strings), cut to 60 characters."""
    entry = programs.entries[head]
    text = (entry.text or entry.program.text) if kind == "replacement" else entry.explanation.text  # type: ignore
    return text if len(text) <= 60 else text[:59] + "…"


def _iou(programs: ProgramSet, head: Any, kind: str) -> float | None:
    entry = programs.entries[head]
    return entry.iou("test") if kind == "replacement" else entry.explanation.iou("test")  # type: ignore[union-attr]


def _headless(handle: Any, programs: ProgramSet | None, kinds: tuple[str, ...], test: list[Sequence],
              sweep: bool, orders: tuple[str, ...], steps: Seq[float], seed: int, progress: bool) -> EvalReport:
    """A model without an LM head: the embedding distance between base and hybrid per kind, and with ``sweep``
    the IoU-order sweep by embedding distance (a ΔPPL order needs perplexity)."""
    if sweep and "delta_ppl" in orders:
        raise InputError(f"{handle.name} has no language-model head, so there is no per-head ΔPPL to order a sweep "
                         "by: use order='iou' (on the command line, leave out --order)")
    report = EvalReport(handle.name, len(test), False, None, len(programs) if programs is not None else 0, seed=seed)
    costs = _Costs(handle, test, None) if programs is not None else None
    for kind in kinds if programs is not None else ():
        chosen = programs.programs(kind)
        kr = KindReport(kind, len(chosen), [head_name(h) for h in programs.keys() if h not in chosen])
        if chosen:
            with _timed(report.seconds, "embedding distance"), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NEURAL_WARNING)
                with replace_heads(handle, programs, which=kind) as hybrid:
                    kr.embedding_distance = embedding_distance(costs.base_embeddings, hybrid, test)
            costs.remember(chosen, None, kr.embedding_distance)
            if sweep:
                order = order_heads(programs, "iou", which=kind, seed=seed)
                with _timed(report.seconds, "sweep"):
                    kr.sweep = _sweep_rows(costs, chosen, order, steps, seed, f"sweep ({kind}s)", progress)
                for row in kr.sweep:
                    row["cheapest"] = cheapest({ORDER_LABELS["iou"]: row["delta"],
                                                ORDER_LABELS["random"]: row["delta_random_order"]})
                kr.sweep_orders, kr.head_orders = ["iou"], {"iou": [head_name(h) for h in order]}
        report.kinds[kind] = kr
    return report


def evaluate_programs(model: Any, corpus: Any, programs: Any = None, *, which: WhichArg = "both",
                      per_head: bool = False, sweep: bool = False, order: OrderArg = "iou",
                      steps: Seq[float] = SWEEP_STEPS, tasks: str | Seq[str] | None = None,
                      limit: int | float | None = None, include_path: Any = None, task_sweep: bool = True,
                      batch_size: int = 16, seed: int = CorpusConfig.seed, trust_programs: Any = False,
                      max_len: int = CorpusConfig.max_len, max_sequences: int | None = CorpusConfig.max_sequences,
                      known_per_head: Mapping[str, Mapping[Any, float]] | None = None,
                      progress: bool = False) -> EvalReport:
    """Measure the base model and the hybrid with ``programs`` swapped in, for each kind ``which`` names.

    ``corpus``: a text file (read with ``max_len``/``max_sequences``), a ``Splits`` (its test windows are
    measured; the ΔPPL order is measured on its select windows, so the order is not fitted to the windows that
    judge it) or a list of Sequences (used for both). ``which``: "both" (default), "replacement" or
    "explanation". ``per_head``: ΔPPL with one head swapped at a time, and Spearman(test IoU, ΔPPL) with a 95%
    bootstrap interval over heads; ``known_per_head``: kind → head → ΔPPL already measured on these test windows
    (explain's search tasks measure the replacements'), not measured again. ``sweep``: ``steps`` (fractions of the
    kind's heads, default 0/10/25/50/100%) swapped in ``order`` ("iou": best test IoU first; "delta_ppl": cheapest
    per-head ΔPPL first; "both": side by side), beside a random order and random programs; each row names the
    cheaper order. Models without an LM head are measured by embedding distance (IoU order only). ``tasks``: lm-eval
    tasks on the base and each kind's hybrid (with ``sweep`` and ``task_sweep``: also at 0/25/50/100%). Returns an
    :class:`EvalReport` (``.format()``, ``.to_json()``, ``.plot(png)``).
    """
    kinds, orders = _kinds(which), _orders(order)
    if order != "iou" and not sweep:
        raise InputError(f"order={order!r} orders the sweep: pass sweep=True too (on the command line, --sweep PNG)")
    steps = _check_steps(steps)
    programs = _program_set(programs, trust_programs)
    handle = load_model(model)
    test, order_seqs, order_on = _windows(handle, corpus, max_len, max_sequences, seed)
    if tasks:
        require_lm_head(handle)  # before minutes of perplexity: lm-eval cannot score this model
    if not handle.has_lm_head:
        return _headless(handle, programs, kinds, test, sweep, orders, steps, seed, progress)
    seconds: dict[str, float] = {}
    with _timed(seconds, "perplexity"):
        base_losses = window_losses(handle, test, progress=False)
    base = math.exp(base_losses[0].sum() / base_losses[1].sum())
    report = EvalReport(handle.name, len(test), True, base, len(programs) if programs is not None else 0,
                        tasks_limit=limit, seed=seed, seconds=seconds)
    task_kw = dict(limit=limit, include_path=include_path, batch_size=batch_size, seed=seed)
    if programs is None:
        if tasks:
            from .downstream import downstream

            with _timed(seconds, "tasks"):
                report.downstream = downstream(handle, tasks, **task_kw)
        return report
    if sweep and "delta_ppl" in orders:
        report.order_on, report.order_sequences = order_on, len(order_seqs)
    costs = _Costs(handle, test, base)
    base_tasks = None  # lm-eval's run of the base, once, which every kind's hybrid is compared with
    for kind in kinds:
        kr = _measure_kind(handle, programs, kind, costs, base_losses, seed, per_head,
                           (known_per_head or {}).get(kind), progress, seconds)
        report.kinds[kind] = kr
        if not kr.heads:
            continue
        if sweep:
            _sweep(handle, programs, kind, kr, orders, costs, order_seqs, steps, seed, progress, seconds)
        if tasks:
            with _timed(seconds, "tasks"):
                if base_tasks is None:
                    from .downstream import base_run

                    base_tasks = base_run(handle, tasks, **task_kw)
                _downstream(handle, programs, kind, kr, tasks, sweep and task_sweep, task_kw, progress, base_tasks)
    return report


def _downstream(handle: Any, programs: ProgramSet, kind: str, report: KindReport, tasks: Any, sweep: bool,
                task_kw: dict, progress: bool, base: Any = None) -> None:
    """lm-eval tasks on the base and this kind's hybrid (surgery/downstream.py); with ``sweep`` also per step."""
    from .downstream import downstream
    from .downstream_sweep import downstream_sweep

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEURAL_WARNING)
        report.downstream = downstream(handle, tasks, programs, which=kind, base=base, **task_kw)
    if sweep:
        order = report.head_orders[report.sweep_orders[0]]  # type: ignore[index]  # the ΔPPL sweep's order
        report.downstream_sweep = downstream_sweep(handle, programs.programs(kind), tasks, order=order,
                                                   progress=progress, **task_kw)
