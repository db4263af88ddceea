"""The attention DSL: expression trees over kernel primitives and combinators (DESIGN section 2).

A DSL program is safe by construction: it can only name the primitives and combinators below, so it
can be loaded from anyone and evaluated on any input by the numba kernels in
``headsurgeon.kernels.primitives``. Three equivalent forms:

* the tree (frozen dataclasses ``Prim``, ``Mix``, ``Fallback``, ``Gate``, ``Sharpen``, ``Mul``);
* JSON, e.g. ``{"mix": [[0.7, {"prev": 1}], [0.3, {"first": {}}]]}``;
* text, e.g. ``0.7*prev(1) + 0.3*first()``.

``parse(to_text(t)) == t`` and ``from_json(to_json(t)) == t`` for every valid tree; invalid input raises
``ProgramValidationError`` saying what is wrong and what is allowed.

Primitives (``causal`` is the mask policy of the model; every primitive scores only visible keys):

==========================  =================================================================
``self()``                  the query itself
``prev(k)`` / ``next(k)``   key i-k / i+k (``next`` only sees anything without a causal mask)
``first()``                 position 0 (BOS)
``window(a, b)``            keys at offsets a..b behind the query (j = i-d, a <= d <= b; d < 0 looks ahead)
``decay(rate)``             rate**|i-j| over visible keys, 0 < rate <= 1
``uniform()``               every visible key
``none()``                  nothing (the row falls back to position 0)
``same_token()``            earlier occurrences of the query's token (non-causal: all other occurrences)
``same_token_recent()``     the most recent earlier occurrence of the query's token
``induction()``             the key right after an earlier occurrence of the query's token
``key_in_set(ids=[..])``    every visible key whose token id is in the set
``recent(PRED)``            the most recent key j <= i satisfying PRED
``sentence_start()``        the first token of the query's sentence
``word_start()``            the first token of the query's word
``same_word()``             every visible token of the query's word (the query included)
``dep_head()``              the token holding the query's dependency head
``dep_children()``          the tokens whose dependency head is the query
``profile(w=[w0, ..], tail=t, bos=b)``
                            a positional profile: key j = i-d gets w[d] for 0 <= d < len(w) and ``tail``
                            beyond (default 0); with ``bos`` given, key 0 gets ``bos`` instead. Keys ahead
                            of the query (d < 0, non-causal only) score 0. Weights are finite and >= 0
                            (a fitted "mean attention by offset plus a first-token weight").
``key_weight(w=[[id, x], ..], default=d)``
                            every visible key scores the weight of its token id (listed ids), else
                            ``default`` (default 1); ``mul(profile(..), key_weight(..))`` multiplies a
                            positional profile by per-key-token factors, like softmax logits adding.
``class_weight(q=[[ids..], ..], k=[[ids..], ..], w=[[x, ..], ..], default=d)``
                            token classes (disjoint id lists): every visible key scores ``w[c][e]`` where
                            the query token is in class ``q[c]`` and the key token in class ``k[e]``
                            (``len(q)`` rows of ``len(k)`` weights), ``default`` (default 1) when either
                            token is in no class: categorical query-class x key-class attention, as in
                            Transformer Programs; ``mul(profile, key_weight, class_weight)`` adds the three
                            as logits.
``match(q=F, k=F, pairs=[[qv, kv], ...], select=closest|all)``
                            keys whose (query value, key value) pair is listed; ``closest`` keeps only
                            the nearest such key (largest j <= i when causal, else smallest |i-j|,
                            ties to the left). F in: token, position, word, sent, pos, punct, cap,
                            newline, sent_end, word_start, dep_head. ``pos`` values may be tag names.
==========================  =================================================================

Predicates (PRED): a flag ``punct``, ``sent_end``, ``newline``, ``cap``, ``word_start``; a POS tag
``pos=NOUN``; or a token set ``ids=[3, 17]`` (in JSON: ``"punct"``, ``{"pos": "NOUN"}``,
``{"ids": [3, 17]}``).

Combinators:

* ``w1*A + w2*B + ...`` (JSON ``{"mix": [[w1, A], [w2, B]]}``): the sum of the *row-normalized*
  components, weights finite and > 0 (so ``0.7*prev(1) + 0.3*first()`` puts 0.7 on the previous token
  and 0.3 on BOS whatever the components' raw scales; a component with an empty row contributes
  nothing there).
* ``fallback(A, B, ...)``: per row, the first argument whose row is non-empty.
* ``gate(PRED, A, B)``: rows whose *query* satisfies PRED take A, the others B
  (``gate(ids=[..], A, B)`` is the query-in-set gate).
* ``sharpen(A, t)``: A**t, renormalized per row (t > 0). ``sharpen(A, t, by=[[t1, [ids..]], ..])``
  gives rows whose *query* token is in a listed (disjoint) id set the exponent of that set instead: a
  temperature per query-token class, written once instead of one ``gate`` per class.
* ``mul(A, B, ...)``: elementwise product (intersection of supports).

Evaluation composes the kernels; ``evaluate`` finally applies ``normalize_scores`` (mask, clip, row
normalization, empty rows to position 0).

Bounds. Every parameter is bounded and every program has a cost bound, so that a program from anyone (a
checkpoint, programs.json, an LLM reply) does at most O(B x N x N x MAX_COST) work. The checks run while
text or JSON is read (before large structures are built) and in ``validate``, which ``to_text``,
``to_json``, ``canonical_json`` (so ``Program.from_node``) and evaluation call on trees built in code.
A violation is a ``ProgramValidationError`` naming the parameter, the bound and the fix:

=====================================  ==========================================================================
parameter (kind)                       bound
=====================================  ==========================================================================
``prev(k)``, ``next(k)`` (offset)      1 <= k <= MAX_OFFSET (4096)
``window(a, b)`` (int)                 -MAX_OFFSET (-4096) <= a <= b <= MAX_OFFSET (4096)
``decay(rate)`` (rate)                 0 < rate <= 1
``ids=[..]`` (ids)                     1 to MAX_IDS (65536) token ids, each 0..MAX_VALUE (2**30)
``recent(PRED)`` (pred)                a flag, a POS tag, or ids=[..] of 1 to MAX_IDS (65536) token ids
``match(q=, k=)`` (feature)            one of MATCH_FEATURES
``match(select=)`` (select)            closest or all
``tail``, ``default`` (nonneg)         0 <= x <= MAX_WEIGHT (1e30)
``profile(bos=)`` (optnonneg)          absent, or 0 <= x <= MAX_WEIGHT (1e30)
``profile(w=)`` (weights)              1 to MAX_PROFILE (4096) weights, each 0..MAX_WEIGHT (1e30)
``key_weight(w=)`` (idweights)         1 to MAX_IDS (65536) [token id, weight] entries
``class_weight(q=, k=)`` (idclasses)   1 to MAX_CLASSES (256) disjoint classes, MAX_IDS (65536) token ids in all
``class_weight(w=)`` (matrix)          len(q) rows of len(k) weights (at most 256 x 256), each 0..MAX_WEIGHT (1e30)
``match(pairs=)`` (pairs)              1 to MAX_PAIRS (4096) pairs of values within +-MAX_VALUE (2**30)
``w1*A + w2*B`` (mix)                  1 to MAX_NODES terms, weights 0 < w <= MAX_WEIGHT (1e30)
``fallback(A, B, ..)``                 2 to MAX_NODES arguments
``gate(PRED, A, B)``                   PRED as for recent; ids=[..]: 1 to MAX_IDS (65536) token ids
``sharpen(A, t, by=..)``               0 < t <= MAX_EXPONENT (1e6); by: 1 to MAX_CLASSES (256) disjoint classes, MAX_IDS (65536) ids in all
``mul(A, B, ..)``                      2 to MAX_NODES arguments
program text or JSON document          at most MAX_TEXT_CHARS (4,000,000) characters
one number, name or string literal     at most MAX_LITERAL_CHARS (64) characters
nesting                                MAX_DEPTH (64) expressions, MAX_LIST_DEPTH (4) levels of [lists]
size                                   at most MAX_NODES (256) nodes
cost                                   at most MAX_COST (512) (``cost``: estimated passes over the score cells)
=====================================  ==========================================================================

The cost of a program (``cost``) is the sum of ``PRIMITIVE_COST`` over its primitives and
``COMBINATOR_COST`` over its combinators (per term or argument for mix, fallback and mul): each unit is
about one pass over the B x N x N score cells. Every kernel does O(N) work per query row whatever its
parameters (windows and offsets are clipped to the sequence), so an accepted program costs
O(cells x MAX_COST) per batch.
"""
from __future__ import annotations

import json
import math
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from headsurgeon.kernels import primitives as K
from headsurgeon.kernels.normalize import normalize_scores

from .errors import ProgramValidationError, excerpt

__all__ = [
    "Prim", "Mix", "Fallback", "Gate", "Sharpen", "Mul", "Pred", "Node",
    "parse", "to_text", "from_json", "to_json", "canonical_json", "json_loads", "validate", "cost",
    "features_needed", "evaluate_scores", "evaluate", "PRIMITIVES", "COMBINATORS", "FLAGS", "MATCH_FEATURES",
    "KNOWN_POS_TAGS", "KIND_BOUNDS", "COMBINATOR_BOUNDS", "PRIMITIVE_COST", "COMBINATOR_COST", "clear_scratch",
    "MAX_OFFSET", "MAX_VALUE", "MAX_IDS", "MAX_CLASSES", "MAX_PAIRS", "MAX_PROFILE", "MAX_WEIGHT",
    "MAX_EXPONENT", "MAX_TEXT_CHARS", "MAX_LITERAL_CHARS", "MAX_DEPTH", "MAX_LIST_DEPTH", "MAX_NODES",
    "MAX_COST",
]

