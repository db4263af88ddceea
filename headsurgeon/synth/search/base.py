"""The searcher interface: what every program searcher reads (a ``PatternSource``), what it returns (candidates
per head), how it is stopped (a time budget, a cancel event), and the registry ``explain`` runs searchers from.

A searcher is an object with a ``name`` and ``search(store, splits, *, heads, progress, budget, cancel) ->
{(layer, head): [ScoredProgram, ...]}``, ``splits`` the store's windows by split (headsurgeon/synth/splits.py). Registering a factory under a name
(:func:`register_searcher`) makes it available to :func:`run_searchers` and ``hs.explain`` without
editing the library; see docs/architecture.md for the recipe.
"""
from __future__ import annotations

import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ..sequence import Sequence as TokenSequence
from ..splits import StoreSplits, SplitsLike
from ...core import Head, HeadsurgeonError, InputError

if TYPE_CHECKING:  # programs load the DSL and numba; the CLI reads this module's configs to build its flags
    from ..scored import ScoredProgram

__all__ = [
    "CandidateMap", "PatternSource", "PatternReader", "ValueNormSource", "Searcher", "SearchSettings", "StopCheck", "SearcherUnavailable",
    "SearcherFactory", "register_searcher", "unregister_searcher", "searchers", "searcher_factory", "make_searcher",
    "run_searchers",
    "check_splits", "merge_candidates",
]

CandidateMap = dict[Head, list["ScoredProgram"]]


