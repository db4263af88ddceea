"""ProgramHead and replace_heads: swap query heads' attention for programs, per head, before values mix.

The substitution happens at ``blocks.{l}.attn.hook_pattern`` ([batch, head, query, key]) where the
backend honours pattern edits, and otherwise (TransformerBridge on BERT discards them) by recomputing
the head's ``z`` from ``hook_v``: ``z_h = A_h · v_kv(h)``. Never at the attention output, where heads are
already mixed by W_O. Patterns come from the programs through the content-addressed tensor cache plus a
per-batch cache, so a repeated batch costs a dictionary lookup. Programs of small support arrive as
compressed rows and are scattered into the head's slice, never densified (headsurgeon/surgery/swap/headpatterns.py).
"""
from __future__ import annotations

import contextlib
import copy as _copy
import dataclasses
import hashlib
import operator
import os
import warnings
from collections import OrderedDict
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from ...kernels.cache import TensorCache
from ...kernels.sparse import SparseRows
from ...synth.program import Program
from ...synth.programset import ProgramSet
from ...synth.sequence import Sequence
from ...synth.tensors import is_sparse_program, program_rows
from ...synth.vocab import Vocabulary, VocabularyError
from .fast_attention import ForwardState, programs_for
from .frozen_qk import FrozenQK, frozen_slices
from .headpatterns import LayerPatterns
from .ids import SequenceRegistry
from ..models.loading import ModelHandle, load_model
from .plain_model import plain_model
from .providers import ProgramPatterns, as_provider
from ...core import WHICHES, Head, HeadsurgeonError, Which

#: default cap on the hybrid's per-batch pattern cache (placed copies included): a dense program at 1 x 2,048
#: tokens holds 16 MiB per head per batch, so a cap in batches alone let a long-context run grow to gigabytes
BATCH_CACHE_BYTES = 256 << 20


class SurgeryError(HeadsurgeonError, ValueError):
    """A head swap cannot be applied (bad head key, duplicate, program failing on a batch, KV-cache use)."""


class BypassError(SurgeryError, AttributeError):
    """A bridge method that would run the base model without the programs; the message names what to call."""


class ProgramHead(nn.Module):
    """One query head whose attention comes from a program (blended with the neural one by ``alpha``)."""

    def __init__(self, layer: int, head: int, source: Any, alpha: float = 1.0, cache: TensorCache | None = None):
        super().__init__()
        if not 0.0 <= float(alpha) <= 1.0:
            raise SurgeryError(f"alpha must lie in [0, 1] (0 = neural, 1 = program), got {alpha}")
        self.layer, self.head = int(layer), int(head)
        self.provider = as_provider(source, cache)
        self.alpha = float(alpha)

    @property
    def program(self) -> Any:
        return self.provider.program if isinstance(self.provider, ProgramPatterns) else self.provider

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        """The program's attention for the batch, float32 [B, N, N]; failures become a SurgeryError."""
        try:
            out = np.asarray(self.provider.patterns(sequences, causal), dtype=np.float32)
        except Exception as e:
            raise SurgeryError(f"the program for {Head.label((self.layer, self.head))} failed on a batch of "
                               f"{len(sequences)} sequences: {type(e).__name__}: {e}") from e
        width = max(s.n for s in sequences)
        if out.shape != (len(sequences), width, width):
            raise SurgeryError(f"the program for {Head.label((self.layer, self.head))} returned shape {out.shape}; "
                               f"expected {(len(sequences), width, width)}")
        if not np.isfinite(out).all():
            raise SurgeryError(f"the program for {Head.label((self.layer, self.head))} returned NaN/inf")
        return out

    def pattern_rows(self, sequences: list[Sequence], causal: bool) -> SparseRows | np.ndarray:
        """The batch's attention as the hybrid's hook takes it: compressed rows for sparse DSL programs
        (through the tensor cache), else :meth:`patterns`."""
        provider = self.provider
        if not (isinstance(provider, ProgramPatterns) and is_sparse_program(provider.program)):
            return self.patterns(sequences, causal)
        try:
            return program_rows([provider.program], sequences, causal, provider.cache)[0]
        except Exception as e:
            raise SurgeryError(f"the program for {Head.label((self.layer, self.head))} failed on a batch of "
                               f"{len(sequences)} sequences: {type(e).__name__}: {e}") from e

    def blend(self, neural: torch.Tensor, program: torch.Tensor) -> torch.Tensor:
        if self.alpha >= 1.0:
            return program
        if self.alpha <= 0.0:
            return neural
        return self.alpha * program + (1.0 - self.alpha) * neural

    def extra_repr(self) -> str:
        return f"{Head.label((self.layer, self.head))}, alpha={self.alpha}, program={self.program!r}"