# The bounds of the table in the module docstring (a test checks that the two agree).
MAX_OFFSET = 4096  # prev/next/window offsets: the longest context a dense [N, N] score matrix is built for
MAX_VALUE = 1 << 30  # token ids and match values
MAX_IDS = 65_536  # token ids in one id list or table (a whole vocabulary of most models)
MAX_CLASSES = 256  # token classes of class_weight (each side) and sharpen(by=...)
MAX_PAIRS = 4096  # match pairs (the match table has at most MAX_PAIRS**2 cells: 16 MiB)
MAX_PROFILE = MAX_OFFSET  # profile weights
MAX_WEIGHT = 1e30  # score and mix weights (kernels compute in float32)
MAX_EXPONENT = 1e6  # sharpen exponents
MAX_TEXT_CHARS = 4_000_000  # program text or JSON document
MAX_LITERAL_CHARS = 64  # one number, name or string in the text form
MAX_DEPTH = 64  # nested expressions
MAX_LIST_DEPTH = 4  # nested [lists] in a parameter value
MAX_NODES = 256  # nodes (primitives and combinators) of one program
MAX_COST = 512  # the sum of PRIMITIVE_COST / COMBINATOR_COST over the tree

FLAGS = ("punct", "sent_end", "newline", "cap", "word_start")
MATCH_FEATURES = (
    "token", "position", "word", "sent", "pos", "punct", "cap", "newline", "sent_end",
    "word_start", "dep_head",
)
# spaCy's coarse (Universal Dependencies) tags; names are validated against this set and mapped
# to ids through ``headsurgeon.synth.features.POS_TAGS`` at evaluation time (a test checks that the
# two lists hold the same tags).
KNOWN_POS_TAGS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
    "PUNCT", "SCONJ", "SYM", "VERB", "X", "SPACE",
)
SELECTS = ("closest", "all")

# name -> tuple of (param name, kind, default); kinds: offset (int >= 1), int, rate, ids, pred,
# feature, pairs, select, weights (list of floats >= 0), idweights (list of [id, weight >= 0]),
# nonneg (float >= 0), optnonneg (float >= 0 or None). _REQ marks a required parameter.
_REQ = object()
PRIMITIVES: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "self": (),
    "first": (),
    "uniform": (),
    "none": (),
    "same_token": (),
    "same_token_recent": (),
    "induction": (),
    "sentence_start": (),
    "word_start": (),
    "same_word": (),
    "dep_head": (),
    "dep_children": (),
    "prev": (("k", "offset", 1),),
    "next": (("k", "offset", 1),),
    "window": (("a", "int", _REQ), ("b", "int", _REQ)),
    "decay": (("rate", "rate", _REQ),),
    "key_in_set": (("ids", "ids", _REQ),),
    "recent": (("pred", "pred", _REQ),),
    "profile": (("w", "weights", _REQ), ("tail", "nonneg", 0.0), ("bos", "optnonneg", None)),
    "key_weight": (("w", "idweights", _REQ), ("default", "nonneg", 1.0)),
    "class_weight": (("q", "idclasses", _REQ), ("k", "idclasses", _REQ), ("w", "matrix", _REQ),
                     ("default", "nonneg", 1.0)),
    "match": (("q", "feature", _REQ), ("k", "feature", _REQ), ("pairs", "pairs", _REQ),
              ("select", "select", "closest")),
}
COMBINATORS = ("mix", "fallback", "gate", "sharpen", "mul")

# parameter kind -> its bound, as written in the module docstring's table
KIND_BOUNDS: dict[str, str] = {
    "offset": "1 <= k <= MAX_OFFSET (4096)",
    "int": "-MAX_OFFSET (-4096) <= a <= b <= MAX_OFFSET (4096)",
    "rate": "0 < rate <= 1",
    "ids": "1 to MAX_IDS (65536) token ids, each 0..MAX_VALUE (2**30)",
    "pred": "a flag, a POS tag, or ids=[..] of 1 to MAX_IDS (65536) token ids",
    "feature": "one of MATCH_FEATURES",
    "select": "closest or all",
    "nonneg": "0 <= x <= MAX_WEIGHT (1e30)",
    "optnonneg": "absent, or 0 <= x <= MAX_WEIGHT (1e30)",
    "weights": "1 to MAX_PROFILE (4096) weights, each 0..MAX_WEIGHT (1e30)",
    "idweights": "1 to MAX_IDS (65536) [token id, weight] entries",
    "idclasses": "1 to MAX_CLASSES (256) disjoint classes, MAX_IDS (65536) token ids in all",
    "matrix": "len(q) rows of len(k) weights (at most 256 x 256), each 0..MAX_WEIGHT (1e30)",
    "pairs": "1 to MAX_PAIRS (4096) pairs of values within +-MAX_VALUE (2**30)",
}
COMBINATOR_BOUNDS: dict[str, str] = {
    "mix": "1 to MAX_NODES terms, weights 0 < w <= MAX_WEIGHT (1e30)",
    "fallback": "2 to MAX_NODES arguments",
    "gate": "PRED as for recent; ids=[..]: 1 to MAX_IDS (65536) token ids",
    "sharpen": "0 < t <= MAX_EXPONENT (1e6); by: 1 to MAX_CLASSES (256) disjoint classes, MAX_IDS (65536) ids in all",
    "mul": "2 to MAX_NODES arguments",
}

# Estimated passes over the B x N x N score cells: a primitive's kernel (plus its lookups) ...
PRIMITIVE_COST: dict[str, int] = {
    "self": 1, "first": 1, "uniform": 1, "none": 1, "same_token": 1, "same_token_recent": 1, "induction": 1,
    "sentence_start": 1, "word_start": 1, "same_word": 1, "dep_head": 1, "dep_children": 1, "prev": 1,
    "next": 1, "window": 1, "decay": 1, "key_in_set": 1, "recent": 1, "profile": 1, "key_weight": 2,
    "class_weight": 2, "match": 2,
}
# ... and a combinator's own work (mix: per term, fallback: per argument, mul: per argument).
COMBINATOR_COST: dict[str, int] = {"mix": 1, "fallback": 2, "gate": 2, "sharpen": 4, "mul": 1}

_PRIM_FEATURES = {
    "sentence_start": ("sent",),
    "word_start": ("word",),
    "same_word": ("word",),
    "dep_head": ("dep_head",),
    "dep_children": ("dep_head",),
}


def _err(msg: str) -> ProgramValidationError:
    return ProgramValidationError(msg)


# --------------------------------------------------------------------------------------------
# the tree
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pred:
    """A token predicate: ``kind`` is "flag" (value: flag name), "pos" (tag name) or "ids" (tuple)."""

    kind: str
    value: Any


