"""The DSL's bounds: every limit a program must meet, and the checks that enforce them while it is read.

Every parameter is bounded and every program has a cost bound, so that a program from anyone (a
checkpoint, programs.json, an LLM reply) does at most O(B x N x N x MAX_COST) work. ``KINDS`` maps each
parameter kind to its bound (as documented), its check and its placeholder in signatures; the spec
(headsurgeon/synth/dsl/spec.py) gives each parameter a kind. A violation is a ``ProgramValidationError`` naming the
parameter, the bound and the fix.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from ..errors import ProgramValidationError
from ..features import POS_TAGS
from .labels import dep_labels
from .nodes import NUMBERS, Pred
from .quote import _show

__all__ = [
    "MAX_OFFSET", "MAX_VALUE", "MAX_IDS", "MAX_CLASSES", "MAX_PAIRS", "MAX_PROFILE", "MAX_WEIGHT",
    "MAX_EXPONENT", "MAX_TEXT_CHARS", "MAX_LITERAL_CHARS", "MAX_DEPTH", "MAX_LIST_DEPTH", "MAX_NODES",
    "MAX_COST", "FLAGS", "MATCH_FEATURES", "KNOWN_POS_TAGS", "SELECTS", "Kind", "KINDS", "STRUCTURE_BOUNDS",
]

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
MAX_COST = 512  # the sum of the spec's costs over the tree

FLAGS = ("punct", "sent_end", "newline", "cap", "word_start", "quote")
MATCH_FEATURES = (
    "token", "position", "word", "sent", "pos", "punct", "cap", "newline", "sent_end",
    "word_start", "dep_head", "dep", "quote",
)
# how predicates are written, for error messages
_PRED_FORMS = "a flag ({flags}), pos=TAG, dep=LABEL, ids=[...], tokens=[\"..\"] or tok(\"..\")"
# POS tag names are validated against the one tag list of the library (headsurgeon/synth/features/spacy_views.py).
KNOWN_POS_TAGS: tuple[str, ...] = tuple(POS_TAGS)
SELECTS = ("closest", "all")


def _err(msg: str) -> ProgramValidationError:
    return ProgramValidationError(msg)


_DEPTH_MESSAGE = (f"program nests deeper than {MAX_DEPTH} levels (MAX_DEPTH); flatten it, e.g. one mix "
                  "of many terms instead of nested mixes")
_NODES_MESSAGE = (f"program has more than {MAX_NODES} nodes (MAX_NODES); use fewer terms or split it "
                  "into several programs")


class _Budget:
    """Counts the nodes a reader builds, stopping at MAX_NODES before the tree grows further."""

    def __init__(self) -> None:
        self.nodes = 0

    def tick(self, count: int = 1) -> None:
        self.nodes += count
        if self.nodes > MAX_NODES:
            raise _err(_NODES_MESSAGE)


def _check_text_size(text: Any, what: str) -> None:
    """Refuse documents over MAX_TEXT_CHARS before reading them."""
    if len(text) > MAX_TEXT_CHARS:
        raise _err(f"{what} has {len(text)} characters; at most {MAX_TEXT_CHARS} are allowed (MAX_TEXT_CHARS): "
                   "a program this large is not a program")


# --------------------------------------------------------------------------------------------
# value checks (shared by the text parser, the JSON reader and ``validate``)
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


_PLAIN_INT = frozenset((int,))


def _weights_array(value: Sequence, items: Iterable) -> np.ndarray | None:
    """``value`` (a row or a table) as float64 when every one of its ``items`` is a plain int or float, finite and in
    0..MAX_WEIGHT, checked at C speed (a fitted table holds thousands); None otherwise, so that the per-item checks
    name what is wrong."""
    if not set(map(type, items)) <= NUMBERS:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (OverflowError, ValueError, TypeError):
        return None
    if not (np.isfinite(arr).all() and (arr >= 0.0).all() and (arr <= MAX_WEIGHT).all()):
        return None
    return arr


def _plain_weights(values: Sequence) -> tuple[float, ...] | None:
    """``values`` as weights, checked in one pass (``_weights_array``); None: the per-item checks decide."""
    arr = _weights_array(values, values)
    return tuple(arr.tolist()) if arr is not None and arr.ndim == 1 else None


def _plain_ids(values: Sequence) -> list[int] | None:
    """``values`` when every one is a plain int in 0..MAX_VALUE (checked at C speed); None otherwise."""
    if not values or not set(map(type, values)) <= _PLAIN_INT or min(values) < 0 or max(values) > MAX_VALUE:
        return None
    return list(values)


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
    plain = _plain_ids(value)
    ids = sorted(set(plain) if plain is not None else {_as_int(v, f"{what} entry") for v in value})
    if ids[0] < 0:
        raise _err(f"{what} must hold token ids >= 0; got {ids[0]}")
    return tuple(ids)


def _as_pos_tag(value: Any, what: str) -> str:
    """A known POS tag name, upper-cased."""
    if not isinstance(value, str) or len(value) > MAX_LITERAL_CHARS or value.upper() not in KNOWN_POS_TAGS:
        raise _err(f"{what} must be a POS tag, one of {', '.join(KNOWN_POS_TAGS)}; got {_show(value)}")
    return value.upper()


def _as_dep_label(value: Any, what: str) -> str:
    """A known dependency label, in the label list's spelling (matched case-insensitively)."""
    labels = dep_labels()
    if isinstance(value, str) and len(value) <= MAX_LITERAL_CHARS:
        if value in labels:
            return value
        folded = {lab.lower(): lab for lab in labels}
        if value.lower() in folded:
            return folded[value.lower()]
    raise _err(f"{what} must be a dependency label, one of {', '.join(labels)}; got {_show(value)}")


