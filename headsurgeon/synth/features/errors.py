"""The one error the feature views raise: an optional linguistic resource (spaCy model, WordNet) is missing."""
from __future__ import annotations
from ...core import HeadsurgeonError

__all__ = ["FeatureDependencyError"]


class FeatureDependencyError(HeadsurgeonError, RuntimeError):
    """An optional linguistic resource (spaCy model, NLTK corpus) is missing; the message says how to install it."""
