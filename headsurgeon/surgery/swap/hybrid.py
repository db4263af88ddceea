"""HybridModel: the model with some query heads' attention swapped for programs, inside its own calls only.

A call runs either the fused path (headsurgeon/surgery/swap/fused_path.py) or the bridge with the program hooks
(headsurgeon/surgery/swap/hooked_path.py), both from the batch's patterns (headsurgeon/surgery/swap/batch_patterns.py).
Patterns come from the programs through the content-addressed tensor cache plus that per-batch cache, so a repeated
batch costs a dictionary lookup.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Iterator

import torch
from torch import nn

from ...kernels.cache import TensorCache
from ...synth.programset import ProgramSet
from ...synth.sequence import Sequence
from .batch_patterns import BATCH_CACHE_BYTES
from .errors import BypassError, SurgeryError
from .fast_attention import ForwardState
from .frozen_qk import FrozenQK, frozen_slices
from .fused_path import FusedPath
from .headpatterns import LayerPatterns
from .hooked_path import HookedPath
from .ids import SequenceRegistry
from ..models.loading import ModelHandle
from .pattern_edits import pattern_edits_take_effect
from .program_head import ProgramHead
from ...core import Head


# bridge methods that would run the base without the program hooks, and what runs the hybrid instead
_BYPASSING = {
    "generate_stream": "hybrid.generate(...)", "hf_generate": "hybrid.generate(...)",
    "diffusion_generate": "hybrid.generate(...)", "predict_next_sentence": "hybrid(ids)",
    "encoder_output": "hybrid.run_with_cache(ids)", "original_model": "hybrid(ids)",
}


class HybridModel(HookedPath, FusedPath, nn.Module):
    """The model with some heads replaced, in its own calls only; the base model itself stays unchanged.

    ``hybrid(ids)`` returns logits with the programs applied: its hooks are installed for that call and
    removed after it (like TransformerLens' ``run_with_hooks``), so calling the base model or handle
    directly always runs the unmodified model. The weights are shared with the base by design (training
    the hybrid trains them; ``replace_heads(..., copy=True)`` gives an independent copy).
    ``hybrid.replaced`` maps (layer, head) → program; attributes of the ModelHandle (tokenizer, n_layers,
    ...) and of the TransformerBridge are reachable directly.
    """

    def __init__(self, handle: ModelHandle, heads: dict[Head, ProgramHead], cache: TensorCache | None,
                 batch_cache_bytes: int = BATCH_CACHE_BYTES, fused: bool = True) -> None:
        super().__init__()
        self.base = handle.model
        self.program_heads = nn.ModuleDict({Head.label(k): v for k, v in sorted(heads.items())})
        object.__setattr__(self, "handle", handle)
        self.cache = cache
        self.registry = SequenceRegistry(handle.tokenizer, handle.bos_id)
        self.mode = "pattern" if pattern_edits_take_effect(handle) else "z"
        self._batch_cache: OrderedDict[str, dict[int, LayerPatterns]] = OrderedDict()
        self._batch_cache_bytes = batch_cache_bytes
        self._ids: torch.Tensor | None = None
        self._batch: dict[int, LayerPatterns] | None = None
        # decode ids to text only if some program reads text, offsets or linguistic features
        self._need_text = any(getattr(ph.provider, "needs_text", True) for ph in heads.values())
        self._lengths: torch.Tensor | None = None
        self._v: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []
        self._restored = False
        self.program_set: ProgramSet | None = None  # set by replace_heads when given one: scores for cards
        self._check_hook_points()
        # Q/K slices of fully replaced heads: weight decay must not move them (headsurgeon/surgery/swap/frozen_qk.py)
        self._frozen = FrozenQK(frozen_slices(handle, [k for k, ph in heads.items() if ph.alpha >= 1.0]))
        #: run unwatched calls through the fused attention (headsurgeon/surgery/swap/fast_attention.py); False: always the hooks
        self.fused = fused
        #: which path the last call took: "fused" (SDPA + pattern·V) or "hooked" (the bridge with pattern hooks)
        self.last_path: str | None = None
        self.last_state: ForwardState | None = None  # the fused path's record of its last forward (layers, heads)
        self._watched: list[nn.Module] | None = None
        self._aliased: bool | None = None

    # ------------------------------------------------------------ public face
    @property
    def replaced(self) -> dict[Head, Any]:
        return {Head(ph.layer, ph.head): ph.program for ph in self.program_heads.values()}

    @property
    def active(self) -> bool:
        """False once :meth:`restore` detached the programs."""
        return not self._restored

    def forward(self, input: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """Logits (or whatever the base returns) with program heads applied; pass attention_mask for padding."""
        if attention_mask is not None and (not self.handle.causal or bool((attention_mask == 0).any())):
            kwargs["attention_mask"] = attention_mask.to(self.handle.device)
        input = self._on_device(input)
        plain = self._fused_model(input, kwargs)
        if plain is not None:
            return self._fused_forward(plain, input, kwargs.get("attention_mask"))
        self.last_path = "hooked"
        with self._applied(attention_mask):
            return self.base(input, **kwargs)

    # TransformerLens habits: the bridge's own entry points, run on the hybrid (tests/surgery/test_hybrid_tl.py)
    def run_with_cache(self, input: Any, *args: Any, **kwargs: Any) -> Any:
        """TransformerLens' ``run_with_cache`` on the hybrid: the cache holds the patterns the hybrid uses."""
        with self._applied(kwargs.get("attention_mask")):
            return self.base.run_with_cache(self._on_device(input), *args, **kwargs)

    def run_with_hooks(self, input: Any, *args: Any, **kwargs: Any) -> Any:
        """TransformerLens' ``run_with_hooks`` on the hybrid: user hooks run after the program hooks."""
        with self._applied(kwargs.get("attention_mask")):
            return self.base.run_with_hooks(self._on_device(input), *args, **kwargs)

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Any = (), bwd_hooks: Any = (), reset_hooks_end: bool = True,
              clear_contexts: bool = False) -> Iterator["HybridModel"]:
        """TransformerLens' ``hooks`` context manager; yields the hybrid, whose calls inside run the user hooks too."""
        with self.base.hooks(fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks), reset_hooks_end=reset_hooks_end,
                             clear_contexts=clear_contexts):
            yield self

    @contextlib.contextmanager
    def _applied(self, attention_mask: torch.Tensor | None = None) -> Iterator[None]:
        """The program hooks, installed for one call of the base (first on each hook point) and removed after it."""
        if not self.active:
            raise SurgeryError("this hybrid was restored; call replace_heads again to re-apply the programs")
        if self._handles:
            raise SurgeryError("this hybrid is already running (a hybrid call inside a hook of the same hybrid?)")
        if attention_mask is not None:
            self._lengths = attention_mask.sum(-1).cpu()
        self._frozen.pending = self._frozen.pending or torch.is_grad_enabled()
        self._install()
        try:
            yield
        finally:
            self._remove_hooks()
            self._lengths = None
            self._v.clear()

    def _on_device(self, input: Any) -> Any:
        if isinstance(input, torch.Tensor) and not input.is_floating_point():
            return input.to(self.handle.device)
        return input

    def register_sequences(self, sequences: list[Sequence]) -> None:
        """Tell the hybrid the exact Sequences (text, offsets) behind ids it will see; otherwise ids are decoded."""
        self.registry.register(sequences)

    @torch.no_grad()
    def generate(self, ids: torch.Tensor | str, max_new_tokens: int = 32, temperature: float = 0.0,
                 eos_id: int | None = None, seed: int | None = None, **tl_options: Any) -> torch.Tensor | str:
        """Greedy (temperature 0) or sampled continuation; full recompute per step (programs see whole sequences).

        A string prompt is tokenized like TransformerLens does (``to_tokens``) and the text is returned.
        TransformerLens' other ``generate`` options are refused rather than silently running the base model.
        """
        if tl_options:
            raise SurgeryError(f"hybrid.generate does not take {sorted(tl_options)}: it recomputes every step with "
                               "the programs; use hybrid.generate(ids_or_text, max_new_tokens=, temperature=, "
                               "eos_id=, seed=)")
        if isinstance(ids, str):
            out = self.generate(self.base.to_tokens(ids), max_new_tokens, temperature, eos_id, seed)
            return self.base.to_string(out[0])
        ids = ids if ids.ndim == 2 else ids[None]
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for _ in range(max_new_tokens):
            window = ids[:, -self.handle.n_ctx:]
            logits = self(window)[:, -1].float().cpu()
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
            else:
                nxt = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt.to(ids.device)], dim=1)
            if eos_id is not None and bool((nxt == eos_id).all()):
                break
        return ids

    def restore(self) -> Any:
        """Detach the programs: later calls of this hybrid raise, its pattern caches are freed; returns the base.

        No hook outlives a call, so the base model was already unmodified between calls. Weights are not
        restored: they are the base's own (shared), including any training done through the hybrid;
        ``replace_heads(..., copy=True)`` keeps the base's weights apart.
        """
        self._remove_hooks()
        self._frozen.close()
        self._restored = True
        self._batch_cache.clear()
        self._v.clear()
        return self.base

    def __enter__(self) -> "HybridModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        if name in _BYPASSING:
            raise BypassError(f"hybrid.{name} would run the base model without the programs; use "
                               f"{_BYPASSING[name]} (or hybrid.base.{name} for the base on purpose)")
        handle = self.__dict__.get("handle")
        if handle is not None and hasattr(handle, name):
            return getattr(handle, name)
        return getattr(self._modules["base"], name)

    def __repr__(self) -> str:
        """A few lines: which heads run which program; the full module tree is ``.base``."""
        shown = [f"  {Head.label(k)}: {str(p)[:70]}" for k, p in sorted(self.replaced.items())[:8]]
        more = len(self.replaced) - len(shown)
        return "\n".join([f"HybridModel({self.handle.name}: {len(self.replaced)} of {self.handle.n_layers * self.handle.n_heads} "
                           f"heads replaced, {self.mode} mode{'' if self.active else ', restored'}; module tree: .base)",
                           *shown, *([f"  ... and {more} more"] if more > 0 else [])])
