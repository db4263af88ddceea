"""ScoredProgram: one program for one head with its scores per split and where it came from.

The one record every stage passes along (docs/architecture.md, Types): a searcher's proposal (headsurgeon/synth/search/),
a program competing in selection (headsurgeon/synth/select.py), a head's replacement, explanation or frontier point
(headsurgeon/synth/programset.py ``Entry``) and what the report shows (headsurgeon/report/heads.py). The head it is for is
the key it is filed under (a searcher's ``{head: [ScoredProgram, ...]}``, ``ProgramSet.entries``).
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core import Metric, Split
from ..core.scores import Scores
from .program import Program
from ..core.vocabulary import TokenVocabulary

__all__ = ["ScoredProgram", "TEXT_LIMIT", "GLOSS_LIMIT"]

#: rendered texts (and glosses) longer than this are stored cut in programs.json ("chars" keeps the full length)
TEXT_LIMIT = 1000
GLOSS_LIMIT = 600


class ScoredProgram:
    """``program`` proposed by ``source`` (enumerative, learned, llm, library, tp, baseline) with its ``scores``.

    ``budget``: the character budget it won (None: unbounded or not selected yet); ``digits``: the significant
    digits its float literals were rounded to (None: as proposed). ``text`` is ``program.render(vocab)`` with the
    vocabulary of selection (:meth:`of`), else rendered without one when first read; ``chars`` its length and
    ``gloss`` the English sentence. Read back from programs.json, a text over ``TEXT_LIMIT`` characters is its
    first ``TEXT_LIMIT`` characters plus " …" (``chars`` stays the full length; render the program for the whole).
    """

    __slots__ = ("program", "source", "scores", "hypothesis", "budget", "digits", "_text", "_gloss", "_chars",
                 "_size")

    def __init__(self, program: Program, source: str = "unknown", scores: Mapping | None = None,
                 hypothesis: str = "", budget: int | None = None, digits: int | None = None, *,
                 text: str | None = None, gloss: str | None = None, chars: int | None = None,
                 size: int | None = None) -> None:
        self.program, self.source, self.hypothesis = program, source, hypothesis
        self.scores: Scores = Scores.of(scores)
        self.budget, self.digits = budget, digits
        self._text, self._gloss, self._chars, self._size = text, gloss, chars, size

    @classmethod
    def of(cls, program: Program, source: str = "unknown", scores: Mapping | None = None, vocab: TokenVocabulary | None = None,
           hypothesis: str = "", budget: int | None = None, digits: int | None = None) -> "ScoredProgram":
        """A record with text, chars, gloss and size rendered now (token strings from ``vocab``, a Vocabulary)."""
        text = program.render(vocab)
        return cls(program, source, scores, hypothesis, budget, digits, text=text, gloss=program.gloss(vocab),
                   chars=len(text), size=program.size)

    # what a person reads: rendered once when kept, else without a vocabulary on demand
    @property
    def rendered(self) -> bool:
        """Whether ``text`` was rendered when the record was kept (else it is rendered without a vocabulary)."""
        return self._text is not None

    @property
    def text(self) -> str:
        return self._text if self._text is not None else self.program.render()

    @property
    def gloss(self) -> str:
        return self._gloss if self._gloss is not None else self.program.gloss()

    @property
    def chars(self) -> int:
        """Characters of the whole rendered text (more than ``len(text)`` when stored cut)."""
        return self._chars if self._chars is not None else len(self.text)

    @property
    def size(self) -> int:
        """Description length (``Program.size``)."""
        return self._size if self._size is not None else self.program.size

    # scores
    def score(self, split: Split, metric: Metric) -> float | None:
        """``metric`` on ``split`` (None when not measured)."""
        return self.scores.get(split, metric)

    def iou(self, split: Split = "test") -> float | None:
        """Soft IoU on ``split`` (None when not measured)."""
        return self.scores.get(split, "iou")

    def jsd(self, split: Split = "test") -> float | None:
        """Jensen-Shannon distance on ``split`` (None when not measured)."""
        return self.scores.get(split, "jsd")

    # programs.json
    def to_json(self, program_json: Any = None) -> dict:
        """The programs.json form; ``program_json`` replaces ``program.to_json()`` (packed tables)."""
        text, gloss = self.text, self.gloss
        text = text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + " …"
        gloss = gloss if len(gloss) <= GLOSS_LIMIT else gloss[:GLOSS_LIMIT] + " …"
        out: dict[str, Any] = {"budget": self.budget,
                               "program": self.program.to_json() if program_json is None else program_json,
                               "kind": self.program.kind, "text": text, "size": self.size, "chars": self.chars,
                               "gloss": gloss, "source": self.source, **self.scores.by_metric()}
        if self.hypothesis:
            out["hypothesis"] = self.hypothesis
        if self.digits is not None:
            out["digits"] = self.digits
        return out

    @classmethod
    def from_json(cls, item: Mapping[str, Any], program: Program) -> "ScoredProgram":
        """Read back :meth:`to_json` (``program`` already parsed); fields missing are rendered without a vocab."""
        def typed(key: str, kind: type) -> Any:
            value = item.get(key)
            return value if isinstance(value, kind) and not isinstance(value, bool) else None

        return cls(program, str(item.get("source", "unknown")), Scores.from_by_metric(item),
                   str(item.get("hypothesis", "")), typed("budget", int), typed("digits", int),
                   text=typed("text", str), gloss=typed("gloss", str), chars=typed("chars", int),
                   size=typed("size", int))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScoredProgram) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable: scores grow as splits are measured

    def _fields(self) -> tuple:
        return (self.program, self.source, self.scores, self.hypothesis, self.budget, self.digits, self.text,
                self.gloss, self.chars, self.size)

    def __repr__(self) -> str:
        return (f"ScoredProgram({self.program.text[:60]!r}, source={self.source!r}, budget={self.budget}, "
                f"scores={dict(self.scores)})")
