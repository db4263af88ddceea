"""Description length of a DSL tree: how much a person has to read to know the program exactly.

Every node counts 1 and so does every scalar literal: each number, each id or token in a list, each
table cell, each named option. ``prev(1)`` is 2; a 32x32 class table alone is over 1,000.
"""
from __future__ import annotations

from typing import Any

from .memo import memo
from .nodes import SCALARS, Fallback, Gate, Mix, Mul, Node, Pred, Prim, Sharpen, Sum

__all__ = ["size"]


def _literals(value: Any) -> int:
    """Scalar literals in a parameter value (lists and tables count each element)."""
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= SCALARS:
            return len(value)  # a row of scalars, each one literal (a fitted table holds thousands)
        return sum(_literals(v) for v in value)
    if isinstance(value, Pred):
        return 1 + _literals(value.value)
    return 0 if value is None else 1


def size(node: Node | Pred) -> int:
    """Nodes plus scalar literals of a tree."""
    if isinstance(node, Prim):  # once per primitive object (headsurgeon/synth/dsl/memo.py): tables are large
        return memo(node, "size", lambda: 1 + sum(_literals(v) for _, v in node.params))
    if isinstance(node, Pred):
        return 1 + _literals(node.value)
    if isinstance(node, (Mix, Sum)):
        return 1 + sum(1 + size(child) for _, child in node.terms)
    if isinstance(node, (Fallback, Mul)):
        return 1 + sum(size(child) for child in node.args)
    if isinstance(node, Gate):
        return 1 + size(node.pred) + size(node.then) + size(node.other)
    if isinstance(node, Sharpen):
        return 1 + _literals(node.t) + _literals(node.by) + size(node.arg)
    raise TypeError(f"not a DSL node: {node!r}")
