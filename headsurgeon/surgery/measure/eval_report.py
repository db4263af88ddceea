"""``evaluate_programs``: what swapping a ProgramSet in costs, for both kinds of program side by side.

Each head holds a replacement (its most faithful program, often a fitted table) and maybe an explanation (its
best readable one, headsurgeon/synth/programset.py). Every measurement here (the headline, per-head costs, the sweep,
Spearman(IoU, ΔPPL) and Spearman(fidelity, KL), lm-eval tasks) is made for each kind asked, labelled by kind; heads
without an explanation are counted and named, since they stay neural when explanations are swapped in.
``headsurgeon eval`` prints this report and ``explain`` measures with it (headsurgeon/explain_measure.py).

A swap's cost is the mean per-token KL(base ‖ hybrid) of the next-token distributions beside ΔPPL, both from one
pass of the hybrid against base log-probabilities computed once per set of windows (headsurgeon/surgery/measure/divergence.py), with
paired bootstrap intervals over windows. Each distinct set of swapped heads is measured once (the headline is the
sweep's last step, a per-head swap its one-head step), so nothing is computed twice.
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

from ...synth.trust import TrustPrograms
from ...core.configs import with_shortcuts
from ...core import InputError, WHICHES, Which, HeadLike
from ...synth.programset import ProgramSet
from ...synth.scored import ScoredProgram
from ...synth.sequence import Sequence
from ..configs import CorpusConfig, MeasureConfig
from ..corpus import Splits, load_corpus
from .divergence import CostSummary, WindowCosts, summarize
from .evaluate import spearman_ci, sweep_heads
from .eval_format import format_report
from ..models.loading import load_model
from ..swap.replace import replace_heads
from .scorable import require_lm_head
from .sweep import SwapCosts, ppl, sweep_rows
from .sweep_order import Order, order_heads
from ...core import Head
from ..models.handle import ModelHandle

__all__ = ["EvalReport", "KindReport", "evaluate_programs", "SwapCosts", "SWEEP_STEPS"]

#: the fractions of heads a sweep swaps: the seed paper's 0/10/25/50/100% (explain's and eval's one default)
SWEEP_STEPS: tuple[float, ...] = MeasureConfig.sweep_steps  # headsurgeon/surgery/configs.py: the one default

WhichArg = Literal["both", "replacement", "explanation"]
OrderArg = Literal["iou", "delta_ppl", "both"]
#: the orders ``order="both"`` sweeps, the headline's first
SWEPT_ORDERS: tuple[Order, ...] = ("iou", "delta_ppl")
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
    kl: float | None = None  # mean per predicted token of KL(base ‖ hybrid), nats (headsurgeon/surgery/measure/divergence.py)
    kl_ci95: list[float] | None = None
    delta_nll: float | None = None  # mean per-token change in cross-entropy, nats: ΔPPL = exp(ΔNLL) − 1
    delta_nll_ci95: list[float] | None = None
    tokens: int | None = None  # the predicted tokens these means are over
    delta_wide: bool | None = None  # the ΔPPL interval is wider than the effect: more test windows needed
    kl_wide: bool | None = None  # the same for KL
    embedding_distance: float | None = None  # models without an LM head
    per_head: list[dict[str, Any]] | None = None  # {head, program, iou, jsd, delta_pct, delta_ci95_pct, kl, kl_ci95}
    spearman: dict[str, Any] | None = None  # Spearman(test IoU, per-head ΔPPL): {rho, ci95, heads}, with per_head
    spearman_kl: dict[str, Any] | None = None  # fidelity ("iou", "jsd" on test) → Spearman(it, per-head KL)
    sweep: list[dict[str, Any]] | None = None  # replacement_sweep rows with each arm's KL, + the second order's arm
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
    test_tokens: int | None = None  # the predicted test tokens every cost is a mean over (None without an LM head)
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
            out.update(ppl=self.ppl, test_tokens=self.test_tokens)
        if self.kinds:
            out.update(which=list(self.kinds), headline=self.headline,
                       kinds={k: r.to_json() for k, r in self.kinds.items()})
            if self.order_on is not None:
                out.update(order_on=self.order_on, order_sequences=self.order_sequences)
            headline = self.kinds[self.headline].to_json()  # type: ignore[index]  # headline is set whenever kinds is
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
        from .plots import plot_report

        path = plot_report(self, out_png)
        self.sweep_png = str(path)
        return path


def _kinds(which: str) -> tuple[Which, ...]:
    kinds = tuple(k for k in WHICHES if which in ("both", k))
    if not kinds:
        raise InputError(f"which must be 'both', 'replacement' or 'explanation', not {which!r}")
    return kinds


def _orders(order: str) -> tuple[Order, ...]:
    orders = tuple(o for o in SWEPT_ORDERS if order in ("both", o))
    if not orders:
        raise InputError(f"order must be 'iou', 'delta_ppl' or 'both', not {order!r}")
    return orders


def _program_set(programs: ProgramSet | str | Path | None, trust_programs: TrustPrograms) -> ProgramSet | None:
    if programs is None:
        return None
    if isinstance(programs, (str, Path)):
        programs = ProgramSet.load(programs)
    if not isinstance(programs, ProgramSet):
        raise InputError(f"programs must be a ProgramSet or a programs.json path, got {type(programs).__name__}; "
                         "build one with hs.ProgramSet() and .add(head, program)")
    return programs.trusted(trust_programs)


def _windows(handle: ModelHandle, corpus: Any, max_len: int, max_sequences: int | None,
             seed: int) -> tuple[list[Sequence], list[Sequence], str]:
    """(test windows, windows the ΔPPL order is measured on, their split's name)."""
    if isinstance(corpus, (str, Path)):
        corpus = load_corpus(handle, corpus, max_len=max_len, max_sequences=max_sequences, seed=seed)
    if isinstance(corpus, Splits):
        corpus.require("test")  # an interval over one window is degenerate: refused with the fix
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


def _check_steps(steps: Seq[float]) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in steps)
    except (TypeError, ValueError):
        out = ()
    if not out or any(not 0.0 <= x <= 1.0 for x in out):
        raise InputError(f"steps must be fractions of heads between 0 and 1, e.g. {SWEEP_STEPS}; got {steps!r}")
    return out


