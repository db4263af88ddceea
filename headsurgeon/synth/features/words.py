"""Words and sentences of a Sequence, aligned to the model's own tokens by character offsets (no spaCy needed).

The geometry here (:class:`Layout`, :func:`align_spans`) is shared by every view in this package, so that
subword tokens are aligned to words, sentences and spaCy tokens once, never inside programs.

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
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Layout", "align_spans", "build_layout", "is_punct_text", "quote_mask", "renumber", "rule_sentences", "sentence_of",
]

_WORD_RE = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:['’]\w+)*|([^\w\s])\1*|[\r\n]+")
_TERMINAL_RE = re.compile(r"[.!?]+[\"'”’»)\]]*")
_NEWLINE_RE = re.compile(r"[\r\n]+")
_QUOTE_RE = re.compile(r'["“”]')
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "mt", "vs", "e.g", "i.e"})


@dataclass
class Layout:
    """Per-token character geometry shared by all views of one sequence."""

    special: list[bool]  # [n]
    eff: list[tuple[int, int]]  # offsets with zero-width tokens widened to their character
    core: list[tuple[int, int]]  # span used for overlap alignment (see module docstring)
    word_span: list[tuple[int, int]]  # char span of the token's word
    word_raw: list[int]  # word id before renumbering (-1 special)
    lo: int  # covered region of text: [lo, hi)
    hi: int
    holder: np.ndarray  # int64 [hi-lo]: first token holding each character of the region, -1 none


def align_spans(core: list[tuple[int, int]], special: list[bool], targets: list[tuple[int, int]]) -> list[int]:
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


def renumber(raw: list[int]) -> np.ndarray:
    """Relabel non-negative ids 0, 1, ... in order of first appearance; -1 stays -1 (int64 array)."""
    seen: dict[int, int] = {}
    return np.array([seen.setdefault(r, len(seen)) if r >= 0 else -1 for r in raw], dtype=np.int64)


#: a zero-width token spelled like a special-token marker ([CLS], [SEP], [PAD], <s>, </s>, <|endoftext|>) is special;
#: byte-fallback pieces (<0xE6>) are text, not markers
_MARKER = re.compile(r"^(\[[A-Z]+\]|<\|?/?[a-z][a-z_]*\|?>)$")


def _is_blank(s: str) -> bool:
    """Whitespace without a line break (a ▁/Ġ-only token), or empty."""
    return (s == "" or s.isspace()) and "\n" not in s and "\r" not in s


def build_layout(seq: Any) -> Layout:
    """Compute special flags, effective/core spans, word spans and the char→token holder map."""
    text: str = seq.text
    length = len(text)
    n = seq.n
    off = [(min(max(s, 0), length), min(max(e, s, 0), length)) for s, e in np.asarray(seq.offsets).tolist()]
    special = [False] * n
    seen_text = False
    tokens = list(getattr(seq, "tokens", None) or [""] * n)
    for i, (s, e) in enumerate(off):
        marker = s == e and bool(_MARKER.match(str(tokens[i]) if i < len(tokens) else ""))  # [CLS], [SEP], </s>
        if (i == 0 and seq.has_bos) or (s == 0 and e == 0 and seen_text) or marker:
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
    widx = align_spans(core, special, words)
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
    return Layout(special, eff, core, word_span, widx, lo, hi, holder)


def rule_sentences(text: str, lo: int, hi: int) -> tuple[list[int], list[int]]:
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


def sentence_of(layout: Layout, cuts: list[int]) -> np.ndarray:
    """Sentence index per token (by the first character of its word), renumbered from 0."""
    raw = [
        -1 if sp else max(bisect.bisect_right(cuts, ws[0]) - 1, 0)
        for sp, ws in zip(layout.special, layout.word_span)
    ]
    return renumber(raw)


@functools.lru_cache(maxsize=65536)
def is_punct_text(s: str) -> bool:
    """Every visible character is Unicode punctuation or a symbol (and there is one)."""
    vis = [c for c in s if not c.isspace()]
    return bool(vis) and all(unicodedata.category(c)[0] in "PS" for c in vis)


def quote_mask(text: str, lo: int, hi: int) -> np.ndarray:
    """bool [hi-lo]: characters inside a quoted span ("..." or “...”), the quote marks included.

    “ opens and ” closes; a straight ``"`` opens when whitespace (or the region's start) is before it and
    a visible character after it, closes in the mirror case, and otherwise toggles. A close with no open
    before it starts its span at ``lo`` (the window began inside a quote); an open never closed runs to ``hi``.
    """
    mask = np.zeros(max(hi - lo, 0), dtype=bool)
    start: int | None = None
    first = True
    for m in _QUOTE_RE.finditer(text, lo, hi):
        p, q = m.start(), m.group()
        before = p == lo or text[p - 1].isspace()
        after = p + 1 < hi and not text[p + 1].isspace()
        if q == "“" or (q == '"' and before and after):
            opens = True
        elif q == "”" or (q == '"' and not before and not after):
            opens = False
        else:
            opens = start is None
        if opens:
            if start is None:
                start = p
        else:
            begin = start if start is not None else (lo if first else None)
            if begin is not None:
                mask[begin - lo : p + 1 - lo] = True
            start = None
        first = False
    if start is not None:
        mask[start - lo :] = True
    return mask
