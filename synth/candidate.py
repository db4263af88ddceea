"""Candidate: one program proposed for one head by one searcher; Choice: one program selection kept for a head."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..kernels.core import METRICS, Metric, Split
from .program import Program

#: rendered texts (and glosses) longer than this are stored cut in programs.json ("chars" keeps the full length)
TEXT_LIMIT = 1000
GLOSS_LIMIT = 600


@dataclass
class Candidate:
    """A proposal for head ``(layer, head)``; ``source`` names the searcher (enumerative, learned, llm, library, tp)."""

    head: tuple[int, int]
    program: Program
    source: str
    hypothesis: str = ""
    scores: dict[Split, dict[Metric, float]] = field(default_factory=dict)  # split -> {"iou", "jsd", "topq"}

    def score(self, split: Split, metric: Metric) -> float | None:
        return self.scores.get(split, {}).get(metric)


@dataclass
class Choice:
    """A program kept for a head (explanation, replacement or frontier point) with its size, text and scores.

    ``budget`` is the character budget it won (None: unbounded); ``text`` is ``program.render(vocab)`` and
    ``chars`` its length; ``scores`` maps split → {"iou", "jsd", "topq"}; ``digits`` the significant digits its
    float literals were rounded to (None: as proposed). Read back from programs.json, a text over ``TEXT_LIMIT``
    characters is its first ``TEXT_LIMIT`` characters plus " …" (``chars`` stays the full length; render the
    program for the whole text).
    """

    program: Program
    source: str
    budget: int | None
    size: int
    chars: int
    text: str
    gloss: str
    scores: dict[Split, dict[Metric, float]] = field(default_factory=dict)
    hypothesis: str = ""
    digits: int | None = None

    @classmethod
    def of(cls, program: Program, source: str, budget: int | None = None, scores: dict | None = None,
           vocab: Any = None, hypothesis: str = "", digits: int | None = None) -> "Choice":
        """A Choice with size, text, chars and gloss computed from ``program`` (token strings from ``vocab``)."""
        text = program.render(vocab)
        return cls(program, source, budget, program.size, len(text), text, program.gloss(vocab),
                   {k: dict(v) for k, v in (scores or {}).items()}, hypothesis, digits)

    def iou(self, split: Split = "test") -> float | None:
        return self.scores.get(split, {}).get("iou")

    def to_json(self, program_json: Any = None) -> dict:
        """The programs.json form; ``program_json`` replaces ``program.to_json()`` (packed tables)."""
        text = self.text if len(self.text) <= TEXT_LIMIT else self.text[:TEXT_LIMIT] + " …"
        gloss = self.gloss if len(self.gloss) <= GLOSS_LIMIT else self.gloss[:GLOSS_LIMIT] + " …"
        out: dict[str, Any] = {"budget": self.budget,
                               "program": self.program.to_json() if program_json is None else program_json,
                               "kind": self.program.kind, "text": text, "size": self.size, "chars": self.chars,
                               "gloss": gloss, "source": self.source}
        for m in METRICS:
            out[m] = {split: s[m] for split, s in self.scores.items() if m in s}
        if self.hypothesis:
            out["hypothesis"] = self.hypothesis
        if self.digits is not None:
            out["digits"] = self.digits
        return out

    @classmethod
    def from_json(cls, item: dict, program: Program, budget: int | None = None) -> "Choice":
        """Read back :meth:`to_json` (``program`` already parsed); missing fields are recomputed without a vocab."""
        scores: dict[Split, dict[Metric, float]] = {}
        for m in METRICS:
            for split, v in (item.get(m) or {}).items():
                scores.setdefault(split, {})[m] = v
        text = item.get("text")
        if not isinstance(text, str):
            text = program.render()
        chars = item.get("chars")
        gloss = item.get("gloss")
        return cls(program, str(item.get("source", "unknown")), budget,
                   int(item["size"]) if isinstance(item.get("size"), int) else program.size,
                   int(chars) if isinstance(chars, int) else len(text), text,
                   gloss if isinstance(gloss, str) else program.gloss(), scores, str(item.get("hypothesis", "")),
                   item.get("digits") if isinstance(item.get("digits"), int) else None)
