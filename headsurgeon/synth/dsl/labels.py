"""Dependency labels for ``dep=LABEL`` predicates: the feature arrays' label list, and words for glosses.

The ``dep`` feature array (headsurgeon/synth/features/arrays.py) holds indices into ``features.DEP_LABELS``; until that
list exists the DSL validates against spaCy's English label set below, in the same spelling.
"""
from __future__ import annotations

from typing import Any

__all__ = ["dep_labels", "dep_index", "POS_WORDS"]

# spaCy's English (ClearNLP-style) dependency labels, as en_core_web_sm spells them
_SPACY_DEP_LABELS: tuple[str, ...] = (
    "ROOT", "acl", "acomp", "advcl", "advmod", "agent", "amod", "appos", "attr", "aux", "auxpass", "case", "cc",
    "ccomp", "compound", "conj", "csubj", "csubjpass", "dative", "dep", "det", "dobj", "expl", "intj", "mark",
    "meta", "neg", "nmod", "npadvmod", "nsubj", "nsubjpass", "nummod", "oprd", "parataxis", "pcomp", "pobj",
    "poss", "preconj", "predet", "prep", "prt", "punct", "quantmod", "relcl", "xcomp",
)

# POS tags in words, for glosses ("the most recent noun")
POS_WORDS: dict[str, str] = {
    "ADJ": "adjective", "ADP": "preposition", "ADV": "adverb", "AUX": "auxiliary verb", "CCONJ": "conjunction",
    "DET": "determiner", "INTJ": "interjection", "NOUN": "noun", "NUM": "number", "PART": "particle",
    "PRON": "pronoun", "PROPN": "proper noun", "PUNCT": "punctuation mark", "SCONJ": "subordinating conjunction",
    "SYM": "symbol", "VERB": "verb", "X": "other word", "SPACE": "whitespace token",
}


def dep_labels() -> tuple[str, ...]:
    """The dependency labels whose indices the ``dep`` feature array holds (``features.DEP_LABELS`` when defined)."""
    from .. import features

    labels: Any = getattr(features, "DEP_LABELS", None)
    if labels is None:
        arrays = getattr(features, "arrays", None)
        labels = getattr(arrays, "DEP_LABELS", None)
    return tuple(labels) if labels is not None else _SPACY_DEP_LABELS


def dep_index(label: str) -> int:
    """The index of ``label`` in ``dep_labels()`` (a value no position holds when the list lacks it)."""
    labels = dep_labels()
    return labels.index(label) if label in labels else -(1 << 40)
