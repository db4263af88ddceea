"""``build_hybrid``: swap as many heads as fit under a budget, cheapest causal cost first, heal what is left, and judge
the result on windows that neither selection nor healing saw.

Each head gets the cheapest of its candidates (its program, its frontier points of that size, a refit of its
mixture weights to the head's output, headsurgeon/surgery/swap/refit.py) by single-swap KL on the select windows
(headsurgeon/surgery/measure/head_costs.py), and heads are ordered by that cost. Costs compound, so the set grows in chunks re-measured
jointly on the select windows (a set fits a budget when the upper end of its ΔPPL interval there is within it): a chunk whose joint cost exceeds twice the sum of its heads' single costs is taken
apart, and its heads that cost more together than alone go to the back of the queue. ``select_more`` adds windows of
documents after explain's windows (never in any split) to the ordering and the growth: the chosen programs of the
``SHORTLIST`` x wanted cheapest heads are measured on them too and reordered by the pooled KL. With a budget and
healing, the budget bounds the healed hybrid: longer prefixes of the order are healed and measured until the longest
that fits is found (``_grow_healed``). Healing tunes the norm gains on the synth windows and ``heal_more`` windows of
later documents (headsurgeon/surgery/swap/heal.py), by default distilling from the base (which is then its own
control), and keeps the step of the lowest loss on the select windows (early stopping); with next-token loss a copy of the base is tuned the same way
and every healed figure is against it. Costs are KL(base ‖ hybrid) and ΔPPL per predicted token with paired
bootstrap intervals (headsurgeon/surgery/measure/divergence.py).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .synth.trust import TrustPrograms
from .configs import BuildConfig
from .core import InputError
from .core.fileio import json_bytes
from .surgery.threads import fit_threads
from .core import Head, Which

if TYPE_CHECKING:  # the model and measurement types load torch: named for the checker only
    from .surgery.corpus import Splits
    from .surgery.measure.divergence import BaseDistributions, CostSummary, WindowCosts
    from .surgery.models.handle import ModelHandle
    from .surgery.swap.heal import HealReport
    from .surgery.swap.hybrid import HybridModel
    from .synth.program import Program
    from .synth.programset import ProgramSet
    from .synth.sequence import Sequence
    from .synth.vocab import Vocabulary

    Healed = tuple[HybridModel, HealReport]

__all__ = ["BuildResult", "build_hybrid", "BUILD_FILE"]

BUILD_FILE = "build.json"
#: a chunk whose joint cost passes this multiple of its heads' summed single costs is taken apart
COMPOUND_LIMIT = 2.0
#: with --select-more, the heads measured on the extra windows: this many times the heads asked for, cheapest on the
#: select windows first (a head further down rarely comes up, and each costs a swap per extra window)
SHORTLIST = 2


@dataclass
class BuildResult:
    """What ``build_hybrid`` chose and what it cost: heads in the order added, the joint re-measurements on the select
    windows, the test cost before healing, and (with healing) the healed cost against the equally tuned base."""

    model: str
    which: str
    target: dict[str, Any]
    heads: list[str]
    order: list[str]
    steps: list[dict[str, Any]]
    select: dict[str, Any] | None
    test: dict[str, Any] | None
    windows: dict[str, int]
    costs: dict[str, Any]
    healed: dict[str, Any] | None = None
    control: dict[str, Any] | None = None
    checkpoint: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    hybrid: Any = field(default=None, repr=False, compare=False)  # the (healed) HybridModel; not in build.json

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hybrid"}

    def format(self) -> str:
        """What a reader asks first: how many heads, what they cost on held-out windows, before and after healing."""
        total = self.target.get("model_heads", 0)
        lines = [f"{self.model}: {len(self.heads)} of {total} heads swapped for their {self.which}s "
                 f"({100 * len(self.heads) / max(total, 1):.1f}%), cheapest single-swap KL first; judged on "
                 f"{self.windows.get('measured', 0)} windows no selection or healing saw"]
        if self.test:
            lines.append(f"  untuned:  {_line(self.test)}")
        if self.healed:
            against = ("the base: distilling from it leaves the base itself unchanged"
                       if self.healed.get("objective") == "kl" else "the base tuned the same way")
            lines.append(f"  healed:   {_line(self.healed['test'])}  (against {against})")
            tries = self.healed.get("budget_tries")
            if tries:
                shown = ", ".join(f"{t['heads']} {t['delta_ppl_pct']:+.2f}%"
                                  + (f" (≤ {t['delta_ppl_ci95_pct'][1]:+.2f}%)" if "delta_ppl_ci95_pct" in t else "")
                                  for t in tries)
                lines.append(f"  the budget held after healing: {len(self.heads)} heads (select windows, healed: "
                             f"{shown})")
        if self.control:
            lines.append("  control, the same number of heads in select-IoU order:")
            lines.append(f"    untuned: {_line(self.control['test'])}")
            if self.control.get("healed"):
                lines.append(f"    healed:  {_line(self.control['healed'])}")
        lines.append(f"  heads: {', '.join(self.heads[:40])}{' …' if len(self.heads) > 40 else ''}")
        ratios = _ratios(self.costs, self.which)
        if ratios:
            lines.append(f"  per head, its cheapest program's single-swap KL over mean-ablating the head: median "
                         f"{sorted(ratios)[len(ratios) // 2]:.2f}; below 1 for {sum(r < 1 for r in ratios)} of "
                         f"{len(ratios)} heads, below 0.5 for {sum(r < 0.5 for r in ratios)}")
        if self.checkpoint:
            lines.append(f"  wrote {self.checkpoint} (with {BUILD_FILE})")
        return "\n".join(lines)


def _ratios(costs: dict[str, Any], which: str) -> list[float]:
    """Per head: the KL of its cheapest candidate over the mean ablation's KL."""
    chosen = costs.get("chosen", {})
    out = []
    for name, row in costs.get("heads", {}).items():
        label = chosen.get(name, which)
        mean = row.get("mean", {}).get("kl")
        own = row.get(label, {}).get("kl")
        if mean and own is not None:
            out.append(own / mean)
    return out


