"""The user's program library as a searcher: each given program becomes a candidate for every head, scored on
``synth`` and ``select`` like any searcher's (what ``select_programs(library=...)`` adds at selection time)."""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..candidate import Candidate
from ..program import Program
from ..select import score_programs
from .base import CandidateMap, Head, PatternSource, StopCheck, check_splits

SOURCE = "library"


class LibrarySearcher:
    """Proposes the same fixed programs (``Program`` objects or DSL text) for every head."""

    name = SOURCE

    def __init__(self, programs: Iterable[Program | str] = ()) -> None:
        parsed = [p if isinstance(p, Program) else Program.parse(p) for p in programs]
        self.programs = _unique(parsed)

    def search(self, store: PatternSource, *, synth_idx: Sequence[int], select_idx: Sequence[int],
               heads: Sequence[Head] | None = None, progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Every program for every head, with IoU / JSD / top-q IoU on synth and select."""
        synth, select = check_splits(synth_idx, select_idx, "the library searcher")
        heads = [(int(h[0]), int(h[1])) for h in (store.heads if heads is None else heads)]
        if not self.programs or not heads:
            return {}
        stop = StopCheck(budget, cancel)
        scores: dict[str, dict[str, np.ndarray]] = {}
        for split, idx in tqdm((("synth", synth), ("select", select)), desc="library", disable=not progress,
                               leave=False):
            if stop():
                return {}
            scores[split] = score_programs(store, heads, self.programs, idx)
        return {h: [Candidate(h, p, SOURCE, "", {split: {m: float(v[r, k]) for m, v in got.items()}
                                                 for split, got in scores.items()})
                    for k, p in enumerate(self.programs)]
                for r, h in enumerate(heads)}

    def report(self) -> str:
        """Nothing to add to the run's notes."""
        return ""


def _unique(programs: list[Program]) -> list[Program]:
    """The programs without repeats (by hash), in their first order."""
    seen: dict[str, Program] = {}
    for p in programs:
        seen.setdefault(p.hash, p)
    return list(seen.values())
