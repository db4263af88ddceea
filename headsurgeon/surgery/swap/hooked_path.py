"""The hybrid's hooked path: program hooks on the bridge's hook points, installed for one call and removed after it.

``hook_pattern`` ([batch, head, query, key]) takes the program's pattern where the backend honours pattern edits;
otherwise (TransformerBridge on BERT discards them) the head's ``z`` is recomputed from ``hook_v``:
``z_h = A_h · v_kv(h)``. Never at the attention output, where heads are already mixed by W_O.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .batch_patterns import BatchPatterns
from .errors import SurgeryError
from .program_head import ProgramHead


class HookedPath(BatchPatterns):
    """HybridModel's part that hooks the bridge (headsurgeon/surgery/swap/hybrid.py sets these attributes)."""

    base: Any  # the TransformerBridge
    mode: str  # "pattern" where the backend honours pattern edits, else "z"
    _handles: list[Any]  # the hooks of the call running now
    _v: dict[int, torch.Tensor]  # per layer, this call's hook_v output (z mode)

    def _check_hook_points(self) -> None:
        if "embed.hook_in" not in self.base.hook_dict:
            raise SurgeryError(f"{self.handle.name}: no embed.hook_in hook point to read token ids from")

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _install(self) -> None:
        """Hook the base for one call of this hybrid (removed again in ``forward``'s finally)."""
        hooks = self.base.hook_dict
        self._remove_hooks()
        self._handles.append(hooks["embed.hook_in"].register_forward_hook(self._remember_ids, prepend=True))
        for layer, heads in self._by_layer().items():
            attention = [ph for ph in heads if not getattr(ph.provider, "output_level", False)]
            outputs = [ph for ph in heads if getattr(ph.provider, "output_level", False)]
            if attention:  # in z mode the backend ignores this edit; it lets observers see the pattern used
                hp = hooks[f"blocks.{layer}.attn.hook_pattern"]
                self._handles.append(hp.register_forward_hook(self._pattern_hook(layer), prepend=True))
            if attention and self.mode == "pattern":
                attention = []
            if attention:
                hv = hooks[f"blocks.{layer}.attn.hook_v"]
                self._handles.append(hv.register_forward_hook(self._v_hook(layer), prepend=True))
            if attention or outputs:
                hz = hooks[f"blocks.{layer}.attn.hook_z"]
                self._handles.append(hz.register_forward_hook(self._z_hook(layer, attention, outputs), prepend=True))

    def _remember_ids(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self._ids = output.detach()
        self._batch = None  # this forward's program patterns, computed at the first hooked layer

    def _pattern_hook(self, layer: int):
        def hook(module: nn.Module, inputs: Any, pattern: torch.Tensor) -> torch.Tensor | None:
            if self.mode == "z" and len(module._forward_hooks) == 1:
                return None  # the backend ignores pattern edits; only observers (hooks after this one) need it
            found = self._batch_patterns(pattern.shape[-2], pattern.shape[-1])[layer]
            if self.mode == "z" and not torch.is_grad_enabled():
                # the backend has consumed the pattern already; edited in place, observers see the pattern used
                # and the bridge does not warn that a returned edit is discarded (z carries it)
                found.apply(pattern, in_place=True)
                return None
            if self.mode == "pattern" and not pattern.requires_grad and len(module._forward_hooks) == 1:
                found.apply(pattern, in_place=True)  # inference, nobody else watching: no new [B, H, N, N] buffer
                return None
            # out of place: autograd keeps the softmax output; no grad into replaced heads
            return found.apply(pattern, in_place=False)
        return hook

    def _v_hook(self, layer: int):
        def hook(module: nn.Module, inputs: Any, v: torch.Tensor) -> None:
            self._v[layer] = v
        return hook

    def _z_hook(self, layer: int, heads: list[ProgramHead], outputs: list[ProgramHead]):
        group = self.handle.n_heads // self.handle.n_kv_heads
        d = self.handle.d_head

        def hook(module: nn.Module, inputs: Any, z: torch.Tensor) -> torch.Tensor:
            z4 = z if z.ndim == 4 else z.reshape(z.shape[0], z.shape[1], -1, d)  # raw hooks see [b, pos, heads*d]
            out = z4.clone()
            if heads:
                v = self._v.pop(layer, None)
                if v is None:
                    raise SurgeryError(f"layer {layer}: hook_v did not fire before hook_z; cannot recompute z")
                v4 = v if v.ndim == 4 else v.reshape(v.shape[0], v.shape[1], -1, d)
                for ph, program_z in self._batch_patterns(z4.shape[1], v4.shape[1])[layer].head_z(v4, group):
                    out[:, :, ph.head] = ph.blend(z4[:, :, ph.head], program_z)
            for ph in outputs:
                fixed = ph.provider.outputs(z4.shape[1]).to(device=z4.device, dtype=z4.dtype)
                out[:, :, ph.head] = ph.blend(z4[:, :, ph.head], fixed.expand(z4.shape[0], -1, -1))
            return out.reshape(z.shape)
        return hook
