"""FeatureView: the lazy, cached per-token linguistic views a program reads as ``seq.features``.

Cheap views come from headsurgeon/synth/features/words.py, spaCy views from spacy_views.py (one ``nlp.pipe`` run over
many sequences, see :func:`compute_features`), WordNet flags from wordnet.py; each is computed once per
sequence. The ``*_VIEWS`` tuples name them for the sandbox's attribute allowlist and the LLM prompt.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .spacy_views import align_doc, align_ents, parse_texts
from .wordnet import wordnet_flags
from .words import Layout, build_layout, is_punct_text, quote_mask, renumber, rule_sentences, sentence_of

__all__ = ["BASIC_VIEWS", "NER_VIEWS", "SPACY_VIEWS", "WORDNET_VIEWS", "FeatureView", "compute_features"]

BASIC_VIEWS: tuple[str, ...] = (
    "word_index", "is_word_start", "sentence_index", "is_sentence_end",
    "is_punct", "is_capitalized", "is_newline", "is_special", "is_quoted",
)
SPACY_VIEWS: tuple[str, ...] = (
    "pos", "tag", "lemma", "dep", "dep_head", "pos_index", "spacy_index", "spacy_sentence_index",
    "dep_index", "lemma_id", "is_stop", "children", "ancestors",
)
WORDNET_VIEWS: tuple[str, ...] = ("is_noun_wordnet", "is_verb_wordnet")
# spaCy's named entities come from a second, NER-only pipeline, run only when a program asks for them.
NER_VIEWS: tuple[str, ...] = ("ent_type",)


class FeatureView:
    """Lazy per-token linguistic views of one Sequence; each view is computed once and cached.

    Cheap views (no spaCy): ``word_index``, ``is_word_start``, ``sentence_index``, ``is_sentence_end``,
    ``is_punct``, ``is_capitalized``, ``is_newline``, ``is_special``, ``is_quoted``. spaCy views: ``pos``,
    ``tag``, ``lemma``, ``dep`` (lists of str), ``dep_head``, ``pos_index``, ``spacy_index``,
    ``spacy_sentence_index``, ``dep_index``, ``lemma_id`` (int64), ``is_stop`` (bool), ``children``,
    ``ancestors`` (lists of lists of token indices); NER: ``ent_type`` (list of str).
    NLTK views: ``is_noun_wordnet``, ``is_verb_wordnet``.
    """

    def __init__(self, seq: Any) -> None:
        self._seq = seq
        self._views: dict[str, Any] = {}
        self._layout: Layout | None = None

    # ---- plumbing ---------------------------------------------------------------------------
    def _get_layout(self) -> Layout:
        if self._layout is None:
            self._layout = build_layout(self._seq)
        return self._layout

    def _basic(self, name: str) -> Any:
        if name not in self._views:
            self._compute_basic()
        return self._views[name]

    def _spacy(self, name: str) -> Any:
        if name not in self._views:
            _run_spacy([self])
        return self._views[name]

    def _ner(self, name: str) -> Any:
        if name not in self._views:
            _run_ner([self])
        return self._views[name]

    def _wordnet(self, name: str) -> Any:
        if name not in self._views:
            self._compute_wordnet()
        return self._views[name]

    @property
    def has_spacy(self) -> bool:
        """Whether the spaCy views have been computed for this sequence."""
        return "pos" in self._views

    def spacy_text(self) -> str:
        """The part of ``text`` the tokens cover, which is what spaCy is run on."""
        lay = self._get_layout()
        return self._seq.text[lay.lo : lay.hi]

    # ---- cheap views ------------------------------------------------------------------------
    def _compute_basic(self) -> None:
        seq, lay = self._seq, self._get_layout()
        text, n = seq.text, seq.n
        special = lay.special
        word = renumber([-1 if sp else w for sp, w in zip(special, lay.word_raw)])
        word_start = np.zeros(n, dtype=bool)
        prev = -1
        for i, w in enumerate(word.tolist()):
            if w >= 0:
                word_start[i] = w != prev
                prev = w
        cuts, ends = rule_sentences(text, lay.lo, lay.hi)
        sent = sentence_of(lay, cuts)
        sent_end = np.zeros(n, dtype=bool)
        for c in ends:
            if lay.lo <= c < lay.hi and lay.holder[c - lay.lo] >= 0:
                sent_end[lay.holder[c - lay.lo]] = True
        punct = np.zeros(n, dtype=bool)
        quoted = np.zeros(n, dtype=bool)
        qmask = quote_mask(text, lay.lo, lay.hi)
        newline = np.zeros(n, dtype=bool)
        cap = np.zeros(n, dtype=bool)
        for i in range(n):
            if special[i]:
                continue
            s, e = lay.eff[i]
            piece = text[s:e]
            punct[i] = is_punct_text(piece)
            a, b = lay.core[i]
            quoted[i] = bool(qmask[max(a - lay.lo, 0) : max(b - lay.lo, 0)].any())
            newline[i] = "\n" in piece or "\r" in piece
            if word_start[i]:
                ws = lay.word_span[i][0]
                cap[i] = ws < len(text) and text[ws].isupper()
        self._views.update(
            word_index=word, is_word_start=word_start, sentence_index=sent, is_sentence_end=sent_end,
            is_punct=punct, is_capitalized=cap, is_newline=newline, is_special=np.array(special, dtype=bool), is_quoted=quoted,
        )

    @property
    def word_index(self) -> np.ndarray:
        """int64 [n]: word of each token (subwords of one word share it), from 0; -1 for special tokens."""
        return self._basic("word_index")

    @property
    def is_word_start(self) -> np.ndarray:
        """bool [n]: the token is the first token of its word in this sequence."""
        return self._basic("is_word_start")

    @property
    def sentence_index(self) -> np.ndarray:
        """int64 [n]: rule-based sentence of each token (see module docstring), from 0; -1 for special tokens."""
        return self._basic("sentence_index")

    @property
    def is_sentence_end(self) -> np.ndarray:
        """bool [n]: the token holds the last visible character of a (rule-based) sentence."""
        return self._basic("is_sentence_end")

    @property
    def is_punct(self) -> np.ndarray:
        """bool [n]: every visible character of the token is punctuation or a symbol (Unicode P*/S*)."""
        return self._basic("is_punct")

    @property
    def is_capitalized(self) -> np.ndarray:
        """bool [n]: the token starts a word whose first character is uppercase."""
        return self._basic("is_capitalized")

    @property
    def is_newline(self) -> np.ndarray:
        """bool [n]: the token's characters include a line break."""
        return self._basic("is_newline")

    @property
    def is_special(self) -> np.ndarray:
        """bool [n]: BOS/EOS-like token without text (offsets convention of Sequence)."""
        return self._basic("is_special")

    @property
    def is_quoted(self) -> np.ndarray:
        """bool [n]: a visible character of the token lies in a quoted span, marks included (words.quote_mask)."""
        return self._basic("is_quoted")

    # ---- spaCy views ------------------------------------------------------------------------
    def _set_spacy(self, doc: Any) -> None:
        """Align a spaCy Doc parsed from :meth:`spacy_text` to the model's tokens."""
        self._views.update(align_doc(doc, self._get_layout(), self._seq.n))

    @property
    def pos(self) -> list[str]:
        """Coarse UPOS tag (spaCy ``pos_``) of the spaCy token each model token belongs to; "" if none."""
        return self._spacy("pos")

    @property
    def tag(self) -> list[str]:
        """Fine-grained tag (spaCy ``tag_``, Penn Treebank) per token; "" if none."""
        return self._spacy("tag")

    @property
    def lemma(self) -> list[str]:
        """Lemma (spaCy ``lemma_``) per token; "" if none."""
        return self._spacy("lemma")

    @property
    def dep(self) -> list[str]:
        """Dependency label (spaCy ``dep_``, "ROOT" for the root) per token; "" if none."""
        return self._spacy("dep")

    @property
    def dep_head(self) -> np.ndarray:
        """int64 [n]: model token holding the first character of the dependency head; -1 root/none.

        "Holding" means the first token whose (non-empty) offsets contain that character; a token may
        point to itself when it spans both the dependent and its head.
        """
        return self._spacy("dep_head")

    @property
    def pos_index(self) -> np.ndarray:
        """int64 [n]: index of ``pos`` in :data:`POS_TAGS`; -1 for special/unaligned tokens."""
        return self._spacy("pos_index")

    @property
    def spacy_index(self) -> np.ndarray:
        """int64 [n]: index of the aligned token in the spaCy Doc of :meth:`spacy_text`; -1 none."""
        return self._spacy("spacy_index")

    @property
    def spacy_sentence_index(self) -> np.ndarray:
        """int64 [n]: sentence by spaCy's parser-based segmentation, from 0; -1 for special tokens."""
        return self._spacy("spacy_sentence_index")

    @property
    def dep_index(self) -> np.ndarray:
        """int64 [n]: index of ``dep`` in :data:`DEP_LABELS`; -1 for special/unaligned tokens or unknown labels."""
        return self._spacy("dep_index")

    @property
    def lemma_id(self) -> np.ndarray:
        """int64 [n]: one id per distinct lower-cased lemma in this sequence (from 0, in order of first
        appearance); tokens aligned to one spaCy token share it; -1 none."""
        return self._spacy("lemma_id")

    @property
    def is_stop(self) -> np.ndarray:
        """bool [n]: spaCy's ``is_stop`` of the aligned spaCy token (False for special/unaligned tokens)."""
        return self._spacy("is_stop")

    @property
    def children(self) -> list[list[int]]:
        """Per token, the other tokens whose ``dep_head`` is it (ascending)."""
        return self._spacy("children")

    @property
    def ancestors(self) -> list[list[int]]:
        """Per token, the chain ``dep_head``, its ``dep_head``, ... up to the root (nearest first, no repeats)."""
        return self._spacy("ancestors")

    @property
    def ent_type(self) -> list[str]:
        """spaCy named-entity type (``ent_type_``: PERSON, GPE, DATE ...) of the aligned spaCy token; "" none.

        Computed by a separate NER-only pipeline (spacy_views.load_spacy_ner), only when read.
        """
        return self._ner("ent_type")

    # ---- NLTK WordNet views -----------------------------------------------------------------
    def _compute_wordnet(self) -> None:
        self._views.update(wordnet_flags(self._seq.text, self._get_layout(), self._seq.n))

    @property
    def is_noun_wordnet(self) -> np.ndarray:
        """bool [n]: the token's word (lower-cased, via WordNet's morphy) has a noun synset."""
        return self._wordnet("is_noun_wordnet")

    @property
    def is_verb_wordnet(self) -> np.ndarray:
        """bool [n]: the token's word (lower-cased, via WordNet's morphy) has a verb synset."""
        return self._wordnet("is_verb_wordnet")

    # ---- export -----------------------------------------------------------------------------
    def to_dict(self, spacy: bool | None = None) -> dict[str, np.ndarray | list]:
        """All views as plain picklable values (copies): cheap ones always; spaCy ones if ``spacy``
        is True (computed now), or, for None, if already computed; WordNet and NER ones if already computed."""
        self._basic("word_index")
        if spacy:
            self._spacy("pos")
        names = list(BASIC_VIEWS)
        if spacy is None and self.has_spacy or spacy:
            names += SPACY_VIEWS
        names += [v for v in WORDNET_VIEWS + NER_VIEWS if v in self._views]
        out: dict[str, np.ndarray | list] = {}
        for k in names:
            v = self._views[k]
            out[k] = v.copy() if isinstance(v, np.ndarray) else list(v)
        return out

    def __repr__(self) -> str:
        return f"FeatureView(n={self._seq.n}, computed={sorted(self._views)})"


