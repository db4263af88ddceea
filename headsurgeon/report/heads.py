"""What the report shows per head, read from a ProgramSet entry: explanation, replacement, frontier, best template.

Reads synth/programset.py's ``Entry.explanation``, ``Entry.frontier`` and ``Entry.replacement_choice()`` (each a
``Choice``, synth/candidate.py); on a record from before explanations (no frontier), a replacement that fits
``READABLE_CHARS`` (synth/program.py) stands in as the explanation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headsurgeon.synth.program import READABLE_CHARS, Program
from headsurgeon.synth.programset import Entry, ProgramSet
from headsurgeon.synth.select import BASELINES, score_programs


@dataclass
class Shown:
    """One program as a person sees it: rendered text, gloss, size, characters, budget and scores per split."""

    program: Program
    text: str
    gloss: str
    size: int | None
    chars: int | None
    budget: int | None = None
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = ""

    def iou(self, split: str = "test") -> float | None:
        """IoU on ``split`` (None when not measured)."""
        return (self.scores.get(split) or {}).get("iou")

    def jsd(self, split: str = "test") -> float | None:
        """JSD on ``split`` (None when not measured)."""
        return (self.scores.get(split) or {}).get("jsd")


@dataclass
class HeadView:
    """Everything the report says about one head."""

    head: tuple[int, int]
    replacement: Shown
    explanation: Shown | None
    frontier: list[Shown]
    hypothesis: str = ""
    template: str | None = None
    template_iou: float | None = None

    def same(self) -> bool:
        """Whether the explanation is the replacement itself."""
        return self.explanation is not None and self.explanation.program == self.replacement.program

    def trust_key(self) -> tuple:
        """Sort key: heads with a readable explanation first, then by its test IoU, then the replacement's."""
        ex = self.explanation.iou() if self.explanation is not None else None
        rep = self.replacement.iou()
        return (ex is None, -(ex if ex is not None else -1.0), -(rep if rep is not None else -1.0), self.head)


def safe(call: Any, default: Any) -> Any:
    """``call()``, or ``default`` when the program cannot answer (e.g. a backend without glosses)."""
    try:
        return call()
    except Exception:  # a report never fails on one program's rendering
        return default


def from_program(program: Program, vocab: Any, scores: dict | None = None, source: str = "",
                 budget: int | None = None) -> Shown:
    """A Shown built from a bare Program (rendered with ``vocab`` when given)."""
    text = safe(lambda: program.render(vocab), program.text)
    return Shown(program, text, safe(lambda: program.gloss(vocab), ""), safe(lambda: program.size, None),
                 len(text), budget, dict(scores or {}), source)


def from_choice(choice: Any, vocab: Any) -> Shown:
    """A Shown from a ``Choice`` (synth/candidate.py); a text stored cut (programs.json) is rendered again."""
    text = choice.text
    if not text or (choice.chars is not None and len(text) < choice.chars and vocab is not None):
        text = safe(lambda: choice.program.render(vocab), text or choice.program.text)
    gloss = choice.gloss or safe(lambda: choice.program.gloss(vocab), "")
    size = choice.size if choice.size is not None else safe(lambda: choice.program.size, None)
    return Shown(choice.program, text, gloss, size, choice.chars if choice.chars is not None else len(text),
                 choice.budget, dict(choice.scores or {}), choice.source)


def view(head: tuple[int, int], entry: Entry, vocab: Any) -> HeadView:
    """The HeadView of one ProgramSet entry (synth/programset.py ``Entry``)."""
    rep = safe(lambda: entry.replacement_choice(vocab if not entry.text else None), None)
    replacement = from_choice(rep, vocab) if rep is not None else from_program(entry.program, vocab, entry.scores,
                                                                               entry.source)
    explanation = from_choice(entry.explanation, vocab) if entry.explanation is not None else None
    frontier = [from_choice(c, vocab) for c in entry.frontier]
    if explanation is None and not frontier and (replacement.chars or 0) <= READABLE_CHARS:
        explanation = replacement  # a record from before explanations: a readable replacement explains itself
    if not frontier:
        frontier = [s for s in (explanation, replacement) if s is not None]
    return HeadView(head, replacement, explanation, frontier, entry.hypothesis or "")


def views(programs: ProgramSet, vocab: Any = None) -> list[HeadView]:
    """One HeadView per head, in head order."""
    return [view(h, e, vocab) for h, e in programs.entries.items()]


def add_templates(heads: list[HeadView], store: Any, test_idx: list[int], select_idx: list[int] | None = None) -> None:
    """Score the single templates (synth/select.py ``BASELINES``) and attach each head's best one.

    Chosen on ``select_idx`` when given (reported on test, like every program), else the best on test
    (an upper bound for the templates).
    """
    if not heads or not test_idx:
        return
    keys = [v.head for v in heads]
    templates = [Program.parse(t) for t in BASELINES]
    test = score_programs(store, keys, templates, list(test_idx))["iou"]
    choose = score_programs(store, keys, templates, list(select_idx))["iou"] if select_idx else test
    for r, v in enumerate(heads):
        best = int(np.argmax(choose[r]))
        v.template, v.template_iou = BASELINES[best], float(test[r, best])


def frontier_points(v: HeadView) -> list[tuple[int, float, str, bool]]:
    """(size, test IoU, budget label, is the explanation) per frontier point; equal points share a label."""
    merged: dict[tuple[int, float], tuple[list[str], bool]] = {}
    for s in v.frontier:
        iou = s.iou()
        if s.size is None or iou is None:
            continue
        label = f"≤{s.budget}" if s.budget else "any"
        is_ex = v.explanation is not None and s.program == v.explanation.program
        key = (int(s.size), round(float(iou), 4))
        labs, ex = merged.get(key, ([], False))
        merged[key] = (labs + [label], ex or is_ex)
    return [(size, iou, ", ".join(dict.fromkeys(labs)), ex) for (size, iou), (labs, ex) in merged.items()]


def example_window(store: Any, test_idx: list[int], max_tokens: int, look: int = 20) -> int | None:
    """The test window shown in every head's heatmaps: the longest among the first ``look`` (ties: first)."""
    if not test_idx:
        return None
    cands = list(test_idx[:look])
    return max(cands, key=lambda i: (min(store.sequences[i].n, max_tokens), -cands.index(i)))


def patterns(v: HeadView, store: Any, index: int, n: int, cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The real pattern and the explanation's and replacement's on window ``index``, cropped to n × n."""
    seq = store.sequences[index]
    out = {"real": np.asarray(store.pattern(index, *v.head), dtype=np.float32)[:n, :n]}
    for name, shown in (("explanation", v.explanation), ("replacement", v.replacement)):
        if shown is None or (name == "replacement" and v.same()):
            continue
        key = shown.program.hash
        if key not in cache:
            cache[key] = safe(lambda: shown.program.evaluate([seq], causal=store.causal)[0], None)
        if cache[key] is not None:
            out[name] = cache[key][:n, :n]
    return out