def _order_deltas(chosen: dict, report: KindReport, costs: SwapCosts, order_costs: SwapCosts, progress: bool,
                  seconds: dict[str, float]) -> dict[Any, float]:
    """Each head's own ΔPPL for the ΔPPL order: the per-head table's when it was measured on the same windows, else
    one swap per head on ``order_costs``' windows (select, so the order is not fitted to the windows judging it)."""
    if order_costs is costs and report.per_head is not None:
        return {r["head"]: r["delta_pct"] / 100 for r in report.per_head}
    with _timed(seconds, "ΔPPL order"):
        return {h: order_costs.measure({h: p})["delta"]
                for h, p in tqdm(list(chosen.items()), desc=f"ΔPPL order ({report.kind}s)", disable=not progress)}


def _sweep(programs: ProgramSet, kind: Which, report: KindReport, orders: tuple[Order, ...], costs: SwapCosts,
           order_costs: SwapCosts, steps: Seq[float], seed: int, progress: bool, seconds: dict[str, float]) -> None:
    """The kind's sweep in ``orders[0]`` with its baselines, plus the second order's arm and the cheaper order."""
    chosen = programs.programs(kind)
    heads: dict[str, list[Head]] = {}
    for order in orders:
        deltas = None
        if order == "delta_ppl":
            deltas = _order_deltas(chosen, report, costs, order_costs, progress, seconds)
            report.order_delta_pct = {Head.label(h): 100 * d for h, d in deltas.items()}
        heads[order] = order_heads(programs, order, which=kind, deltas=deltas, seed=seed)
    items, _ = sweep_heads(chosen, None)
    with _timed(seconds, "sweep"):
        rows = sweep_rows(costs, items, heads, steps, seed, desc=f"sweep ({kind}s)", progress=progress)
    report.sweep, report.sweep_orders = rows, list(orders)
    report.head_orders = {order: [Head.label(h) for h in hs] for order, hs in heads.items()}


#: the fidelity measures per-head KL is ranked against (test split; headsurgeon/synth/scored.py ``iou``/``jsd``)
FIDELITY: tuple[str, ...] = ("iou", "jsd")


def _spearman(per_head: list[dict[str, Any]], x: str, y: str, seed: int) -> dict[str, Any] | None:
    """Spearman's rho between the per-head rows' ``x`` and ``y``, with a 95% bootstrap interval over heads
    (headsurgeon/surgery/measure/evaluate.py ``spearman_ci``); None below 3 heads with both."""
    pairs = [(r[x], r[y]) for r in per_head if r.get(x) is not None and r.get(y) is not None]
    if len(pairs) < 3:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: rho is undefined (NaN, shown as missing)
        rho, low, high = spearman_ci([a for a, _ in pairs], [b for _, b in pairs], seed=seed)

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {"rho": finite(rho), "ci95": [finite(low), finite(high)], "heads": len(pairs)}