def pattern_edits_take_effect(handle: ModelHandle) -> bool:
    """Whether this backend uses an edited hook_pattern (TransformerBridge on BERT does not)."""
    if handle.pattern_edits is not None:
        return handle.pattern_edits
    ids = torch.tensor([[handle.bos_id or 0, 1 % handle.vocab_size, 2 % handle.vocab_size]], device=handle.device)
    hp = handle.model.hook_dict[handle.pattern_hook(0)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = handle.model(ids)
        h = hp.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
        try:
            edited = handle.model(ids)
        finally:
            h.remove()
    works = not torch.equal(base, edited)
    handle.pattern_edits = works
    return works


_HOOK_DICTS = tuple(operator.attrgetter(name) for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                           "_backward_pre_hooks"))


def _bridge_own(hook: Any) -> bool:
    """Whether a module hook is the libraries' own wiring, not a user's: TransformerBridge's (it captures residuals
    for its forward) or transformers' (it records outputs only when asked to)."""
    return getattr(hook, "__module__", "").startswith(("transformer_lens.model_bridge", "transformers."))


# bridge methods that would run the base without the program hooks, and what runs the hybrid instead
_BYPASSING = {
    "generate_stream": "hybrid.generate(...)", "hf_generate": "hybrid.generate(...)",
    "diffusion_generate": "hybrid.generate(...)", "predict_next_sentence": "hybrid(ids)",
    "encoder_output": "hybrid.run_with_cache(ids)", "original_model": "hybrid(ids)",
}


