"""Program searchers behind one interface (:mod:`.base`) and a registry: enumerative, learned, the LLM agent and a
user-supplied program library are registered here (:mod:`.builtin`); others plug in with :func:`register_searcher`."""
from __future__ import annotations

from . import builtin as _builtin  # noqa: F401 - registers the built-in searchers
from .base import (
    CandidateMap, Head, PatternSource, Searcher, SearcherFactory, SearcherUnavailable, SearchSettings, StopCheck,
    make_searcher, register_searcher, run_searchers, searchers, unregister_searcher,
)

__all__ = [
    "CandidateMap", "Head", "PatternSource", "Searcher", "SearcherFactory", "SearcherUnavailable", "SearchSettings",
    "StopCheck", "make_searcher", "register_searcher", "run_searchers", "searchers", "unregister_searcher",
]