def _line(summary: dict[str, Any]) -> str:
    lo, hi = summary["delta_ppl_ci95_pct"]
    klo, khi = summary["kl_ci95"]
    wide = "  [interval wider than the effect]" if summary.get("delta_wide") else ""
    return (f"ΔPPL {summary['delta_ppl_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}], KL {summary['kl']:.4f} [{klo:.4f}, "
            f"{khi:.4f}] over {summary['tokens']} tokens{wide}")


class _Joint:
    """Joint costs of head sets on fixed windows, as summaries: each distinct set is measured once
    (headsurgeon/surgery/measure/eval_report.py ``SwapCosts``)."""

    def __init__(self, handle: ModelHandle, windows: list[Sequence], programs: dict[Head, Program]) -> None:
        from .surgery.measure.sweep import SwapCosts

        self.costs, self.programs = SwapCosts(handle, windows), programs

    def measure(self, heads: list[Head]) -> CostSummary:
        from .surgery.measure.divergence import summarize

        return summarize(self.costs.lm_costs({h: self.programs[h] for h in heads}))


def within(summary: CostSummary, budget: float | None) -> bool:
    """Whether a set fits the ΔPPL ``budget`` (a ratio): the upper end of its 95% interval, not its estimate, must be
    within it, so that a set grown on few windows, its heads kept because their cost there happened to be low, still
    fits on text it never saw."""
    return budget is None or summary.delta_ppl_ci95[1] <= budget


