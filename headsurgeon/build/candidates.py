"""Each head's candidates in a build: its program of the kind swapped, its frontier points of that kind's size, and a
refit of its mixture weights to the head's output (headsurgeon/surgery/swap/refit.py); the cheapest by single-swap
KL goes into the chosen program set."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..configs import BuildConfig
from ..core import Head

if TYPE_CHECKING:  # the model types load torch: named for the checker only
    from ..surgery.models.handle import ModelHandle
    from ..synth.program import Program
    from ..synth.programset import ProgramSet
    from ..synth.sequence import Sequence
    from ..synth.vocab import Vocabulary

__all__ = ["chosen_set", "frontier_candidates", "mixture_refits"]


def frontier_candidates(programs: ProgramSet, which: str) -> dict[Head, dict[str, Program]]:
    """Per head, its frontier points other than its ``which`` program, of that kind's size (readable for
    explanations), labelled by budget: build measures them beside the program and keeps the cheapest."""
    from ..synth.program import READABLE_CHARS

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


def mixture_refits(handle: ModelHandle, programs: ProgramSet, cfg: BuildConfig, synth: list[Sequence],
                   vocab: Vocabulary | None) -> dict[Head, Program]:
    """Per head whose program is a mixture or a gate over mixtures: the same components reweighted (per branch) to
    match the head's output on the synth windows (headsurgeon/surgery/swap/refit.py), kept when it changed and, for
    explanations, is still readable."""
    from ..surgery.swap.refit import refit_mixtures
    from ..synth.program import READABLE_CHARS

    found = refit_mixtures(handle, programs, synth, which=cfg.which, progress=cfg.progress)
    return {h: r.after for h, r in found.items()
            if r.changed and (cfg.which != "explanation" or r.after.chars(vocab) <= READABLE_CHARS)}


def chosen_set(programs: ProgramSet, which: str, choice: dict[Head, str], extra: dict[Head, dict[str, Program]],
               vocab: Vocabulary | None) -> ProgramSet:
    """The program set with each head's ``which`` slot holding the candidate build chose for it (a refitted mixture
    carries no pattern scores: it was chosen by its causal cost)."""
    from ..synth.programset import Entry, ProgramSet
    from ..synth.scored import ScoredProgram

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
