"""The enumerative searcher (see :mod:`.search`): primitives with parameter grids, composed per head on compact cells."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ....core.lazy import lazy_package

if TYPE_CHECKING:  # the package's names, loaded on first use (headsurgeon/core/lazy.py)
    from .config import EnumerativeConfig
    from .fitset import FitSet
    from .library import primitive_library, query_predicates
    from .mixtures import GramStats, nnls_gram, round_weights
    from .search import SOURCE, EnumerativeSearcher, SearchStats, enumerative_search
    from .split import SplitArrays

__all__, __getattr__, __dir__ = lazy_package(__file__, __name__)