def _pair_value(value: Any, feature: str | None, what: str) -> Any:
    if feature == "pos" and isinstance(value, str):
        return _as_pos_tag(value, what)
    if feature == "dep" and isinstance(value, str):
        return _as_dep_label(value, what)
    return _as_int(value, what)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, int) else (1, 0, value)


def _check_weights(value: Any, what: str) -> tuple[float, ...]:
    """profile(w=...): 1..MAX_PROFILE weights."""
    _as_list(value, what, MAX_PROFILE, "MAX_PROFILE", "w=[1, 0.5]", "weights")
    return _plain_weights(value) or tuple(_as_weight(x, f"{what} weight") for x in value)


def _check_idweights(value: Any, what: str) -> tuple[tuple[int, float], ...]:
    """key_weight(w=...): 1..MAX_IDS [token id, weight] entries, each id once."""
    _as_list(value, what, MAX_IDS, "MAX_IDS", "w=[[13, 2.5]]", "[token id, weight] entries")
    if all(type(item) in (list, tuple) and len(item) == 2 for item in value):
        ids, weights = _plain_ids([item[0] for item in value]), _plain_weights([item[1] for item in value])
        if ids is not None and weights is not None and len(set(ids)) == len(ids):
            return tuple(sorted(zip(ids, weights)))
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
    plain = _plain_classes(value)
    if plain is not None:
        return plain
    classes: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for c, item in enumerate(value):
        ids = _check_class_ids(item, f"{what} class {c}", seen)
        classes.append(ids)
    return tuple(classes)


def _plain_classes(value: Sequence) -> tuple[tuple[int, ...], ...] | None:
    """``value``'s classes, each sorted, when they are non-empty lists of plain ints in 0..MAX_VALUE with no id
    twice and MAX_IDS in all, checked in one C pass; None otherwise (the class checks then name what is wrong)."""
    if not all(type(c) in (list, tuple) and c for c in value):
        return None
    flat = list(chain.from_iterable(value))
    if len(flat) > MAX_IDS or _plain_ids(flat) is None or len(set(flat)) != len(flat):
        return None
    return tuple(tuple(sorted(c)) for c in value)


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
    plain = _plain_matrix(value, nk)
    if plain is not None:
        return plain
    return tuple(_plain_weights(r) or tuple(_as_weight(x, f"{what} weight") for x in r) for r in value)


def _plain_matrix(rows: Sequence, width: int) -> tuple[tuple[float, ...], ...] | None:
    """``rows`` (each ``width`` long) as weights, checked in one pass over the whole table (``_weights_array``);
    None: the row checks decide."""
    arr = _weights_array(rows, chain.from_iterable(rows)) if rows and width else None
    return tuple(map(tuple, arr.tolist())) if arr is not None else None


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


def _check_pred(pred: Pred, where: str) -> Pred:
    """A predicate built in code: a known flag, POS tag or dependency label, or 1..MAX_IDS token ids."""
    if pred.kind == "flag" and isinstance(pred.value, str) and pred.value in FLAGS:
        return pred
    if pred.kind == "pos":
        return Pred("pos", _as_pos_tag(pred.value, f"{where} pos="))
    if pred.kind == "dep":
        return Pred("dep", _as_dep_label(pred.value, f"{where} dep="))
    if pred.kind == "ids":
        return Pred("ids", _as_ids(pred.value, f"{where} ids="))
    raise _err(f"{where}: expected a predicate: {_PRED_FORMS.format(flags=', '.join(FLAGS))}; "
               f"got {_show(pred.kind)}={_show(pred.value)}")


def _make_pred(value: Any, key: str | None, where: str) -> Pred:
    """Build a predicate from a bare flag name (key None) or a keyword pos=TAG / dep=LABEL / ids=[...]."""
    if key is None:
        if isinstance(value, str) and value in FLAGS:
            return Pred("flag", value)
        raise _err(f"{where}: expected a predicate: {_PRED_FORMS.format(flags=', '.join(FLAGS))}; "
                   f"got {_show(value)}")
    if key == "pos":
        return Pred("pos", _as_pos_tag(value, f"{where} pos="))
    if key == "dep":
        return Pred("dep", _as_dep_label(value, f"{where} dep="))
    if key == "ids":
        return Pred("ids", _as_ids(value, f"{where} ids="))
    if key == "pred":
        if isinstance(value, Pred):
            return _check_pred(value, where)
        return _make_pred(value, None, where)
    raise _err(f"{where}: unknown predicate {_show(key)}=...; use {_PRED_FORMS.format(flags=', '.join(FLAGS))}")