@dataclass(frozen=True)
class Prim:
    """A primitive with its parameters, in the canonical order of ``PRIMITIVES[name]``."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)


@dataclass(frozen=True)
class Mix:
    """Weighted sum of row-normalized components: ``terms = ((w, node), ...)``."""

    terms: tuple[tuple[float, Any], ...]


@dataclass(frozen=True)
class Fallback:
    """Per row, the first argument whose row is non-empty."""

    args: tuple[Any, ...]


@dataclass(frozen=True)
class Gate:
    """Rows whose query satisfies ``pred`` take ``then``, the others ``other``."""

    pred: Pred
    then: Any
    other: Any


@dataclass(frozen=True)
class Sharpen:
    """``arg ** t``, renormalized per row; ``by = ((t1, ids1), ..)``: query tokens in ids_k use t_k."""

    arg: Any
    t: float
    by: tuple[tuple[float, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Mul:
    """Elementwise product of the arguments."""

    args: tuple[Any, ...]


Node = Union[Prim, Mix, Fallback, Gate, Sharpen, Mul]


# --------------------------------------------------------------------------------------------
# quoting hostile input in error messages
# --------------------------------------------------------------------------------------------

class _Raw(str):
    """A string that ``repr`` shows as is (placeholders inside clipped values)."""

    def __repr__(self) -> str:
        return str(self)


_CLIP_ITEMS = 6


def _clip(value: Any, depth: int = 0) -> Any:
    """A small stand-in for ``value`` (few items, shallow, short strings) that is cheap and safe to ``repr``."""
    if value is None or isinstance(value, (bool, float, np.floating)):
        return value
    if isinstance(value, (int, np.integer)):
        v = int(value)
        return v if v.bit_length() <= 64 else _Raw(f"<an integer of {v.bit_length()} bits>")
    if isinstance(value, str):
        return value if len(value) <= 60 else _Raw(repr(value[:60]) + f"... ({len(value)} characters)")
    if isinstance(value, (list, tuple)):
        if depth >= 2:
            return _Raw("[...]")
        items = [_clip(v, depth + 1) for v in value[:_CLIP_ITEMS]]
        return items + [_Raw(f"... ({len(value)} items)")] if len(value) > _CLIP_ITEMS else items
    if isinstance(value, dict):
        if depth >= 2:
            return _Raw("{...}")
        out = {_Raw(repr(_clip(k, 2))): _clip(v, depth + 1) for k, v in list(value.items())[:_CLIP_ITEMS]}
        if len(value) > _CLIP_ITEMS:
            out[_Raw("...")] = _Raw(f"({len(value)} keys)")
        return out
    return _Raw(f"<{type(value).__name__}>")


def _show(value: Any) -> str:
    """Quote an input value in an error message: at most about 200 characters, whatever its size or depth."""
    clipped = _clip(value)
    return str(clipped) if isinstance(clipped, _Raw) else excerpt(clipped)


# --------------------------------------------------------------------------------------------
# parameter checking (shared by the text parser, the JSON reader and ``validate``)
# --------------------------------------------------------------------------------------------

def _as_int(value: Any, what: str, limit: int | None = MAX_VALUE, bound: str = "MAX_VALUE") -> int:
    """An integer (integral floats accepted) with |value| <= ``limit`` (None: the caller checks the range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _err(f"{what} must be an integer; got {_show(value)}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise _err(f"{what} must be an integer; got {_show(value)}")
    v = int(value)
    if limit is not None and abs(v) > limit:
        raise _err(f"{what} must lie within -{limit}..{limit} ({bound}); got {_show(v)}")
    return v


def _as_offset(value: Any, what: str, low: int) -> int:
    """A position offset in low..MAX_OFFSET (kernels clip offsets to the sequence, so larger ones add nothing)."""
    v = _as_int(value, what, None)
    if low >= 1 and v < low:
        raise _err(f"{what} needs an offset >= 1 (use self() for offset 0); got {_show(v)}")
    if not low <= v <= MAX_OFFSET:
        raise _err(f"{what} must lie in {low}..{MAX_OFFSET} (MAX_OFFSET, the longest context the DSL addresses); "
                   f"got {_show(v)}: use a smaller offset, or uniform() / profile(w=[..], tail=t) for distant keys")
    return v


def _as_float(value: Any, what: str) -> float:
    """A finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _err(f"{what} must be a number; got {_show(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise _err(f"{what} must be finite; got {_show(value)}") from None
    if not math.isfinite(v):
        raise _err(f"{what} must be finite; got {v!r}")
    return v


def _as_weight(value: Any, what: str) -> float:
    """A score weight: finite, >= 0 and at most MAX_WEIGHT (kernels compute in float32)."""
    v = _as_float(value, what)
    if v < 0.0:
        raise _err(f"{what} must be >= 0; got {v}")
    if v > MAX_WEIGHT:
        raise _err(f"{what} must be at most {MAX_WEIGHT:g} (MAX_WEIGHT; scores are float32); got {v}")
    return v


def _as_list(value: Any, what: str, limit: int, bound: str, example: str, noun: str) -> Sequence:
    """A non-empty list or tuple of at most ``limit`` items, checked before any item is read."""
    if not isinstance(value, (list, tuple)) or not value:
        raise _err(f"{what} must be a non-empty list of {noun}, e.g. {example}; got {_show(value)}")
    if len(value) > limit:
        raise _err(f"{what} lists {len(value)} {noun}; at most {limit} are allowed ({bound}): keep the ones "
                   "that matter, or split the program")
    return value


def _as_ids(value: Any, what: str, limit: int = MAX_IDS) -> tuple[int, ...]:
    """A sorted, deduplicated tuple of 1..``limit`` token ids, each 0..MAX_VALUE."""
    _as_list(value, what, limit, "MAX_IDS", "ids=[3, 17]", "token ids")
    ids = sorted({_as_int(v, f"{what} entry") for v in value})
    if ids[0] < 0:
        raise _err(f"{what} must hold token ids >= 0; got {ids[0]}")
    return tuple(ids)


def _as_pos_tag(value: Any, what: str) -> str:
    """A known POS tag name, upper-cased."""
    if not isinstance(value, str) or len(value) > MAX_LITERAL_CHARS or value.upper() not in KNOWN_POS_TAGS:
        raise _err(f"{what} must be a POS tag, one of {', '.join(KNOWN_POS_TAGS)}; got {_show(value)}")
    return value.upper()


def _pair_value(value: Any, feature: str, what: str) -> Any:
    if feature == "pos" and isinstance(value, str):
        return _as_pos_tag(value, what)
    return _as_int(value, what)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, int) else (1, 0, value)


def _check_weights(value: Any, what: str) -> tuple[float, ...]:
    """profile(w=...): 1..MAX_PROFILE weights."""
    _as_list(value, what, MAX_PROFILE, "MAX_PROFILE", "w=[1, 0.5]", "weights")
    return tuple(_as_weight(x, f"{what} weight") for x in value)


def _check_idweights(value: Any, what: str) -> tuple[tuple[int, float], ...]:
    """key_weight(w=...): 1..MAX_IDS [token id, weight] entries, each id once."""
    _as_list(value, what, MAX_IDS, "MAX_IDS", "w=[[13, 2.5]]", "[token id, weight] entries")
    table: dict[int, float] = {}
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise _err(f"{what}: each entry must be [token id, weight]; got {_show(item)}")
        tid = _as_int(item[0], f"{what} token id")
        if tid < 0:
            raise _err(f"{what} token ids must be >= 0; got {tid}")
        wt = _as_weight(item[1], f"{what} weight for token {tid}")
        if tid in table:
            raise _err(f"{what} lists token id {tid} twice")
        table[tid] = wt
    return tuple(sorted(table.items()))


def _check_idclasses(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    """class_weight(q=/k=...): 1..MAX_CLASSES disjoint id classes, MAX_IDS ids in all."""
    _as_list(value, what, MAX_CLASSES, "MAX_CLASSES", "[[3, 17], [5]]", "token classes (lists of ids)")
    classes, seen = [], set()
    for c, item in enumerate(value):
        ids = _check_class_ids(item, f"{what} class {c}", seen)
        classes.append(ids)
    return tuple(classes)


def _check_class_ids(item: Any, what: str, seen: set[int]) -> tuple[int, ...]:
    """One class of a disjoint class list: its ids, within what is left of MAX_IDS; adds them to ``seen``."""
    left = MAX_IDS - len(seen)
    if isinstance(item, (list, tuple)) and len(item) > left:
        raise _err(f"{what} brings the classes past {MAX_IDS} token ids in all (MAX_IDS); list fewer ids")
    ids = _as_ids(item, what)
    clash = seen.intersection(ids)
    if clash:
        raise _err(f"{what.rsplit(' class', 1)[0]} lists token id {min(clash)} in two classes; "
                   "the classes must be disjoint")
    seen.update(ids)
    return ids


def _check_matrix(value: Any, what: str, others: Mapping[str, Any]) -> tuple[tuple[float, ...], ...]:
    """class_weight(w=...): len(q) rows of len(k) weights."""
    nq, nk = len(others.get("q", ())), len(others.get("k", ()))
    if (not isinstance(value, (list, tuple)) or len(value) != nq
            or any(not isinstance(r, (list, tuple)) or len(r) != nk for r in value)):
        raise _err(f"{what} must be a table of {nq} rows (query classes) of {nk} weights (key classes) "
                   f"each; got {_show(value)}")
    return tuple(tuple(_as_weight(x, f"{what} weight") for x in r) for r in value)


def _check_pairs(value: Any, what: str, others: Mapping[str, Any]) -> tuple[tuple[Any, Any], ...]:
    """match(pairs=...): 1..MAX_PAIRS [query value, key value] pairs, canonically sorted."""
    _as_list(value, what, MAX_PAIRS, "MAX_PAIRS", "pairs=[[3, 4]]", "[query value, key value] pairs")
    qf, kf = others.get("q"), others.get("k")
    pairs = set()
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise _err(f"{what}: each pair must be [query value, key value]; got {_show(pair)}")
        pairs.add((_pair_value(pair[0], qf, f"{what} query value"),
                   _pair_value(pair[1], kf, f"{what} key value")))
    return tuple(sorted(pairs, key=lambda p: (_sort_key(p[0]), _sort_key(p[1]))))


def _check_choice(value: Any, what: str, choices: tuple[str, ...], noun: str) -> str:
    """One of a fixed set of names."""
    if not isinstance(value, str) or value not in choices:
        raise _err(f"{what} must be {noun}, one of {', '.join(choices)}; got {_show(value)}")
    return value


def _check_param(prim: str, name: str, kind: str, value: Any, others: Mapping[str, Any]) -> Any:
    """Validate and canonicalize one parameter value against its kind's bound (``KIND_BOUNDS``)."""
    what = f"{prim}({name}=...)"
    if kind == "offset":
        return _as_offset(value, what, 1)
    if kind == "int":
        return _as_offset(value, what, -MAX_OFFSET)
    if kind == "rate":
        v = _as_float(value, what)
        if not 0.0 < v <= 1.0:
            raise _err(f"{what} must lie in (0, 1]; got {v}")
        return v
    if kind == "ids":
        return _as_ids(value, what)
    if kind == "pred":
        if not isinstance(value, Pred):
            raise _err(f"{what} must be a predicate ({', '.join(FLAGS)}, pos=TAG or ids=[...]); got {_show(value)}")
        return _check_pred(value, what)
    if kind == "feature":
        return _check_choice(value, what, MATCH_FEATURES, "a feature")
    if kind == "select":
        return _check_choice(value, what, SELECTS, "a selection mode")
    if kind == "nonneg" or (kind == "optnonneg" and value is not None):
        return _as_weight(value, what)
    if kind == "optnonneg":
        return None
    if kind == "weights":
        return _check_weights(value, what)
    if kind == "idweights":
        return _check_idweights(value, what)
    if kind == "idclasses":
        return _check_idclasses(value, what)
    if kind == "matrix":
        return _check_matrix(value, what, others)
    if kind == "pairs":
        return _check_pairs(value, what, others)
    raise AssertionError(kind)


def _make_prim(name: str, positional: Sequence[Any], keywords: Mapping[str, Any]) -> Prim:
    """Bind positional/keyword arguments to a primitive's parameters, with clear errors."""
    if not isinstance(name, str) or name not in PRIMITIVES:
        raise _err(
            f"unknown primitive {_show(name)}; primitives: {', '.join(sorted(PRIMITIVES))}; "
            f"combinators: {', '.join(COMBINATORS)}"
        )
    spec = PRIMITIVES[name]
    sig = ", ".join(p[0] for p in spec)
    if len(positional) > len(spec):
        raise _err(f"{name}({sig}) takes {len(spec)} argument(s); got {len(positional) + len(keywords)}")
    bound: dict[str, Any] = {}
    for (pname, _, _), value in zip(spec, positional):
        bound[pname] = value
    names = {p[0] for p in spec}
    for key, value in keywords.items():
        if key not in names:
            raise _err(f"{name}() has no parameter {_show(key)}; its signature is {name}({sig})")
        if key in bound:
            raise _err(f"{name}() got parameter {key!r} twice")
        bound[key] = value
    params = []
    for pname, kind, default in spec:
        if pname not in bound:
            if default is _REQ:
                raise _err(f"{name}({sig}) is missing parameter {pname!r}")
            bound[pname] = default
        bound[pname] = _check_param(name, pname, kind, bound[pname], bound)
        params.append((pname, bound[pname]))
    if name == "window" and bound["a"] > bound["b"]:
        raise _err(f"window(a, b) needs a <= b; got a={bound['a']}, b={bound['b']}")
    return _checked(Prim(name, tuple(params)))


def _check_pred(pred: Pred, where: str) -> Pred:
    """A predicate built in code: a known flag, a known POS tag or 1..MAX_IDS token ids."""
    if pred.kind == "flag" and isinstance(pred.value, str) and pred.value in FLAGS:
        return pred
    if pred.kind == "pos":
        return Pred("pos", _as_pos_tag(pred.value, f"{where} pos="))
    if pred.kind == "ids":
        return Pred("ids", _as_ids(pred.value, f"{where} ids="))
    raise _err(f"{where}: expected a predicate: a flag ({', '.join(FLAGS)}), pos=TAG or ids=[...]; "
               f"got {_show(pred.kind)}={_show(pred.value)}")


def _make_pred(value: Any, key: str | None, where: str) -> Pred:
    """Build a predicate from a bare flag name (key None) or a keyword pos=TAG / ids=[...]."""
    if key is None:
        if isinstance(value, str) and value in FLAGS:
            return Pred("flag", value)
        raise _err(
            f"{where}: expected a predicate: a flag ({', '.join(FLAGS)}), pos=TAG or ids=[...]; got {_show(value)}"
        )
    if key == "pos":
        return Pred("pos", _as_pos_tag(value, f"{where} pos="))
    if key == "ids":
        return Pred("ids", _as_ids(value, f"{where} ids="))
    if key == "pred":
        if isinstance(value, Pred):
            return _check_pred(value, where)
        return _make_pred(value, None, where)
    raise _err(f"{where}: unknown predicate {_show(key)}=...; use a flag ({', '.join(FLAGS)}), pos=TAG or ids=[...]")


def _mix_weight(w: Any) -> float:
    """A mix weight: 0 < w <= MAX_WEIGHT."""
    wf = _as_float(w, "mix weight")
    if wf <= 0.0:
        raise _err(f"mix weights must be > 0 (components are row-normalized and added); got {wf}")
    if wf > MAX_WEIGHT:
        raise _err(f"mix weights must be at most {MAX_WEIGHT:g} (MAX_WEIGHT; scores are float32); got {wf}")
    return wf


def _make_mix(terms: Sequence[tuple[Any, Any]]) -> Mix:
    if not terms:
        raise _err("mix needs at least one [weight, expression] term")
    return Mix(tuple((_mix_weight(w), node) for w, node in terms))


def _sharpen_exponent(t: Any, what: str) -> float:
    """A sharpen exponent: 0 < t <= MAX_EXPONENT."""
    tf = _as_float(t, what)
    if tf <= 0.0:
        raise _err(f"{what} must be > 0 (sharpen needs t > 0); got {tf}")
    if tf > MAX_EXPONENT:
        raise _err(f"{what} must be at most {MAX_EXPONENT:g} (MAX_EXPONENT); got {tf}: a larger power "
                   "already keeps only each row's maximum")
    return tf


def _sharpen_classes(by: Any) -> tuple[tuple[float, tuple[int, ...]], ...]:
    """sharpen(by=...): 1..MAX_CLASSES disjoint [t, [ids..]] classes, MAX_IDS ids in all."""
    if not isinstance(by, (list, tuple)):
        raise _err(f"sharpen(A, t, by=...) expects a list of [t, [token ids]] classes; got {_show(by)}")
    if len(by) > MAX_CLASSES:
        raise _err(f"sharpen(A, t, by=...) lists {len(by)} classes; at most {MAX_CLASSES} are allowed "
                   "(MAX_CLASSES): merge classes that share an exponent")
    classes = []
    seen: set[int] = set()
    for item in by:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise _err(f"sharpen(A, t, by=...): each class is [t, [token ids]]; got {_show(item)}")
        tk = _sharpen_exponent(item[0], "sharpen(A, t, by=...) class exponents")
        classes.append((tk, _check_class_ids(item[1], "sharpen(A, t, by=...) class ids", seen)))
    return tuple(sorted(classes))


def _make_sharpen(arg: Any, t: Any, by: Any = None) -> Sharpen:
    tf = _sharpen_exponent(t, "sharpen(A, t) exponent t")
    if by is None or (isinstance(by, (list, tuple)) and not by):
        return Sharpen(arg, tf)
    return Sharpen(arg, tf, _sharpen_classes(by))


def _children(node: Node) -> tuple:
    if isinstance(node, Mix):
        return tuple(t for _, t in node.terms)
    if isinstance(node, (Fallback, Mul)):
        return node.args
    if isinstance(node, Gate):
        return (node.then, node.other)
    if isinstance(node, Sharpen):
        return (node.arg,)
    return ()


# --------------------------------------------------------------------------------------------
# whole trees: size, depth and cost (one check for text, JSON and trees built in code)
# --------------------------------------------------------------------------------------------

# Nodes known to satisfy every bound (checked primitives, validated roots), by identity.
_CHECKED: "weakref.WeakValueDictionary[int, Node]" = weakref.WeakValueDictionary()


def _checked(node: Node) -> Node:
    """Record that ``node`` passed its checks, so ``validate`` need not repeat them."""
    try:
        _CHECKED[id(node)] = node
    except TypeError:  # not weakly referenceable: it is simply checked again next time
        pass
    return node


def _is_checked(node: Any) -> bool:
    return _CHECKED.get(id(node)) is node


def _node_cost(node: Node) -> int:
    """Estimated passes over the score cells that ``node`` itself makes (children not included)."""
    if isinstance(node, Prim):
        return PRIMITIVE_COST[node.name]
    if isinstance(node, Mix):
        return COMBINATOR_COST["mix"] * len(node.terms)
    if isinstance(node, Fallback):
        return COMBINATOR_COST["fallback"] * len(node.args)
    if isinstance(node, Mul):
        return COMBINATOR_COST["mul"] * len(node.args)
    return COMBINATOR_COST["gate" if isinstance(node, Gate) else "sharpen"]


def _node_args(args: Any, name: str) -> None:
    """fallback/mul arguments: a tuple of 2..MAX_NODES nodes."""
    if not isinstance(args, tuple) or not 2 <= len(args) <= MAX_NODES:
        raise _err(f"{name} needs a tuple of 2 to {MAX_NODES} expressions (MAX_NODES); got {_show(args)}")


def _check_node(node: Any) -> None:
    """Check one node built in code against its bounds (its children are checked on their own)."""
    if isinstance(node, Prim):
        if (not isinstance(node.params, tuple) or len(node.params) > len(PRIMITIVES.get(node.name, ()))
                or any(not isinstance(p, tuple) or len(p) != 2 for p in node.params)):
            raise _err(f"{_show(node.name)}: params must be a tuple of (name, value) pairs, one per parameter "
                       "of PRIMITIVES[name]")
        _make_prim(node.name, [], dict(node.params))
    elif isinstance(node, Mix):
        if not isinstance(node.terms, tuple) or not 1 <= len(node.terms) <= MAX_NODES:
            raise _err(f"mix needs a tuple of 1 to {MAX_NODES} (weight, expression) terms (MAX_NODES)")
        for term in node.terms:
            if not isinstance(term, tuple) or len(term) != 2:
                raise _err(f"each mix term is (weight, expression); got {_show(term)}")
            _mix_weight(term[0])
    elif isinstance(node, (Fallback, Mul)):
        _node_args(node.args, "fallback" if isinstance(node, Fallback) else "mul")
    elif isinstance(node, Gate):
        if not isinstance(node.pred, Pred):
            raise _err(f"gate(PRED, A, B) needs a predicate; got {_show(node.pred)}")
        _check_pred(node.pred, "gate()")
    elif isinstance(node, Sharpen):
        _sharpen_exponent(node.t, "sharpen(A, t) exponent t")
        if node.by:
            _sharpen_classes(node.by)
    else:
        raise _err(f"not a DSL node: {_show(node)}")


def _measure(node: Node, check: bool) -> int:
    """Walk the tree (iteratively) enforcing MAX_DEPTH, MAX_NODES and MAX_COST; ``check``: every node's bounds too.

    Returns the program's cost.
    """
    count = total = 0
    stack = [(node, 1)]
    while stack:
        cur, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise _err(_DEPTH_MESSAGE)
        if count > MAX_NODES:
            raise _err(_NODES_MESSAGE)
        if check and not _is_checked(cur):
            _check_node(cur)
        total += _node_cost(cur)
        if total > MAX_COST:
            raise _err(f"program's estimated cost exceeds MAX_COST ({MAX_COST} passes over the score cells; "
                       "see dsl.cost): use fewer terms, or fewer sharpen/match/class nodes")
        stack.extend((c, depth + 1) for c in _children(cur))
    return total


_DEPTH_MESSAGE = (f"program nests deeper than {MAX_DEPTH} levels (MAX_DEPTH); flatten it, e.g. one mix "
                  "of many terms instead of nested mixes")
_NODES_MESSAGE = (f"program has more than {MAX_NODES} nodes (MAX_NODES); use fewer terms or split it "
                  "into several programs")


def validate(node: Node) -> Node:
    """Check a tree, however it was built, against every bound of the module docstring; return it.

    Raises ProgramValidationError. Trees from ``parse`` / ``from_json`` and trees validated before are
    recognized (by identity) and not walked again.
    """
    if _is_checked(node):
        return node
    _measure(node, check=True)
    return _checked(node)


def cost(node: Node) -> int:
    """The program's estimated cost: passes over the B x N x N score cells (bounded by MAX_COST)."""
    validate(node)
    return _measure(node, check=False)


# --------------------------------------------------------------------------------------------
# text form
# --------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""(?:
        (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
      | (?P<str>"[^"\\]*"|'[^'\\]*')
      | (?P<op>[()\[\],=*+-])
    )""",
    re.VERBOSE,
)
_SPACE_RE = re.compile(r"\s*")
_LITERAL_NOUNS = {"num": "number", "name": "name", "str": "string"}


class _Lexer:
    """Tokens of DSL text, read on demand (so an error stops the work where it is found)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.ahead: list[tuple[str, Any, int]] = []

    def _scan(self) -> tuple[str, Any, int]:
        """The next token after ``pos`` (literals of at most MAX_LITERAL_CHARS characters)."""
        text = self.text
        pos = _SPACE_RE.match(text, self.pos).end()
        if pos >= len(text):
            self.pos = pos
            return ("eof", None, len(text))
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise _err(f"unexpected character {text[pos]!r} at column {pos + 1} in {excerpt(text)}")
        kind = m.lastgroup
        raw = m.group(kind)
        if kind != "op" and len(raw) > MAX_LITERAL_CHARS:
            raise _err(f"the {_LITERAL_NOUNS[kind]} at column {pos + 1} has {len(raw)} characters; at most "
                       f"{MAX_LITERAL_CHARS} are allowed (MAX_LITERAL_CHARS): write it shorter")
        if kind == "num":
            val: Any = int(raw) if raw.isdigit() else float(raw)
        elif kind == "str":
            val = raw[1:-1]
        else:
            val = raw
        self.pos = m.end()
        return (kind, val, pos)

    def peek(self, ahead: int = 0) -> tuple[str, Any, int]:
        while len(self.ahead) <= ahead:
            self.ahead.append(self._scan())
        return self.ahead[ahead]

    def next(self) -> tuple[str, Any, int]:
        tok = self.peek()
        self.ahead.pop(0)
        return tok

    def expect(self, op: str) -> None:
        kind, val, col = self.next()
        if kind != "op" or val != op:
            shown = "end of input" if kind == "eof" else repr(val)
            raise _err(f"expected {op!r} at column {col + 1}, found {shown} in {excerpt(self.text)}")

    def at_op(self, op: str, ahead: int = 0) -> bool:
        kind, val, _ = self.peek(ahead)
        return kind == "op" and val == op


class _Budget:
    """Counts the nodes a reader builds, stopping at MAX_NODES before the tree grows further."""

    def __init__(self) -> None:
        self.nodes = 0

    def tick(self, count: int = 1) -> None:
        self.nodes += count
        if self.nodes > MAX_NODES:
            raise _err(_NODES_MESSAGE)


class _Parser:
    def __init__(self, text: str) -> None:
        self.lx = _Lexer(text)
        self.depth = 0
        self.budget = _Budget()

    def parse(self) -> Node:
        node = self.expr()
        kind, val, col = self.lx.peek()
        if kind != "eof":
            raise _err(f"unexpected {val!r} at column {col + 1} after a complete expression in {excerpt(self.lx.text)}")
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _err(_DEPTH_MESSAGE)
        terms = [self.term()]
        while self.lx.at_op("+"):
            self.lx.next()
            terms.append(self.term())
        self.depth -= 1
        if len(terms) == 1 and terms[0][0] is None:
            return terms[0][1]
        self.budget.tick()
        return _make_mix([(1.0 if w is None else w, node) for w, node in terms])

    def term(self) -> tuple[float | None, Node]:
        kind, val, col = self.lx.peek()
        if kind == "num":
            self.lx.next()
            if not self.lx.at_op("*"):
                raise _err(f"a number at column {col + 1} must be a weight written as {val}*expression")
            self.lx.next()
            return float(val), self.factor()
        node = self.factor()
        if self.lx.at_op("*"):
            self.lx.next()
            kind2, val2, col2 = self.lx.next()
            if kind2 != "num":
                raise _err(f"expected a weight after '*' at column {col2 + 1}; write w*expression")
            return float(val2), node
        return None, node

    def factor(self) -> Node:
        kind, val, col = self.lx.next()
        if kind == "op" and val == "(":
            node = self.expr()
            self.lx.expect(")")
            return node
        if kind != "name":
            shown = "end of input" if kind == "eof" else repr(val)
            raise _err(f"expected a primitive or combinator at column {col + 1}, found {shown}")
        if not self.lx.at_op("("):
            raise _err(f"{val!r} at column {col + 1} must be called with parentheses, e.g. {val}()")
        self.lx.next()
        self.budget.tick()
        args = self.arglist(val)
        return self.build(val, args, col)

    def arglist(self, name: str) -> list[tuple[str | None, Any]]:
        """Arguments of ``name(...)`` as (keyword or None, value); values are nodes or literals."""
        args: list[tuple[str | None, Any]] = []
        if self.lx.at_op(")"):
            self.lx.next()
            return args
        while True:
            kind, val, col = self.lx.peek()
            if kind == "name" and self.lx.at_op("=", 1):
                self.lx.next()
                self.lx.next()
                args.append((val, self.literal(limit=_list_limit(name, val), what=f"{name}({val}=...)")))
            elif kind == "name" and self.lx.at_op("(", 1):
                args.append((None, self.expr()))
            elif kind == "num" and self.lx.at_op("*", 1):
                args.append((None, self.expr()))
            elif kind == "op" and val == "(":
                args.append((None, self.expr()))
            else:
                lit = self.literal(limit=_list_limit(name, len(args)), what=f"argument {len(args) + 1} of {name}()")
                if isinstance(lit, (int, float)) and self.lx.at_op("+"):
                    raise _err(f"unexpected '+' after {lit} at column {col + 1}")
                args.append((None, lit))
            if len(args) > _MAX_ARGS:
                raise _err(f"a call at column {col + 1} has more than {_MAX_ARGS} arguments (MAX_NODES)")
            if self.lx.at_op(","):
                self.lx.next()
                continue
            self.lx.expect(")")
            return args

    def literal(self, depth: int = 0, limit: tuple[int, str] = (MAX_IDS, "MAX_IDS"), what: str = "a list") -> Any:
        """A number, name, string or [list] (of at most ``limit`` items at the outer level)."""
        kind, val, col = self.lx.next()
        if kind == "op" and val == "-":
            kind, val, col = self.lx.next()
            if kind != "num":
                raise _err(f"expected a number after '-' at column {col + 1}")
            return -val
        if kind in ("num", "name", "str"):
            return val
        if kind == "op" and val == "[":
            return self.list_literal(depth + 1, col, limit, what)
        shown = "end of input" if kind == "eof" else repr(val)
        raise _err(f"expected a value (number, name or [list]) at column {col + 1}, found {shown}")

    def list_literal(self, depth: int, col: int, limit: tuple[int, str], what: str) -> list[Any]:
        """The items of a [list] whose '[' was just read: at most MAX_LIST_DEPTH deep and ``limit`` long."""
        if depth > MAX_LIST_DEPTH:
            raise _err(f"the list at column {col + 1} nests deeper than {MAX_LIST_DEPTH} levels (MAX_LIST_DEPTH); "
                       "DSL parameters need at most 3, e.g. by=[[2, [3, 17]]]")
        items: list[Any] = []
        if self.lx.at_op("]"):
            self.lx.next()
            return items
        while True:
            if len(items) >= limit[0]:
                raise _err(f"{what} lists more than {limit[0]} items (the list at column {col + 1}); at most "
                           f"{limit[0]} are allowed ({limit[1]}): keep the ones that matter, or split the program")
            items.append(self.literal(depth, what=f"an item of {what}"))
            if self.lx.at_op(","):
                self.lx.next()
                continue
            self.lx.expect("]")
            return items

    def build(self, name: str, args: list[tuple[str | None, Any]], col: int) -> Node:
        where = f"{name}() at column {col + 1}"
        nodes = [v for k, v in args if k is None and _is_node(v)]
        if name in ("fallback", "mul"):
            if any(k is not None or not _is_node(v) for k, v in args):
                raise _err(f"{where} takes only expressions as arguments")
            if len(nodes) < 2:
                raise _err(f"{where} needs at least 2 expressions; got {len(nodes)}")
            return Fallback(tuple(nodes)) if name == "fallback" else Mul(tuple(nodes))
        if name == "gate":
            if len(args) != 3:
                raise _err(f"{where} takes 3 arguments gate(PRED, A, B); got {len(args)}")
            (pk, pv), (k1, a), (k2, b) = args
            if _is_node(pv) or k1 is not None or k2 is not None or not _is_node(a) or not _is_node(b):
                raise _err(f"{where} must be written gate(PRED, A, B) with PRED a flag, pos=TAG or ids=[...]")
            return Gate(_make_pred(pv, pk, where), a, b)
        if name == "sharpen":
            pos = [v for k, v in args if k is None]
            kw = {k: v for k, v in args if k is not None}
            if set(kw) - {"t", "by"} or len(args) - ("by" in kw) != 2 or not pos or not _is_node(pos[0]):
                raise _err(f"{where} must be written sharpen(A, t) with A an expression and t > 0 "
                           "(optionally sharpen(A, t, by=[[t1, [ids..]], ..]))")
            t = kw.get("t", pos[1] if len(pos) > 1 else None)
            if _is_node(t):
                raise _err(f"{where}: the exponent t must be a number")
            return _make_sharpen(pos[0], t, kw.get("by"))
        if name == "mix":
            raise _err(f"{where}: write a mix as w1*A + w2*B")
        if nodes:
            raise _err(f"{where}: primitive {name} does not take expressions as arguments")
        if name == "recent":
            if len(args) != 1:
                raise _err(f"{where} takes one predicate, e.g. recent(punct) or recent(pos=NOUN); "
                           f"got {len(args)} arguments")
            k, v = args[0]
            return _checked(Prim("recent", (("pred", _make_pred(v, k, where)),)))
        positional = [v for k, v in args if k is None]
        keywords: dict[str, Any] = {}
        for k, v in args:
            if k is not None:
                if k in keywords:
                    raise _err(f"{where} got parameter {k!r} twice")
                keywords[k] = v
        if any(k is None for k, _ in args[len(positional):]):
            raise _err(f"{where}: positional arguments must come before keyword arguments")
        return _make_prim(name, positional, keywords)


_MAX_ARGS = MAX_NODES
# the most items the outer list of a parameter of each kind can hold (inner lists: MAX_IDS)
_KIND_LIST_LIMITS = {"weights": (MAX_PROFILE, "MAX_PROFILE"), "idclasses": (MAX_CLASSES, "MAX_CLASSES"),
                     "matrix": (MAX_CLASSES, "MAX_CLASSES"), "pairs": (MAX_PAIRS, "MAX_PAIRS")}


def _list_limit(name: str, param: str | int) -> tuple[int, str]:
    """The most items (and the bound's name) of a list for parameter ``param`` (keyword or position) of ``name``."""
    if name == "sharpen":
        return (MAX_CLASSES, "MAX_CLASSES")
    spec = PRIMITIVES.get(name, ())
    if isinstance(param, int):
        kind = spec[param][1] if param < len(spec) else ""
    else:
        kind = next((k for p, k, _ in spec if p == param), "")
    return _KIND_LIST_LIMITS.get(kind, (MAX_IDS, "MAX_IDS"))


def _is_node(v: Any) -> bool:
    return isinstance(v, (Prim, Mix, Fallback, Gate, Sharpen, Mul))


def _check_text_size(text: Any, what: str) -> None:
    """Refuse documents over MAX_TEXT_CHARS before reading them."""
    if len(text) > MAX_TEXT_CHARS:
        raise _err(f"{what} has {len(text)} characters; at most {MAX_TEXT_CHARS} are allowed (MAX_TEXT_CHARS): "
                   "a program this large is not a program")


def parse(text: str) -> Node:
    """Parse DSL text (e.g. ``0.7*prev(1) + 0.3*first()``) into a validated tree."""
    if not isinstance(text, str):
        raise _err(f"DSL text must be a string; got {type(text).__name__}")
    _check_text_size(text, "DSL text")
    if not text.strip():
        raise _err("empty DSL program; write an expression such as prev(1)")
    node = _Parser(text).parse()
    _measure(node, check=False)
    return _checked(node)


def _fmt_num(x: float | int) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def _fmt_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt_value(x) for x in v) + "]"
    if isinstance(v, str):
        return v if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", v) else json.dumps(v)
    return _fmt_num(v)


def _fmt_pred(p: Pred) -> str:
    if p.kind == "flag":
        return p.value
    if p.kind == "pos":
        return f"pos={p.value}"
    return f"ids={_fmt_value(p.value)}"


def to_text(node: Node) -> str:
    """Print a tree in the readable text form; ``parse(to_text(t)) == t`` (the tree is validated first)."""
    return _to_text(validate(node))


def _to_text(node: Node) -> str:
    """``to_text`` of a validated tree (recursion depth at most MAX_DEPTH)."""
    if isinstance(node, Prim):
        if node.name == "recent":
            return f"recent({_fmt_pred(node.param('pred'))})"
        if node.name in ("key_in_set", "match", "profile", "key_weight", "class_weight"):
            inner = ", ".join(f"{k}={_fmt_value(v)}" for k, v in node.params if v is not None)
        else:
            inner = ", ".join(_fmt_value(v) for _, v in node.params)
        return f"{node.name}({inner})"
    if isinstance(node, Mix):
        parts = []
        for w, t in node.terms:
            body = _to_text(t)
            if isinstance(t, Mix):
                body = f"({body})"
            parts.append(f"{_fmt_num(w)}*{body}")
        return " + ".join(parts)
    if isinstance(node, Fallback):
        return "fallback(" + ", ".join(_to_text(a) for a in node.args) + ")"
    if isinstance(node, Mul):
        return "mul(" + ", ".join(_to_text(a) for a in node.args) + ")"
    if isinstance(node, Gate):
        return f"gate({_fmt_pred(node.pred)}, {_to_text(node.then)}, {_to_text(node.other)})"
    if isinstance(node, Sharpen):
        if node.by:
            classes = ", ".join(f"[{_fmt_num(t)}, {_fmt_value(ids)}]" for t, ids in node.by)
            return f"sharpen({_to_text(node.arg)}, {_fmt_num(node.t)}, by=[{classes}])"
        return f"sharpen({_to_text(node.arg)}, {_fmt_num(node.t)})"
    raise TypeError(f"not a DSL node: {_show(node)}")


# --------------------------------------------------------------------------------------------
# JSON form
# --------------------------------------------------------------------------------------------

def _pred_to_json(p: Pred) -> Any:
    if p.kind == "flag":
        return p.value
    if p.kind == "pos":
        return {"pos": p.value}
    return {"ids": list(p.value)}


def _pred_from_json(obj: Any, where: str) -> Pred:
    if isinstance(obj, str):
        return _make_pred(obj, None, where)
    if isinstance(obj, dict) and len(obj) == 1:
        (k, v), = obj.items()
        return _make_pred(v, k, where)
    raise _err(f"{where}: a predicate is a flag name string, {{\"pos\": TAG}} or {{\"ids\": [...]}}; "
               f"got {_show(obj)}")


def _json_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, Pred):
        return _pred_to_json(v)
    return v


