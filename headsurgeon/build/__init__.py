"""``build_hybrid``: swap as many heads as fit under a budget, cheapest causal cost first, heal what is left, and judge
the result on windows that neither selection nor healing saw.

Each head gets the cheapest of its candidates (build/candidates.py) by single-swap KL on the select windows
(headsurgeon/surgery/measure/head_costs.py), and heads are ordered by that cost; the set grows with joint
re-measurement, since costs compound (build/growth.py). ``select_more`` adds windows of documents after explain's
(build/windows.py) to the ordering and the growth: the chosen programs of the ``SHORTLIST`` x wanted cheapest heads
are measured on them too and reordered by the pooled KL. With a budget and healing, the budget bounds the healed
hybrid (build/healing.py). Healing tunes the norm gains on the synth windows and ``heal_more`` windows of later
documents (headsurgeon/surgery/swap/heal.py), by default distilling from the base (which is then its own control),
and keeps the step of the lowest loss on the select windows; with next-token loss a copy of the base is tuned the same
way and every healed figure is against it. Costs are KL(base ‖ hybrid) and ΔPPL per predicted token with paired
bootstrap intervals (headsurgeon/surgery/measure/divergence.py).
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..configs import BuildConfig
from ..core import Head, InputError
from ..core.fileio import json_bytes
from ..surgery.threads import fit_threads
from ..synth.trust import TrustPrograms
from .candidates import chosen_set, frontier_candidates, mixture_refits
from .control import iou_control
from .growth import JointCosts, grow, within
from .healing import Healer, grow_healed, heal_and_judge
from .result import BUILD_FILE, BuildResult, card_metrics
from .windows import corpus_windows, fresh_windows, more_costs_path, more_windows

if TYPE_CHECKING:  # the model and measurement types load torch: named for the checker only
    from ..surgery.corpus import Splits
    from ..surgery.measure.divergence import WindowCosts
    from ..surgery.models.handle import ModelHandle
    from ..synth.programset import ProgramSet
    from ..synth.sequence import Sequence
    from .healing import Healed

__all__ = ["BUILD_FILE", "BuildResult", "build_hybrid", "fresh_windows", "more_windows", "split_mismatch", "within"]

#: with --select-more, the heads measured on the extra windows: this many times the heads asked for, cheapest on the
#: select windows first (a head further down rarely comes up, and each costs a swap per extra window)
SHORTLIST = 2


@contextmanager
def _stage(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Time one stage of forwards into ``seconds[name]``, its threads sized when it starts
    (headsurgeon/surgery/threads.py ``fit_threads``): a long build started beside a busy process must not keep one
    thread to its end."""
    fit_threads()
    start = time.perf_counter()
    yield
    seconds[name] = time.perf_counter() - start


def _pooled_kl(*parts: WindowCosts) -> float:
    """Per-token KL over the windows of several WindowCosts together."""
    kl = sum(float(p.kl.sum()) for p in parts)
    tokens = sum(int(p.tokens.sum()) for p in parts)
    return kl / max(tokens, 1)