def _headline(report: KindReport, costs: WindowCosts, seed: int) -> None:
    """Fill the kind's headline: perplexity, ΔPPL, ΔNLL and KL with their intervals, tokens, the wide flags."""
    s = summarize(costs, seed=seed)
    report.hybrid_ppl = ppl(costs)
    report.hybrid_delta_pct = 100 * s.delta_ppl
    report.hybrid_delta_ci95_pct = [100 * s.delta_ppl_ci95[0], 100 * s.delta_ppl_ci95[1]]
    report.kl, report.kl_ci95 = s.kl, list(s.kl_ci95)
    report.delta_nll, report.delta_nll_ci95 = s.delta_nll, list(s.delta_nll_ci95)
    report.tokens, report.delta_wide, report.kl_wide = s.tokens, s.delta_wide, s.kl_wide


def _cost_fields(s: CostSummary) -> dict[str, Any]:
    """A per-head row's cost: ΔPPL (%) and KL with their intervals."""
    return {"delta_pct": 100 * s.delta_ppl, "delta_ci95_pct": [100 * s.delta_ppl_ci95[0], 100 * s.delta_ppl_ci95[1]],
            "kl": s.kl, "kl_ci95": list(s.kl_ci95)}


def _per_head_rows(programs: ProgramSet, kind: Which, costs: SwapCosts, known: Mapping[Any, float] | None, seed: int,
                   progress: bool) -> list[dict[str, Any]]:
    """Per head of the kind: its test IoU and JSD, and the cost of swapping it alone. A head in ``known`` (ΔPPL
    already measured on these windows by explain's search tasks) keeps that ΔPPL unmeasured: no KL, no intervals."""
    given = {Head.parse(h): float(d) for h, d in (known or {}).items()}
    rows = []
    for head, program in tqdm(list(programs.programs(kind).items()), desc=f"per-head cost ({kind}s)",
                              disable=not progress):
        scored = _scored(programs, head, kind)
        row = {"head": Head.label(head), "program": _text(scored), "iou": scored.iou("test"),
               "jsd": scored.jsd("test")}
        if head in given:
            row.update(delta_pct=100 * given[head], delta_ci95_pct=None, kl=None, kl_ci95=None)
        else:
            row.update(_cost_fields(summarize(costs.lm_costs({head: program}), seed=seed)))
        rows.append(row)
    return rows


def _measure_kind(handle: ModelHandle, programs: ProgramSet, kind: Which, costs: SwapCosts, seed: int, per_head: bool,
                  known: Mapping[Any, float] | None, progress: bool, seconds: dict[str, float]) -> KindReport:
    """The headline (all heads of this kind swapped, with bootstrap intervals) and the per-head table."""
    chosen = programs.programs(kind)
    report = KindReport(kind, len(chosen), [Head.label(h) for h in programs.keys() if h not in chosen])
    if not chosen:
        return report
    with _timed(seconds, "perplexity"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEURAL_WARNING)  # the report names them
        with replace_heads(handle, programs, which=kind) as hybrid:  # checks the tokenizer's fingerprint
            _headline(report, costs.lm_costs(chosen, hybrid), seed)
    if per_head:
        with _timed(seconds, "per-head ΔPPL"):
            report.per_head = _per_head_rows(programs, kind, costs, known, seed, progress)
        report.spearman = _spearman(report.per_head, "iou", "delta_pct", seed)
        by_kl = {m: _spearman(report.per_head, m, "kl", seed) for m in FIDELITY}
        report.spearman_kl = {m: sp for m, sp in by_kl.items() if sp is not None} or None
    return report


def _scored(programs: ProgramSet, head: HeadLike, kind: Which) -> ScoredProgram:
    """The head's program of this kind with its scores (headsurgeon/synth/scored.py)."""
    entry = programs.entries[Head.parse(head)]
    return entry.replacement if kind == "replacement" else entry.explanation  # type: ignore[return-value]  # only heads with that kind of program reach here


def _text(scored: ScoredProgram) -> str:
    """The program as rendered at selection time (token strings), cut to 60 characters."""
    text = scored.text or scored.program.text
    return text if len(text) <= 60 else text[:59] + "…"