def compute_features(
    sequences: Iterable[Any],
    spacy: bool = True,
    *,
    ner: bool = False,
    batch_size: int = 64,
    progress: bool | None = None,
) -> None:
    """Fill the views of many sequences at once; spaCy runs once per distinct covered text via ``nlp.pipe``.

    ``ner``: also the named-entity view (a second, NER-only spaCy pipeline).
    ``progress``: show a tqdm bar (None: only when more than 200 texts go through spaCy).
    """
    views = [s.features for s in sequences]
    for fv in views:
        fv._basic("word_index")
    if spacy:
        _run_spacy(views, batch_size=batch_size, progress=progress)
    if ner:
        _run_ner(views, batch_size=batch_size, progress=progress)


def _run_spacy(views: list[FeatureView], batch_size: int = 64, progress: bool | None = None) -> None:
    """Parse each distinct covered text once with ``nlp.pipe`` and align the Docs to the views lacking spaCy."""
    todo: dict[str, list[FeatureView]] = {}
    for fv in views:
        if not fv.has_spacy:
            todo.setdefault(fv.spacy_text(), []).append(fv)
    if not todo:
        return
    texts = list(todo)
    for text, doc in zip(texts, parse_texts(texts, batch_size=batch_size, progress=progress)):
        for fv in todo[text]:
            fv._set_spacy(doc)


def _run_ner(views: list[FeatureView], batch_size: int = 64, progress: bool | None = None) -> None:
    """Parse each distinct covered text once with the NER-only pipeline and align the entities."""
    todo: dict[str, list[FeatureView]] = {}
    for fv in views:
        if "ent_type" not in fv._views:
            todo.setdefault(fv.spacy_text(), []).append(fv)
    if not todo:
        return
    texts = list(todo)
    for text, doc in zip(texts, parse_texts(texts, batch_size=batch_size, progress=progress, ner=True)):
        for fv in todo[text]:
            fv._views.update(align_ents(doc, fv._get_layout(), fv._seq.n))
