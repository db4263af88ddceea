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
"""
from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from headsurgeon.kernels import primitives as K
from headsurgeon.kernels.normalize import normalize_scores

from .errors import ProgramValidationError

__all__ = [
    "Prim", "Mix", "Fallback", "Gate", "Sharpen", "Mul", "Pred", "Node",
    "parse", "to_text", "from_json", "to_json", "canonical_json", "features_needed",
    "evaluate_scores", "evaluate", "PRIMITIVES", "COMBINATORS", "FLAGS", "MATCH_FEATURES",
    "KNOWN_POS_TAGS", "clear_scratch",
]

MAX_DEPTH = 64
MAX_NODES = 20_000
MAX_OFFSET = 1 << 30
MAX_WEIGHTS = 100_000
MAX_WEIGHT = 1e30

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
# parameter checking (shared by the text parser and the JSON reader)
# --------------------------------------------------------------------------------------------

def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _err(f"{what} must be an integer; got {value!r}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise _err(f"{what} must be an integer; got {value!r}")
    v = int(value)
    if abs(v) > MAX_OFFSET:
        raise _err(f"{what} must lie within +-{MAX_OFFSET}; got {v}")
    return v


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _err(f"{what} must be a number; got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise _err(f"{what} must be finite; got {v!r}")
    return v


def _as_weight(value: Any, what: str) -> float:
    """A score weight: finite, >= 0 and at most MAX_WEIGHT (kernels compute in float32)."""
    v = _as_float(value, what)
    if v < 0.0:
        raise _err(f"{what} must be >= 0; got {v}")
    if v > MAX_WEIGHT:
        raise _err(f"{what} must be at most {MAX_WEIGHT:g} (scores are float32); got {v}")
    return v


def _as_ids(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise _err(f"{what} must be a non-empty list of token ids, e.g. ids=[3, 17]; got {value!r}")
    ids = sorted({_as_int(v, f"{what} entry") for v in value})
    if ids[0] < 0:
        raise _err(f"{what} must hold token ids >= 0; got {ids[0]}")
    return tuple(ids)


def _as_pos_tag(value: Any, what: str) -> str:
    if not isinstance(value, str) or value.upper() not in KNOWN_POS_TAGS:
        raise _err(f"{what} must be a POS tag, one of {', '.join(KNOWN_POS_TAGS)}; got {value!r}")
    return value.upper()


def _pair_value(value: Any, feature: str, what: str) -> Any:
    if feature == "pos" and isinstance(value, str):
        return _as_pos_tag(value, what)
    return _as_int(value, what)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, int) else (1, 0, value)


def _check_param(prim: str, name: str, kind: str, value: Any, others: Mapping[str, Any]) -> Any:
    """Validate and canonicalize one parameter value."""
    what = f"{prim}({name}=...)"
    if kind == "offset":
        v = _as_int(value, what)
        if v < 1:
            raise _err(f"{what} needs an offset >= 1 (use self() for offset 0); got {v}")
        return v
    if kind == "int":
        return _as_int(value, what)
    if kind == "rate":
        v = _as_float(value, what)
        if not 0.0 < v <= 1.0:
            raise _err(f"{what} must lie in (0, 1]; got {v}")
        return v
    if kind == "ids":
        return _as_ids(value, what)
    if kind == "pred":
        if not isinstance(value, Pred):
            raise _err(f"{what} must be a predicate ({', '.join(FLAGS)}, pos=TAG or ids=[...]); got {value!r}")
        return value
    if kind == "feature":
        if not isinstance(value, str) or value not in MATCH_FEATURES:
            raise _err(f"{what} must be a feature, one of {', '.join(MATCH_FEATURES)}; got {value!r}")
        return value
    if kind == "nonneg" or (kind == "optnonneg" and value is not None):
        return _as_weight(value, what)
    if kind == "optnonneg":
        return None
    if kind == "weights":
        if not isinstance(value, (list, tuple)) or not value:
            raise _err(f"{what} must be a non-empty list of weights >= 0, e.g. w=[1, 0.5]; got {value!r:.200}")
        if len(value) > MAX_WEIGHTS:
            raise _err(f"{what} lists {len(value)} weights; at most {MAX_WEIGHTS} are allowed")
        return tuple(_as_weight(x, f"{what} weight") for x in value)
    if kind == "idweights":
        if not isinstance(value, (list, tuple)) or not value:
            raise _err(f"{what} must be a non-empty list of [token id, weight] pairs, e.g. w=[[13, 2.5]]; "
                       f"got {value!r:.200}")
        if len(value) > MAX_WEIGHTS:
            raise _err(f"{what} lists {len(value)} token weights; at most {MAX_WEIGHTS} are allowed")
        table: dict[int, float] = {}
        for item in value:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise _err(f"{what}: each entry must be [token id, weight]; got {item!r}")
            tid = _as_int(item[0], f"{what} token id")
            if tid < 0:
                raise _err(f"{what} token ids must be >= 0; got {tid}")
            wt = _as_weight(item[1], f"{what} weight for token {tid}")
            if tid in table:
                raise _err(f"{what} lists token id {tid} twice")
            table[tid] = wt
        return tuple(sorted(table.items()))
    if kind == "idclasses":
        if not isinstance(value, (list, tuple)) or not value:
            raise _err(f"{what} must be a non-empty list of token classes (lists of ids), e.g. [[3, 17], [5]]; "
                       f"got {value!r:.200}")
        classes, seen = [], set()
        for c, item in enumerate(value):
            ids = _as_ids(item, f"{what} class {c}")
            clash = seen.intersection(ids)
            if clash:
                raise _err(f"{what} lists token id {min(clash)} in two classes; the classes must be disjoint")
            seen.update(ids)
            classes.append(ids)
        if len(seen) > MAX_WEIGHTS:
            raise _err(f"{what} lists {len(seen)} token ids; at most {MAX_WEIGHTS} are allowed")
        return tuple(classes)
    if kind == "matrix":
        nq, nk = len(others.get("q", ())), len(others.get("k", ()))
        if (not isinstance(value, (list, tuple)) or len(value) != nq
                or any(not isinstance(r, (list, tuple)) or len(r) != nk for r in value)):
            raise _err(f"{what} must be a table of {nq} rows (query classes) of {nk} weights (key classes) "
                       f"each; got {value!r:.200}")
        return tuple(tuple(_as_weight(x, f"{what} weight") for x in r) for r in value)
    if kind == "select":
        if value not in SELECTS:
            raise _err(f"{what} must be one of {', '.join(SELECTS)}; got {value!r}")
        return value
    if kind == "pairs":
        if not isinstance(value, (list, tuple)) or not value:
            raise _err(f"{what} must be a non-empty list of [query value, key value] pairs; got {value!r}")
        qf, kf = others.get("q"), others.get("k")
        pairs = set()
        for pair in value:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise _err(f"{what}: each pair must be [query value, key value]; got {pair!r}")
            pairs.add((_pair_value(pair[0], qf, f"{what} query value"),
                       _pair_value(pair[1], kf, f"{what} key value")))
        return tuple(sorted(pairs, key=lambda p: (_sort_key(p[0]), _sort_key(p[1]))))
    raise AssertionError(kind)


def _make_prim(name: str, positional: list[Any], keywords: dict[str, Any]) -> Prim:
    """Bind positional/keyword arguments to a primitive's parameters, with clear errors."""
    if name not in PRIMITIVES:
        raise _err(
            f"unknown primitive {name!r}; primitives: {', '.join(sorted(PRIMITIVES))}; "
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
            raise _err(f"{name}() has no parameter {key!r}; its signature is {name}({sig})")
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
    return Prim(name, tuple(params))


def _make_pred(value: Any, key: str | None, where: str) -> Pred:
    """Build a predicate from a bare flag name (key None) or a keyword pos=TAG / ids=[...]."""
    if key is None:
        if isinstance(value, str) and value in FLAGS:
            return Pred("flag", value)
        raise _err(
            f"{where}: expected a predicate: a flag ({', '.join(FLAGS)}), pos=TAG or ids=[...]; got {value!r}"
        )
    if key == "pos":
        return Pred("pos", _as_pos_tag(value, f"{where} pos="))
    if key == "ids":
        return Pred("ids", _as_ids(value, f"{where} ids="))
    if key == "pred":
        if isinstance(value, Pred):
            return value
        return _make_pred(value, None, where)
    raise _err(f"{where}: unknown predicate {key}=...; use a flag ({', '.join(FLAGS)}), pos=TAG or ids=[...]")


def _make_mix(terms: list[tuple[Any, Any]]) -> Mix:
    if not terms:
        raise _err("mix needs at least one [weight, expression] term")
    out = []
    for w, node in terms:
        wf = _as_float(w, "mix weight")
        if wf <= 0.0:
            raise _err(f"mix weights must be > 0 (components are row-normalized and added); got {wf}")
        out.append((wf, node))
    return Mix(tuple(out))


def _make_sharpen(arg: Any, t: Any, by: Any = None) -> Sharpen:
    tf = _as_float(t, "sharpen(A, t) exponent t")
    if tf <= 0.0:
        raise _err(f"sharpen(A, t) needs t > 0; got {tf}")
    if by is None or (isinstance(by, (list, tuple)) and not by):
        return Sharpen(arg, tf)
    if not isinstance(by, (list, tuple)):
        raise _err(f"sharpen(A, t, by=...) expects a list of [t, [token ids]] classes; got {by!r:.200}")
    classes = []
    seen: set[int] = set()
    for item in by:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise _err(f"sharpen(A, t, by=...): each class is [t, [token ids]]; got {item!r:.200}")
        tk = _as_float(item[0], "sharpen(A, t, by=...) class exponent")
        if tk <= 0.0:
            raise _err(f"sharpen(A, t, by=...) class exponents must be > 0; got {tk}")
        ids = _as_ids(item[1], "sharpen(A, t, by=...) class ids")
        clash = seen.intersection(ids)
        if clash:
            raise _err(f"sharpen(A, t, by=...) lists token id {min(clash)} in two classes; the classes must be disjoint")
        seen.update(ids)
        classes.append((tk, ids))
    return Sharpen(arg, tf, tuple(sorted(classes)))


def _check_size(node: Node) -> None:
    """Reject trees deeper than MAX_DEPTH or larger than MAX_NODES."""
    count = 0
    stack = [(node, 1)]
    while stack:
        cur, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise _err(f"program nests deeper than {MAX_DEPTH} levels")
        if count > MAX_NODES:
            raise _err(f"program has more than {MAX_NODES} nodes")
        stack.extend((c, depth + 1) for c in _children(cur))


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
# text form
# --------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
      | (?P<str>"[^"\\]*"|'[^'\\]*')
      | (?P<op>[()\[\],=*+-])
    )""",
    re.VERBOSE,
)


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[tuple[str, Any, int]] = []
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            m = _TOKEN_RE.match(text, pos)
            if not m or m.end() == pos:
                raise _err(f"unexpected character {text[pos]!r} at column {pos + 1} in {text!r}")
            kind = m.lastgroup
            raw = m.group(kind)
            col = m.start(kind)
            if kind == "num":
                val: Any = int(raw) if raw.isdigit() else float(raw)
            elif kind == "str":
                val = raw[1:-1]
            else:
                val = raw
            self.toks.append((kind, val, col))
            pos = m.end()
        self.i = 0

    def peek(self, ahead: int = 0) -> tuple[str, Any, int]:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else ("eof", None, len(self.text))

    def next(self) -> tuple[str, Any, int]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, op: str) -> None:
        kind, val, col = self.next()
        if kind != "op" or val != op:
            shown = "end of input" if kind == "eof" else repr(val)
            raise _err(f"expected {op!r} at column {col + 1}, found {shown} in {self.text!r}")

    def at_op(self, op: str, ahead: int = 0) -> bool:
        kind, val, _ = self.peek(ahead)
        return kind == "op" and val == op


class _Parser:
    def __init__(self, text: str) -> None:
        self.lx = _Lexer(text)
        self.depth = 0

    def parse(self) -> Node:
        node = self.expr()
        kind, val, col = self.lx.peek()
        if kind != "eof":
            raise _err(f"unexpected {val!r} at column {col + 1} after a complete expression in {self.lx.text!r}")
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _err(f"program nests deeper than {MAX_DEPTH} levels")
        terms = [self.term()]
        while self.lx.at_op("+"):
            self.lx.next()
            terms.append(self.term())
        self.depth -= 1
        if len(terms) == 1 and terms[0][0] is None:
            return terms[0][1]
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
        args = self.arglist()
        return self.build(val, args, col)

    def arglist(self) -> list[tuple[str | None, Any]]:
        """Arguments as (keyword or None, value); values are nodes, literals or ('ident', name)."""
        args: list[tuple[str | None, Any]] = []
        if self.lx.at_op(")"):
            self.lx.next()
            return args
        while True:
            kind, val, col = self.lx.peek()
            if kind == "name" and self.lx.at_op("=", 1):
                self.lx.next()
                self.lx.next()
                args.append((val, self.literal()))
            elif kind == "name" and self.lx.at_op("(", 1):
                args.append((None, self.expr()))
            elif kind == "num" and self.lx.at_op("*", 1):
                args.append((None, self.expr()))
            elif kind == "op" and val == "(":
                args.append((None, self.expr()))
            else:
                lit = self.literal()
                if isinstance(lit, (int, float)) and self.lx.at_op("+"):
                    raise _err(f"unexpected '+' after {lit} at column {col + 1}")
                args.append((None, lit))
            if self.lx.at_op(","):
                self.lx.next()
                continue
            self.lx.expect(")")
            return args

    def literal(self) -> Any:
        kind, val, col = self.lx.next()
        if kind == "op" and val == "-":
            kind, val, col = self.lx.next()
            if kind != "num":
                raise _err(f"expected a number after '-' at column {col + 1}")
            return -val
        if kind in ("num", "name", "str"):
            return val
        if kind == "op" and val == "[":
            items = []
            if self.lx.at_op("]"):
                self.lx.next()
                return items
            while True:
                items.append(self.literal())
                if self.lx.at_op(","):
                    self.lx.next()
                    continue
                self.lx.expect("]")
                return items
        shown = "end of input" if kind == "eof" else repr(val)
        raise _err(f"expected a value (number, name or [list]) at column {col + 1}, found {shown}")

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
            return Prim("recent", (("pred", _make_pred(v, k, where)),))
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


def _is_node(v: Any) -> bool:
    return isinstance(v, (Prim, Mix, Fallback, Gate, Sharpen, Mul))


def parse(text: str) -> Node:
    """Parse DSL text (e.g. ``0.7*prev(1) + 0.3*first()``) into a validated tree."""
    if not isinstance(text, str):
        raise _err(f"DSL text must be a string; got {type(text).__name__}")
    if not text.strip():
        raise _err("empty DSL program; write an expression such as prev(1)")
    node = _Parser(text).parse()
    _check_size(node)
    return node


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
    """Print a tree in the readable text form; ``parse(to_text(t)) == t``."""
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
            body = to_text(t)
            if isinstance(t, Mix):
                body = f"({body})"
            parts.append(f"{_fmt_num(w)}*{body}")
        return " + ".join(parts)
    if isinstance(node, Fallback):
        return "fallback(" + ", ".join(to_text(a) for a in node.args) + ")"
    if isinstance(node, Mul):
        return "mul(" + ", ".join(to_text(a) for a in node.args) + ")"
    if isinstance(node, Gate):
        return f"gate({_fmt_pred(node.pred)}, {to_text(node.then)}, {to_text(node.other)})"
    if isinstance(node, Sharpen):
        if node.by:
            classes = ", ".join(f"[{_fmt_num(t)}, {_fmt_value(ids)}]" for t, ids in node.by)
            return f"sharpen({to_text(node.arg)}, {_fmt_num(node.t)}, by=[{classes}])"
        return f"sharpen({to_text(node.arg)}, {_fmt_num(node.t)})"
    raise TypeError(f"not a DSL node: {node!r}")


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
    raise _err(f"{where}: a predicate is a flag name string, {{\"pos\": TAG}} or {{\"ids\": [...]}}; got {obj!r}")


def _json_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, Pred):
        return _pred_to_json(v)
    return v


def to_json(node: Node) -> Any:
    """The JSON-serializable form (dicts, lists, numbers, strings)."""
    if isinstance(node, Prim):
        if not node.params:
            return {node.name: {}}
        if node.name in ("prev", "next"):
            return {node.name: node.params[0][1]}
        if node.name == "recent":
            return {"recent": _pred_to_json(node.param("pred"))}
        return {node.name: {k: _json_value(v) for k, v in node.params if v is not None}}
    if isinstance(node, Mix):
        return {"mix": [[w, to_json(t)] for w, t in node.terms]}
    if isinstance(node, Fallback):
        return {"fallback": [to_json(a) for a in node.args]}
    if isinstance(node, Mul):
        return {"mul": [to_json(a) for a in node.args]}
    if isinstance(node, Gate):
        return {"gate": [_pred_to_json(node.pred), to_json(node.then), to_json(node.other)]}
    if isinstance(node, Sharpen):
        if node.by:
            return {"sharpen": [to_json(node.arg), node.t, [[t, list(ids)] for t, ids in node.by]]}
        return {"sharpen": [to_json(node.arg), node.t]}
    raise TypeError(f"not a DSL node: {node!r}")


def _from_json(obj: Any, depth: int) -> Node:
    if depth > MAX_DEPTH:
        raise _err(f"program nests deeper than {MAX_DEPTH} levels")
    if not isinstance(obj, dict) or len(obj) != 1:
        raise _err(
            "each DSL node is a JSON object with exactly one key (a primitive or combinator name), "
            f"e.g. {{\"prev\": 1}}; got {obj!r:.200}"
        )
    (name, body), = obj.items()
    if name == "mix":
        if not isinstance(body, list) or not body:
            raise _err(f"mix expects a non-empty list of [weight, node] pairs; got {body!r:.200}")
        terms = []
        for item in body:
            if not isinstance(item, list) or len(item) != 2:
                raise _err(f"each mix term is [weight, node]; got {item!r:.200}")
            terms.append((item[0], _from_json(item[1], depth + 1)))
        return _make_mix(terms)
    if name in ("fallback", "mul"):
        if not isinstance(body, list) or len(body) < 2:
            raise _err(f"{name} expects a list of at least 2 nodes; got {body!r:.200}")
        args = tuple(_from_json(a, depth + 1) for a in body)
        return Fallback(args) if name == "fallback" else Mul(args)
    if name == "gate":
        if not isinstance(body, list) or len(body) != 3:
            raise _err(f"gate expects [predicate, node, node]; got {body!r:.200}")
        return Gate(_pred_from_json(body[0], "gate"), _from_json(body[1], depth + 1), _from_json(body[2], depth + 1))
    if name == "sharpen":
        if not isinstance(body, list) or len(body) not in (2, 3):
            raise _err(f"sharpen expects [node, t] or [node, t, [[t1, [ids..]], ..]]; got {body!r:.200}")
        return _make_sharpen(_from_json(body[0], depth + 1), body[1], body[2] if len(body) == 3 else None)
    if name not in PRIMITIVES:
        raise _err(
            f"unknown primitive {name!r}; primitives: {', '.join(sorted(PRIMITIVES))}; "
            f"combinators: {', '.join(COMBINATORS)}"
        )
    if name == "recent":
        return Prim("recent", (("pred", _pred_from_json(body, "recent")),))
    if body is None or body == {} or body == []:
        return _make_prim(name, [], {})
    if isinstance(body, dict):
        return _make_prim(name, [], dict(body))
    if isinstance(body, list):
        return _make_prim(name, list(body), {})
    return _make_prim(name, [body], {})


def from_json(obj: Any) -> Node:
    """Read the JSON form (a parsed object or a JSON string) into a validated tree."""
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as e:
            raise _err(f"DSL JSON does not parse: {e}") from None
    node = _from_json(obj, 1)
    _check_size(node)
    return node


def canonical_json(node: Node) -> str:
    """Compact, key-sorted JSON text: the canonical form that program hashes are computed from."""
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
            texp = np.full(ctx.ids.shape, node.t, dtype=np.float64)
            for tk, ids in node.by:
                texp[np.isin(ctx.ids, np.asarray(ids, dtype=np.int64))] = tk
            K.sharpen_rows_by(out, texp)
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