def _grow(joint: _Joint, order: list[Head], single: dict[Head, float], k_max: int, budget: float | None, chunk: int,
          steps: list[dict[str, Any]]) -> list[Head]:
    """Heads in ``order`` added chunk by chunk under ``k_max`` heads (and the ΔPPL ``budget``, a ratio, on the select
    windows), each chunk re-measured jointly; see the module docstring for chunks that compound."""

    chosen: list[Head] = []
    current = 0.0
    queue, deferred = list(order), []

    def fits(summary: CostSummary) -> bool:
        return within(summary, budget)

    def record(heads: list[Head], summary: CostSummary, kept: bool) -> None:
        steps.append({"heads": len(chosen) + (len(heads) if kept else 0), "tried": [Head.label(h) for h in heads],
                      "kept": kept, "kl": summary.kl, "delta_ppl_pct": 100 * summary.delta_ppl,
                      "delta_ppl_ci95_pct": [100 * x for x in summary.delta_ppl_ci95]})

    while queue and len(chosen) < k_max:
        take = queue[: min(chunk, k_max - len(chosen))]
        queue = queue[len(take):]
        summary = joint.measure(chosen + take)
        compounds = summary.kl - current > COMPOUND_LIMIT * sum(single[h] for h in take) + 1e-9
        if fits(summary) and not (compounds and len(take) > 1):
            record(take, summary, True)
            chosen += take
            current = summary.kl
            continue
        record(take, summary, False)
        for h in take:  # one at a time: keep the heads that fit and do not compound; the rest wait
            if len(chosen) >= k_max:
                break
            alone = joint.measure(chosen + [h])
            ok = fits(alone) and alone.kl - current <= COMPOUND_LIMIT * single[h] + 1e-9
            record([h], alone, ok)
            if ok:
                chosen.append(h)
                current = alone.kl
            elif fits(alone):
                deferred.append(h)
        if budget is not None and not fits(summary) and not any(s["kept"] for s in steps[-len(take):]):
            break  # nothing of the cheapest remaining chunk fits the budget: the rest costs more
        if not queue and deferred:
            queue, deferred = deferred, []  # compounding heads get a second chance once the cheap ones are in
            single = {**single, **{h: math.inf for h in queue}}  # ...accepted on budget alone
    return chosen


def _windows(handle: ModelHandle, corpus: str | Path, heldout: str | Path | None,
             cfg: BuildConfig) -> tuple[Splits, list[Sequence]]:
    from .surgery.corpus import load_corpus, make_sequences, read_documents

    splits = load_corpus(handle, corpus, **asdict(cfg.corpus))
    splits.require("synth", minimum=1)
    splits.require("select", "test")  # both are judged with intervals over windows
    extra = []
    if heldout is not None:
        extra = make_sequences(handle, read_documents(heldout, cfg.corpus.separator), max_len=cfg.corpus.max_len,
                               max_sequences=cfg.corpus.max_sequences)
    return splits, extra


def more_windows(handle: ModelHandle, corpus: str | Path, cfg: BuildConfig, want: int) -> list[Sequence]:
    """``want`` windows of ``corpus`` from documents none of explain's windows came from (those read after its
    ``max_sequences`` windows, a document cut by that limit skipped), so choosing or healing on them never touches a
    test window; an InputError when explain read the whole corpus."""
    from .surgery.corpus import make_sequences, read_documents

    limit = cfg.corpus.max_sequences
    if limit is None:
        raise InputError("--select-more and --heal-more take windows after explain's --max-sequences windows, but no "
                         "limit was set (explain read the whole corpus); give build explain's --max-sequences")
    docs = read_documents(corpus, cfg.corpus.separator)
    cap = limit + 2 * want + 64
    while True:
        windows = make_sequences(handle, docs, max_len=cfg.corpus.max_len, max_sequences=cap)
        read = {s.doc for s in windows[:limit]}
        fresh = [s for s in windows[limit:] if s.doc not in read]
        if len(fresh) >= want or len(windows) < cap:
            break
        cap *= 2
    if not fresh:
        raise InputError(f"the corpus has no document after explain's {limit} windows, so --select-more and "
                         "--heal-more have nothing to add; give a longer corpus or leave them out")
    if len(fresh) < want:
        warnings.warn(f"--select-more/--heal-more want {want} windows: the corpus holds only {len(fresh)} after "
                      "explain's", stacklevel=3)
    return fresh[:want]


