"""Fused QKV trained in place: the bridge's split q/k/v projections read the fused weight the checkpoint saves.

TransformerBridge splits a fused ``query_key_value`` (GPT-NeoX, Falcon) into q/k/v ``nn.Linear`` copies once, at
boot; where the split is a copy (an interleaved layout), training updates the copies while the model's state
dict, and so ``save_hybrid`` and its change detection (headsurgeon/hub/checkpoint/weights.py), keep the stale fused weight.
:func:`tie_split_qkv` replaces each copy by a :class:`FusedSlice` that gathers its rows from the fused parameter
on every call, so gradients land on the fused weight and there is one copy of the truth.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["AliasedLinear", "FusedSlice", "tie_split_qkv"]


class FusedSlice(nn.Module):
    """A q, k or v projection whose weight and bias are gathered from a fused qkv Linear on every call."""

    def __init__(self, fused: nn.Module, weight_index: torch.Tensor, bias_index: torch.Tensor | None):
        super().__init__()
        self.__dict__["fused"] = fused  # a plain reference: the fused Linear stays owned (and saved) by its model
        n_in = int(fused.weight.shape[1])
        rows = weight_index[:, 0] // n_in
        self.by_rows = bool(weight_index.shape[1] == n_in
                            and torch.equal(weight_index, rows[:, None] * n_in + torch.arange(n_in)[None, :]))
        self.register_buffer("weight_index", rows if self.by_rows else weight_index, persistent=False)
        self.register_buffer("bias_index", bias_index, persistent=False)
        self.in_features, self.out_features = int(weight_index.shape[1]), int(weight_index.shape[0])

    @property
    def weight(self) -> torch.Tensor:
        """This projection's [out, in] weight, differentiable into the fused parameter."""
        w = self.fused.weight
        return w.index_select(0, self.weight_index) if self.by_rows else w.reshape(-1)[self.weight_index]

    @property
    def bias(self) -> torch.Tensor | None:
        """This projection's bias (a gather from the fused bias), or None."""
        b = getattr(self.fused, "bias", None)
        return None if b is None or self.bias_index is None else b.index_select(0, self.bias_index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, gathered from the fused qkv"


class AliasedLinear(nn.Linear):
    """A split q/k/v Linear whose parameters are views of the fused ones (GPT-2's c_attn), kept so by deepcopy.

    A plain Parameter deep-copies by cloning, so ``replace_heads(copy=True)`` would train a detached copy.
    """

    def __init__(self, linear: nn.Module, fused: nn.Module):
        nn.Module.__init__(self)
        self.in_features, self.out_features = int(linear.weight.shape[1]), int(linear.weight.shape[0])
        self.weight, self.bias = linear.weight, linear.bias
        self.__dict__["fused"] = fused

    def __deepcopy__(self, memo: dict) -> "AliasedLinear":
        fused = copy.deepcopy(self.fused, memo)
        new = AliasedLinear.__new__(AliasedLinear)
        memo[id(self)] = new
        nn.Module.__init__(new)
        new.in_features, new.out_features, new.__dict__["fused"] = self.in_features, self.out_features, fused
        new.weight = nn.Parameter(_alias(self.weight, self.fused.weight, fused.weight), self.weight.requires_grad)
        new.bias = (None if self.bias is None else
                    nn.Parameter(_alias(self.bias, self.fused.bias, fused.bias), self.bias.requires_grad))
        return new


def _alias(t: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The view of ``new`` that ``t`` is of ``old`` (same shape, strides and relative offset)."""
    view = new.detach().as_strided(t.shape, t.stride(), t.storage_offset() - old.storage_offset()
                                   + new.storage_offset())
    if not torch.equal(view, t.detach()):
        raise RuntimeError("a split q/k/v view does not map onto the copied fused weight")
    return view


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _index_maps(attn: Any, fused: nn.Module, name: str) -> list[tuple[torch.Tensor, torch.Tensor | None]] | None:
    """Run the bridge's own split on a probe whose fused entries are their flat indices: where each q/k/v entry
    comes from (exact in float64)."""
    w = fused.weight
    probe_linear = nn.Linear(int(w.shape[1]), int(w.shape[0]), bias=getattr(fused, "bias", None) is not None,
                             dtype=torch.float64)
    with torch.no_grad():
        probe_linear.weight.copy_(torch.arange(w.numel(), dtype=torch.float64).reshape(w.shape))
        if probe_linear.bias is not None:
            probe_linear.bias.copy_(torch.arange(probe_linear.bias.numel(), dtype=torch.float64))
    probe = nn.Module()
    setattr(probe, name, probe_linear)
    try:
        with torch.no_grad():
            parts = attn.split_qkv_matrix(probe)
    except Exception:  # a split that reads more than the fused Linear: leave the bridge as it is
        return None
    maps = []
    for part in parts:
        weight, bias = part.weight.detach(), getattr(part, "bias", None)
        if weight.dtype != torch.float64 or weight.dim() != 2 or not torch.equal(weight, weight.round()):
            return None
        maps.append((weight.long(), None if bias is None else bias.detach().long()))
    return maps


def _fused_of(attn: Any) -> tuple[nn.Module, str] | None:
    """The fused qkv nn.Linear under a joint-QKV attention bridge, and its attribute name in the HF module."""
    qkv = getattr(attn, "submodules", {}).get("qkv")
    if qkv is None:
        return None
    fused = getattr(qkv, "original_component", None)
    if fused is None or not isinstance(getattr(fused, "weight", None), torch.Tensor) or not qkv.name:
        return None
    return fused, str(qkv.name)


def tie_split_qkv(bridge: Any) -> int:
    """Make every split q/k/v copy of a fused qkv read the fused parameter; the number of layers changed."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge

    tied = 0
    for block in getattr(bridge, "blocks", []):
        attn = getattr(block, "attn", None)
        if not isinstance(attn, JointQKVAttentionBridge) or (found := _fused_of(attn)) is None:
            continue
        fused, name = found
        linears = [getattr(attn, p).original_component for p in "qkv"]
        if any(isinstance(m, (FusedSlice, AliasedLinear)) for m in linears):
            continue  # already tied
        if all(_shares_storage(m.weight, fused.weight) and (m.bias is None or _shares_storage(m.bias, fused.bias))
               for m in linears):
            for part, linear in zip("qkv", linears):  # views (GPT-2's c_attn): keep them views across deepcopy
                getattr(attn, part).set_original_component(AliasedLinear(linear, fused))
            tied += 1
            continue
        maps = _index_maps(attn, fused, name)
        slices = None if maps is None else [FusedSlice(fused, wi.to(fused.weight.device),
                                                       None if bi is None else bi.to(fused.weight.device))
                                            for wi, bi in maps]
        if slices is None or not all(_same(s, m) for s, m in zip(slices, linears)):
            warnings.warn(f"{type(attn).__name__}: cannot tie the split q/k/v to the fused {name}; training them "
                          "will not reach the saved weights")
            continue
        for part, piece in zip("qkv", slices):
            getattr(attn, part).set_original_component(piece)
        tied += 1
    return tied


def _same(piece: FusedSlice, linear: nn.Module) -> bool:
    """The gathered weight and bias equal the split copy's, bit for bit."""
    with torch.no_grad():
        if not torch.equal(piece.weight, linear.weight):
            return False
        a, b = piece.bias, getattr(linear, "bias", None)
        return (a is None) == (b is None) and (a is None or torch.equal(a, b))
