"""What a Python program sees: the ``seq`` view and its ``seq.features`` namespace, built from plain dicts.

The parent turns each Sequence into a picklable dict (:func:`sequence_view`, with features computed
by :func:`features_for` only when the program reads them); the job process wraps it in
:class:`SequenceView`, whose arrays are read-only.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import pysafety


class FeatureNamespace:
    """``seq.features`` inside a program: precomputed views by attribute (``seq.features.word_index``)."""

    __slots__ = ("_values", "_missing")

    def __init__(self, values: dict[str, Any], missing: str | None = None) -> None:
        self._values = dict(values)
        self._missing = missing

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        missing = object.__getattribute__(self, "_missing")
        raise AttributeError(
            f"seq.features has no view {name!r}; available: {', '.join(sorted(values)) or 'none'}"
            + (f" ({missing})" if missing else "")
        )

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def keys(self) -> list[str]:
        """Names of the available views."""
        return sorted(self._values)

    def to_dict(self) -> dict[str, Any]:
        """All views as a plain dict (a shallow copy)."""
        return dict(self._values)

    def __repr__(self) -> str:
        return f"FeatureNamespace({', '.join(sorted(self._values))})"


class SequenceView:
    """``seq`` inside a program: ids (int64 [n]), tokens, text, offsets (int64 [n, 2]), n, features."""

    __slots__ = ("ids", "tokens", "text", "offsets", "n", "features")

    def __init__(self, view: Mapping[str, Any]) -> None:
        ids = np.array(view["ids"], dtype=np.int64).reshape(-1)
        offsets = np.array(view["offsets"], dtype=np.int64).reshape(-1, 2)
        ids.setflags(write=False)
        offsets.setflags(write=False)
        self.ids = ids
        self.tokens = list(view["tokens"])
        self.text = str(view["text"])
        self.offsets = offsets
        self.n = int(ids.shape[0])
        self.features = FeatureNamespace(view.get("features") or {}, view.get("features_missing"))

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"SequenceView(n={self.n})"


def sequence_view(seq: Any, features: Mapping[str, Any] | None = None, features_missing: str | None = None,
                  *, words: bool = False) -> dict:
    """The plain picklable view of a Sequence (or of a mapping with ids/tokens/text/offsets[/features]) sent to the sandbox.

    ``has_bos`` travels too (the tokenizer facade's special tokens); ``words``: add the rule-based word index
    (``words``, for the facade's ``word_ids()``; computed in the parent, cheap, no spaCy).
    """
    if isinstance(seq, Mapping):
        ids = np.asarray(seq["ids"], dtype=np.int64).reshape(-1)
        n = int(ids.shape[0])
        tokens = [str(t) for t in seq.get("tokens", [""] * n)]
        text = str(seq.get("text", ""))
        offsets = np.asarray(seq.get("offsets", np.zeros((n, 2), np.int64)), dtype=np.int64).reshape(-1, 2)
        feats = dict(features if features is not None else (seq.get("features") or {}))
        has_bos = bool(seq.get("has_bos", False))
        word_list = seq.get("words") if words else None
    else:
        ids = np.asarray(seq.ids, dtype=np.int64).reshape(-1)
        n = int(ids.shape[0])
        tokens = [str(t) for t in seq.tokens]
        text = str(seq.text)
        offsets = np.asarray(seq.offsets, dtype=np.int64).reshape(-1, 2)
        feats = dict(features or {})
        has_bos = bool(getattr(seq, "has_bos", False))
        word_list = seq.features.word_index.tolist() if words and hasattr(seq, "features") else None
    if len(tokens) != n or offsets.shape[0] != n:
        raise ValueError(
            f"sequence fields disagree: {n} ids, {len(tokens)} tokens, {offsets.shape[0]} offsets; "
            "build them from one tokenization"
        )
    out = {"ids": ids, "tokens": tokens, "text": text, "offsets": offsets, "n": n, "has_bos": has_bos,
           "features": feats, "features_missing": features_missing}
    if word_list is not None:
        out["words"] = [int(w) for w in word_list]
    return out


def features_for(sequences: list, info: pysafety.ProgramInfo) -> tuple[list[dict], list[str | None]]:
    """Feature dicts per sequence, computed in the parent only when the program reads ``seq.features``."""
    n = len(sequences)
    if not info.uses_features:
        return [{} for _ in range(n)], [None] * n
    from .. import features as _features  # here, not at the top: the sandbox worker never needs it

    spacy_views, wordnet_views = _features.SPACY_VIEWS, _features.WORDNET_VIEWS
    real = [s for s in sequences if not isinstance(s, Mapping) and hasattr(s, "features")]
    note: str | None = None
    if real and info.mentions(spacy_views):
        try:
            _features.compute_features(real, spacy=True)
        except Exception as e:  # noqa: BLE001 - a missing spaCy model becomes a note, not a crash
            note = f"spaCy views unavailable: {type(e).__name__}: {e}"
    if real and info.mentions(_features.NER_VIEWS):
        try:
            _features.compute_features(real, spacy=False, ner=True)
        except Exception as e:  # noqa: BLE001 - a missing NER model becomes a note, not a crash
            note = f"spaCy named entities unavailable: {type(e).__name__}: {e}"
    want_wordnet = [v for v in wordnet_views if info.mentions((v,))]
    out: list[dict] = []
    missing: list[str | None] = []
    for s in sequences:
        if isinstance(s, Mapping):
            out.append(dict(s.get("features") or {}))
            missing.append(None)
            continue
        why = note
        try:
            fv = s.features
            for v in want_wordnet:
                try:
                    getattr(fv, v)
                except Exception as e:  # noqa: BLE001 - missing WordNet data becomes a note, not a crash
                    why = f"WordNet views unavailable: {type(e).__name__}: {e}"
            out.append(dict(fv.to_dict()))
        except Exception as e:  # noqa: BLE001 - a view that fails becomes a note, not a crash
            out.append({})
            why = f"features could not be computed: {type(e).__name__}: {e}"
        missing.append(why)
    return out, missing


_PARSES: "OrderedDict[str, tuple]" = OrderedDict()  # text -> spacy_shim.doc_data, for this process (LRU)
_PARSES_LOCK = threading.Lock()
_MAX_PARSES = 8192


def spacy_documents(sequences: list) -> list[dict[str, tuple]]:
    """Per sequence, ``{its text: its full spaCy parse}`` as plain tuples (headsurgeon/synth/sandbox/spacy_shim.py), parsed here
    in the parent, once per text and process: what ``nlp(sentence)`` returns inside the sandbox."""
    from ..features.spacy_views import load_spacy_full  # here, not at the top: the sandbox worker never needs it
    from .spacy_shim import doc_data

    texts = [str(s.get("text", "")) if isinstance(s, Mapping) else str(s.text) for s in sequences]
    with _PARSES_LOCK:
        found = {t: _PARSES[t] for t in texts if t in _PARSES}
    todo = [t for t in dict.fromkeys(texts) if t not in found]
    if todo:
        nlp = load_spacy_full()
        for t, doc in zip(todo, nlp.pipe(todo, batch_size=64)):
            found[t] = doc_data(doc)
    with _PARSES_LOCK:
        for t in dict.fromkeys(texts):
            _PARSES[t] = found[t]
            _PARSES.move_to_end(t)
        while len(_PARSES) > _MAX_PARSES:
            _PARSES.popitem(last=False)
    return [{t: found[t]} for t in texts]


# ==================================================================================================
