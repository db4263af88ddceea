"""Which trees evaluate to compressed rows, and that evaluation: the sparse twin of headsurgeon/synth/dsl/evaluate.py.

A tree is evaluated sparse when every primitive in it declares a ``support`` in the spec
(headsurgeon/synth/dsl/catalog.py: prev, self, first, window, key sets, match, same-token, ...); its per-row key
bound follows from the declarations (``row_support``). The result is a
``headsurgeon.kernels.sparse.SparseRows`` whose ``to_dense()`` equals ``evaluate``'s array
(tests/kernels/test_sparse_dsl.py checks every sparse-capable primitive and combinator).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from headsurgeon.kernels.normalize import normalize_rows
from headsurgeon.kernels.sparse import RowsBuffer, SparseRows, empty_rows_like

from .build import validate
from .context import Context
from .nodes import Node, Prim, children
from .spec import COUNTED, PRIMITIVE_SPECS, combinator_for
from ...core import InputError

__all__ = ["row_support", "is_sparse", "evaluate_sparse_scores", "evaluate_sparse"]


def row_support(node: Node) -> float | None:
    """Bound on the keys one query row of ``node`` scores: an int, ``inf`` (counted at run time), or None (dense)."""
    if isinstance(node, Prim):
        spec = PRIMITIVE_SPECS[node.name]
        support = spec.support(node) if callable(spec.support) else spec.support
        if support is None or spec.sparse is None:
            return None
        return math.inf if support == COUNTED else float(support)
    combinator = combinator_for(node)
    if combinator is None or combinator.sparse is None:
        return None
    bounds = [row_support(c) for c in children(node)]
    known = [b for b in bounds if b is not None]
    if len(known) < len(bounds):
        return None
    return float(combinator.support(known))


def is_sparse(node: Node) -> bool:
    """Whether ``node`` evaluates to compressed rows (every primitive in it has a declared support)."""
    return row_support(node) is not None


def _evaluate(node: Node, ids: np.ndarray, lengths: np.ndarray, features: Mapping[str, np.ndarray] | None,
              causal: bool, pos_tags: Iterable[str] | None, normalized: bool, out: RowsBuffer | None = None) -> SparseRows:
    validate(node)
    if not is_sparse(node):
        raise InputError("this program has a primitive of dense support (decay, uniform, profile, key_weight, "
                         "class_weight); evaluate it with dsl.evaluate (check dsl.is_sparse first)")
    ctx = Context(ids, lengths, features, causal, pos_tags)
    if ctx.ids.shape[0] == 0 or ctx.n == 0:
        return empty_rows_like(ctx.lengths, ctx.n)
    # a lone primitive writes its rows normalized in the same pass (headsurgeon/kernels/primitives/sparse_prims.py)
    ctx.normalize_leaf = normalized and isinstance(node, Prim)
    ctx.leaf_out = out if ctx.normalize_leaf else None
    rows = ctx.eval_sparse(node)
    return normalize_rows(rows, causal, out) if normalized and not rows.normalized else rows


def evaluate_sparse_scores(node: Node, ids: np.ndarray, lengths: np.ndarray,
                           features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
                           pos_tags: Iterable[str] | None = None) -> SparseRows:
    """Raw scores of a sparse tree as compressed rows (``evaluate_scores``'s array, cell for cell)."""
    return _evaluate(node, ids, lengths, features, causal, pos_tags, False)


def evaluate_sparse(node: Node, ids: np.ndarray, lengths: np.ndarray,
                    features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
                    pos_tags: Iterable[str] | None = None, out: RowsBuffer | None = None) -> SparseRows:
    """Normalized attention of a sparse tree as compressed rows (``evaluate``'s array, cell for cell).

    ``out``: a ``RowsBuffer`` reused across calls; the result is a view of it, valid until its next use.
    """
    return _evaluate(node, ids, lengths, features, causal, pos_tags, True, out)
