"""Headless encoders (a ``BertModel`` with no prediction head, e.g. all-MiniLM-L6-v2) loaded without inventing a head.

TransformerLens' BERT adapter only wraps ``BertForMaskedLM``-shaped modules (``bert.*`` plus ``cls.predictions.*``).
A headless ``BertModel`` is therefore placed inside a :class:`HeadlessBertReadout`: the real encoder as ``.bert``
and a fixed readout (identity transform, unit LayerNorm, decoder tied to the word embeddings, zero bias, all
frozen). The readout is deterministic, so two loads compute identical logits, but it was never trained: nothing
downstream uses its logits (``perplexity`` refuses such a model; its replacement cost is
``headsurgeon/surgery/measure/evaluate.py``'s ``embedding_distance`` over the encoder's own final hidden states). Checkpoints see only
the real encoder (:func:`real_model`), so its state dict equals the one on disk.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # transformers takes seconds to import: named for the checker only
    from transformers import PreTrainedModel

__all__ = ["HEADLESS_ARCHITECTURES", "is_headless", "wrap_headless", "real_model", "final_hidden_module"]

#: base-model classes without a prediction head that the loader can wrap, and the head-bearing class TL bridges
HEADLESS_ARCHITECTURES = {"BertModel": "BertForMaskedLM"}


def is_headless(hf_model: PreTrainedModel) -> bool:
    """Whether ``hf_model`` is a bare base model (no LM head) of an architecture the loader can wrap."""
    return type(hf_model).__name__ in HEADLESS_ARCHITECTURES


def _readout_class() -> type:
    from transformers import BertForMaskedLM  # here: importing transformers costs seconds

    class HeadlessBertReadout(BertForMaskedLM):
        """A BertModel under a fixed, untrained readout so TransformerLens can bridge it; see the module docstring."""

        headless = True

    return HeadlessBertReadout


_READOUT: type | None = None


@torch.no_grad()
def wrap_headless(base: Any) -> Any:
    """The module TransformerLens bridges for a headless encoder: ``base`` itself as ``.bert``, a fixed readout."""
    global _READOUT
    if _READOUT is None:
        _READOUT = _readout_class()
    config = base.config
    with torch.device("meta"):
        wrapper = _READOUT(config)
    wrapper.bert = base
    head = wrapper.cls.predictions
    d = int(config.hidden_size)
    device, dtype = base.embeddings.word_embeddings.weight.device, base.embeddings.word_embeddings.weight.dtype
    head.transform.dense = torch.nn.Linear(d, d, device=device, dtype=dtype)
    head.transform.dense.weight.copy_(torch.eye(d, dtype=dtype))
    head.transform.dense.bias.zero_()
    head.transform.LayerNorm = torch.nn.LayerNorm(d, eps=config.layer_norm_eps, device=device, dtype=dtype)
    head.decoder = torch.nn.Linear(d, int(config.vocab_size), bias=False, device=device, dtype=dtype)
    head.decoder.weight = base.embeddings.word_embeddings.weight  # tied, as BertForMaskedLM ties it
    head.bias = torch.nn.Parameter(torch.zeros(int(config.vocab_size), device=device, dtype=dtype))
    head.decoder.bias = head.bias
    for param in head.parameters():
        if param is not head.decoder.weight:
            param.requires_grad_(False)
    wrapper.train(base.training)
    return wrapper


def real_model(hf_model: PreTrainedModel) -> Any:
    """The model whose weights a checkpoint stores: the encoder inside a headless readout, else ``hf_model``."""
    return hf_model.bert if getattr(hf_model, "headless", False) else hf_model


def final_hidden_module(hf_model: PreTrainedModel) -> Any:
    """The module whose output holds the final hidden states (``last_hidden_state``): the base model."""
    model = real_model(hf_model)
    return getattr(model, "base_model", model)