def to_json(node: Node) -> Any:
    """The JSON-serializable form (dicts, lists, numbers, strings); the tree is validated first."""
    return _to_json(validate(node))


def _to_json(node: Node) -> Any:
    """``to_json`` of a validated tree (recursion depth at most MAX_DEPTH)."""
    if isinstance(node, Prim):
        if not node.params:
            return {node.name: {}}
        if node.name in ("prev", "next"):
            return {node.name: node.params[0][1]}
        if node.name == "recent":
            return {"recent": _pred_to_json(node.param("pred"))}
        return {node.name: {k: _json_value(v) for k, v in node.params if v is not None}}
    if isinstance(node, Mix):
        return {"mix": [[w, _to_json(t)] for w, t in node.terms]}
    if isinstance(node, Fallback):
        return {"fallback": [_to_json(a) for a in node.args]}
    if isinstance(node, Mul):
        return {"mul": [_to_json(a) for a in node.args]}
    if isinstance(node, Gate):
        return {"gate": [_pred_to_json(node.pred), _to_json(node.then), _to_json(node.other)]}
    if isinstance(node, Sharpen):
        if node.by:
            return {"sharpen": [_to_json(node.arg), node.t, [[t, list(ids)] for t, ids in node.by]]}
        return {"sharpen": [_to_json(node.arg), node.t]}
    raise TypeError(f"not a DSL node: {_show(node)}")


