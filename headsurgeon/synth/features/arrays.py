"""Padded feature arrays for the numba kernels: many sequences' views as int64 ``[B, N]`` arrays by kernel name.

Kernel programs name features briefly (``"word"``, ``"pos"`` ...); :data:`KERNEL_FEATURE_VIEWS` maps each name
to the FeatureView attribute it reads, and spaCy runs only when a spaCy feature is requested. ``dep`` indexes
:data:`DEP_LABELS`, ``lemma`` is a per-sequence lemma id (equal ids = same lemma), ``quote`` flags tokens in
"..."/“...” spans (rule-based, no spaCy).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .view import compute_features
from ...core import InputError

__all__ = ["FEATURE_NAMES", "KERNEL_FEATURE_VIEWS", "SPACY_FEATURES", "WORDNET_FEATURES", "batch_feature_arrays"]

# Names accepted by batch_feature_arrays, mapped to the FeatureView attribute each one reads.
KERNEL_FEATURE_VIEWS: dict[str, str] = {
    "word": "word_index",
    "word_start": "is_word_start",
    "sent": "sentence_index",
    "sent_end": "is_sentence_end",
    "punct": "is_punct",
    "cap": "is_capitalized",
    "newline": "is_newline",
    "pos": "pos_index",
    "dep_head": "dep_head",
    "dep": "dep_index",
    "lemma": "lemma_id",
    "quote": "is_quoted",
    "spacy_sent": "spacy_sentence_index",
    "noun_wn": "is_noun_wordnet",
    "verb_wn": "is_verb_wordnet",
}
# Kernel feature names that need no optional corpus (spaCy ones need the spaCy model).
FEATURE_NAMES: tuple[str, ...] = (
    "word", "word_start", "sent", "sent_end", "punct", "cap", "newline", "pos", "dep_head", "spacy_sent",
    "dep", "lemma", "quote",
)
SPACY_FEATURES: frozenset[str] = frozenset({"pos", "dep_head", "spacy_sent", "dep", "lemma"})
# Extra names batch_feature_arrays accepts when NLTK's WordNet corpus is installed.
WORDNET_FEATURES: frozenset[str] = frozenset({"noun_wn", "verb_wn"})


def batch_feature_arrays(sequences: list[Any], names: Iterable[str]) -> dict[str, np.ndarray]:
    """Padded int64 ``[B, N]`` feature arrays for the numba kernels (pad -1; flags are 0/1).

    ``names`` from :data:`FEATURE_NAMES` (plus :data:`WORDNET_FEATURES`); spaCy runs only when a name
    in :data:`SPACY_FEATURES` is requested.
    """
    names = list(names)
    bad = [k for k in names if k not in KERNEL_FEATURE_VIEWS]
    if bad:
        raise InputError(f"unknown feature name(s) {bad}; valid: {sorted(KERNEL_FEATURE_VIEWS)}")
    seqs = list(sequences)
    compute_features(seqs, spacy=any(k in SPACY_FEATURES for k in names))
    width = max((s.n for s in seqs), default=0)
    out: dict[str, np.ndarray] = {}
    for k in names:
        arr = np.full((len(seqs), width), -1, dtype=np.int64)
        attr = KERNEL_FEATURE_VIEWS[k]
        for b, s in enumerate(seqs):
            arr[b, : s.n] = getattr(s.features, attr)
        out[k] = arr
    return out
