"""``ProgramStore``: a pattern source whose heads are known programs, with no model behind it.

What a searcher should recover, a report of known heads, a benchmark at any number of heads: the store answers
``batch`` and ``pattern`` like ``headsurgeon/surgery/patterns/store.py``'s AttentionStore (the ``PatternSource`` of
headsurgeon/synth/search/base.py), from each program evaluated once over all its windows.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence as Seq

import numpy as np

from ..core import Head, InputError
from .program import Program
from .sequence import Sequence

__all__ = ["ProgramStore"]


class ProgramStore:
    """Windows ``sequences`` and, per (layer, head), the program (or DSL text) that is that head's attention."""

    def __init__(self, sequences: list[Sequence], programs: Mapping[Head, Program | str], causal: bool = True) -> None:
        if not sequences:
            raise InputError("a ProgramStore needs at least one window")
        self.sequences, self.causal = list(sequences), bool(causal)
        self.programs: dict[Head, Program] = {Head(int(h[0]), int(h[1])): p if isinstance(p, Program) else Program.parse(p)
                         for h, p in programs.items()}
        self._patterns: dict[str, np.ndarray] = {}

    @property
    def heads(self) -> list[Head]:
        """The (layer, head) pairs, in the order given."""
        return list(self.programs)

    def _all(self, head: Head) -> np.ndarray:
        program = self.programs.get(head)
        if program is None:
            raise InputError(f"head {Head.label(head)} is not in this ProgramStore; it holds "
                             f"{', '.join(Head.label(h) for h in self.heads)}")
        if program.hash not in self._patterns:
            self._patterns[program.hash] = program.evaluate(self.sequences, causal=self.causal)
        return self._patterns[program.hash]

    def pattern(self, index: int, layer: int, head: int) -> np.ndarray:
        """The pattern [n, n] of one head on window ``index``."""
        n = self.sequences[index].n
        return self._all(Head(layer, head))[index, :n, :n]

    def batch(self, indices: Seq[int] | None = None, heads: Seq[tuple[int, int]] | None = None,
              dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Patterns [H, B, N, N] of ``heads`` (default: all) on windows ``indices`` (default: all), and the lengths."""
        idx = list(range(len(self.sequences))) if indices is None else list(indices)
        n = max(self.sequences[i].n for i in idx)
        pats = np.stack([self._all(Head(*h))[idx, :n, :n] for h in (self.heads if heads is None else heads)])
        return pats.astype(dtype), np.array([self.sequences[i].n for i in idx], dtype=np.int64)
