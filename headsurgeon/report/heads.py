"""What the report shows per head, read from a ProgramSet entry: explanation, replacement, frontier, best template.

Reads headsurgeon/synth/programset.py's ``Entry.replacement``, ``.explanation`` and ``.frontier`` (each a ``ScoredProgram``,
headsurgeon/synth/scored.py); on a record from before explanations (no frontier), a replacement that fits ``READABLE_CHARS``
(headsurgeon/synth/program.py) stands in as the explanation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from headsurgeon.core.vocabulary import TokenVocabulary
from headsurgeon.synth.program import READABLE_CHARS, Program
from headsurgeon.synth.programset import Entry, ProgramSet
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.select import BASELINES, score_programs
from headsurgeon.synth.splits import StoreSplits

if TYPE_CHECKING:  # importing the searchers' package registers them all: the report needs only the protocol
    from headsurgeon.synth.search.base import PatternReader


@dataclass
class HeadView:
    """Everything the report says about one head."""

    head: tuple[int, int]
    replacement: ScoredProgram
    explanation: ScoredProgram | None
    frontier: list[ScoredProgram]
    hypothesis: str = ""
    template: str | None = None
    template_iou: float | None = None
    template_select_iou: float | None = None
    windows: list = field(default_factory=list)  # report/windows.py ``Window``s, set by ``windows.add_windows``

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


def shown(p: ScoredProgram, vocab: TokenVocabulary | None) -> ScoredProgram:
    """``p`` as a person sees it: a text never rendered, or stored cut (programs.json), is rendered with ``vocab``."""
    if not p.rendered:
        text = safe(lambda: p.program.render(vocab), p.program.text)
        gloss, chars = safe(lambda: p.program.gloss(vocab), ""), len(text)
    else:
        text, chars = p.text, p.chars
        if len(text) < chars and vocab is not None:
            text = safe(lambda: p.program.render(vocab), text)
        gloss = safe(lambda: p.gloss, "") or safe(lambda: p.program.gloss(vocab), "")
    return ScoredProgram(p.program, p.source, p.scores, p.hypothesis, p.budget, p.digits, text=text, gloss=gloss,
                         chars=chars, size=safe(lambda: p.size, None))


def view(head: tuple[int, int], entry: Entry, vocab: TokenVocabulary | None) -> HeadView:
    """The HeadView of one ProgramSet entry (headsurgeon/synth/programset.py ``Entry``)."""
    replacement = shown(entry.replacement, vocab)
    explanation = shown(entry.explanation, vocab) if entry.explanation is not None else None
    frontier = [shown(c, vocab) for c in entry.frontier]
    if explanation is None and not frontier and (replacement.chars or 0) <= READABLE_CHARS:
        explanation = replacement  # a record from before explanations: a readable replacement explains itself
    if not frontier:
        frontier = [s for s in (explanation, replacement) if s is not None]
    return HeadView(head, replacement, explanation, frontier, entry.hypothesis or "")


def views(programs: ProgramSet, vocab: TokenVocabulary | None = None) -> list[HeadView]:
    """One HeadView per head, in head order."""
    return [view(h, e, vocab) for h, e in programs.entries.items()]


def add_templates(heads: list[HeadView], store: PatternReader, splits: StoreSplits) -> None:
    """Score the single templates (headsurgeon/synth/select.py ``BASELINES``) and attach each head's best one.

    Chosen on ``splits.select`` when it has windows (reported on test, like every program), else the best on test
    (an upper bound for the templates).
    """
    test_idx, select_idx = splits["test"], splits["select"]
    if not heads or not test_idx:
        return
    keys = [v.head for v in heads]
    templates = [Program.parse(t) for t in BASELINES]
    test = score_programs(store, keys, templates, test_idx)["iou"]
    choose = score_programs(store, keys, templates, select_idx)["iou"] if select_idx else test
    for r, v in enumerate(heads):
        best = int(np.argmax(choose[r]))
        v.template, v.template_iou = BASELINES[best], float(test[r, best])
        v.template_select_iou = float(choose[r, best]) if select_idx else None


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


def example_window(store: PatternReader, test_idx: list[int], max_tokens: int, look: int = 20) -> int | None:
    """The test window shown in every head's heatmaps: the longest among the first ``look`` (ties: first)."""
    if not test_idx:
        return None
    cands = list(test_idx[:look])
    return max(cands, key=lambda i: (min(store.sequences[i].n, max_tokens), -cands.index(i)))


def patterns(v: HeadView, store: PatternReader, index: int, n: int, cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The real pattern and the explanation's and replacement's on window ``index``, cropped to n × n."""
    seq = store.sequences[index]
    out = {"real": np.asarray(store.pattern(index, *v.head), dtype=np.float32)[:n, :n]}
    for name, shown in (("explanation", v.explanation), ("replacement", v.replacement)):
        if shown is None or (name == "replacement" and v.same()):
            continue
        key = shown.program.hash
        if key not in cache:
            cache[key] = safe(lambda shown=shown: shown.program.evaluate([seq], causal=store.causal)[0], None)
        if cache[key] is not None:
            out[name] = cache[key][:n, :n]
    return out
