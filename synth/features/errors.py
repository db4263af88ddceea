"""The one error the feature views raise: an optional linguistic resource (spaCy model, WordNet) is missing."""
from __future__ import annotations

__all__ = ["FeatureDependencyError"]


class FeatureDependencyError(RuntimeError):
    """An optional linguistic resource (spaCy model, NLTK corpus) is missing; the message says how to install it."""
