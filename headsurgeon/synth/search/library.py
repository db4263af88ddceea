"""The user's program library as a searcher: each given program becomes a candidate for every head, scored on
``synth`` and ``select`` like any searcher's (what ``select_programs(library=...)`` adds at selection time).

Library files in EAPS's style (headsurgeon/synth/eaps.py) arrive as ``LibraryProgram``s; a Python program's hypothesis is
the label it returns beside its matrix (its most common one on a few synth windows), else its function name.
A Python program that fails on a synth or select window is dropped, and :meth:`LibrarySearcher.report` says why.
The search has a time budget (seconds, in total across heads; headsurgeon/synth/eaps.py ``LIBRARY_BUDGET_S`` unless the
library's files or the caller give another): past it no further program starts, the programs scored on both
splits compete, and the report says how many were left out.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..scored import ScoredProgram
from ...kernels.cache import TensorCache
from ..eaps import LIBRARY_BUDGET_S, LibraryProgram, probe_labels
from ..errors import ProgramError
from ..program import Program
from ..select import score_programs
from .base import CandidateMap, PatternSource, StopCheck
from ..splits import StoreSplits
from ...core import Head, InputError

SOURCE = "library"
# Per process, across head tasks of a run that shares a pattern cache (headsurgeon/synth/runcache.py): why a program failed,
# and each program's label on the probe windows; both depend on the program and the windows only.
_FAILED: dict[tuple[str, int], str] = {}
_LABELS: dict[tuple[str, tuple], str] = {}
PROBE_WINDOWS = 8  # synth windows a Python program's labels are read from


class LibrarySearcher:
    """Proposes the same fixed programs (``Program`` objects, DSL text or ``LibraryProgram``s) for every head."""

    name = SOURCE

    def __init__(self, programs: Iterable[Program | str | LibraryProgram] = (), budget: float | None = None,
                 cache: TensorCache | None = None) -> None:
        """``budget``: seconds for the whole search (all heads); default the library files' (``load_library``).
        ``cache``: where the programs' patterns are kept across head tasks (headsurgeon/synth/runcache.py ``run_cache``)."""
        self.cache = cache
        self.hypotheses: dict[str, str] = {}
        budgets: list[float | None] = []
        self.names: dict[str, str] = {}
        parsed: list[Program] = []
        for p in programs:
            if isinstance(p, LibraryProgram):
                parsed.append(p.program)
                budgets.append(p.budget)
                self.names.setdefault(p.program.hash, f"{p.name} ({p.origin})")
                if p.hypothesis:
                    self.hypotheses.setdefault(p.program.hash, p.hypothesis)
            else:
                parsed.append(p if isinstance(p, Program) else Program.parse(p))
        self.programs = _unique(parsed)
        if budget is None:
            given = [b for b in budgets if b is not None]
            budget = min(given) if given else (None if budgets else LIBRARY_BUDGET_S)
        if budget is not None and not budget >= 0:
            raise InputError(f"the library time budget must be >= 0 seconds or None; got {budget}")
        self.budget = budget
        self.notes: list[str] = []

    def search(self, store: PatternSource, splits: StoreSplits, *, heads: Sequence[Head] | None = None,
               progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Every program for every head, with IoU / JSD / top-q IoU on synth and select."""
        synth, select = splits.checked("the library searcher")
        heads = [Head(int(h[0]), int(h[1])) for h in (store.heads if heads is None else heads)]
        if not self.programs or not heads:
            return {}
        stop = StopCheck(budget, cancel)
        clock = StopCheck(self.budget)
        groups = [[p for p in self.programs if not p.sandboxed]] + [[p] for p in self.programs if p.sandboxed]
        groups = [g for g in groups if g]
        cols: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # program hash -> split -> metric -> [H]
        failed: set[str] = set()
        windows = hash(tuple(getattr(store.sequences[i], "key", i) for i in list(synth) + list(select)))
        for split, idx in tqdm((("synth", synth), ("select", select)), desc="library", disable=not progress,
                               leave=False):
            if stop():
                return {}
            for group in groups:  # each Python program alone: a failing one is dropped, not the whole library
                if group[0].hash in failed:
                    continue
                if (group[0].hash, windows) in _FAILED:  # failed in an earlier task of this process on these windows
                    failed.add(group[0].hash)
                    self.notes.append(f"library program {self.names.get(group[0].hash, group[0].hash[:12])} "
                                      f"dropped: {_FAILED[(group[0].hash, windows)]}")
                    continue
                if clock():
                    break
                try:
                    got = score_programs(store, heads, group, idx, self.cache)
                except ProgramError as e:
                    if not group[0].sandboxed:
                        raise
                    failed.add(group[0].hash)
                    if self.cache is not None:
                        _FAILED[(group[0].hash, windows)] = str(e)[:300]
                    self.notes.append(f"library program {self.names.get(group[0].hash, group[0].hash[:12])} "
                                      f"dropped: {str(e)[:300]}")
                    continue
                for k, p in enumerate(group):
                    cols.setdefault(p.hash, {})[split] = {m: v[:, k] for m, v in got.items()}
        programs = [p for p in self.programs if p.hash not in failed and len(cols.get(p.hash, ())) == 2]
        if clock():
            left = len(self.programs) - len(programs) - len(failed)
            self.notes.append(f"library search stopped at its time budget of {self.budget:g} s (in total across "
                              f"{len(heads)} heads): {len(programs)} of {len(self.programs)} programs scored, {left} "
                              "not tried; raise --library-budget or pass fewer programs")
        if not programs:
            return {}
        labels = {} if clock() else self._labels([p for p in programs if p.sandboxed],
                                                 [store.sequences[i] for i in synth[:PROBE_WINDOWS]])
        hyp = {p.hash: self.hypotheses.get(p.hash) or labels.get(p.hash) or self.names.get(p.hash, "").split(" (")[0]
               for p in programs}
        return {h: [ScoredProgram(p, SOURCE, {split: {m: float(v[r]) for m, v in got.items()}
                                              for split, got in cols[p.hash].items()}, hyp[p.hash])
                    for p in programs]
                for r, h in enumerate(heads)}

    def _labels(self, programs: list[Program], windows: list) -> dict[str, str]:
        """``probe_labels``, remembered per program and windows in this process when the run shares a cache."""
        if self.cache is None:
            return probe_labels(programs, windows)
        key = tuple(getattr(w, "key", id(w)) for w in windows)
        todo = [p for p in programs if (p.hash, key) not in _LABELS]
        for h, label in probe_labels(todo, windows).items():
            _LABELS[(h, key)] = label
        for p in todo:
            _LABELS.setdefault((p.hash, key), "")
        return {p.hash: _LABELS[(p.hash, key)] for p in programs if _LABELS.get((p.hash, key))}

    def report(self) -> str:
        """The library programs dropped because they failed, one line each."""
        return "\n".join(self.notes)


def _unique(programs: list[Program]) -> list[Program]:
    """The programs without repeats (by hash), in their first order."""
    seen: dict[str, Program] = {}
    for p in programs:
        seen.setdefault(p.hash, p)
    return list(seen.values())
