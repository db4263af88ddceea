"""Linguistic feature views of a Sequence, aligned to the model's own tokens by character offsets.

Programs read these views (``seq.features.word_index``, ``.pos`` ...) and numba kernels read them as
padded arrays (:func:`batch_feature_arrays`). Aligning subword tokens to words, sentences and spaCy
tokens happens once here, never inside programs. One idea per module:

* ``words.py``: token geometry, rule-based words and sentences, and the alignment conventions;
* ``spacy_views.py``: loading spaCy, the POS tag list, aligning a parsed Doc to the tokens;
* ``wordnet.py``: WordNet noun/verb flags; ``errors.py``: the missing-resource error;
* ``view.py``: :class:`FeatureView`, the lazy cached views, and :func:`compute_features`;
* ``arrays.py``: :func:`batch_feature_arrays`, the kernels' padded arrays.
"""
from __future__ import annotations

from .arrays import FEATURE_NAMES, KERNEL_FEATURE_VIEWS, SPACY_FEATURES, WORDNET_FEATURES, batch_feature_arrays
from .errors import FeatureDependencyError
from .spacy_views import DEP_LABELS, POS_TAGS, SPACY_INSTALL_HINT, SPACY_MODELS, load_spacy, load_spacy_ner
from .view import BASIC_VIEWS, NER_VIEWS, SPACY_VIEWS, WORDNET_VIEWS, FeatureView, compute_features
from .wordnet import load_wordnet

__all__ = [
    "BASIC_VIEWS", "DEP_LABELS", "FEATURE_NAMES", "KERNEL_FEATURE_VIEWS", "NER_VIEWS", "POS_TAGS", "SPACY_FEATURES", "SPACY_INSTALL_HINT",
    "SPACY_MODELS", "SPACY_VIEWS", "WORDNET_FEATURES", "WORDNET_VIEWS", "FeatureDependencyError", "FeatureView",
    "batch_feature_arrays", "compute_features", "load_spacy", "load_spacy_ner", "load_wordnet",
]
