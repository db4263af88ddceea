"""The hybrid's fused attention: neural heads through SDPA, replaced heads as ``pattern · V`` with no Q·Kᵀ or softmax.

Registered with transformers as the attention implementation ``"headsurgeon"`` (``AttentionInterface``; its masks
are SDPA's), it receives each layer's post-RoPE query, key and value. Per layer it runs
``scaled_dot_product_attention`` on the heads that keep a neural part (GQA: their key/value heads selected), and
adds each replaced head's ``alpha · pattern · v`` from the batch's :class:`LayerPatterns` (headsurgeon/surgery/swap/headpatterns.py):
sparse programs by one gather and ``index_add``, dense ones by a matmul. Since ``(α P + (1 - α) A) V =
α P V + (1 - α) A V``, blended heads are the neural output scaled by ``1 - alpha`` plus the program's share: the
same output as the hooked path's edited pattern (tests/surgery/test_fast_attention.py). Layers without program heads
run transformers' own SDPA function.

The batch's patterns reach the function through a context variable set for one forward (:func:`programs_for`),
so concurrent forwards in other threads or contexts never see them.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ...core import HeadsurgeonError
from .headpatterns import LayerPatterns

__all__ = ["IMPLEMENTATION", "FastPathUnsupported", "ForwardState", "programs_for", "register"]

#: the name this attention function and its mask are registered under with transformers
IMPLEMENTATION = "headsurgeon"


class FastPathUnsupported(HeadsurgeonError, RuntimeError):
    """A layer asked for something the fused path does not compute (softcapping, sinks, position bias)."""


@dataclass
class ForwardState:
    """One forward's program patterns per layer and what its attention calls did (read by tests and the probe)."""

    patterns: dict[int, LayerPatterns]
    layers_seen: list[int] = field(default_factory=list)
    neural_heads: dict[int, int] = field(default_factory=dict)  # layer → query heads given to SDPA


_STATE: contextvars.ContextVar[ForwardState | None] = contextvars.ContextVar("headsurgeon_fast_attention", default=None)


@contextlib.contextmanager
def programs_for(state: ForwardState) -> Iterator[ForwardState]:
    """Run the ``"headsurgeon"`` attention with ``state``'s patterns for the forwards inside this block."""
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


def program_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` [B, H, N, d], ``key``/``value`` [B, KV, N, d] →
    ([B, N, H, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None \
            or getattr(module, "sinks", None) is not None:
        raise FastPathUnsupported(f"{type(module).__name__} needs softcapping, sinks or a position bias")
    state = _STATE.get()
    layer = getattr(module, "headsurgeon_layer", None)
    if state is None or layer is None:
        raise FastPathUnsupported("the headsurgeon attention ran outside a hybrid's forward")
    state.layers_seen.append(layer)
    found = state.patterns.get(layer)
    B, H, N, d = query.shape
    if found is None:
        state.neural_heads[layer] = H
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if key.shape[2] != N:
        raise FastPathUnsupported("KV-cache decoding: program heads need the whole sequence")
    group = H // key.shape[1]
    plan = found.neural_plan(H, group, value.device, value.dtype)
    neural = plan["neural"]
    state.neural_heads[layer] = len(neural)
    out = torch.zeros(B, N, H, value.shape[-1], dtype=value.dtype, device=value.device) if len(neural) < H else None
    if neural:
        causal = N > 1 and attention_mask is None and (is_causal if is_causal is not None
                                                       else getattr(module, "is_causal", True))
        gqa = {}
        if out is None:
            q, k, v = query, key, value
            if group > 1:  # every head kept: GQA as transformers' own SDPA function runs it
                if attention_mask is None:
                    gqa["enable_gqa"] = True
                else:
                    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        else:
            q = query.index_select(1, plan["index"])
            k, v = (key.index_select(1, plan["kv"]), value.index_select(1, plan["kv"]))
        z = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout,
                                                             scale=scaling, is_causal=causal, **gqa)
        z = z.transpose(1, 2)
        if plan["keep"] is not None:
            z = z * plan["keep"]
        out = z.contiguous() if out is None else out.index_copy_(2, plan["index"], z)
    return found.add_program_z(out, value, group), None


def register() -> str:
    """Register the attention function and its mask (SDPA's) with transformers, once; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(IMPLEMENTATION, program_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION
