"""The enumerative searcher (see :mod:`.search`): primitives with parameter grids, composed per head on compact cells."""
from __future__ import annotations

from .config import EnumerativeConfig
from .fitset import FitSet
from .library import primitive_library, query_predicates
from .mixtures import GramStats, nnls_gram, round_weights
from .search import SOURCE, EnumerativeSearcher, SearchStats, enumerative_search
from .split import SplitArrays

__all__ = [
    "EnumerativeConfig", "EnumerativeSearcher", "enumerative_search", "primitive_library", "query_predicates",
    "SearchStats", "round_weights", "nnls_gram", "FitSet", "SplitArrays", "GramStats", "SOURCE",
]
