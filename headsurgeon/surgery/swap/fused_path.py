"""The hybrid's fused path: an unwatched call runs the plain transformers model with the program heads in its fused
attention (headsurgeon/surgery/swap/plain_model.py, headsurgeon/surgery/swap/fast_attention.py), skipping the hooks."""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn

from .batch_patterns import BatchPatterns
from .errors import SurgeryError
from .fast_attention import ForwardState, programs_for
from .frozen_qk import FrozenQK
from .plain_model import plain_model

#: a module's four hook tables: any entry not the libraries' own wiring is a watcher
_HOOK_DICTS = tuple(operator.attrgetter(name) for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                           "_backward_pre_hooks"))


def _bridge_own(hook: Any) -> bool:
    """Whether a module hook is the libraries' own wiring, not a user's: TransformerBridge's (it captures residuals
    for its forward) or transformers' (it records outputs only when asked to)."""
    return getattr(hook, "__module__", "").startswith(("transformer_lens.model_bridge", "transformers."))


class FusedPath(BatchPatterns):
    """HybridModel's part that decides whether a call may skip the hooks and runs it fused
    (headsurgeon/surgery/swap/hybrid.py sets these attributes)."""

    base: Any  # the TransformerBridge
    fused: bool
    last_path: str | None
    last_state: ForwardState | None
    _restored: bool  # set by restore(): no fused call after it
    _frozen: FrozenQK
    _handles: list[Any]  # the hooks of the hooked call running now
    _watched: list[nn.Module] | None  # the bridge's modules, listed on the first call
    _points: set[int]  # ids of the bridge's hook points
    _aliased: bool | None

    def _fused_model(self, input: Any, kwargs: dict[str, Any]) -> nn.Module | None:
        """The plain transformers model when this call may skip the hooks (headsurgeon/surgery/swap/plain_model.py), else None:
        only for token ids with no option but a padding mask, no output-level program, and nobody watching (no
        hook on any hook point or module of the bridge, no global module hook)."""
        if not (self.fused and not self._restored and isinstance(input, torch.Tensor) and input.ndim == 2
                and not input.is_floating_point() and set(kwargs) <= {"attention_mask"}):
            return None
        if any(getattr(ph.provider, "output_level", False) for ph in self.program_heads.values()):
            return None
        if torch.is_grad_enabled() and self._aliased_parameters():
            return None  # the bridge trains views of a fused weight (GPT-2's q/k/v); training keeps to its path
        from torch.nn.modules import module as _module

        if (_module._global_forward_hooks or _module._global_forward_pre_hooks or _module._global_backward_hooks
                or _module._global_backward_pre_hooks):
            return None
        if self._watched is None:  # the bridge's modules; any hook on a hook point is a watcher
            self._watched = list(self.base.modules())
            self._points = {id(hp) for hp in self.base.hook_dict.values()}
        for kind in _HOOK_DICTS:
            for m in filter(kind, self._watched):  # the few modules with such hooks, found in C
                if id(m) in self._points or not all(_bridge_own(f) for f in kind(m).values()):
                    return None
        return plain_model(self.handle)

    def _aliased_parameters(self) -> bool:
        """Whether two of the bridge's parameters share storage (its q/k/v views of GPT-2's fused c_attn)."""
        if self._aliased is None:
            storages = [p.untyped_storage().data_ptr() for p in self.base.parameters()]
            self._aliased = len(set(storages)) < len(storages)
        return self._aliased

    def _fused_forward(self, plain: nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Logits from the plain model with the program heads in its fused attention (headsurgeon/surgery/swap/fast_attention.py)."""
        if self._handles:
            raise SurgeryError("this hybrid is already running (a hybrid call inside a hook of the same hybrid?)")
        if plain.training != self.base.training:
            plain.train(self.base.training)
        self._frozen.pending = self._frozen.pending or torch.is_grad_enabled()
        self._ids, self._batch = ids, None
        self._lengths = attention_mask.sum(-1).cpu() if attention_mask is not None else None
        try:
            state = ForwardState(self._batch_patterns(ids.shape[1], ids.shape[1]))
            with programs_for(state):
                out = plain(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits
        finally:
            self._lengths = None
        self.last_path, self.last_state = "fused", state
        return out
