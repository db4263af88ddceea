"""Embedding distance: what a swap costs a model without an LM head (a sentence encoder such as all-MiniLM-L6-v2).

The sentence embedding is the one sentence-transformers computes: the final hidden states averaged over the real
tokens (attention mask 1). The distance between base and hybrid is ``1 − cos`` of their embeddings, averaged over
windows: 0 when the hybrid computes the same representation, up to 2.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np
import torch

from ...synth.errors import excerpt
from ...synth.sequence import Sequence
from ..batches import padded_batch
from ..models.headless import final_hidden_module
from ..models.loading import ModelHandle, load_model
from ..swap.hybrid import HybridModel
from ...core import HeadsurgeonError

__all__ = ["EMBEDDING_METRIC", "EvaluationError", "check_batch_size", "sentence_embeddings", "embedding_distances",
           "embedding_distance"]

#: the metric's name, as errors, sweep rows and reports spell it
EMBEDDING_METRIC = "embedding_distance"


class EvaluationError(HeadsurgeonError, ValueError):
    """An evaluation was asked for something it cannot compute (no sequences, bad batch size, no LM head)."""


def check_batch_size(batch_size: Any) -> None:
    """Refuse a batch size that is not a whole number >= 1 (range() would fail or loop on it)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise EvaluationError(f"batch_size must be a whole number of sequences >= 1 (e.g. 16), got "
                              f"{excerpt(batch_size)}")


def _handle_and_call(model: Any) -> tuple[ModelHandle, Any]:
    if isinstance(model, HybridModel):
        return model.handle, model
    handle = load_model(model)
    return handle, lambda ids, attention_mask=None: handle.forward(ids, attention_mask)


def _hidden(output: Any) -> torch.Tensor:
    """The final hidden states [batch, pos, d_model] from a base model's output."""
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0] if isinstance(output, (tuple, list)) else output


@torch.no_grad()
def sentence_embeddings(model: Any, sequences: list[Sequence], batch_size: int = 16) -> torch.Tensor:
    """float64 [n_sequences, d_model]: mean-pooled final hidden states over each window's real tokens."""
    check_batch_size(batch_size)
    handle, call = _handle_and_call(model)
    if not sequences:
        raise EvaluationError(f"{EMBEDDING_METRIC} needs at least one sequence")
    if handle.hf_model is None:
        raise EvaluationError(f"{handle.name} has no Hugging Face model inside (a legacy HookedTransformer?): "
                              f"{EMBEDDING_METRIC} reads the base model's final hidden states")
    if isinstance(model, HybridModel):
        model.register_sequences(sequences)
    seen: list[torch.Tensor] = []
    hook = final_hidden_module(handle.hf_model).register_forward_hook(lambda m, i, o: seen.append(_hidden(o)))
    out = torch.zeros(len(sequences), handle.d_model, dtype=torch.float64)
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].n)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for start in range(0, len(order), batch_size):
                rows = order[start: start + batch_size]
                ids, mask = padded_batch([sequences[i] for i in rows])
                seen.clear()
                call(ids, attention_mask=mask)
                hidden, weight = seen[-1].double().cpu(), mask[..., None].double()
                out[rows] = (hidden * weight).sum(1) / weight.sum(1).clamp_min(1.0)
    finally:
        hook.remove()
    return out


def _embeddings_of(x: Any, sequences: list[Sequence], batch_size: int) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else sentence_embeddings(x, sequences, batch_size)


def embedding_distances(model: Any, hybrid: Any, sequences: list[Sequence], batch_size: int = 16) -> np.ndarray:
    """Per window: ``1 − cos`` between the base's and the hybrid's sentence embeddings (either may be precomputed)."""
    a = _embeddings_of(model, sequences, batch_size)
    b = _embeddings_of(hybrid, sequences, batch_size)
    if a.shape != b.shape:
        raise EvaluationError(f"the two embeddings differ in shape ({tuple(a.shape)} vs {tuple(b.shape)}): compare a "
                              "model with its own hybrid on the same sequences")
    return (1.0 - torch.nn.functional.cosine_similarity(a, b, dim=-1)).clamp_min(0.0).numpy()


def embedding_distance(model: Any, hybrid: Any, sequences: list[Sequence], batch_size: int = 16) -> float:
    """Mean cosine distance between base and hybrid mean-pooled final hidden states (sentence-transformers' pooling)."""
    return float(embedding_distances(model, hybrid, sequences, batch_size).mean())