def fresh_windows(handle: ModelHandle, corpus: str | Path, cfg: BuildConfig) -> tuple[list[Sequence], list[Sequence]]:
    """The windows after explain's, split: ``select_more`` for choosing and growing, the next ``heal_more`` for
    healing (so early stopping on the select windows never checks what healing trained on)."""
    want = cfg.select_more + (cfg.heal_more if cfg.heal else 0)
    fresh = more_windows(handle, corpus, cfg, want) if want else []
    return fresh[: cfg.select_more], fresh[cfg.select_more:]


def _more_path(costs: str | Path | None) -> Path | None:
    """Where the costs on the --select-more windows are kept: beside --costs, ``NAME.more.json``."""
    if costs is None:
        return None
    path = Path(costs)
    return path.with_name(f"{path.stem}.more{path.suffix or '.json'}")


def _pooled_kl(*parts: WindowCosts) -> float:
    """Per-token KL over the windows of several WindowCosts together."""
    kl = sum(float(p.kl.sum()) for p in parts)
    tokens = sum(int(p.tokens.sum()) for p in parts)
    return kl / max(tokens, 1)


def build_hybrid(model: Any, corpus: Any, programs: Any, out: str | Path | None = None, *,
                 config: BuildConfig | None = None, trust_programs: TrustPrograms = False, **shortcuts: Any) -> BuildResult:
    """Swap the cheapest heads (single-swap KL on the select windows) of ``programs`` (a ProgramSet or programs.json)
    until ``fraction`` of the model's heads or the ``budget_ppl`` (percent, select windows) is reached, growing the
    set with joint re-measurement; each head gets the cheapest of its candidates (its program of kind ``which`` and
    its frontier points of that kind's size). Measured on the test windows (and ``heldout`` text); with ``heal``, the
    norm gains of the hybrid and of a copy of the base are tuned on the synth (and ``heal_more``) windows and
    compared. With ``out``, the
    (healed) hybrid is saved there with ``build.json``. Settings: :class:`BuildConfig`, or its fields as keywords."""
    from .hub.checkpoint import save_hybrid
    from .surgery.measure.divergence import BaseDistributions, summarize, window_costs
    from .surgery.measure.head_costs import head_costs
    from .surgery.swap.replace import replace_heads
    from .synth.vocab import Vocabulary

    cfg = BuildConfig.resolve(config, shortcuts)
    if (cfg.fraction is None) == (cfg.budget_ppl is None):
        raise InputError("build needs exactly one of fraction (a share of the model's heads, e.g. 0.25) and "
                         "budget_ppl (a ΔPPL in percent on the select windows, e.g. 5)")
    if cfg.heal_more and not cfg.heal:
        raise InputError(f"heal_more={cfg.heal_more} adds training windows to healing, which is off: add heal=True "
                         "(--heal) or leave heal_more out")
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    handle, programs, splits, heldout = _inputs(model, corpus, programs, trust_programs, cfg)
    more, heal_more = fresh_windows(handle, corpus, cfg)
    model_heads = handle.n_layers * handle.n_heads
    n_programs = len(programs.programs(cfg.which))
    k_max = n_programs if cfg.fraction is None else min(n_programs, int(round(cfg.fraction * model_heads)))
    seconds["load"] = time.perf_counter() - t0

    t = time.perf_counter()
    fit_threads()  # headsurgeon/surgery/threads.py: the cores free now, never more
    vocab = Vocabulary.from_tokenizer(handle.tokenizer) if handle.tokenizer is not None else None
    extra = _candidates(programs, cfg.which)
    refits = _refits(handle, programs, cfg, splits.synth, vocab)
    for h, program in refits.items():
        extra.setdefault(h, {})["refit"] = program
    seconds["refit"] = time.perf_counter() - t
    t = time.perf_counter()
    fit_threads()  # each stage sized to the cores free when it starts
    costs = head_costs(handle, programs, splits.select, which=(cfg.which,), reference=splits.synth,
                       progress=cfg.progress, path=cfg.costs, extra=extra)
    choice = {h: min([cfg.which, *extra.get(h, {})], key=lambda label: (costs.kl(h, label), label))
              for h in costs.order(cfg.which)}
    single = {h: costs.kl(h, label) or 0.0 for h, label in choice.items()}
    chosen_set = _chosen_set(programs, cfg.which, choice, extra, vocab)
    swap_of = chosen_set.programs(cfg.which)
    order = sorted(single, key=lambda h: (single[h], h))
    more_costs = None
    if more:  # the shortlist's chosen programs measured again on the fresh windows, reordered by the pooled KL
        shortlist = order[: min(len(order), SHORTLIST * k_max)]
        more_costs = head_costs(handle, {h: swap_of[h] for h in shortlist}, more, which=("replacement",),
                                ablation=False, progress=cfg.progress, path=_more_path(cfg.costs))
        single = {**single, **{h: _pooled_kl(costs.costs[h][choice[h]], more_costs.costs[h]["replacement"])
                               for h in shortlist}}
        order = sorted(shortlist, key=lambda h: (single[h], h)) + order[len(shortlist):]
    seconds["head costs"] = time.perf_counter() - t

    select_windows = splits.select + more
    t = time.perf_counter()
    fit_threads()  # each stage sized to the cores free when it starts
    joint = _Joint(handle, select_windows, swap_of)
    steps: list[dict[str, Any]] = []
    chunk = cfg.chunk or max(1, round(0.02 * model_heads))
    budget = None if cfg.budget_ppl is None else cfg.budget_ppl / 100
    heads = _grow(joint, order, single, k_max, budget, chunk, steps)
    seconds["growth"] = time.perf_counter() - t
    healer = _Healer(handle, chosen_set, cfg, splits.synth + heal_more, select_windows) if cfg.heal and heads else None
    budget_tries: list[dict[str, Any]] = []
    ready: Healed | None = None
    if healer is not None and budget is not None:  # the budget holds for what is shipped: the healed hybrid
        t = time.perf_counter()
        fit_threads()  # each stage sized to the cores free when it starts
        chain = heads + [h for h in order if h not in heads]
        heads, budget_tries, ready = _grow_healed(healer, chain[:k_max], len(heads), budget, chunk)
        seconds["healed growth"] = time.perf_counter() - t
    select = joint.measure(heads).to_json() if heads else None

    measured = splits.test + heldout
    t = time.perf_counter()
    fit_threads()  # each stage sized to the cores free when it starts
    base = BaseDistributions(handle, measured)
    hybrid_set = chosen_set.subset(heads)
    test = None
    if heads:
        with replace_heads(handle, hybrid_set, which=cfg.which) as hybrid:
            test = summarize(window_costs(base, hybrid, hybrid.register_sequences)).to_json()
    control = _control(programs, cfg.which, len(heads), base, handle) if cfg.control and heads else None
    seconds["test"] = time.perf_counter() - t

    final = replace_heads(handle, hybrid_set, which=cfg.which) if heads else None
    healed = None
    if healer is not None:
        t = time.perf_counter()
        fit_threads()  # each stage sized to the cores free when it starts
        final, healed = _heal_and_judge(healer, heads, measured, base, control, programs, ready)
        if budget_tries:
            healed["budget_tries"] = budget_tries
        seconds["heal"] = time.perf_counter() - t
    result = BuildResult(
        model=handle.name, which=cfg.which,
        target={"fraction": cfg.fraction, "budget_ppl": cfg.budget_ppl, "k_max": k_max, "model_heads": model_heads,
                "program_heads": n_programs, "chunk": chunk},
        heads=[Head.label(h) for h in heads], order=[Head.label(h) for h in order], steps=steps, select=select,
        test=test, windows={"synth": len(splits.synth), "select": len(splits.select), "select_more": len(more),
                            "heal_more": len(heal_more),
                            "test": len(splits.test), "heldout": len(heldout), "measured": len(measured)},
        costs={**costs.to_json(), "chosen": {Head.label(h): label for h, label in choice.items()},
               **({"pooled_kl": {Head.label(h): single[h] for h in more_costs.costs}} if more_costs else {})}, healed=healed,
        control=control, seconds=seconds, hybrid=final)
    if out is not None:
        if final is None:
            raise InputError("no head fits the budget on the select windows, so there is no hybrid to save; raise "
                             "--budget-ppl or --fraction")
        result.checkpoint = str(out)
        result.seconds["total"] = time.perf_counter() - t0
        save_hybrid(final, out, metrics={"build": _card_metrics(result)}, overwrite=True,
                    extra_files={BUILD_FILE: json_bytes(result.to_json())})
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _inputs(model: Any, corpus: str | Path, programs: ProgramSet | str | Path, trust_programs: TrustPrograms,
            cfg: BuildConfig) -> tuple[ModelHandle, ProgramSet, Splits, list[Sequence]]:
    """(handle, trusted ProgramSet, splits, heldout windows), refusing what build cannot use before any work."""
    from .surgery.models.loading import load_model
    from .surgery.measure.scorable import require_lm_head
    from .synth.programset import ProgramSet

    if isinstance(programs, (str, Path)):
        programs = ProgramSet.load(programs)
    if not isinstance(programs, ProgramSet):
        raise InputError(f"programs must be a ProgramSet or a programs.json path, got {type(programs).__name__}")
    programs = programs.trusted(trust_programs)
    if not programs.programs(cfg.which):
        raise InputError(f"the program set holds no {cfg.which}s; build with which='replacement', or explain first")
    handle = load_model(model, **asdict(cfg.model))
    require_lm_head(handle)
    splits, heldout = _windows(handle, corpus, cfg.heldout, cfg)
    mismatch = split_mismatch(programs.meta, splits)
    if mismatch:
        warnings.warn(mismatch, stacklevel=3)
    return handle, programs, splits, heldout