def _json_nodes(body: Any, name: str, least: int, example: str) -> list:
    """The node list of a JSON mix/fallback/mul: ``least``..MAX_NODES entries, checked before reading them."""
    if not isinstance(body, list) or len(body) < least:
        raise _err(f"{name} expects a list of at least {least} {example}; got {_show(body)}")
    if len(body) > MAX_NODES:
        raise _err(f"{name} lists {len(body)} entries; {_NODES_MESSAGE}")
    return body


def _from_json(obj: Any, depth: int, budget: _Budget) -> Node:
    if depth > MAX_DEPTH:
        raise _err(_DEPTH_MESSAGE)
    if not isinstance(obj, dict) or len(obj) != 1:
        raise _err(
            "each DSL node is a JSON object with exactly one key (a primitive or combinator name), "
            f"e.g. {{\"prev\": 1}}; got {_show(obj)}"
        )
    budget.tick()
    (name, body), = obj.items()
    if name == "mix":
        terms = []
        for item in _json_nodes(body, "mix", 1, "[weight, node] pairs (non-empty list)"):
            if not isinstance(item, list) or len(item) != 2:
                raise _err(f"each mix term is [weight, node]; got {_show(item)}")
            terms.append((item[0], _from_json(item[1], depth + 1, budget)))
        return _make_mix(terms)
    if name in ("fallback", "mul"):
        args = tuple(_from_json(a, depth + 1, budget) for a in _json_nodes(body, name, 2, "nodes"))
        return Fallback(args) if name == "fallback" else Mul(args)
    if name == "gate":
        if not isinstance(body, list) or len(body) != 3:
            raise _err(f"gate expects [predicate, node, node]; got {_show(body)}")
        pred = _pred_from_json(body[0], "gate")
        return Gate(pred, _from_json(body[1], depth + 1, budget), _from_json(body[2], depth + 1, budget))
    if name == "sharpen":
        if not isinstance(body, list) or len(body) not in (2, 3):
            raise _err(f"sharpen expects [node, t] or [node, t, [[t1, [ids..]], ..]]; got {_show(body)}")
        return _make_sharpen(_from_json(body[0], depth + 1, budget), body[1], body[2] if len(body) == 3 else None)
    if name not in PRIMITIVES:
        raise _err(
            f"unknown primitive {_show(name)}; primitives: {', '.join(sorted(PRIMITIVES))}; "
            f"combinators: {', '.join(COMBINATORS)}"
        )
    if name == "recent":
        return _checked(Prim("recent", (("pred", _pred_from_json(body, "recent")),)))
    if body is None or (isinstance(body, (dict, list)) and not body):
        return _make_prim(name, [], {})
    if isinstance(body, dict):
        return _make_prim(name, [], body)
    if isinstance(body, list):
        return _make_prim(name, body, {})
    return _make_prim(name, [body], {})


