"""The ``spacy`` module programs import in the sandbox: parses made by the trusted side, read-only, behind spaCy's API.

EAPS's program files (headsurgeon/synth/eaps.py) call ``spacy.load("en_core_web_sm")`` and then ``nlp(sentence)``; the
sandbox cannot load spaCy (no files, no model), so the parent parses each window's text with the real pipeline
(:func:`doc_data`, run in the parent by headsurgeon/synth/sandbox/views.py) and sends plain tuples; a job process installs
them per window (:func:`set_documents`) and ``nlp(text)`` returns a :class:`Doc` over them. Exactly what the
EAPS files use is offered (``grep`` of the four files, benchmarks/RESULTS.md): Doc iteration, indexing,
slicing, ``len``, ``.text``, ``.ents``, ``.sents``; Token ``.text .i .idx .pos_ .tag_ .dep_ .lemma_ .ent_type_
.head .children .lefts .rights .ancestors .sent .is_sent_start .is_sent_end .sent_start .is_stop .is_punct
.is_space .is_title .whitespace_``; Span ``.start .end .text .label_``, iteration, ``len``. Anything else is
an AttributeError naming what is offered. This module imports nothing: it runs inside the job process.
"""
from __future__ import annotations

from typing import Any, Iterator

MODELS = ("en_core_web_sm",)  # the pipeline the parent parses with (headsurgeon/synth/features/spacy_views.py SPACY_MODELS)
TOKEN_FIELDS = ("text", "idx", "whitespace_", "pos_", "tag_", "dep_", "head_i", "lemma_", "ent_type_", "is_stop",
                "is_punct", "is_space", "is_title", "is_sent_start", "is_sent_end")
_F = {name: k for k, name in enumerate(TOKEN_FIELDS)}
_DOCS: dict[str, tuple] = {}  # the current window's parses: text -> (tokens, ents, sents)


def set_documents(docs: dict[str, tuple]) -> None:
    """Install the parses of the window about to run (called by the job process, never reachable by programs)."""
    _DOCS.clear()
    _DOCS.update(docs)


def doc_data(doc: Any) -> tuple:
    """A real spaCy Doc as plain tuples: (per token TOKEN_FIELDS, ents (start, end, label), sents (start, end))."""
    toks = tuple((t.text, t.idx, t.whitespace_, t.pos_, t.tag_, t.dep_, t.head.i, t.lemma_, t.ent_type_,
                  bool(t.is_stop), bool(t.is_punct), bool(t.is_space), bool(t.is_title), bool(t.is_sent_start),
                  bool(t.is_sent_end)) for t in doc)
    ents = tuple((e.start, e.end, e.label_) for e in doc.ents)
    sents = tuple((s.start, s.end) for s in doc.sents)
    return toks, ents, sents


def _offered(kind: str, names: tuple[str, ...], name: str) -> AttributeError:
    return AttributeError(f"the sandbox's spaCy {kind} has no attribute {name!r}: parses are computed outside the "
                          f"sandbox and offer only {', '.join(names)}")


class Token:
    """One token of a :class:`Doc` (read-only)."""

    __slots__ = ("_doc", "i")
    OFFERED = ("text", "i", "idx", "pos_", "tag_", "dep_", "lemma_", "ent_type_", "head", "children", "lefts",
               "rights", "ancestors", "sent", "is_sent_start", "is_sent_end", "sent_start", "is_stop", "is_punct",
               "is_space", "is_title", "whitespace_")

    def __init__(self, doc: "Doc", i: int) -> None:
        self._doc, self.i = doc, i

    def _f(self, name: str) -> Any:
        return self._doc._toks[self.i][_F[name]]

    text = property(lambda self: self._f("text"))
    idx = property(lambda self: self._f("idx"))
    whitespace_ = property(lambda self: self._f("whitespace_"))
    pos_ = property(lambda self: self._f("pos_"))
    tag_ = property(lambda self: self._f("tag_"))
    dep_ = property(lambda self: self._f("dep_"))
    lemma_ = property(lambda self: self._f("lemma_"))
    ent_type_ = property(lambda self: self._f("ent_type_"))
    is_stop = property(lambda self: self._f("is_stop"))
    is_punct = property(lambda self: self._f("is_punct"))
    is_space = property(lambda self: self._f("is_space"))
    is_title = property(lambda self: self._f("is_title"))
    is_sent_start = property(lambda self: self._f("is_sent_start"))
    is_sent_end = property(lambda self: self._f("is_sent_end"))

    @property
    def sent_start(self) -> Any:
        """spaCy's deprecated form: False for the first token, else 1 (a sentence start) or -1 (truthy too)."""
        return False if self.i == 0 else (1 if self.is_sent_start else -1)

    @property
    def head(self) -> "Token":
        return Token(self._doc, self._f("head_i"))

    @property
    def children(self) -> Iterator["Token"]:
        return (Token(self._doc, k) for k, t in enumerate(self._doc._toks) if t[_F["head_i"]] == self.i and k != self.i)

    @property
    def lefts(self) -> Iterator["Token"]:
        return (t for t in self.children if t.i < self.i)

    @property
    def rights(self) -> Iterator["Token"]:
        return (t for t in self.children if t.i > self.i)

    @property
    def ancestors(self) -> Iterator["Token"]:
        def walk() -> Iterator[Token]:
            k, seen = self.i, {self.i}
            while True:
                h = self._doc._toks[k][_F["head_i"]]
                if h in seen:
                    return
                seen.add(h)
                yield Token(self._doc, h)
                k = h
        return walk()

    @property
    def sent(self) -> "Span":
        for a, b in self._doc._sents:
            if a <= self.i < b:
                return Span(self._doc, a, b)
        return Span(self._doc, 0, len(self._doc))

    def __getattr__(self, name: str) -> Any:
        raise _offered("Token", Token.OFFERED, name)

    def __len__(self) -> int:
        return len(self.text)

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Token) and other._doc is self._doc and other.i == self.i

    def __hash__(self) -> int:
        return hash((id(self._doc), self.i))


