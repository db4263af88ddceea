"""``round_numbers``: a tree with every float literal rounded to what matters (ids and integers unchanged)."""
from __future__ import annotations

from typing import Any

from .bounds import MAX_EXPONENT, MAX_WEIGHT, _err
from .build import make_mix, make_prim, make_sharpen, make_sum, validate
from .nodes import Fallback, Gate, Mix, Mul, Node, Prim, Sharpen, Sum
from .spec import PRIMITIVE_SPECS

__all__ = ["round_numbers", "round_float"]


def round_float(x: float, digits: int, limit: float = MAX_WEIGHT) -> float:
    """``x`` to ``digits`` significant digits, kept within ``limit`` (a positive ``x`` stays positive)."""
    return min(float(f"{float(x):.{digits}g}"), limit)


def _round_value(kind: str, value: Any, digits: int) -> Any:
    """A parameter value of ``kind`` with its floats rounded."""
    if kind in ("nonneg", "optnonneg") and value is not None:
        return round_float(value, digits)
    if kind == "rate":
        return round_float(value, digits, 1.0)
    if kind == "weights":
        return [round_float(x, digits) for x in value]
    if kind == "idweights":
        return [[t, round_float(w, digits)] for t, w in value]
    if kind == "matrix":
        return [[round_float(x, digits) for x in row] for row in value]
    return value


def _round(node: Node, digits: int) -> Node:
    if isinstance(node, Prim):
        spec = PRIMITIVE_SPECS[node.name]
        if not any(p.kind in ("nonneg", "optnonneg", "rate", "weights", "idweights", "matrix") for p in spec.params):
            return node
        return make_prim(node.name, [], {p.name: _round_value(p.kind, node.param(p.name), digits)
                                         for p in spec.params})
    if isinstance(node, (Mix, Sum)):
        terms = [(round_float(w, digits), _round(t, digits)) for w, t in node.terms]
        return make_mix(terms) if isinstance(node, Mix) else make_sum(terms)
    if isinstance(node, Fallback):
        return Fallback(tuple(_round(a, digits) for a in node.args))
    if isinstance(node, Mul):
        return Mul(tuple(_round(a, digits) for a in node.args))
    if isinstance(node, Gate):
        return Gate(node.pred, _round(node.then, digits), _round(node.other, digits))
    if isinstance(node, Sharpen):
        by = [[round_float(t, digits, MAX_EXPONENT), ids] for t, ids in node.by]
        return make_sharpen(_round(node.arg, digits), round_float(node.t, digits, MAX_EXPONENT), by)
    raise TypeError(f"not a DSL node: {node!r}")


def round_numbers(node: Node, digits: int = 2) -> Node:
    """The tree with every float literal (mix/sum weights, profile, key_weight and class_weight values, sharpen
    exponents, decay rates) rounded to ``digits`` significant digits, within its bounds; ids and ints unchanged."""
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 17:
        raise _err(f"round_numbers needs 1 <= digits <= 17; got {digits!r}")
    return validate(_round(validate(node), digits))
