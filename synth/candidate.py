"""Candidate: one program proposed for one head by one searcher, with its scores as they become known."""
from __future__ import annotations

from dataclasses import dataclass, field

from .program import Program


@dataclass
class Candidate:
    """A proposal for head ``(layer, head)``; ``source`` names the searcher (enumerative, learned, llm, library, tp)."""

    head: tuple[int, int]
    program: Program
    source: str
    hypothesis: str = ""
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # split -> {"iou", "jsd", "topq"}

    def score(self, split: str, metric: str) -> float | None:
        return self.scores.get(split, {}).get(metric)
