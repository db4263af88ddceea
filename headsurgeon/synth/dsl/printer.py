"""The text printer: ``to_text(node, vocab=None)``, the inverse of headsurgeon/synth/dsl/text.py's ``parse``.

Without a vocabulary the text is canonical (token ids as numbers; ``parse(to_text(t)) == t``). With one
every token id prints as its string (``key_in_set(tokens=["▁the"])``, ``recent(tok("."))``), and
``parse(to_text(t, vocab), vocab=vocab) == t``. Numbers print in the shortest form that reads back to
the same value (``0.7``); ``round_numbers`` (headsurgeon/synth/dsl/rounding.py) removes digits that do not matter.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .bounds import _show
from .build import validate
from .memo import memo
from .nodes import Fallback, Gate, Mix, Mul, Node, Pred, Prim, Sharpen, Sum
from .spec import PRIMITIVE_SPECS
from .tokens import fmt_token
from ...core.vocabulary import TokenVocabulary

__all__ = ["to_text"]


def _fmt_num(x: float | int) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x)) if isinstance(x, float) else str(x)


def _fmt_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt_value(x) for x in v) + "]"
    if isinstance(v, str):
        return v if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", v) else json.dumps(v)
    return _fmt_num(v)


def _fmt_tokens(ids: Any, vocab: TokenVocabulary | None) -> str:
    return "[" + ", ".join(fmt_token(i, vocab) for i in ids) + "]"


def _fmt_pred(p: Pred, vocab: TokenVocabulary | None) -> str:
    if p.kind == "flag":
        return p.value
    if p.kind in ("pos", "dep"):
        return f"{p.kind}={p.value}"
    if vocab is None:
        return f"ids={_fmt_value(p.value)}"
    if len(p.value) == 1:
        return f"tok({fmt_token(p.value[0], vocab)})"
    return f"tokens={_fmt_tokens(p.value, vocab)}"


def _fmt_param(kind: str, value: Any, vocab: TokenVocabulary | None, node: Prim) -> str:
    """One parameter value; token ids as strings when ``vocab`` is given."""
    if vocab is None:
        return _fmt_value(value)
    if kind == "ids":
        return _fmt_tokens(value, vocab)
    if kind == "idweights":
        return "[" + ", ".join(f"[{fmt_token(t, vocab)}, {_fmt_num(w)}]" for t, w in value) + "]"
    if kind == "idclasses":
        return "[" + ", ".join(_fmt_tokens(c, vocab) for c in value) + "]"
    if kind == "pairs":
        fq, fk = node.param("q") == "token", node.param("k") == "token"
        return "[" + ", ".join(f"[{fmt_token(a, vocab) if fq else _fmt_value(a)}, "
                               f"{fmt_token(b, vocab) if fk else _fmt_value(b)}]" for a, b in value) + "]"
    return _fmt_value(value)


def to_text(node: Node, vocab: TokenVocabulary | None = None) -> str:
    """Print a tree in the readable text form (the tree is validated first).

    ``parse(to_text(t)) == t``; with a ``Vocabulary`` token ids print as token strings and
    ``parse(to_text(t, vocab), vocab=vocab) == t``.
    """
    if vocab is None:  # the canonical text, once per node object (headsurgeon/synth/dsl/memo.py)
        return memo(node, "text", lambda: _to_text(validate(node), None))
    return _to_text(validate(node), vocab)


def _terms(terms: tuple, vocab: TokenVocabulary | None, omit_one: bool) -> list[str]:
    parts = []
    for w, t in terms:
        body = _to_text(t, vocab)
        if isinstance(t, Mix):
            body = f"({body})"
        parts.append(body if omit_one and w == 1.0 else f"{_fmt_num(w)}*{body}")
    return parts


def _to_text(node: Node, vocab: TokenVocabulary | None) -> str:
    """``to_text`` of a validated tree (recursion depth at most MAX_DEPTH)."""
    if isinstance(node, Prim) and vocab is None:
        return memo(node, "text", lambda: _prim_text(node, None))
    if isinstance(node, Prim):
        return _prim_text(node, vocab)
    return _combinator_text(node, vocab)


def _prim_text(node: Prim, vocab: TokenVocabulary | None) -> str:
    """One primitive's text."""
    spec = PRIMITIVE_SPECS[node.name]
    if spec.takes_pred:
        return f"{node.name}({_fmt_pred(node.params[0][1], vocab)})"
    kinds = {p.name: p.kind for p in spec.params}
    if spec.keywords:
        inner = ", ".join(f"{'tokens' if vocab is not None and kinds[k] == 'ids' else k}="
                          f"{_fmt_param(kinds[k], v, vocab, node)}" for k, v in node.params if v is not None)
    else:
        inner = ", ".join(_fmt_param(kinds[k], v, vocab, node) for k, v in node.params)
    return f"{node.name}({inner})"


def _combinator_text(node: Node, vocab: TokenVocabulary | None) -> str:
    """One combinator's text, its children through ``_to_text``."""
    if isinstance(node, Mix):
        return " + ".join(_terms(node.terms, vocab, omit_one=False))
    if isinstance(node, Sum):
        return "sum(" + ", ".join(_terms(node.terms, vocab, omit_one=True)) + ")"
    if isinstance(node, Fallback):
        return "fallback(" + ", ".join(_to_text(a, vocab) for a in node.args) + ")"
    if isinstance(node, Mul):
        return "mul(" + ", ".join(_to_text(a, vocab) for a in node.args) + ")"
    if isinstance(node, Gate):
        return f"gate({_fmt_pred(node.pred, vocab)}, {_to_text(node.then, vocab)}, {_to_text(node.other, vocab)})"
    if isinstance(node, Sharpen):
        if node.by:
            fmt = (lambda ids: _fmt_tokens(ids, vocab)) if vocab is not None else _fmt_value
            classes = ", ".join(f"[{_fmt_num(t)}, {fmt(ids)}]" for t, ids in node.by)
            return f"sharpen({_to_text(node.arg, vocab)}, {_fmt_num(node.t)}, by=[{classes}])"
        return f"sharpen({_to_text(node.arg, vocab)}, {_fmt_num(node.t)})"
    raise TypeError(f"not a DSL node: {_show(node)}")
