"""The DSL tree: frozen, hashable node types (the value every other DSL module reads or builds)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Union

from .memo import memo

__all__ = ["Pred", "Prim", "Mix", "Sum", "Fallback", "Gate", "Sharpen", "Mul", "Node", "NODE_TYPES", "is_node",
           "children", "NUMBERS", "SCALARS"]

#: the exact types of a parameter's plain numbers and scalars: a row (a fitted table holds thousands) whose items are
#: all of these is checked, counted and converted in one pass; bool, None, numpy scalars and subclasses go item by item
NUMBERS = frozenset((int, float))
SCALARS = frozenset((int, float, str, bool))


def _field_hash(node: Any) -> int:
    """The dataclass hash of a node's fields, computed once per node object (headsurgeon/synth/dsl/memo.py): a table's
    parameters hold thousands of numbers, and the searchers look the same trees up in many dicts."""
    return memo(node, "hash", lambda: hash(tuple(getattr(node, f.name) for f in fields(node))))


@dataclass(frozen=True)
class Pred:
    """A token predicate: ``kind`` is "flag" (value: flag name), "pos" (tag name), "dep" (dependency label) or
    "ids" (tuple of token ids)."""

    __hash__ = _field_hash

    kind: str
    value: Any


@dataclass(frozen=True)
class Prim:
    """A primitive with its parameters, in the canonical order of ``PRIMITIVES[name]``."""

    __hash__ = _field_hash

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str) -> Any:
        """The value of parameter ``key``."""
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)


@dataclass(frozen=True)
class Mix:
    """Weighted sum of row-normalized components: ``terms = ((w, node), ...)``."""

    __hash__ = _field_hash

    terms: tuple[tuple[float, Any], ...]


@dataclass(frozen=True)
class Sum:
    """Weighted sum of the components' raw scores, each row normalized once at the end: ``terms = ((w, node), ...)``."""

    __hash__ = _field_hash

    terms: tuple[tuple[float, Any], ...]


@dataclass(frozen=True)
class Fallback:
    """Per row, the first argument whose row is non-empty."""

    __hash__ = _field_hash

    args: tuple[Any, ...]


@dataclass(frozen=True)
class Gate:
    """Rows whose query satisfies ``pred`` take ``then``, the others ``other``."""

    __hash__ = _field_hash

    pred: Pred
    then: Any
    other: Any


@dataclass(frozen=True)
class Sharpen:
    """``arg ** t``, renormalized per row; ``by = ((t1, ids1), ..)``: query tokens in ids_k use t_k."""

    __hash__ = _field_hash

    arg: Any
    t: float
    by: tuple[tuple[float, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Mul:
    """Elementwise product of the arguments."""

    __hash__ = _field_hash

    args: tuple[Any, ...]


Node = Union[Prim, Mix, Sum, Fallback, Gate, Sharpen, Mul]
NODE_TYPES = (Prim, Mix, Sum, Fallback, Gate, Sharpen, Mul)


def is_node(value: Any) -> bool:
    """Whether ``value`` is a DSL node."""
    return isinstance(value, NODE_TYPES)


def children(node: Node) -> tuple:
    """The direct sub-expressions of ``node`` (none for a primitive)."""
    if isinstance(node, (Mix, Sum)):
        return tuple(t for _, t in node.terms)
    if isinstance(node, (Fallback, Mul)):
        return node.args
    if isinstance(node, Gate):
        return (node.then, node.other)
    if isinstance(node, Sharpen):
        return (node.arg,)
    return ()