def build_hybrid(model: Any, corpus: str | Path, programs: ProgramSet | str | Path, out: str | Path | None = None, *,
                 config: BuildConfig | None = None, trust_programs: TrustPrograms = False,
                 **shortcuts: Any) -> BuildResult:
    """Swap the cheapest heads (single-swap KL on the select windows) of ``programs`` (a ProgramSet or programs.json)
    until ``fraction`` of the model's heads or the ``budget_ppl`` (percent, select windows) is reached, growing the
    set with joint re-measurement; each head gets the cheapest of its candidates (its program of kind ``which``, its
    frontier points of that kind's size, a refit of its mixture). Measured on the test windows (and ``heldout`` text);
    with ``heal``, the norm gains of the hybrid and of a copy of the base are tuned on the synth (and ``heal_more``)
    windows and compared. With ``out``, the (healed) hybrid is saved there with ``build.json``. ``model`` is anything
    :func:`headsurgeon.load_model` loads. Settings: :class:`BuildConfig`, or its fields as keywords."""
    from ..hub.checkpoint import save_hybrid
    from ..surgery.measure.divergence import BaseDistributions, summarize, window_costs
    from ..surgery.measure.head_costs import head_costs
    from ..surgery.swap.replace import replace_heads
    from ..synth.vocab import Vocabulary

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

    with _stage(seconds, "refit"):
        vocab = Vocabulary.from_tokenizer(handle.tokenizer) if handle.tokenizer is not None else None
        extra = frontier_candidates(programs, cfg.which)
        for h, program in mixture_refits(handle, programs, cfg, splits.synth, vocab).items():
            extra.setdefault(h, {})["refit"] = program
    with _stage(seconds, "head costs"):
        costs = head_costs(handle, programs, splits.select, which=(cfg.which,), reference=splits.synth,
                           progress=cfg.progress, path=cfg.costs, extra=extra)
        choice = {h: min([cfg.which, *extra.get(h, {})], key=lambda label: (costs.kl(h, label), label))
                  for h in costs.order(cfg.which)}
        single = {h: costs.kl(h, label) or 0.0 for h, label in choice.items()}
        swap_set = chosen_set(programs, cfg.which, choice, extra, vocab)
        swap_of = swap_set.programs(cfg.which)
        order = sorted(single, key=lambda h: (single[h], h))
        more_costs = None
        if more:  # the shortlist's chosen programs measured again on the fresh windows, reordered by the pooled KL
            shortlist = order[: min(len(order), SHORTLIST * k_max)]
            more_costs = head_costs(handle, {h: swap_of[h] for h in shortlist}, more, which=("replacement",),
                                    ablation=False, progress=cfg.progress, path=more_costs_path(cfg.costs))
            single = {**single, **{h: _pooled_kl(costs.costs[h][choice[h]], more_costs.costs[h]["replacement"])
                                   for h in shortlist}}
            order = sorted(shortlist, key=lambda h: (single[h], h)) + order[len(shortlist):]

    select_windows = splits.select + more
    with _stage(seconds, "growth"):
        joint = JointCosts(handle, select_windows, swap_of)
        steps: list[dict[str, Any]] = []
        chunk = cfg.chunk or max(1, round(0.02 * model_heads))
        budget = None if cfg.budget_ppl is None else cfg.budget_ppl / 100
        heads = grow(joint, order, single, k_max, budget, chunk, steps)
    healer = Healer(handle, swap_set, cfg, splits.synth + heal_more, select_windows) if cfg.heal and heads else None
    budget_tries: list[dict[str, Any]] = []
    ready: Healed | None = None
    if healer is not None and budget is not None:  # the budget holds for what is shipped: the healed hybrid
        with _stage(seconds, "healed growth"):
            chain = heads + [h for h in order if h not in heads]
            heads, budget_tries, ready = grow_healed(healer, chain[:k_max], len(heads), budget, chunk)
    select = joint.measure(heads).to_json() if heads else None

    measured = splits.test + heldout
    with _stage(seconds, "test"):
        base = BaseDistributions(handle, measured)
        hybrid_set = swap_set.subset(heads)
        test = None
        if heads:
            with replace_heads(handle, hybrid_set, which=cfg.which) as hybrid:
                test = summarize(window_costs(base, hybrid)).to_json()
        control = iou_control(programs, cfg.which, len(heads), base, handle) if cfg.control and heads else None

    final, healed = None, None
    if healer is not None:
        with _stage(seconds, "heal"):
            final, healed = heal_and_judge(healer, heads, measured, base, control, programs, ready)
            if budget_tries:
                healed["budget_tries"] = budget_tries
    elif heads:
        final = replace_heads(handle, hybrid_set, which=cfg.which)
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
        save_hybrid(final, out, metrics={"build": card_metrics(result)}, overwrite=True,
                    extra_files={BUILD_FILE: json_bytes(result.to_json())})
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _inputs(model: Any, corpus: str | Path, programs: ProgramSet | str | Path, trust_programs: TrustPrograms,
            cfg: BuildConfig) -> tuple[ModelHandle, ProgramSet, Splits, list[Sequence]]:
    """(handle, trusted ProgramSet, splits, heldout windows), refusing what build cannot use before any work."""
    from ..surgery.models.loading import load_model
    from ..surgery.measure.scorable import require_lm_head
    from ..synth.programset import ProgramSet

    if isinstance(programs, (str, Path)):
        programs = ProgramSet.load(programs)
    if not isinstance(programs, ProgramSet):
        raise InputError(f"programs must be a ProgramSet or a programs.json path, got {type(programs).__name__}")
    programs = programs.trusted(trust_programs)
    if not programs.programs(cfg.which):
        raise InputError(f"the program set holds no {cfg.which}s; build with which='replacement', or explain first")
    handle = load_model(model, **asdict(cfg.model))
    require_lm_head(handle)
    splits, heldout = corpus_windows(handle, corpus, cfg.heldout, cfg)
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
