"""The enumerative searcher, at its historical import path; the code lives in ``headsurgeon.synth.search.enumerative``."""
from __future__ import annotations

from .search.base import PatternSource as AttentionStoreLike
from .search.enumerative import (
    SOURCE, EnumerativeSearcher, FitSet, SearchStats, Split, enumerative_search, nnls_gram, primitive_library,
    query_predicates, round_weights,
)

__all__ = [
    "enumerative_search", "EnumerativeSearcher", "primitive_library", "query_predicates", "SearchStats",
    "round_weights", "nnls_gram", "FitSet", "Split", "AttentionStoreLike", "SOURCE",
]