def _mix_weight(w: Any) -> float:
    """A mix weight: 0 < w <= MAX_WEIGHT."""
    wf = _as_float(w, "mix weight")
    if wf <= 0.0:
        raise _err(f"mix weights must be > 0 (components are row-normalized and added); got {wf}")
    if wf > MAX_WEIGHT:
        raise _err(f"mix weights must be at most {MAX_WEIGHT:g} (MAX_WEIGHT; scores are float32); got {wf}")
    return wf


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


# --------------------------------------------------------------------------------------------
# parameter kinds: the bound, the check and the signature placeholder of each
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """A parameter kind: its documented bound, its check (value, what, other params) and its placeholder."""

    bound: str
    check: Callable[[Any, str, Mapping[str, Any]], Any]
    placeholder: str
    list_limit: tuple[int, str] = (MAX_IDS, "MAX_IDS")  # most items of the outer list, for the text reader


def _check_rate(value: Any, what: str, others: Mapping[str, Any]) -> float:
    v = _as_float(value, what)
    if not 0.0 < v <= 1.0:
        raise _err(f"{what} must lie in (0, 1]; got {v}")
    return v


def _check_pred_param(value: Any, what: str, others: Mapping[str, Any]) -> Pred:
    if not isinstance(value, Pred):
        raise _err(f"{what} must be a predicate ({_PRED_FORMS.format(flags=', '.join(FLAGS))}); got {_show(value)}")
    return _check_pred(value, what)


KINDS: dict[str, Kind] = {
    "offset": Kind("1 <= k <= MAX_OFFSET (4096)", lambda v, what, o: _as_offset(v, what, 1), "k"),
    "int": Kind("-MAX_OFFSET (-4096) <= a <= b <= MAX_OFFSET (4096)",
                lambda v, what, o: _as_offset(v, what, -MAX_OFFSET), "d"),
    "rate": Kind("0 < rate <= 1", _check_rate, "rate"),
    "ids": Kind("1 to MAX_IDS (65536) token ids, each 0..MAX_VALUE (2**30)", lambda v, what, o: _as_ids(v, what),
                "[..]"),
    "pred": Kind("a flag, a POS tag, a dependency label, or ids=[..] of 1 to MAX_IDS (65536) token ids",
                 _check_pred_param, "PRED"),
    "feature": Kind("one of MATCH_FEATURES",
                    lambda v, what, o: _check_choice(v, what, MATCH_FEATURES, "a feature"), "F"),
    "select": Kind("closest or all", lambda v, what, o: _check_choice(v, what, SELECTS, "a selection mode"),
                   "|".join(SELECTS)),
    "nonneg": Kind("0 <= x <= MAX_WEIGHT (1e30)", lambda v, what, o: _as_weight(v, what), "x"),
    "optnonneg": Kind("absent, or 0 <= x <= MAX_WEIGHT (1e30)",
                      lambda v, what, o: None if v is None else _as_weight(v, what), "x"),
    "weights": Kind("1 to MAX_PROFILE (4096) weights, each 0..MAX_WEIGHT (1e30)",
                    lambda v, what, o: _check_weights(v, what), "[w0, ..]", (MAX_PROFILE, "MAX_PROFILE")),
    "idweights": Kind("1 to MAX_IDS (65536) [token id, weight] entries",
                      lambda v, what, o: _check_idweights(v, what), "[[id, x], ..]"),
    "idclasses": Kind("1 to MAX_CLASSES (256) disjoint classes, MAX_IDS (65536) token ids in all",
                      lambda v, what, o: _check_idclasses(v, what), "[[ids..], ..]", (MAX_CLASSES, "MAX_CLASSES")),
    "matrix": Kind("len(q) rows of len(k) weights (at most 256 x 256), each 0..MAX_WEIGHT (1e30)", _check_matrix,
                   "[[x, ..], ..]", (MAX_CLASSES, "MAX_CLASSES")),
    "pairs": Kind("1 to MAX_PAIRS (4096) pairs of values within +-MAX_VALUE (2**30)", _check_pairs,
                  "[[qv, kv], ..]", (MAX_PAIRS, "MAX_PAIRS")),
}

# Limits on a whole program (what, bound), as documented next to the parameter bounds.
STRUCTURE_BOUNDS: tuple[tuple[str, str], ...] = (
    ("program text or JSON document", f"at most MAX_TEXT_CHARS ({MAX_TEXT_CHARS:,}) characters"),
    ("one number, name or string literal", f"at most MAX_LITERAL_CHARS ({MAX_LITERAL_CHARS}) characters"),
    ("nesting", f"MAX_DEPTH ({MAX_DEPTH}) expressions, MAX_LIST_DEPTH ({MAX_LIST_DEPTH}) levels of [lists]"),
    ("size", f"at most MAX_NODES ({MAX_NODES}) nodes"),
    ("cost", f"at most MAX_COST ({MAX_COST}) (``cost``: estimated passes over the score cells)"),
)
