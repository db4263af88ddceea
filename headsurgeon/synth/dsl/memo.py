"""Values derived from a tree once per node object (canonical text, canonical JSON, size, hash).

Nodes are frozen (headsurgeon/synth/dsl/nodes.py), so a value computed from one node's fields holds for its lifetime. The
searchers put one big table primitive into many mixtures, and each mixture is printed, sized and hashed; the
memo keeps that work to once per primitive. Keyed by identity, like build.py's record of checked nodes, so a
lookup never hashes a table and nodes pickle the same with or without it.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

__all__ = ["memo"]

T = TypeVar("T")

_MEMO: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}


def _forget(ref: weakref.ref, key: int) -> None:
    entry = _MEMO.get(key)
    if entry is not None and entry[0] is ref:
        del _MEMO[key]


def memo(node: Any, name: str, compute: Callable[[], T]) -> T:
    """``compute()`` the first time ``name`` is asked of this node object, the stored value afterwards."""
    key = id(node)
    entry = _MEMO.get(key)
    if entry is None or entry[0]() is not node:
        try:
            ref = weakref.ref(node, partial(_forget, key=key))
        except TypeError:  # not weakly referenceable: computed every time
            return compute()
        entry = _MEMO[key] = (ref, {})
    values = entry[1]
    if name not in values:
        values[name] = compute()
    return values[name]
