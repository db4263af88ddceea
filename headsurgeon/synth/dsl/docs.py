"""Documents derived from the spec: the markdown tables of the module docs, the LLM prompt's DSL
reference, and ``gloss``, which fills the spec's English templates for a whole tree.

Nothing here is written by hand per primitive: a primitive registered in the spec (headsurgeon/synth/dsl/spec.py)
appears in every table, in the prompt and in glosses at once.
"""
from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from typing import Any

from .bounds import FLAGS, KINDS, KNOWN_POS_TAGS, MATCH_FEATURES, STRUCTURE_BOUNDS
from .labels import POS_WORDS, dep_labels
from .nodes import Node, Pred, Prim
from .spec import COMBINATOR_SPECS, PRIMITIVE_SPECS, PrimitiveSpec, require_combinator
from .tokens import token_string
from ...core.vocabulary import TokenVocabulary

__all__ = ["primitives_table", "combinators_table", "bounds_table", "render_tables", "reference_text",
           "gloss", "template_fields"]

PREDICATES = (f"a flag ({', '.join(FLAGS)}; quote: inside a quoted span); a POS tag pos=NOUN; a dependency "
              "relation dep=nsubj; or a token set ids=[3, 17], written with the model's vocabulary as "
              'tokens=["▁the", "▁a"] or tok("Lily") (in JSON: "punct", {"pos": "NOUN"}, {"dep": "nsubj"}, '
              '{"ids": [3, 17]})')
MASK_NOTE = "``causal`` is the mask policy of the model; every primitive scores only visible keys"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _support(spec: PrimitiveSpec) -> str:
    """A primitive's declared keys per query row, as the table shows it (headsurgeon/synth/dsl/sparse.py uses it)."""
    if spec.support is None:
        return "all (dense)"
    if callable(spec.support):
        return "set by its parameters"
    return "few (counted)" if isinstance(spec.support, str) else str(spec.support)


def primitives_table() -> str:
    """A markdown table of every primitive: its call, what it attends to, the features it reads, its keys per
    row (sparse evaluation follows from it) and its cost."""
    rows = [(f"``{s.signature}``", s.doc, ", ".join(s.features), _support(s), str(s.cost))
            for s in PRIMITIVE_SPECS.values()]
    return _table(("primitive", "attends to", "reads", "keys per row", "cost"), rows)


def combinators_table() -> str:
    """A markdown table of every combinator: its syntax, meaning and cost."""
    rows = [(f"``{c.syntax}``", c.doc, f"{c.cost} per argument" if c.cost_per_child else str(c.cost))
            for c in COMBINATOR_SPECS.values()]
    return _table(("combinator", "meaning", "cost"), rows)


def bounds_table() -> str:
    """A markdown table of every bound: per parameter kind, per combinator, and on whole programs."""
    rows = []
    for kind, k in KINDS.items():
        uses = [f"``{s.name}({p.name})``" for s in PRIMITIVE_SPECS.values() for p in s.params if p.kind == kind]
        rows.append((f"{', '.join(uses) or 'unused'} ({kind})", k.bound))
    rows += [(f"``{c.syntax}`` ({c.name})", c.bound) for c in COMBINATOR_SPECS.values()]
    rows += list(STRUCTURE_BOUNDS)
    return _table(("parameter (kind)", "bound"), rows)


def render_tables() -> str:
    """The three tables as the module docs embed them (a test checks that they do)."""
    return "\n\n".join([f"Primitives ({MASK_NOTE}):", primitives_table(), "Combinators:", combinators_table(),
                        "Bounds:", bounds_table()])


def reference_text() -> str:
    """The DSL reference the LLM prompt shows: every primitive, the predicates and every combinator."""
    lines = [f"Primitives ({MASK_NOTE.replace('``', '`')}):"]
    lines += [f"  {s.signature}: {s.doc}" for s in PRIMITIVE_SPECS.values()]
    lines += [f"Predicates (PRED): {PREDICATES}.", f"Match features (F): {', '.join(MATCH_FEATURES)}.",
              "Combinators:"]
    lines += [f"  {c.syntax}: {c.doc}" for c in COMBINATOR_SPECS.values()]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# gloss: the spec's English templates filled for a tree