def _headless(handle: ModelHandle, programs: ProgramSet | None, kinds: tuple[Which, ...], test: list[Sequence],
              sweep: bool, orders: tuple[Order, ...], steps: Seq[float], seed: int, progress: bool) -> EvalReport:
    """A model without an LM head: the embedding distance between base and hybrid per kind, and with ``sweep``
    the IoU-order sweep by embedding distance (a ΔPPL order needs perplexity)."""
    if sweep and "delta_ppl" in orders:
        raise InputError(f"{handle.name} has no language-model head, so there is no per-head ΔPPL to order a sweep "
                         "by: use order='iou' (on the command line, leave out --order)")
    report = EvalReport(handle.name, len(test), False, None, len(programs) if programs is not None else 0, seed=seed)
    if programs is None:
        return report
    costs = SwapCosts(handle, test)
    for kind in kinds:
        chosen = programs.programs(kind)
        kr = KindReport(kind, len(chosen), [Head.label(h) for h in programs.keys() if h not in chosen])
        if chosen:
            with _timed(report.seconds, "embedding distance"), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NEURAL_WARNING)
                with replace_heads(handle, programs, which=kind) as hybrid:
                    kr.embedding_distance = costs.distance(chosen, hybrid)
            if sweep:
                order = order_heads(programs, "iou", which=kind, seed=seed)
                with _timed(report.seconds, "sweep"):
                    kr.sweep = sweep_rows(costs, chosen, {"iou": order}, steps, seed, desc=f"sweep ({kind}s)",
                                          progress=progress)
                kr.sweep_orders, kr.head_orders = ["iou"], {"iou": [Head.label(h) for h in order]}
        report.kinds[kind] = kr
    return report


#: evaluate_programs' keyword names before they were MeasureConfig's (headsurgeon/surgery/configs.py): old → new
RENAMED = {"per_head": "delta_ppl", "steps": "sweep_steps", "limit": "task_limit"}


def measure_config(config: MeasureConfig | None, settings: Mapping[str, Any]) -> MeasureConfig:
    """``config``, or one from ``evaluate_programs``' keyword ``settings`` (MeasureConfig's field names; the old
    names ``per_head``, ``steps``, ``limit`` still work, with a DeprecationWarning)."""
    named = dict(settings)
    for old, new in RENAMED.items():
        if old in named:
            warnings.warn(f"evaluate_programs({old}=...) is deprecated: pass {new}=... (MeasureConfig's name)",
                          DeprecationWarning, stacklevel=3)
            if new in named:
                raise InputError(f"evaluate_programs got {old}= and {new}=, one setting twice: pass {new}= only")
            named[new] = named.pop(old)
    cfg = with_shortcuts(MeasureConfig, config, named, "evaluate_programs()")
    if cfg.cloze or cfg.head_costs:
        raise InputError("evaluate_programs does not write the cloze task or measure head costs (explain does, "
                         "headsurgeon/explain_measure.py): give cloze=False and head_costs=False, or run explain")
    return cfg


