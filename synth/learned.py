"""The learned searcher, at its historical import path; the code lives in ``headsurgeon.synth.search.learned``."""
from __future__ import annotations

from .search.learned import (
    DEFAULT_FEATURES, OPTIONAL_FEATURES, SELECTS, SOURCE, FeatureSpace, LearnedConfig, LearnedHead, LearnedSearcher,
    MatchTerm, feature_arrays, fit_head, key_order, learned_search, positional_specs, select_rows, visible,
)

__all__ = [
    "DEFAULT_FEATURES", "OPTIONAL_FEATURES", "SELECTS", "LearnedConfig", "FeatureSpace", "MatchTerm", "LearnedHead",
    "fit_head", "learned_search", "LearnedSearcher", "feature_arrays", "positional_specs", "visible", "key_order",
    "select_rows", "SOURCE",
]