class PatternSource(Protocol):
    """What searchers read from a store (``headsurgeon.surgery.patterns.store.AttentionStore`` fits; synth does not import
    surgery): the sequences, the mask kind, the heads, and real patterns by store index.

    ``batch`` returns patterns [H, B, N, N] and lengths [B]; stores may also accept ``dtype=`` (float16 halves
    the memory of the learned searcher's reads).
    """

    sequences: list[TokenSequence]
    causal: bool

    @property
    def heads(self) -> Sequence[tuple[int, int]]:
        """The (layer, head) pairs the store holds."""

    def batch(self, indices: list[int] | None = None,
              heads: Sequence[tuple[int, int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Real patterns [H, B, N, N] of ``heads`` on sequences ``indices``, and the lengths [B]."""


class PatternReader(PatternSource, Protocol):
    """A ``PatternSource`` that also reads one head's pattern on one window, as report.html shows it
    (headsurgeon/report/); the attention store, its task view and a ``ProgramStore`` all do."""

    def pattern(self, index: int, layer: int, head: int) -> np.ndarray:
        """The pattern [n, n] of query head (``layer``, ``head``) on window ``index``."""


class ValueNormSource(PatternSource, Protocol):
    """A ``PatternSource`` that also holds each key's value norm per head (headsurgeon/surgery/patterns/value_norms.py),
    which the value-weighted scores read (headsurgeon/synth/select.py ``weighs``)."""

    @property
    def has_value_norms(self) -> bool:
        """Whether the norms were captured."""

    def norm_batch(self, indices: list[int], heads: Sequence[tuple[int, int]]) -> np.ndarray:
        """Value norms [H, B, N] of ``heads`` on sequences ``indices``, zero beyond each length."""


class StopCheck:
    """Whether a searcher should stop starting new work: ``cancel`` was set or ``budget`` seconds have passed."""

    def __init__(self, budget: float | None = None, cancel: threading.Event | None = None) -> None:
        if budget is not None and not budget >= 0:
            raise InputError(f"budget must be >= 0 seconds or None; got {budget}")
        self.deadline = None if budget is None else time.monotonic() + float(budget)
        self.cancel = cancel

    def __call__(self) -> bool:
        if self.cancel is not None and self.cancel.is_set():
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def active(self) -> bool:
        """True when there is anything to check (a budget or a cancel event)."""
        return self.deadline is not None or self.cancel is not None


@runtime_checkable
class Searcher(Protocol):
    """A program searcher: candidates per head, fitted on ``splits.synth`` and scored on ``splits.select``.

    Conventions every searcher keeps:

    * ``splits`` (a :class:`StoreSplits`) holds disjoint store indices; the searcher fits and ranks on synth,
      scores on select (``ScoredProgram.scores["synth"]`` / ``["select"]`` with ``"iou"`` and ``"jsd"``) and never
      reads any other sequence (``test`` stays unseen; ``splits.checked(who)`` gives synth and select, refusing
      empty or overlapping ones);
    * ``heads`` defaults to ``store.heads``; the result has a key per head it finished;
    * ``progress`` shows tqdm bars; ``budget`` (seconds of wall clock) and ``cancel`` (a ``threading.Event``)
      stop it from starting new heads, and it returns the heads finished so far;
    * ``report()`` returns one line for the run's notes ("" when there is nothing to say).
    """

    name: str

    def search(self, store: PatternSource, splits: StoreSplits, *, heads: Sequence[Head] | None = None,
               progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Candidates per head (see the class docstring for the conventions)."""

    def report(self) -> str:
        """One line for the run's notes, or ""."""


@dataclass
class SearchSettings:
    """What every searcher factory is given: the seed, progress bars, a folder it may write to, and options
    per searcher name (e.g. ``{"llm": AgentConfig(...), "library": ["prev(1)"], "enumerative": {"beam": 4}}``)."""

    seed: int = 0
    progress: bool = True
    out: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def option(self, name: str, default: Any = None) -> Any:
        """The options given for searcher ``name`` (``default`` when none)."""
        value = self.options.get(name)
        return default if value is None else value


class SearcherUnavailable(HeadsurgeonError, RuntimeError):
    """A factory cannot build its searcher here (e.g. no LLM endpoint); the run notes the message and goes on."""


SearcherFactory = Callable[[SearchSettings], Searcher]

_REGISTRY: dict[str, SearcherFactory] = {}


def register_searcher(name: str, factory: SearcherFactory, *, replace: bool = False) -> None:
    """Make ``factory(settings) -> Searcher`` available under ``name`` (``replace=True`` to overwrite one)."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"a searcher needs a non-empty name; got {name!r}")
    if not callable(factory):
        raise TypeError(f"the factory of searcher {name!r} is not callable: {factory!r}")
    if name in _REGISTRY and not replace:
        raise InputError(f"a searcher named {name!r} is already registered; pass replace=True to overwrite it")
    _REGISTRY[name] = factory


def unregister_searcher(name: str) -> None:
    """Remove a registered searcher (no error when absent)."""
    _REGISTRY.pop(name, None)


def searchers() -> tuple[str, ...]:
    """The registered searcher names, in registration order."""
    return tuple(_REGISTRY)


def searcher_factory(name: str) -> SearcherFactory:
    """The factory registered under ``name`` (headsurgeon/scaleout ships it to workers, whose registries may differ)."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise InputError(f"unknown searcher {name!r}; choose from {searchers()}")
    return factory


def make_searcher(name: str, settings: SearchSettings | None = None) -> Searcher:
    """Build the searcher registered under ``name``."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise InputError(f"unknown searcher {name!r}; choose from {searchers()}")
    return factory(settings or SearchSettings())


def check_splits(synth_idx: Sequence[int], select_idx: Sequence[int], who: str) -> tuple[list[int], list[int]]:
    """Both splits as int lists; an error when either is empty or they share sequences (``StoreSplits.checked``)."""
    return StoreSplits(synth_idx, select_idx).checked(who)


def _search(searcher: Any, store: PatternSource, splits: StoreSplits, **kw: Any) -> CandidateMap:
    """``searcher.search`` with ``splits`` whole; a searcher still written for separate ``synth_idx`` /
    ``select_idx`` keywords gets them, with a DeprecationWarning naming the change."""
    try:
        params = inspect.signature(searcher.search).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]  # no signature to read: call the current form
    if "synth_idx" in params and "splits" not in params:
        warnings.warn(f"searcher {getattr(searcher, 'name', searcher)!r} takes synth_idx/select_idx: its search() "
                      "should take the splits whole, search(store, splits, *, heads, progress, budget, cancel), "
                      "with splits.synth and splits.select (headsurgeon/synth/splits.py)", DeprecationWarning,
                      stacklevel=3)
        return searcher.search(store, synth_idx=list(splits.synth), select_idx=list(splits.select), **kw)
    return searcher.search(store, splits, **kw)


def merge_candidates(pool: CandidateMap, found: CandidateMap) -> None:
    """Append ``found``'s candidates to ``pool`` head by head (in place)."""
    for head, cands in found.items():
        pool.setdefault(head, []).extend(cands)


def run_searchers(store: PatternSource, names: Iterable[str], splits: SplitsLike, *,
                  settings: SearchSettings | None = None,
                  heads: Sequence[Head] | None = None, budget: float | None = None,
                  cancel: threading.Event | None = None, notes: list[str] | None = None,
                  timings: dict[str, float] | None = None,
                  factories: Mapping[str, SearcherFactory] | None = None) -> CandidateMap:
    """Run the named searchers one after another on ``splits`` (a :class:`StoreSplits`, a corpus ``Splits`` or a
    mapping of split name → store indices) and pool their candidates per head (in the order run).

    An unavailable searcher (:class:`SearcherUnavailable`) adds its message to ``notes`` and is skipped;
    each searcher's ``report()`` line goes to ``notes`` and its wall-clock seconds to ``timings``. ``budget``
    is shared: each searcher gets what the ones before it left. ``factories``: name → factory to use instead
    of this process's registry (a Ray worker gets the driver's, headsurgeon/scaleout/task.py).
    """
    settings = settings or SearchSettings()
    splits = StoreSplits.of(splits)
    stop = StopCheck(budget, cancel)
    pool: CandidateMap = {}
    names = list(names)
    found = {name: _REGISTRY.get(name) for name in names} | dict(factories or {})
    missing = [name for name in names if found[name] is None]
    if missing:
        raise InputError(f"unknown searcher {missing[0]!r}; choose from {searchers()}")
    chosen: dict[str, SearcherFactory] = {name: f for name, f in found.items() if f is not None}
    for name in names:
        t0 = time.perf_counter()
        try:
            searcher = chosen[name](settings)
        except SearcherUnavailable as e:
            if notes is not None:
                notes.append(str(e))
            continue
        left = None if stop.deadline is None else max(0.0, stop.deadline - time.monotonic())
        merge_candidates(pool, _search(searcher, store, splits, heads=heads, progress=settings.progress, budget=left,
                                       cancel=cancel))
        line = searcher.report() if hasattr(searcher, "report") else ""
        if line and notes is not None:
            notes.append(line)
        if timings is not None:
            timings[name] = time.perf_counter() - t0
    return pool