def json_loads(text: str | bytes) -> Any:
    """Parse a JSON document of at most MAX_TEXT_CHARS characters; any failure is a ProgramValidationError."""
    _check_text_size(text, "DSL JSON")
    try:
        return json.loads(text)
    except RecursionError:
        raise _err(f"DSL JSON nests too deeply; a program nests at most {MAX_DEPTH} levels (MAX_DEPTH)") from None
    except json.JSONDecodeError as e:
        raise _err(f"DSL JSON does not parse: {excerpt(str(e))}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts, or bad UTF-8
        raise _err(f"DSL JSON does not parse: {excerpt(str(e))}; numbers need at most "
                   f"{MAX_LITERAL_CHARS} characters (MAX_LITERAL_CHARS)") from None


def from_json(obj: Any) -> Node:
    """Read the JSON form (a parsed object or a JSON string) into a validated tree."""
    if isinstance(obj, (str, bytes, bytearray)):
        obj = json_loads(obj)
    node = _from_json(obj, 1, _Budget())
    _measure(node, check=False)
    return _checked(node)


def canonical_json(node: Node) -> str:
    """Compact, key-sorted JSON text: the canonical form that program hashes are computed from (validated first)."""
    return json.dumps(to_json(node), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def features_needed(node: Node) -> frozenset[str]:
    """Names of the feature arrays (``batch_feature_arrays``) the program reads."""
    need: set[str] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        stack.extend(_children(cur))
        pred = cur.pred if isinstance(cur, Gate) else None
        if isinstance(cur, Prim):
            need.update(_PRIM_FEATURES.get(cur.name, ()))
            if cur.name == "recent":
                pred = cur.param("pred")
            if cur.name == "match":
                need.update(f for f in (cur.param("q"), cur.param("k")) if f not in ("token", "position"))
        if pred is not None and pred.kind == "flag":
            need.add(pred.value)
        elif pred is not None and pred.kind == "pos":
            need.add("pos")
    return frozenset(need)


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------

class _Context:
    """Padded arrays and feature lookups shared by one evaluation."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, features: Mapping[str, np.ndarray] | None,
                 causal: bool, pos_tags: Any) -> None:
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if ids.ndim != 2:
            raise ValueError(f"ids must be a padded [B, N] array; got shape {ids.shape}")
        lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
        if lengths.shape[0] != ids.shape[0]:
            raise ValueError(f"lengths has {lengths.shape[0]} entries for {ids.shape[0]} sequences")
        if lengths.size and (lengths.min() < 0 or lengths.max() > ids.shape[1]):
            raise ValueError(f"lengths must lie in [0, N={ids.shape[1]}]")
        self.ids, self.lengths, self.n = ids, lengths, int(ids.shape[1])
        self.features = features or {}
        self.causal = bool(causal)
        self._pos_tags = pos_tags
        self._cache: dict[str, np.ndarray] = {}
        self._free: list[np.ndarray] = []  # finished intermediate [B,N,N] buffers, reused (no page faults)

    def buf(self) -> np.ndarray | None:
        """A recycled [B,N,N] float32 buffer for a kernel to overwrite, or None (the kernel allocates)."""
        return self._free.pop() if self._free else None

    def release(self, arr: np.ndarray) -> None:
        """Hand back an intermediate result that is no longer needed."""
        self._free.append(arr)

    def feature(self, name: str) -> np.ndarray:
        if name == "token":
            return self.ids
        if name == "position":
            return np.ascontiguousarray(np.broadcast_to(np.arange(self.n, dtype=np.int64), self.ids.shape))
        if name in self._cache:
            return self._cache[name]
        if name not in self.features:
            raise ValueError(
                f"feature array {name!r} is needed but was not supplied (have: {sorted(self.features)}); "
                "pass features=batch_feature_arrays(sequences, names) or use Program.evaluate(sequences)"
            )
        arr = np.asarray(self.features[name])
        if arr.shape != self.ids.shape:
            raise ValueError(f"feature array {name!r} has shape {arr.shape}; expected {self.ids.shape} like ids")
        arr = np.ascontiguousarray(arr.astype(np.int64, copy=False))
        self._cache[name] = arr
        return arr

    def pos_tags(self) -> list[str]:
        if self._pos_tags is None:
            try:
                from .features import POS_TAGS
            except ImportError as e:  # pragma: no cover - depends on the features module
                raise ValueError(
                    "this program names POS tags but the tag list headsurgeon.synth.features.POS_TAGS "
                    f"is unavailable ({e}); pass pos_tags=[...] explicitly"
                ) from e
            self._pos_tags = list(POS_TAGS)
        return list(self._pos_tags)

    def tag_id(self, tag: str) -> int:
        tags = self.pos_tags()
        return tags.index(tag) if tag in tags else -(1 << 40)  # absent tag: matches nothing

    def pred_mask(self, pred: Pred) -> np.ndarray:
        if pred.kind == "flag":
            return np.ascontiguousarray(self.feature(pred.value) != 0)
        if pred.kind == "pos":
            return np.ascontiguousarray(self.feature("pos") == self.tag_id(pred.value))
        return np.ascontiguousarray(np.isin(self.ids, np.asarray(pred.value, dtype=np.int64)))


def _eval_prim(node: Prim, ctx: _Context) -> np.ndarray:
    name, L, n, c = node.name, ctx.lengths, ctx.n, ctx.causal
    if name == "self":
        return K.score_self(L, n, c, out=ctx.buf())
    if name == "first":
        return K.score_first(L, n, c, out=ctx.buf())
    if name == "uniform":
        return K.score_uniform(L, n, c, out=ctx.buf())
    if name == "none":
        return K.score_none(L, n, c, out=ctx.buf())
    if name == "prev":
        return K.score_prev(L, n, node.param("k"), c, out=ctx.buf())
    if name == "next":
        return K.score_next(L, n, node.param("k"), c, out=ctx.buf())
    if name == "window":
        return K.score_window(L, n, node.param("a"), node.param("b"), c, out=ctx.buf())
    if name == "decay":
        return K.score_decay(L, n, node.param("rate"), c, out=ctx.buf())
    if name == "same_token":
        return K.score_same_token(ctx.ids, L, c, out=ctx.buf())
    if name == "same_token_recent":
        return K.score_same_token_recent(ctx.ids, L, c, out=ctx.buf())
    if name == "induction":
        return K.score_induction(ctx.ids, L, c, out=ctx.buf())
    if name == "key_in_set":
        return K.score_keys(ctx.pred_mask(Pred("ids", node.param("ids"))), L, c, out=ctx.buf())
    if name == "recent":
        return K.score_recent(ctx.pred_mask(node.param("pred")), L, c, out=ctx.buf())
    if name == "sentence_start":
        return K.score_group_start(ctx.feature("sent"), L, c, out=ctx.buf())
    if name == "word_start":
        return K.score_group_start(ctx.feature("word"), L, c, out=ctx.buf())
    if name == "same_word":
        return K.score_same_group(ctx.feature("word"), L, c, out=ctx.buf())
    if name == "dep_head":
        return K.score_dep_head(ctx.feature("dep_head"), L, c, out=ctx.buf())
    if name == "dep_children":
        return K.score_dep_children(ctx.feature("dep_head"), L, c, out=ctx.buf())
    if name == "profile":
        bos = node.param("bos")
        return K.score_profile(L, n, np.asarray(node.param("w"), dtype=np.float32), node.param("tail"),
                               -1.0 if bos is None else bos, c, out=ctx.buf())
    if name == "key_weight":  # a class table with one query class and one key class per listed token
        table = node.param("w")
        tids = np.array([t for t, _ in table], dtype=np.int64)
        row = np.append(np.array([w for _, w in table], dtype=np.float32), np.float32(node.param("default")))
        idx = K.value_index(ctx.ids, tids)
        kc = np.where(idx >= 0, idx, len(tids))
        return K.score_class_table(np.zeros_like(kc), kc, row[None, :], L, c, out=ctx.buf())
    if name == "class_weight":
        qc, kc, table = class_tables(node, ctx.ids, ctx.ids)
        return K.score_class_table(qc, kc, table, L, c, out=ctx.buf())
    if name == "match":
        return _eval_match(node, ctx)
    raise AssertionError(name)


def class_tables(node: Prim, query_ids: np.ndarray, key_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query classes of ``query_ids``, key classes of ``key_ids`` and the padded table of ``class_weight``:
    the extra last row / column (tokens in no class) holds ``default``."""
    def classes_of(classes: tuple[tuple[int, ...], ...], ids: np.ndarray) -> np.ndarray:
        vocab = np.array([t for cls in classes for t in cls], dtype=np.int64)
        label = np.array([c for c, cls in enumerate(classes) for _ in cls], dtype=np.int64)
        order = np.argsort(vocab)
        idx = K.value_index(ids, vocab[order])
        return np.where(idx >= 0, label[order][np.maximum(idx, 0)], len(classes))

    q, k = node.param("q"), node.param("k")
    table = np.full((len(q) + 1, len(k) + 1), node.param("default"), dtype=np.float32)
    table[:-1, :-1] = np.asarray(node.param("w"), dtype=np.float32).reshape(len(q), len(k))
    return classes_of(q, query_ids), classes_of(k, key_ids), table


def _eval_match(node: Prim, ctx: _Context) -> np.ndarray:
    qf, kf = node.param("q"), node.param("k")

    def to_int(v: Any) -> int:
        return ctx.tag_id(v) if isinstance(v, str) else int(v)

    pairs = np.array([(to_int(a), to_int(b)) for a, b in node.param("pairs")], dtype=np.int64).reshape(-1, 2)
    qvocab, qinv = np.unique(pairs[:, 0], return_inverse=True)
    kvocab, kinv = np.unique(pairs[:, 1], return_inverse=True)
    table = np.zeros((qvocab.size, kvocab.size), dtype=np.bool_)
    table[qinv.reshape(-1), kinv.reshape(-1)] = True
    qidx = K.value_index(ctx.feature(qf), qvocab)
    kidx = K.value_index(ctx.feature(kf), kvocab)
    closest = node.param("select") == "closest"
    return K.score_match(qidx, kidx, table, ctx.lengths, closest, ctx.causal, out=ctx.buf())


def sharpen_exponents(node: Sharpen, ids: np.ndarray) -> np.ndarray:
    """float64 exponent per query token of ``sharpen(A, t, by=...)``: one sorted lookup, whatever the class count."""
    vocab = np.array([t for _, cls in node.by for t in cls], dtype=np.int64)
    exps = np.array([tk for tk, cls in node.by for _ in cls], dtype=np.float64)
    order = np.argsort(vocab, kind="stable")
    idx = K.value_index(ids, vocab[order])
    return np.ascontiguousarray(np.where(idx >= 0, exps[order][np.maximum(idx, 0)], float(node.t)))


def _eval(node: Node, ctx: _Context) -> np.ndarray:
    """Scores of a subtree: a fresh or recycled buffer the caller owns."""
    if isinstance(node, Prim):
        return _eval_prim(node, ctx)
    if isinstance(node, Mix):
        (w0, t0), rest = node.terms[0], node.terms[1:]
        out = _eval(t0, ctx)
        K.mix_scale(out, float(w0))
        for w, t in rest:
            part = _eval(t, ctx)
            K.mix_accumulate(out, part, float(w))
            ctx.release(part)
        return out
    if isinstance(node, Fallback):
        out = _eval(node.args[0], ctx)
        for alt in node.args[1:]:
            if not K.empty_rows(out).any():
                break
            part = _eval(alt, ctx)
            K.fallback_rows(out, part)
            ctx.release(part)
        return out
    if isinstance(node, Gate):
        qmask = ctx.pred_mask(node.pred)
        inside = np.arange(ctx.n)[None, :] < ctx.lengths[:, None]
        if not (qmask & inside).any():
            return _eval(node.other, ctx)
        out = _eval(node.then, ctx)
        if not (qmask | ~inside).all():
            part = _eval(node.other, ctx)
            K.gate_rows(qmask, out, part)
            ctx.release(part)
        return out
    if isinstance(node, Sharpen):
        out = _eval(node.arg, ctx)
        if node.by:
            K.sharpen_rows_by(out, sharpen_exponents(node, ctx.ids))
        else:
            K.sharpen_rows(out, float(node.t))
        return out
    if isinstance(node, Mul):
        out = _eval(node.args[0], ctx)
        for other in node.args[1:]:
            part = _eval(other, ctx)
            K.multiply(out, part)
            ctx.release(part)
        return out
    raise TypeError(f"not a DSL node: {node!r}")


# Intermediate [B,N,N] buffers left over from earlier evaluations, reused so that a tree costs one
# fresh allocation per call (first-touch page faults of fresh memory dominate simple programs).
SCRATCH_BYTES = 256 << 20
_scratch: list[np.ndarray] = []
_scratch_lock = threading.Lock()


def _take_scratch(shape: tuple[int, int, int]) -> list[np.ndarray]:
    with _scratch_lock:
        mine = [a for a in _scratch if a.shape == shape]
        _scratch[:] = [a for a in _scratch if a.shape != shape]
    return mine


def _give_scratch(arrays: list[np.ndarray]) -> None:
    with _scratch_lock:
        for a in arrays:
            if sum(x.nbytes for x in _scratch) + a.nbytes <= SCRATCH_BYTES:
                _scratch.append(a)


def clear_scratch() -> None:
    """Drop the reusable intermediate buffers (frees up to SCRATCH_BYTES)."""
    with _scratch_lock:
        _scratch.clear()


def evaluate_scores(node: Node, ids: np.ndarray, lengths: np.ndarray,
                    features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
                    pos_tags: Any = None, out: np.ndarray | None = None) -> np.ndarray:
    """Raw scores float32 [B,N,N] of a tree over padded ids/feature arrays (zero outside visible cells).

    ``out``: an optional C-contiguous float32 [B,N,N] buffer that receives the result (every cell is
    overwritten), e.g. a block buffer reused across many programs.
    """
    validate(node)
    ctx = _Context(ids, lengths, features, causal, pos_tags)
    shape = (ctx.ids.shape[0], ctx.n, ctx.n)
    if out is not None:
        out = K._buffer(out, shape)
    if shape[0] == 0 or ctx.n == 0:
        return np.zeros(shape, dtype=np.float32) if out is None else out
    # The first buffer a kernel takes always becomes the root's result (each combinator evaluates
    # the child it writes into first), so ``out`` goes on top of the stack.
    ctx._free = _take_scratch(shape) + ([out] if out is not None else [])
    try:
        with K.threads_for(shape[0] * ctx.n * ctx.n):
            result = _eval(node, ctx)
    finally:
        _give_scratch([a for a in ctx._free if a is not out])
    if out is not None and result is not out:  # defensive; not expected
        out[...] = result
        _give_scratch([result])
        result = out
    return result


def evaluate(node: Node, ids: np.ndarray, lengths: np.ndarray,
             features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
             pos_tags: Any = None, out: np.ndarray | None = None) -> np.ndarray:
    """Attention float32 [B,N,N]: ``normalize_scores`` applied to ``evaluate_scores`` (in place)."""
    scores = evaluate_scores(node, ids, lengths, features, causal, pos_tags, out)
    return normalize_scores(scores, lengths, causal, out=scores, masked=True)