def split_mismatch(meta: Any, splits: Splits) -> str | None:
    """Why build's windows are not the ones explain selected ``programs`` on (programs.json's ``meta``: the split's
    windows and predicted tokens), or None when they are the same or the set does not say. Build and explain split
    text by the same function (headsurgeon/surgery/corpus.py ``load_corpus``), so the same corpus settings give the same split."""
    if not isinstance(meta, dict) or not isinstance(meta.get("splits"), dict):
        return None
    if "split_tokens" not in meta:
        return ("the programs were selected by an older headsurgeon, whose split fractions counted documents; build "
                "splits by predicted tokens, so its select and test windows may hold text explain searched or selected "
                "on: run explain again for a test split the programs never saw")
    had = {"windows": meta["splits"], "predicted tokens": meta["split_tokens"]}
    now = {"windows": splits.sizes(), "predicted tokens": splits.tokens()}
    if had != now:
        return (f"the programs were selected on another split of the text (explain: {had}; build: {now}), so build's "
                "select and test windows may hold text explain searched or selected on: give build the corpus, "
                "--max-len, --max-sequences and --seed explain had")
    return None


def _candidates(programs: ProgramSet, which: str) -> dict[Head, dict[str, Program]]:
    """Per head, its frontier points other than its ``which`` program, of that kind's size (readable for
    explanations), labelled by budget: build measures them beside the program and keeps the cheapest."""
    from .synth.program import READABLE_CHARS

    out: dict[Head, dict[str, Program]] = {}
    for h, entry in programs.entries.items():
        own = entry.explanation if which == "explanation" else entry.replacement
        if own is None:
            continue
        for point in entry.frontier:
            if point.program.hash == own.program.hash:
                continue
            if which == "explanation" and (point.chars is None or point.chars > READABLE_CHARS):
                continue
            out.setdefault(h, {})[f"frontier:{point.budget or 'any'}"] = point.program
    return out


