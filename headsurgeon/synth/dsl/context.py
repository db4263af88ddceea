"""The evaluation context: one evaluation's padded arrays, feature lookups, recycled buffers and dispatch.

``Context.eval`` is the reference evaluator's dispatch: a primitive goes to its spec's kernel, a
combinator to its spec's kernel (headsurgeon/synth/dsl/spec.py), by table lookup; ``Context.eval_sparse`` the same
through the specs' ``sparse`` kernels (headsurgeon/synth/dsl/sparse.py).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from headsurgeon.kernels.sparse import SparseRows

from ..features import POS_TAGS
from .labels import dep_index
from .nodes import Node, Pred, Prim
from .spec import PRIMITIVE_SPECS, require_combinator
from ...core import InputError

__all__ = ["Context"]


class Context:
    """Padded arrays and feature lookups shared by one evaluation."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, features: Mapping[str, np.ndarray] | None,
                 causal: bool, pos_tags: Iterable[str] | None) -> None:
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if ids.ndim != 2:
            raise InputError(f"ids must be a padded [B, N] array; got shape {ids.shape}")
        lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
        if lengths.shape[0] != ids.shape[0]:
            raise InputError(f"lengths has {lengths.shape[0]} entries for {ids.shape[0]} sequences")
        if lengths.size and (lengths.min() < 0 or lengths.max() > ids.shape[1]):
            raise InputError(f"lengths must lie in [0, N={ids.shape[1]}]")
        self.ids, self.lengths, self.n = ids, lengths, int(ids.shape[1])
        self.features = features or {}
        self.causal = bool(causal)
        self._pos_tags = pos_tags
        self._cache: dict[str, np.ndarray] = {}
        self.free: list[np.ndarray] = []  # finished intermediate [B,N,N] buffers, reused (no page faults)
        self.normalize_leaf = False  # sparse evaluation of a lone primitive: its kernel normalizes the rows
        self.leaf_out: Any = None  # ... into this RowsBuffer (headsurgeon.kernels.sparse), when given

    def buf(self) -> np.ndarray | None:
        """A recycled [B,N,N] float32 buffer for a kernel to overwrite, or None (the kernel allocates)."""
        return self.free.pop() if self.free else None

    def release(self, arr: np.ndarray) -> None:
        """Hand back an intermediate result that is no longer needed."""
        self.free.append(arr)

    def feature(self, name: str) -> np.ndarray:
        """The padded int64 [B, N] array of feature ``name`` (token ids and positions need none supplied)."""
        if name == "token":
            return self.ids
        if name == "position":
            return np.ascontiguousarray(np.broadcast_to(np.arange(self.n, dtype=np.int64), self.ids.shape))
        if name in self._cache:
            return self._cache[name]
        if name not in self.features:
            raise InputError(
                f"feature array {name!r} is needed but was not supplied (have: {sorted(self.features)}); "
                "pass features=batch_feature_arrays(sequences, names) or use Program.evaluate(sequences)"
            )
        arr = np.asarray(self.features[name])
        if arr.shape != self.ids.shape:
            raise InputError(f"feature array {name!r} has shape {arr.shape}; expected {self.ids.shape} like ids")
        arr = np.ascontiguousarray(arr.astype(np.int64, copy=False))
        self._cache[name] = arr
        return arr

    def pos_tags(self) -> list[str]:
        """The POS tag list whose indices the ``pos`` feature array holds."""
        return list(POS_TAGS if self._pos_tags is None else self._pos_tags)

    def tag_id(self, tag: str) -> int:
        """The index of POS tag ``tag`` (a value no position holds when the tag list lacks it)."""
        tags = self.pos_tags()
        return tags.index(tag) if tag in tags else -(1 << 40)  # absent tag: matches nothing

    def value_id(self, feature: str, value: Any) -> int:
        """A match value as the feature array holds it: POS tags and dependency labels by index, numbers as is."""
        if not isinstance(value, str):
            return int(value)
        return dep_index(value) if feature == "dep" else self.tag_id(value)

    def pred_mask(self, pred: Pred) -> np.ndarray:
        """Boolean [B, N]: the positions whose token satisfies ``pred``."""
        if pred.kind == "flag":
            return np.ascontiguousarray(self.feature(pred.value) != 0)
        if pred.kind == "pos":
            return np.ascontiguousarray(self.feature("pos") == self.tag_id(pred.value))
        if pred.kind == "dep":
            return np.ascontiguousarray(self.feature("dep") == dep_index(pred.value))
        return np.ascontiguousarray(np.isin(self.ids, np.asarray(pred.value, dtype=np.int64)))


    def leaf(self) -> tuple[bool, Any]:
        """``(normalized, out)`` for a sparse primitive kernel: whether it writes the final rows, and where."""
        return self.normalize_leaf, self.leaf_out

    def eval_sparse(self, node: Node) -> SparseRows:
        """Raw scores of a subtree as compressed rows (headsurgeon/synth/dsl/sparse.py checks that it can be)."""
        kernel = PRIMITIVE_SPECS[node.name].sparse if isinstance(node, Prim) else require_combinator(node).sparse
        assert kernel is not None, "_evaluate (headsurgeon/synth/dsl/sparse.py) evaluates only trees is_sparse admits"
        return kernel(node, self)

    def eval(self, node: Node) -> np.ndarray:
        """Raw scores of a subtree: a fresh or recycled buffer the caller owns."""
        if isinstance(node, Prim):
            return PRIMITIVE_SPECS[node.name].kernel(node, self)
        return require_combinator(node).kernel(node, self)
