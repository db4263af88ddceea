"""value_norms: how much each key can move through each head, ‖v_j · W_O^h‖, captured beside the patterns.

A head adds Σ_j A_ij v_j W_O^h to the residual stream (headsurgeon/surgery/swap/refit.py), so attention on a key whose value vector
through the output matrix is small (the first-token sink) moves little. The store keeps one float per key per head per
window (headsurgeon/surgery/patterns/store_reader.py ``Layout.value_norms``); headsurgeon/synth/weighted.py weighs patterns by it. GQA: query head h
reads KV head h // (n_heads // n_kv_heads), as headsurgeon/surgery/swap/hooked_path.py's z hook does.
"""
from __future__ import annotations


import torch

from ...core import InputError
from ..models.handle import ModelHandle

__all__ = ["output_matrices", "value_norms", "v_hook"]


def v_hook(layer: int) -> str:
    """The hook point that sees layer ``layer``'s value vectors [batch, pos, kv_heads, d_head]."""
    return f"blocks.{layer}.attn.hook_v"


def output_matrices(handle: ModelHandle) -> list[torch.Tensor]:
    """Every layer's W_O [n_heads, d_head, d_model] (float32, on the model's device), checked against the handle."""
    want = (handle.n_heads, handle.d_head, handle.d_model)
    out = []
    for layer in range(handle.n_layers):
        try:
            w_o = handle.model.blocks[layer].attn.W_O
        except (AttributeError, IndexError, TypeError) as e:
            raise InputError(f"{handle.name}: no output matrix blocks[{layer}].attn.W_O, so value norms cannot be "
                             "captured; load the model with hs.load_model, or capture with value_norms=False") from e
        if tuple(w_o.shape) != want:
            raise InputError(f"{handle.name}: blocks[{layer}].attn.W_O has shape {tuple(w_o.shape)}, expected {want}; "
                             "capture with value_norms=False")
        out.append(w_o.detach().to(torch.float32))
    return out


def value_norms(v: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    """‖v_j · W_O^h‖ per sequence, query head and key: float32 [B, n_heads, N] from ``v`` [B, N, kv, d_head] (or the
    raw [B, N, kv·d_head]) and ``w_o`` [n_heads, d_head, d_model]."""
    n_heads, d_head, _ = w_o.shape
    v4 = v if v.dim() == 4 else v.reshape(v.shape[0], v.shape[1], -1, d_head)
    kv = v4.shape[2]
    if kv < 1 or n_heads % kv:
        raise InputError(f"{kv} value heads do not divide {n_heads} query heads; cannot pair heads for value norms")
    per_query = v4.to(torch.float32).repeat_interleave(n_heads // kv, dim=2)  # [B, N, H, d_head]
    moved = torch.einsum("bnhd,hdm->bhnm", per_query, w_o.to(per_query.device))
    return torch.linalg.vector_norm(moved, dim=-1)