def _refits(handle: ModelHandle, programs: ProgramSet, cfg: BuildConfig, synth: list[Sequence],
            vocab: Vocabulary | None) -> dict[Head, Program]:
    """Per head whose program is a mixture: the same components reweighted to match the head's output on the synth
    windows (headsurgeon/surgery/swap/refit.py), kept when it changed and, for explanations, is still readable."""
    from .surgery.swap.refit import refit_mixtures
    from .synth.program import READABLE_CHARS

    found = refit_mixtures(handle, programs, synth, which=cfg.which, progress=cfg.progress)
    return {h: r.after for h, r in found.items()
            if r.changed and (cfg.which != "explanation" or r.after.chars(vocab) <= READABLE_CHARS)}


def _chosen_set(programs: ProgramSet, which: str, choice: dict[Head, str], extra: dict[Head, dict[str, Program]],
                vocab: Vocabulary | None) -> ProgramSet:
    """The program set with each head's ``which`` slot holding the candidate build chose for it (a refitted mixture
    carries no pattern scores: it was chosen by its causal cost)."""
    from .synth.programset import Entry, ProgramSet
    from .synth.scored import ScoredProgram

    entries = {}
    for h, label in choice.items():
        entry = programs.entries[h]
        if label != which:
            program = extra[h][label]
            picked = next((p for p in entry.frontier if p.program.hash == program.hash), None)
            if picked is None:
                picked = ScoredProgram.of(program, label, {}, vocab, budget=entry.explanation.budget
                                          if which == "explanation" and entry.explanation else None)
            entry = (Entry(entry.replacement, picked, entry.frontier) if which == "explanation"
                     else Entry(picked, entry.explanation, entry.frontier))
        entries[h] = entry
    return ProgramSet(entries, model=programs.model, meta=programs.meta, vocab_fingerprint=programs.vocab_fingerprint)