def evaluate_programs(model: Any, corpus: Any, programs: ProgramSet | str | Path | None = None, config: MeasureConfig | None = None, *,
                      which: WhichArg = "both", sweep: bool = False, task_sweep: bool = True, batch_size: int = 16,
                      seed: int = CorpusConfig.seed, trust_programs: TrustPrograms = False,
                      max_len: int = CorpusConfig.max_len, max_sequences: int | None = CorpusConfig.max_sequences,
                      known_per_head: Mapping[str, Mapping[Any, float]] | None = None,
                      progress: bool = False, **settings: Any) -> EvalReport:
    """Measure the base model and the hybrid with ``programs`` swapped in, for each kind ``which`` names.

    ``config``: a :class:`MeasureConfig` (headsurgeon/surgery/configs.py), or its settings by name as keywords
    (not both): ``delta_ppl``, ``order``, ``sweep_steps``, ``tasks``, ``task_limit``, ``include_path``.
    Every swap is reported as ΔPPL and the mean per-token KL(base ‖ hybrid), with paired bootstrap intervals over
    windows, the predicted tokens counted and a flag where an interval is wider than the effect (headsurgeon/surgery/measure/divergence.py).
    ``corpus``: a text file (read with ``max_len``/``max_sequences``), a ``Splits`` (its test windows are
    measured; the ΔPPL order is measured on its select windows, so the order is not fitted to the windows that
    judge it) or a list of Sequences (used for both). ``which``: "both" (default), "replacement" or
    "explanation". ``delta_ppl``: ΔPPL and KL with one head swapped at a time, Spearman(test IoU, ΔPPL) and
    Spearman(test IoU / test JSD, KL) with 95% bootstrap intervals over heads; ``known_per_head``: kind → head →
    ΔPPL already measured on these test windows (explain's search tasks measure the replacements'), not measured
    again (their KL is left missing). ``sweep``: ``sweep_steps`` (fractions of the
    kind's heads, default 0/10/25/50/100%) swapped in ``order`` ("iou": best select IoU first, as sweep_order.py
    ``iou_split`` says; "delta_ppl": cheapest per-head ΔPPL first; "both": side by side), beside a random order and
    random programs; each row names the cheaper order (headsurgeon/surgery/measure/sweep.py). Models without an LM head are measured by embedding distance (IoU
    order only). ``tasks``: lm-eval tasks (``task_limit`` examples each) on the base and each kind's hybrid (with
    ``sweep`` and ``task_sweep``: also at 0/25/50/100%). Returns an :class:`EvalReport` (``.format()``,
    ``.to_json()``, ``.plot(png)``).
    """
    cfg = measure_config(config, settings)
    order, per_head, tasks, limit = cfg.order, cfg.delta_ppl, cfg.tasks, cfg.task_limit
    include_path = cfg.include_path
    kinds, orders = _kinds(which), _orders(order)
    if order != "iou" and not sweep:
        raise InputError(f"order={order!r} orders the sweep: pass sweep=True too (on the command line, --sweep PNG)")
    steps = _check_steps(cfg.sweep_steps)
    programs = _program_set(programs, trust_programs)
    handle = load_model(model)
    test, order_seqs, order_on = _windows(handle, corpus, max_len, max_sequences, seed)
    if tasks:
        require_lm_head(handle)  # before minutes of perplexity: lm-eval cannot score this model
    if not handle.has_lm_head:
        return _headless(handle, programs, kinds, test, sweep, orders, steps, seed, progress)
    seconds: dict[str, float] = {}
    costs = SwapCosts(handle, test)
    with _timed(seconds, "perplexity"):
        base = costs.lm_costs({})  # the one base pass every swap on the test windows is compared with
    report = EvalReport(handle.name, len(test), True, ppl(base), len(programs) if programs is not None else 0,
                        test_tokens=int(base.tokens.sum()), tasks_limit=limit, seed=seed, seconds=seconds)
    task_kw = dict(limit=limit, include_path=include_path, batch_size=batch_size, seed=seed)
    if programs is None:
        if tasks:
            from .downstream import downstream

            with _timed(seconds, "tasks"):
                report.downstream = downstream(handle, tasks, **task_kw)
        return report
    if sweep and "delta_ppl" in orders:
        report.order_on, report.order_sequences = order_on, len(order_seqs)
    order_costs = costs if order_seqs is test else SwapCosts(handle, order_seqs)
    base_tasks = None  # lm-eval's run of the base, once, which every kind's hybrid is compared with
    for kind in kinds:
        kr = _measure_kind(handle, programs, kind, costs, seed, per_head, (known_per_head or {}).get(kind), progress,
                           seconds)
        report.kinds[kind] = kr
        if not kr.heads:
            continue
        if sweep:
            _sweep(programs, kind, kr, orders, costs, order_costs, steps, seed, progress, seconds)
        if tasks:
            with _timed(seconds, "tasks"):
                if base_tasks is None:
                    from .downstream import base_run

                    base_tasks = base_run(handle, tasks, **task_kw)
                _downstream(handle, programs, kind, kr, tasks, sweep and task_sweep, task_kw, progress, base_tasks)
    return report


def _downstream(handle: ModelHandle, programs: ProgramSet, kind: Which, report: KindReport, tasks: Any, sweep: bool,
                task_kw: dict, progress: bool, base: Any = None) -> None:
    """lm-eval tasks on the base and this kind's hybrid (headsurgeon/surgery/measure/downstream.py); with ``sweep`` also per step."""
    from .downstream import downstream
    from .downstream_sweep import downstream_sweep

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEURAL_WARNING)
        report.downstream = downstream(handle, tasks, programs, which=kind, base=base, **task_kw)
    if sweep:
        order = report.head_orders[report.sweep_orders[0]]  # type: ignore[index]  # the ΔPPL sweep's order
        report.downstream_sweep = downstream_sweep(handle, programs.programs(kind), tasks, order=order,
                                                   progress=progress, **task_kw)
