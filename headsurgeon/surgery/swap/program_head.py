"""ProgramHead: one query head whose attention a program (or another pattern provider) supplies, checked per batch.

Programs of small support arrive as compressed rows, which the hybrid scatters into the head's slice without
densifying them (headsurgeon/surgery/swap/headpatterns.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ...kernels.cache import TensorCache
from ...kernels.sparse import SparseRows
from ...synth.sequence import Sequence
from ...synth.tensors import is_sparse_program, program_rows
from .errors import SurgeryError
from .providers import ProgramPatterns, as_provider
from ...core import Head


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