class _Healer:
    """Heals hybrids of this build's candidates the same way (headsurgeon/surgery/swap/heal.py: the synth windows,
    early-stopped on the select windows) and holds the reference they are judged against: the base itself when
    healing distils from it ("kl"), else a copy of the base tuned the same way ("lm")."""

    def __init__(self, handle: ModelHandle, swap_set: ProgramSet, cfg: BuildConfig, synth: list[Sequence],
                 select: list[Sequence]) -> None:
        from .surgery.swap.handle_copy import independent_handle
        from .surgery.swap.heal import heal

        self.handle, self.swap_set, self.cfg, self.synth, self.select = handle, swap_set, cfg, synth, select
        self.tuned, self.base_heal = handle, None
        if cfg.heal_objective == "lm":
            self.tuned = independent_handle(handle)
            self.base_heal = heal(self.tuned, synth, steps=cfg.heal_steps, validation=select,
                                  progress=cfg.progress).to_json()

    def heal(self, heads: list[Head], swap_set: ProgramSet | None = None) -> Healed:
        """A healed copy of the hybrid swapping ``heads`` (from ``swap_set``, default this build's chosen programs)."""
        from .surgery.swap.heal import heal
        from .surgery.swap.replace import replace_heads

        hybrid = replace_heads(self.handle, (swap_set or self.swap_set).subset(heads), which=self.cfg.which, copy=True)
        return hybrid, heal(hybrid, self.synth, steps=self.cfg.heal_steps, objective=self.cfg.heal_objective,
                            validation=self.select, progress=self.cfg.progress)

    def reference(self, windows: list[Sequence]) -> BaseDistributions:
        from .surgery.measure.divergence import BaseDistributions

        return BaseDistributions(self.tuned, windows)