class HybridModel(nn.Module):
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

    def _fused_model(self, input: Any, kwargs: dict[str, Any]) -> nn.Module | None:
        """The plain transformers model when this call may skip the hooks (headsurgeon/surgery/swap/plain_model.py), else None:
        only for token ids with no option but a padding mask, no output-level program, and nobody watching (no
        hook on any hook point or module of the bridge, no global module hook)."""
        if not (self.fused and self.active and isinstance(input, torch.Tensor) and input.ndim == 2
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

    # ------------------------------------------------------------ hooks
    def _by_layer(self) -> dict[int, list[ProgramHead]]:
        out: dict[int, list[ProgramHead]] = {}
        for ph in self.program_heads.values():
            out.setdefault(ph.layer, []).append(ph)
        return out

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

    def _batch_patterns(self, query_len: int, key_len: int) -> dict[int, LayerPatterns]:
        """Per layer: the attention-level program heads and their patterns for this batch (sparse or dense)."""
        ids = self._ids
        if ids is None or ids.ndim != 2:
            raise SurgeryError("program heads need token ids (embed.hook_in did not fire with [batch, pos] ids)")
        if query_len != key_len or key_len != ids.shape[1]:
            raise SurgeryError(
                f"program heads saw {query_len} queries over {key_len} keys for {ids.shape[1]} input tokens: "
                "KV-cache decoding is not supported; use hybrid.generate (full recompute per step)"
            )
        if self._batch is not None:
            return self._batch
        ids_np = ids.cpu().numpy()
        lengths = (self._lengths.numpy() if self._lengths is not None
                   else np.full(ids_np.shape[0], ids_np.shape[1], dtype=np.int64))
        key = hashlib.sha256(ids_np.astype("<i8").tobytes() + lengths.astype("<i8").tobytes()).hexdigest()
        found = self._batch_cache.get(key)
        if found is not None:
            self._batch_cache.move_to_end(key)
            self._batch = found
            return found
        seqs = [self.registry.get(ids_np[b, : int(lengths[b])], self._need_text) for b in range(ids_np.shape[0])]
        width = ids_np.shape[1]
        found = {}
        shared: dict[Any, Any] = {}  # heads running the same program share its patterns for this batch

        def rows_of(ph: ProgramHead) -> Any:
            key = ph.provider.program.hash if isinstance(ph.provider, ProgramPatterns) else id(ph)
            if key not in shared:
                shared[key] = ph.pattern_rows(seqs, self.handle.causal)
            return shared[key]

        for layer, heads in self._by_layer().items():
            heads = [ph for ph in heads if not getattr(ph.provider, "output_level", False)]
            if not heads:
                continue
            found[layer] = LayerPatterns(heads, [rows_of(ph) for ph in heads], width)
        self._batch_cache[key] = found
        self._evict()
        self._batch = found
        return found

    def _evict(self) -> None:
        """Drop the least recently used batches until the cache holds at most ``batch_cache_bytes`` (the batch
        being run stays referenced by this forward even when it alone is larger)."""
        sizes = {k: sum(lp.nbytes for lp in batch.values()) for k, batch in self._batch_cache.items()}
        total = sum(sizes.values())
        while self._batch_cache and total > self._batch_cache_bytes:
            key, _ = self._batch_cache.popitem(last=False)
            total -= sizes[key]

    def _pattern_hook(self, layer: int):
        def hook(module: nn.Module, inputs: Any, pattern: torch.Tensor) -> torch.Tensor | None:
            if self.mode == "z" and len(module._forward_hooks) == 1:
                return None  # the backend ignores pattern edits; only observers (hooks after this one) need it
            found = self._batch_patterns(pattern.shape[-2], pattern.shape[-1])[layer]
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


def _normalize_programs(handle: ModelHandle, programs: Mapping[Any, Any] | Any) -> dict[Head, Any]:
    items = programs.items() if isinstance(programs, Mapping) else getattr(programs, "items", lambda: None)()
    if items is None:
        raise SurgeryError("programs must map heads ('L3H5' or (3, 5)) to programs, or be a ProgramSet")
    out: dict[Head, Any] = {}
    for key, program in items:
        head = Head.parse(key)
        try:
            handle.check_head(*head)
        except IndexError as e:
            raise SurgeryError(str(e)) from e
        if head in out:
            raise SurgeryError(f"head {Head.label(head)} is given twice ({key!r}); keep one program per head")
        out[head] = program
    if not out:
        raise SurgeryError("no heads to replace: programs is empty")
    return out


def _from_programset(handle: ModelHandle, programs: ProgramSet, which: Which) -> dict[Head, Program]:
    """The ProgramSet's programs of kind ``which``, after checking it was made with this model's tokenizer."""
    fingerprint = programs.vocab_fingerprint
    if fingerprint:
        if handle.tokenizer is None:
            warnings.warn(f"{handle.name} has no tokenizer: cannot check that these programs were selected with "
                          f"its vocabulary (fingerprint {fingerprint[:12]})")
        else:
            try:
                Vocabulary.from_tokenizer(handle.tokenizer).check(fingerprint)
            except VocabularyError as e:
                raise SurgeryError(f"{handle.name}'s tokenizer is not the one this program set was selected with: "
                                   f"{e}") from e
    chosen = programs.programs(which)
    missing = [Head.label(h) for h in programs.keys() if h not in chosen]
    if missing:
        warnings.warn(f"{len(missing)} head(s) have no {which} and keep their neural attention: {', '.join(missing)}")
    return chosen


def independent_handle(handle: ModelHandle) -> ModelHandle:
    """A handle whose model is a deep copy (own weights) with the healing records of those weights
    (headsurgeon/surgery/swap/heal.py); the tokenizer is shared."""
    # after a forward under autograd the bridge keeps non-leaf activations on its modules (an attention's last
    # ``_pattern``), which torch refuses to deep-copy: the copy gets them detached
    memo: dict[int, Any] = {id(v): v.detach() for m in handle.model.modules() for v in vars(m).values()
                            if isinstance(v, torch.Tensor) and not v.is_leaf}
    model = _copy.deepcopy(handle.model, memo)
    copied = dataclasses.replace(handle, model=model, hf_model=getattr(model, "original_model", None))
    copied.healing = _copy.deepcopy(handle.healing)
    return copied


def replace_heads(model: Any, programs: Mapping[Any, Any] | Any, alpha: float | Mapping[Any, float] = 1.0,
                  cache: TensorCache | None = None, which: Which = "replacement", copy: bool = False,
                  trust_programs: Any = False, batch_cache_bytes: int | None = None, fused: bool = True) -> HybridModel:
    """Swap the given heads' attention for programs; returns a HybridModel (also a context manager).

    ``programs`` maps ``(layer, head)`` or ``"L3H5"`` to a Program, DSL text, program JSON or a pattern
    provider; a ProgramSet works too: ``which="replacement"`` (default) swaps in each head's most faithful
    program, ``which="explanation"`` its readable one (heads without one stay neural, with a warning); a
    ProgramSet selected with another tokenizer is refused. ``alpha`` (per head via a mapping) blends neural
    (0) and program (1). The programs apply only inside the hybrid's own calls; the hybrid shares the
    model's weights (``model = replace_heads(model, ...)`` in training code trains them) unless
    ``copy=True``, which gives the hybrid its own deep copy of the model. A ProgramSet read from a file (or a
    programs.json path) is someone else's: its Python programs, in any slot, run only with ``trust_programs=True``
    or their hashes (headsurgeon/synth/trust.py); programs you built in this process need no trust.
    ``batch_cache_bytes``: the most the per-batch pattern cache holds (default ``BATCH_CACHE_BYTES``, 256 MiB;
    a hybrid made from another keeps its cap), so a repeated batch costs a lookup and long contexts stay bounded.
    ``fused``: a call that nobody watches (no hooks, no ``run_with_cache``) runs the transformers model with the
    neural heads through fused SDPA and the replaced heads as ``pattern · V``, computing no Q·Kᵀ or softmax for
    them (headsurgeon/surgery/swap/fast_attention.py); the same logits as the hooked path within float tolerance. ``False`` (or
    ``hybrid.fused = False``) always runs the hooked path.
    """
    if isinstance(programs, (str, os.PathLike)):
        programs = ProgramSet.load(programs)
    if isinstance(programs, ProgramSet):  # the one trust gate (headsurgeon/synth/trust.py), before anything is built
        programs = programs.trusted(trust_programs)
    if which not in WHICHES:
        raise SurgeryError(f"which must be 'replacement' or 'explanation', got {which!r}")
    if which != "replacement" and not isinstance(programs, ProgramSet):
        raise SurgeryError(f"which={which!r} needs a ProgramSet (a plain mapping holds one program per head)")
    base_heads: dict[Head, Any] = {}
    if isinstance(model, HybridModel):
        base_heads = {k: ph.provider for k, ph in ((Head.parse(n), ph) for n, ph in model.program_heads.items())}
        alphas_old = {Head.parse(n): ph.alpha for n, ph in model.program_heads.items()}
        cache = cache or model.cache
        handle = model.handle
        model.restore()
    else:
        alphas_old = {}
        handle = load_model(model)
    if copy:
        handle = independent_handle(handle)
    program_set = programs if isinstance(programs, ProgramSet) else getattr(model, "program_set", None)
    if isinstance(programs, ProgramSet):
        programs = _from_programset(handle, programs, which)
    heads = _normalize_programs(handle, programs)
    dup = set(heads) & set(base_heads)
    if dup:
        raise SurgeryError(f"heads {[Head.label(h) for h in sorted(dup)]} are already replaced in this hybrid")
    cache = cache if cache is not None else TensorCache(max_bytes=256 << 20)
    alpha_of = ({Head.parse(k): float(v) for k, v in alpha.items()} if isinstance(alpha, Mapping) else {})
    modules = {h: ProgramHead(*h, src, alphas_old.get(h, 1.0), cache) for h, src in base_heads.items()}
    for h, src in heads.items():
        modules[h] = ProgramHead(*h, src, alpha_of.get(h, alpha if not isinstance(alpha, Mapping) else 1.0), cache)
    if batch_cache_bytes is None:
        batch_cache_bytes = model._batch_cache_bytes if isinstance(model, HybridModel) else BATCH_CACHE_BYTES
    if isinstance(batch_cache_bytes, bool) or not isinstance(batch_cache_bytes, int) or batch_cache_bytes < 0:
        raise SurgeryError(f"batch_cache_bytes must be a whole number of bytes >= 0; got {batch_cache_bytes!r}")
    hybrid = HybridModel(handle, modules, cache, batch_cache_bytes, fused)
    hybrid.program_set = program_set  # scores and glosses for save_hybrid's manifest and card
    return hybrid
