"""The transformers model under a TransformerBridge, without the bridge: the hybrid's fused forward runs it.

TransformerBridge puts its components (hook points around every piece) in place of the transformers modules and
reimplements attention eagerly so that ``hook_pattern`` fires. A forward that nobody watches needs neither: this
module rebuilds the original module tree from each component's ``original_component`` as shallow copies that
share the parameter and buffer dictionaries (training, ``load_state_dict`` and ``.to()`` reach both), with a
copy of the config whose attention implementation is headsurgeon's (headsurgeon/surgery/swap/fast_attention.py). The bridge
itself is left untouched. :func:`plain_model` answers None where this is not the same model: checked once per
bridge by comparing logits on a few tokens and by requiring every layer's attention to go through the function.
"""
from __future__ import annotations

import copy
import warnings
import weakref
from typing import Any

import torch
from torch import nn

from .fast_attention import FastPathUnsupported, ForwardState, programs_for, register
from ..models.handle import ModelHandle

__all__ = ["plain_model", "unwrap"]

_PLAIN: "weakref.WeakKeyDictionary[nn.Module, Any]" = weakref.WeakKeyDictionary()
_NONE = object()  # cached: this bridge has no usable plain model


def unwrap(module: nn.Module, config: Any = None, new_config: Any = None,
           memo: dict[int, nn.Module] | None = None) -> nn.Module:
    """A shallow copy of ``module``'s original tree (bridge components replaced by what they wrap); parameters and
    buffers are shared, and ``config`` is replaced by ``new_config`` where a module holds it."""
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    source = module
    while isinstance(source, GeneralizedComponent) and getattr(source, "original_component", None) is not None:
        source = source.original_component
    if isinstance(source, GeneralizedComponent):
        raise FastPathUnsupported(f"{type(source).__name__} wraps no transformers module")
    out = copy.copy(source)
    memo[id(module)] = out
    out._modules = {name: (None if child is None else unwrap(child, config, new_config, memo))
                    for name, child in source._modules.items()}
    if config is not None and getattr(source, "config", None) is config:
        object.__setattr__(out, "config", new_config)
    return out


def _attention_layers(plain: nn.Module) -> int:
    """Tag each attention module with its layer (``headsurgeon_layer``, read by the attention function)."""
    count = 0
    for module in plain.modules():
        layer = getattr(module, "layer_idx", None)
        if layer is not None and hasattr(module, "config") and any(
                hasattr(module, name) for name in ("q_proj", "c_attn", "query_key_value", "qkv_proj", "Wqkv")):
            object.__setattr__(module, "headsurgeon_layer", int(layer))
            count += 1
    return count


def _build(handle: ModelHandle) -> nn.Module | None:
    hf = getattr(handle.model, "original_model", None) or handle.hf_model
    if hf is None or not handle.causal or not getattr(handle, "has_lm_head", True):
        return None
    config = getattr(hf, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return None
    new_config = copy.copy(config)
    new_config._attn_implementation_internal = register()
    plain = unwrap(hf, config, new_config)
    if _attention_layers(plain) != handle.n_layers:
        return None
    ids = torch.tensor([[handle.bos_id or 0, 1 % handle.vocab_size, 2 % handle.vocab_size, 3 % handle.vocab_size]],
                       device=handle.device)
    state = ForwardState({})
    tol = 1e-3 if next(hf.parameters()).dtype in (torch.float32, torch.float64) else 5e-2
    try:
        with torch.no_grad(), warnings.catch_warnings(), programs_for(state):
            warnings.simplefilter("ignore")
            got = plain(input_ids=ids, use_cache=False).logits
            want = handle.model(ids)
    except (FastPathUnsupported, TypeError, AttributeError, ValueError, KeyError):
        return None
    if sorted(set(state.layers_seen)) != list(range(handle.n_layers)) or not isinstance(want, torch.Tensor) \
            or want.shape != got.shape or not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol):
        return None
    return plain


def plain_model(handle: ModelHandle) -> nn.Module | None:
    """The bridge's transformers model with headsurgeon's attention (built and checked once per bridge), or None
    where the fused path does not apply: not causal, no LM head, attention that does not dispatch through
    transformers' attention functions, or logits that differ from the bridge's."""
    found = _PLAIN.get(handle.model)
    if found is None:
        try:
            found = _build(handle)
        except FastPathUnsupported:
            found = None
        _PLAIN[handle.model] = _NONE if found is None else found
    return None if found is _NONE else found