def _grow_healed(healer: _Healer, chain: list[Head], start: int, budget: float,
                 chunk: int) -> tuple[list[Head], list[dict[str, Any]], Healed | None]:
    """With ``heal`` and a budget, the budget bounds the healed hybrid: from the ``start`` heads the untuned growth
    kept, longer prefixes of ``chain`` are healed and measured on the select windows (against the equally tuned base),
    the step doubling while they fit, then halved between the longest fit and the shortest miss down to ``chunk``
    heads. Returns the heads, every try, and the healed (hybrid, report) of the longest fit beyond ``start``."""
    from .surgery.measure.divergence import summarize, window_costs

    reference = healer.reference(healer.select)
    tries: list[dict[str, Any]] = []
    good, bad, best = start, None, None
    step = max(chunk, start // 4)

    def attempt(k: int) -> tuple[bool, Healed]:
        hybrid, report = healer.heal(chain[:k])
        summary = summarize(window_costs(reference, hybrid, hybrid.register_sequences))
        fits = within(summary, budget)
        tries.append({"heads": k, "fits": fits, "delta_ppl_pct": 100 * summary.delta_ppl,
                      "delta_ppl_ci95_pct": [100 * x for x in summary.delta_ppl_ci95], "kl": summary.kl,
                      "best_step": report.best_step})
        return fits, (hybrid, report)

    while bad is None and good < len(chain):
        k = min(len(chain), good + step)
        fits, made = attempt(k)
        if fits:
            good, best, step = k, made, 2 * step
        else:
            bad = k
    while bad is not None and bad - good > chunk:
        k = (good + bad) // 2
        fits, made = attempt(k)
        good, best, bad = (k, made, bad) if fits else (good, best, k)
    return chain[:good], tries, best


def _heal_and_judge(healer: _Healer, heads: list[Head], measured: list[Sequence], base: BaseDistributions,
                    control: dict[str, Any] | None, programs: ProgramSet,
                    ready: Healed | None = None) -> tuple[HybridModel, dict[str, Any]]:
    """Heal the hybrid of ``heads`` (unless ``ready`` holds it healed) and the control the same way, and judge them
    on the ``measured`` windows against the base tuned the same way: with "kl" (distilling from the base) that is the
    base itself, whose KL to itself is 0, so no step moves it; with "lm" a copy of the base tuned on the same windows,
    and every healed figure is against that copy."""
    from .surgery.measure.divergence import summarize, window_costs

    healed: dict[str, Any] = {"objective": healer.cfg.heal_objective}
    reference = base
    if healer.base_heal is not None:
        healed["base_heal"] = healer.base_heal
        reference = healer.reference(measured)
        tuned = healer.tuned
        healed["tuned_base_vs_base"] = summarize(window_costs(base, lambda ids, attention_mask=None:
                                                              tuned.forward(ids, attention_mask))).to_json()
    final, report = ready or healer.heal(heads)
    healed["heal"] = report.to_json()
    healed["test"] = summarize(window_costs(reference, final, final.register_sequences)).to_json()
    if control is not None:
        other, _ = healer.heal([Head.parse(h) for h in control["heads"]], programs)
        control["healed"] = summarize(window_costs(reference, other, other.register_sequences)).to_json()
    return final, healed


def _card_metrics(result: BuildResult) -> dict[str, Any]:
    """The figures the model card shows (the full record is build.json)."""
    out: dict[str, Any] = {"which": result.which, "heads": len(result.heads),
                           "measured_windows": result.windows["measured"]}
    for name, summary in (("untuned", result.test), ("healed", (result.healed or {}).get("test"))):
        if summary:
            out[f"{name}_delta_ppl_pct"] = round(summary["delta_ppl_pct"], 3)
            out[f"{name}_delta_ppl_ci95_pct"] = [round(x, 3) for x in summary["delta_ppl_ci95_pct"]]
            out[f"{name}_kl"] = round(summary["kl"], 5)
    return out


def _control(programs: ProgramSet, which: Which, k: int, base: BaseDistributions, handle: ModelHandle) -> dict[str, Any]:
    """The same number of heads in select-IoU order (the order a pattern metric gives), measured on the same windows."""
    from .surgery.measure.divergence import summarize, window_costs
    from .surgery.swap.replace import replace_heads

    chosen = programs.programs(which)

    def select_iou(h: Any) -> float:
        entry = programs.entries[h]
        scored = entry.explanation if which == "explanation" else entry
        value = scored.iou("select") if scored is not None else None
        return -1.0 if value is None else value

    heads = sorted(chosen, key=lambda h: (-select_iou(h), h))[:k]
    with replace_heads(handle, programs.subset(heads), which=which) as hybrid:
        test = summarize(window_costs(base, hybrid, hybrid.register_sequences)).to_json()
    return {"order": "select IoU", "heads": [Head.label(h) for h in heads], "test": test}

