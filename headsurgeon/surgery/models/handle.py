"""``ModelHandle``: a loaded model with its tokenizer and the facts every stage needs (heads, hooks, BOS policy)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from ...core import HeadsurgeonError, InputError
from .source_record import (EmbeddedSource, GgufSource, HfSource, Llama2cSource, ObjectSource, SourceRecord,
                            ZooSource, source_from_json)

__all__ = ["ModelHandle", "ModelLoadError", "SourceRecord", "Llama2cSource", "GgufSource", "HfSource", "ZooSource",
           "EmbeddedSource", "ObjectSource", "source_from_json"]


class ModelLoadError(HeadsurgeonError, ValueError):
    """The model spec could not be turned into a usable model; the message says why and what to do."""


class HeadIndexError(InputError, IndexError):
    """A layer or head index the model does not have (also an IndexError; the CLI reports it in one line)."""


@dataclass(repr=False)
class ModelHandle:
    """A loaded model with its tokenizer and the facts everything downstream needs; call it like the model."""

    model: Any  # TransformerBridge, or a legacy HookedTransformer
    tokenizer: Any
    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    vocab_size: int
    causal: bool
    n_ctx: int
    bos_id: int | None
    prepend_bos: bool
    source: SourceRecord = field(default_factory=ObjectSource)  # where it came from (headsurgeon/surgery/models/source_record.py)
    hf_model: Any = None
    has_lm_head: bool = True  # False: a headless encoder; its logits come from a fixed readout (headsurgeon/surgery/models/headless.py)
    #: whether this backend uses an edited hook_pattern, once measured (headsurgeon/surgery/swap/pattern_edits.py pattern_edits_take_effect)
    pattern_edits: bool | None = field(default=None, compare=False)
    #: hs.heal's records of the weights it changed, oldest first (headsurgeon/surgery/swap/heal.py)
    healing: list[dict[str, Any]] = field(default_factory=list, compare=False)

    @property
    def pattern_hooks(self) -> list[str]:
        """Hook names that see the post-softmax pattern [batch, head, query, key] of each layer."""
        return [self.pattern_hook(layer) for layer in range(self.n_layers)]

    def pattern_hook(self, layer: int) -> str:
        self.check_head(layer, 0)
        return f"blocks.{layer}.attn.hook_pattern"

    @property
    def heads(self) -> list[tuple[int, int]]:
        return [(layer, head) for layer in range(self.n_layers) for head in range(self.n_heads)]

    @property
    def is_masked_lm(self) -> bool:
        return self.has_lm_head and not self.causal and self.hf_model is not None and hasattr(self.hf_model, "cls")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def check_head(self, layer: int, head: int) -> None:
        """Raise a clear HeadIndexError (an IndexError) for a layer/head that does not exist."""
        if not (isinstance(layer, int) and 0 <= layer < self.n_layers):
            raise HeadIndexError(f"layer {layer!r} does not exist: {self.name} has layers 0..{self.n_layers - 1}")
        if not (isinstance(head, int) and 0 <= head < self.n_heads):
            raise HeadIndexError(
                f"head {head!r} does not exist: {self.name} has query heads 0..{self.n_heads - 1} per layer"
            )

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, pos, vocab] for token ids (no BOS added: ids are used as given)."""
        kwargs = {}
        if attention_mask is not None and not self.causal:
            kwargs["attention_mask"] = attention_mask
        elif attention_mask is not None and bool((attention_mask == 0).any()):
            kwargs["attention_mask"] = attention_mask
        return self.model(ids.to(self.device), **kwargs)

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the base model (a HybridModel is called the same way)."""
        return self.forward(ids, attention_mask)

    def __repr__(self) -> str:
        kv = f" ({self.n_kv_heads} key/value)" if self.n_kv_heads != self.n_heads else ""
        return (f"ModelHandle({self.name!r}: {self.n_layers} layers x {self.n_heads} heads{kv}, d_model "
                f"{self.d_model}, d_head {self.d_head}, vocab {self.vocab_size}, "
                f"{'causal' if self.causal else 'bidirectional'}, n_ctx {self.n_ctx}; the module is .model)")

    def describe(self) -> dict:
        return {
            "name": self.name, "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "d_head": self.d_head, "d_model": self.d_model, "vocab_size": self.vocab_size,
            "attention": "causal" if self.causal else "bidirectional", "n_ctx": self.n_ctx,
            "bos_id": self.bos_id, "prepend_bos": self.prepend_bos, "pattern_hooks": self.pattern_hooks,
            "lm_head": self.has_lm_head, "source": self.source.to_json(),
        }
