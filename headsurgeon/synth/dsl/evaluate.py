"""The reference evaluator: a tree's scores over padded arrays, by the spec's kernels (headsurgeon/synth/dsl/catalog.py).

Evaluation composes the kernels through ``Context.eval`` (a table dispatch); ``evaluate`` finally applies
``normalize_scores`` (mask, clip, row normalization, empty rows to position 0). Intermediate [B,N,N]
buffers are recycled across calls, so that a tree costs one fresh allocation per call (first-touch page
faults of fresh memory dominate simple programs).
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

import numpy as np

from headsurgeon.kernels import primitives as kernels
from headsurgeon.kernels.normalize import normalize_scores

from .build import validate
from .context import Context
from .nodes import Node

__all__ = ["evaluate_scores", "evaluate", "SCRATCH_BYTES"]

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


def evaluate_scores(node: Node, ids: np.ndarray, lengths: np.ndarray,
                    features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
                    pos_tags: Iterable[str] | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Raw scores float32 [B,N,N] of a tree over padded ids/feature arrays (zero outside visible cells).

    ``out``: an optional C-contiguous float32 [B,N,N] buffer that receives the result (every cell is
    overwritten), e.g. a block buffer reused across many programs.
    """
    validate(node)
    ctx = Context(ids, lengths, features, causal, pos_tags)
    shape = (ctx.ids.shape[0], ctx.n, ctx.n)
    if out is not None:
        out = kernels.out_buffer(out, shape)
    if shape[0] == 0 or ctx.n == 0:
        return np.zeros(shape, dtype=np.float32) if out is None else out
    # The first buffer a kernel takes always becomes the root's result (each combinator evaluates
    # the child it writes into first), so ``out`` goes on top of the stack.
    ctx.free = _take_scratch(shape) + ([out] if out is not None else [])
    try:
        result = ctx.eval(node)
    finally:
        _give_scratch([a for a in ctx.free if a is not out])
    if out is not None and result is not out:  # defensive; not expected
        out[...] = result
        _give_scratch([result])
        result = out
    return result


def evaluate(node: Node, ids: np.ndarray, lengths: np.ndarray,
             features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
             pos_tags: Iterable[str] | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Attention float32 [B,N,N]: ``normalize_scores`` applied to ``evaluate_scores`` (in place)."""
    scores = evaluate_scores(node, ids, lengths, features, causal, pos_tags, out)
    return normalize_scores(scores, lengths, causal, out=scores, masked=True)
