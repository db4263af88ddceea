"""Model inputs from Sequences: right-padded id and attention-mask tensors, whole or in batches (training loops use these)."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from ..synth.sequence import Sequence
from ..core import InputError

__all__ = ["padded_batch", "batches"]


def padded_batch(sequences: list[Sequence], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, N] and attention mask [B, N] (1 on real tokens) for a list of sequences."""
    if not sequences:
        raise InputError("padded_batch needs at least one sequence")
    width = max(s.n for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, s in enumerate(sequences):
        ids[b, : s.n] = torch.from_numpy(s.ids)
        mask[b, : s.n] = 1
    return ids, mask


def batches(sequences: list[Sequence], batch_size: int = 16, pad_id: int = 0,
            shuffle: bool = False, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(ids, attention_mask)`` batches of ``batch_size`` sequences, in order or shuffled with ``seed``."""
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise InputError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed)).tolist() if shuffle \
        else list(range(len(sequences)))
    for start in range(0, len(order), batch_size):
        yield padded_batch([sequences[i] for i in order[start: start + batch_size]], pad_id)
