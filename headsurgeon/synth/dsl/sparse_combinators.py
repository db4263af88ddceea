"""The combinators' sparse adapters: each composes its children's compressed rows like its dense twin in catalog.py.

Referenced from the combinators' declarations in headsurgeon/synth/dsl/catalog.py (``sparse=``); ``ctx.eval_sparse``
evaluates a child (headsurgeon/synth/dsl/context.py). The kernels are in headsurgeon/kernels/primitives/sparse_combinators.py.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from headsurgeon.kernels import primitives as kernels
from headsurgeon.kernels.sparse import SparseRows

from .context import Context
from .nodes import Fallback, Gate, Mix, Mul, Sharpen, Sum

__all__ = ["mix_sparse", "sum_sparse", "fallback_sparse", "gate_sparse", "sharpen_sparse", "mul_sparse"]


def mix_sparse(node: Mix, ctx: Context) -> SparseRows:
    """Weighted sum of row-normalized children (``_mix``)."""
    (w0, t0), rest = node.terms[0], node.terms[1:]
    out = ctx.eval_sparse(t0)
    kernels.sparse_mix_scale(out, float(w0))
    for w, t in rest:
        out = kernels.sparse_mix_add(out, ctx.eval_sparse(t), float(w))
    return out


def sum_sparse(node: Sum, ctx: Context) -> SparseRows:
    """Weighted sum of raw children, each row normalized once (``_sum``)."""
    (w0, t0), rest = node.terms[0], node.terms[1:]
    out = ctx.eval_sparse(t0)
    kernels.sparse_raw_scale(out, float(w0))
    for w, t in rest:
        out = kernels.sparse_raw_add(out, ctx.eval_sparse(t), float(w))
    kernels.sparse_row_normalize(out)
    return out


def fallback_sparse(node: Fallback, ctx: Context) -> SparseRows:
    """Per row, the first child whose row has mass (``_fallback``)."""
    out = ctx.eval_sparse(node.args[0])
    for alt in node.args[1:]:
        if not kernels.sparse_empty_rows(out).any():
            break
        out = kernels.sparse_fallback(out, ctx.eval_sparse(alt))
    return out


def gate_sparse(node: Gate, ctx: Context) -> SparseRows:
    """Rows whose query satisfies the predicate take ``then``, the others ``other`` (``_gate``)."""
    qmask = ctx.pred_mask(node.pred)
    inside = np.arange(ctx.n)[None, :] < ctx.lengths[:, None]
    if not (qmask & inside).any():
        return ctx.eval_sparse(node.other)
    out = ctx.eval_sparse(node.then)
    if not (qmask | ~inside).all():
        out = kernels.sparse_gate(qmask, out, ctx.eval_sparse(node.other))
    return out


def sharpen_sparse(node: Sharpen, ctx: Context, exponents: Callable[[Sharpen, np.ndarray], np.ndarray]) -> SparseRows:
    """``child ** t`` renormalized per row; ``exponents(node, ids)`` gives the per-query exponents of ``by``."""
    out = ctx.eval_sparse(node.arg)
    if node.by:
        kernels.sparse_sharpen_by(out, exponents(node, ctx.ids))
    else:
        kernels.sparse_sharpen(out, float(node.t))
    return out


def mul_sparse(node: Mul, ctx: Context) -> SparseRows:
    """Elementwise product: the keys every child holds (``_mul``)."""
    out = ctx.eval_sparse(node.args[0])
    for other in node.args[1:]:
        out = kernels.sparse_mul(out, ctx.eval_sparse(other))
    return out