# --------------------------------------------------------------------------------------------

_FLAG_WORDS = {"punct": "punctuation mark", "sent_end": "sentence end", "newline": "newline",
               "cap": "capitalized token", "word_start": "word start", "quote": "token inside quotes"}
_GLOSS_ITEMS = 4


def _num(x: float) -> str:
    """A number in a gloss: two significant digits."""
    return f"{float(f'{x:.2g}'):g}"


def _token(token_id: int, vocab: TokenVocabulary | None) -> str:
    """A token in a gloss: its string in quotes, word-start markers dropped ('Lily'), else "token id 3"."""
    s = token_string(vocab, token_id) if vocab is not None else None
    if s is None:
        return f"token id {token_id}"
    shown = s.replace("\u2581", " ").replace("\u0120", " ").replace("\u010a", "\\n").strip() or s
    return f"'{shown}'"


def _clip(values: Sequence[Any], joiner: str, words: Callable[[Any], str] = str) -> str:
    """At most ``_GLOSS_ITEMS`` values in ``words`` joined (``a, b or c``), with the count when clipped; only the
    values shown are put in words (a class table has thousands of cells)."""
    if len(values) > _GLOSS_ITEMS:
        return ", ".join(words(v) for v in values[:_GLOSS_ITEMS]) + f", ... ({len(values)} in all)"
    items = [words(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {joiner} " + items[-1]


def _token_set(ids: Any, vocab: TokenVocabulary | None) -> str:
    """A token set as a noun phrase: 'Lily', 'the' or 'a'; without a vocabulary "token with id 3 or 17"."""
    ids = [int(i) for i in ids]
    if vocab is None:
        return "token with id " + _clip(ids, "or")
    return _clip(ids, "or", lambda i: _token(i, vocab))


def _pred_words(pred: Pred, vocab: TokenVocabulary | None) -> str:
    """A predicate as a noun phrase ("punctuation mark", "noun", "nsubj dependent", "'Lily'")."""
    if pred.kind == "flag":
        return _FLAG_WORDS.get(pred.value, str(pred.value))
    if pred.kind == "pos":
        return POS_WORDS.get(pred.value, f"{pred.value} token")
    if pred.kind == "dep":
        return f"{pred.value} dependent"
    return _token_set(pred.value, vocab)


#: match features in words ("whose part of speech pairs with its own ...")
_FEATURE_WORDS = {"token": "token", "position": "position", "word": "word index", "sent": "sentence index",
                  "pos": "part of speech", "punct": "punctuation flag", "cap": "capitalization flag",
                  "newline": "newline flag", "sent_end": "sentence-end flag", "word_start": "word-start flag",
                  "dep_head": "dependency head", "dep": "dependency relation", "quote": "quote flag"}
_SELECT_WORDS = {"closest": "the closest token", "all": "every token"}


def _value(feature: str, value: Any, vocab: TokenVocabulary | None) -> str:
    """One value of a match feature: a token string, a POS tag or dependency label in words, else the number."""
    if feature == "token" and not isinstance(value, str):
        return _token(int(value), vocab)
    if feature == "pos":
        tag = value if isinstance(value, str) else (KNOWN_POS_TAGS[value] if 0 <= value < len(KNOWN_POS_TAGS)
                                                     else None)
        return POS_WORDS.get(tag, str(tag)) if tag is not None else f"tag {value}"
    if feature == "dep" and not isinstance(value, str):
        labels = dep_labels()
        return labels[value] if 0 <= value < len(labels) else f"label {value}"
    return str(value)


def _pairs(node: Prim, vocab: TokenVocabulary | None) -> str:
    """``match``'s pairs as "query value → key value", clipped."""
    q, k = node.param("q"), node.param("k")
    return _clip(node.param("pairs"), "and",
                 lambda pair: f"{_value(q, pair[0], vocab)} → {_value(k, pair[1], vocab)}")


def _class_pairs(node: Prim, vocab: TokenVocabulary | None) -> str:
    """``class_weight``'s table as the query-class × key-class pairs that differ most from the default."""
    q, k, default = node.param("q"), node.param("k"), float(node.param("default"))
    w = [float(x) for row in node.param("w") for x in (row if isinstance(row, (list, tuple)) else [row])]
    cells = [(w[c * len(k) + e], c, e) for c in range(len(q)) for e in range(len(k)) if c * len(k) + e < len(w)]
    cells.sort(key=lambda t: -abs(math.log(max(t[0], 1e-30) / max(default, 1e-30))))
    return _clip(cells, "and", lambda cell: f"query {_token_set(q[cell[1]], vocab)} with key "
                                            f"{_token_set(k[cell[2]], vocab)} ×{_num(cell[0])}")


def _distances(weights: Any) -> str:
    """A distance profile in words: "itself 0.2, 1 back 1, 2 back 0.5", clipped."""
    return _clip(list(enumerate(weights)), "and",
                 lambda dx: f"{'itself' if dx[0] == 0 else f'{dx[0]} back'} {_num(float(dx[1]))}")


def _words(value: Any, kind: str = "", vocab: TokenVocabulary | None = None, node: Prim | None = None) -> str:
    """A parameter value of ``kind`` in a gloss: numbers plainly, tokens as strings, long lists clipped, never a
    Python list (``node`` gives the parameters that a table's words need, e.g. ``match``'s features)."""
    if isinstance(value, Pred):
        return _pred_words(value, vocab)
    if kind == "ids":
        return _token_set(value, vocab)
    if kind == "idweights":
        return _clip(value, "and", lambda tw: f"{_token(tw[0], vocab)} ×{_num(tw[1])}")
    if kind == "idclasses":
        return "; ".join(_token_set(c, vocab) for c in value[:_GLOSS_ITEMS]) + (
            f"; ... ({len(value)} classes)" if len(value) > _GLOSS_ITEMS else "")
    if kind == "select":
        return _SELECT_WORDS.get(value, str(value))
    if kind == "feature":
        return _FEATURE_WORDS.get(value, str(value))
    if kind == "pairs" and node is not None:
        return _pairs(node, vocab)
    if kind == "matrix" and node is not None:
        return _class_pairs(node, vocab)
    if kind == "weights":
        return _distances(value)
    if kind == "optnonneg":  # the profile's first-token weight: named first, where the mass usually is
        return "" if value is None else f"the first token {_num(float(value))}, "
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, (list, tuple)):
        return _clip(value, "and", _words)
    return str(value)


def template_fields(template: str) -> set[str]:
    """The placeholder names of a gloss template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


_SAME: Any = object()  # ChildGloss: the child takes its parent's share


class ChildGloss:
    """Renders a combinator's children (``gloss_fields``' callback): ``share`` is the part of the attention row the
    node stands for (1.0 at the root, the product of the mixture shares above it, None under a product or sharpen
    inside a mixture, where shares of the row are not defined), so nested mixtures state shares of the row once."""

    def __init__(self, vocab: TokenVocabulary | None, share: float | None) -> None:
        self.vocab, self.share = vocab, share

    def __call__(self, child: Any, share: float | None = _SAME) -> str:
        """The clause of ``child``, at ``share`` of the row (by default the parent's)."""
        return _gloss(child, self.vocab, self.share if share is _SAME else share)


def _gloss(node: Node, vocab: TokenVocabulary | None, share: float | None) -> str:
    if isinstance(node, Pred):
        return _pred_words(node, vocab)
    if isinstance(node, Prim):
        spec = PRIMITIVE_SPECS[node.name]
        for case, sentence in spec.gloss_cases:
            if all(node.param(k) == v for k, v in case):
                return sentence
        kinds = {p.name: p.kind for p in spec.params}
        return spec.gloss.format(**{k: _words(v, kinds.get(k, ""), vocab, node) for k, v in node.params})
    combinator = require_combinator(node)
    return combinator.gloss.format(**combinator.gloss_fields(node, ChildGloss(vocab, share)))


def gloss(node: Node, vocab: TokenVocabulary | None = None) -> str:
    """An English clause for a tree (or a predicate), from the spec's gloss templates; ``vocab`` names tokens."""
    return _gloss(node, vocab, 1.0)