class Span:
    """A slice of a :class:`Doc`: a sentence, an entity or ``doc[a:b]``."""

    __slots__ = ("_doc", "start", "end", "label_")
    OFFERED = ("start", "end", "text", "label_", "iteration", "len", "indexing")

    def __init__(self, doc: "Doc", start: int, end: int, label: str = "") -> None:
        self._doc, self.start, self.end, self.label_ = doc, start, end, label

    @property
    def text(self) -> str:
        toks = self._doc._toks[self.start:self.end]
        return "".join(t[0] + t[2] for t in toks[:-1]) + (toks[-1][0] if toks else "")

    def __getattr__(self, name: str) -> Any:
        raise _offered("Span", Span.OFFERED, name)

    def __iter__(self) -> Iterator[Token]:
        return (Token(self._doc, k) for k in range(self.start, self.end))

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, k: int) -> Token:
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"span index {k} out of range for a span of {n} tokens")
        return Token(self._doc, self.start + (k % n))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Span) and other._doc is self._doc and (other.start, other.end, other.label_)
                == (self.start, self.end, self.label_))

    def __hash__(self) -> int:
        return hash((id(self._doc), self.start, self.end, self.label_))

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


class Doc:
    """A parsed text: the tokens, entities and sentences the parent's spaCy found (read-only)."""

    __slots__ = ("_toks", "_ents", "_sents", "text")
    OFFERED = ("text", "ents", "sents", "iteration", "len", "indexing", "slicing")

    def __init__(self, text: str, data: tuple) -> None:
        self.text = text
        self._toks, self._ents, self._sents = data

    @property
    def ents(self) -> tuple[Span, ...]:
        return tuple(Span(self, a, b, label) for a, b, label in self._ents)

    @property
    def sents(self) -> Iterator[Span]:
        return (Span(self, a, b) for a, b in self._sents)

    def __getattr__(self, name: str) -> Any:
        raise _offered("Doc", Doc.OFFERED, name)

    def __iter__(self) -> Iterator[Token]:
        return (Token(self, k) for k in range(len(self._toks)))

    def __len__(self) -> int:
        return len(self._toks)

    def __getitem__(self, k: Any) -> Any:
        n = len(self._toks)
        if isinstance(k, slice):
            a, b, step = k.indices(n)
            if step != 1:
                raise ValueError("spaCy Doc slices take no step")
            return Span(self, a, max(a, b))
        if not -n <= k < n:
            raise IndexError(f"token index {k} out of range for a Doc of {n} tokens")
        return Token(self, k % n)

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


class Language:
    """What ``spacy.load(...)`` returns: ``nlp(text)`` is the parent's parse of ``text``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, text: str) -> Doc:
        if not isinstance(text, str):
            raise TypeError(f"nlp() takes a str, got {type(text).__name__}")
        data = _DOCS.get(text)
        if data is None:
            raise ValueError(
                f"spaCy parses in the sandbox are computed outside it, for the window's text only (the `sentence` "
                f"argument); this program asked for a parse of another text ({text[:60]!r}): parse `sentence` and "
                "map its tokens instead")
        return Doc(text, data)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the sandbox's spaCy pipeline offers only nlp(text); it has no {name!r}")


def load(name: str = "en_core_web_sm", **_ignored: Any) -> Language:
    """``spacy.load``: the English pipeline the parent parses with (another model name is a ValueError)."""
    if name not in MODELS:
        raise ValueError(f"spacy.load({name!r}): the sandbox has parses from {', '.join(MODELS)} only; load that one")
    return Language(name)
