"""Program heads stay fixed under training: the Q (and K) slices a replaced head no longer uses never move.

A query head whose pattern comes entirely from a program (alpha 1) gets no gradient into its W_Q rows, and a
key/value group whose query heads are all such heads none into its W_K rows (headsurgeon/surgery/swap/hooked_path.py swaps the
pattern out of place). Weight decay still moves them (AdamW shrinks every parameter it holds), and a slice of
a tensor cannot be left out of an optimizer. So the hybrid takes the slices' values before each optimizer step
that follows one of its own forwards, and writes them back after it (torch's global optimizer step hooks);
an optimizer step that never followed a hybrid forward (training the base directly) is left alone.
The slices are found on the bridge's own q/k projections (plain, view or fused-gather, headsurgeon/surgery/models/fused_qkv.py)
or a legacy HookedTransformer's ``W_Q``/``W_K``; V, O and every other weight train.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..models.fused_qkv import FusedSlice
from ..models.handle import ModelHandle

__all__ = ["frozen_slices", "FrozenQK"]

Slice = tuple[torch.Tensor, torch.Tensor]  # (tensor, indices along its first dimension)


def _rows(head: int, d_head: int) -> torch.Tensor:
    return torch.arange(head * d_head, (head + 1) * d_head)


def _linear_slices(linear: Any, heads: Iterable[int], d_head: int) -> list[Slice]:
    """Rows of a q or k projection (nn.Linear [out, in], a view of a fused weight, or a fused gather)."""
    rows = torch.cat([_rows(h, d_head) for h in heads])
    if isinstance(linear, FusedSlice):
        fused = linear.fused
        out = []
        if linear.by_rows:
            out.append((fused.weight, linear.weight_index[rows.to(linear.weight_index.device)]))
        else:
            out.append((fused.weight.view(-1), linear.weight_index[rows.to(linear.weight_index.device)].reshape(-1)))
        if linear.bias_index is not None and getattr(fused, "bias", None) is not None:
            out.append((fused.bias, linear.bias_index[rows.to(linear.bias_index.device)]))
        return out
    out = [(linear.weight, rows)]
    if getattr(linear, "bias", None) is not None:
        out.append((linear.bias, rows))
    return out


def frozen_slices(handle: ModelHandle, heads: Iterable[tuple[int, int]]) -> list[Slice]:
    """The Q rows of ``heads`` and the K rows of every key/value group all of whose query heads are in ``heads``."""
    by_layer: dict[int, set[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, set()).add(head)
    group = handle.n_heads // handle.n_kv_heads
    out: list[Slice] = []
    for layer, qs in sorted(by_layer.items()):
        kvs = sorted(g for g in {h // group for h in qs} if all(g * group + i in qs for i in range(group)))
        attn = handle.model.blocks[layer].attn
        for part, idx in (("q", sorted(qs)), ("k", kvs)):
            if not idx:
                continue
            legacy = getattr(attn, f"W_{part.upper()}", None)
            if isinstance(legacy, torch.nn.Parameter) and legacy.ndim == 3:  # HookedTransformer [heads, d_model, d]
                bias = getattr(attn, f"b_{part.upper()}", None)
                out += [(t, torch.tensor(idx)) for t in (legacy, bias) if isinstance(t, torch.nn.Parameter)]
                continue
            bridge = getattr(attn, part, None)
            linear = getattr(bridge, "original_component", None)
            if linear is None or getattr(linear, "weight", None) is None:
                continue  # no separate projection to find: nothing is kept fixed (documented in README)
            out += _linear_slices(linear, idx, handle.d_head)
    return out


class FrozenQK:
    """Keeps a hybrid's frozen slices in place across optimizer steps that follow a forward of the hybrid."""

    def __init__(self, slices: list[Slice]) -> None:
        self.slices = slices
        self.pending = False  # a hybrid forward ran since the last optimizer step
        self._saved: list[torch.Tensor] | None = None
        self._storages = {t.untyped_storage().data_ptr() for t, _ in slices}
        me = weakref.ref(self)
        self._hooks = [register_optimizer_step_pre_hook(lambda opt, a, k: (me() or _Gone).before(opt)),
                       register_optimizer_step_post_hook(lambda opt, a, k: (me() or _Gone).after(opt))]
        weakref.finalize(self, _remove, list(self._hooks))  # a hybrid dropped without restore() leaves no hook

    def _holds(self, optimizer: torch.optim.Optimizer) -> bool:
        return any(p.untyped_storage().data_ptr() in self._storages
                   for group in optimizer.param_groups for p in group["params"])

    def before(self, optimizer: torch.optim.Optimizer) -> None:
        if self.pending and self.slices and self._holds(optimizer):
            with torch.no_grad():
                self._saved = [t[i.to(t.device)].clone() for t, i in self.slices]

    def after(self, optimizer: torch.optim.Optimizer) -> None:
        if self._saved is None:
            return
        with torch.no_grad():
            for (t, i), value in zip(self.slices, self._saved):
                t[i.to(t.device)] = value
        self._saved = None
        self.pending = False

    def close(self) -> None:
        """Stop watching optimizer steps (the hybrid was restored)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _remove(hooks: list[Any]) -> None:
    for h in hooks:
        h.remove()


class _Gone:
    """Stands in for a FrozenQK that was garbage-collected: its hooks do nothing."""

    @staticmethod
    def before(optimizer: Any) -> None:
        return None

    @staticmethod
    def after(optimizer: Any) -> None:
        return None
