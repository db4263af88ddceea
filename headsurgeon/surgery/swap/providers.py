"""Pattern providers: what a ProgramHead asks for a batch's attention (programs, captured or ablation patterns).

A provider maps a list of Sequences to final attention float32 ``[B, N, N]`` (N = longest sequence,
zero-padded). Programs are normalized by the framework (through the tensor cache); ablation providers
return their patterns as they are (``zero`` must stay all-zero).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ...kernels.cache import TensorCache
from ...synth.program import Program
from ...synth.sequence import Sequence
from ...synth.tensors import program_tensors
from ...core import InputError, NotFoundError
from ...kernels.normalize import visible_mask

if TYPE_CHECKING:
    import torch


@runtime_checkable
class PatternProvider(Protocol):
    """Anything with ``patterns(sequences, causal) -> float32 [B, N, N]`` can replace a head."""

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray: ...

    # Optional ``needs_text = False`` tells a hybrid it may skip decoding ids to text for this provider.


def renormalize(block: np.ndarray, n: int, causal: bool) -> np.ndarray:
    """Mask an n×n block to the visible grid and make each row sum to 1 (empty rows → key 0)."""
    out = np.where(visible_mask(np.array([n]), n, causal)[0], block[:n, :n], 0.0).astype(np.float32)
    mass = out.sum(-1, keepdims=True)
    empty = mass[:, 0] <= 0
    out = np.divide(out, mass, out=np.zeros_like(out), where=mass > 0)
    out[empty, 0] = 1.0
    return out


class ProgramPatterns:
    """A Program's normalized patterns, through the content-addressed tensor cache."""

    def __init__(self, program: Program, cache: TensorCache | None = None) -> None:
        self.program = program
        self.cache = cache

    @property
    def needs_text(self) -> bool:
        """Python programs and feature-reading DSL programs need the decoded text; ids-only DSL programs do not."""
        return self.program.needs_text

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        return program_tensors([self.program], sequences, causal=causal, cache=self.cache)[0]

    def __repr__(self) -> str:
        return f"ProgramPatterns({self.program.text!r})"


class StoredPatterns:
    """The patterns one head had on known sequences (looked up by token ids); for identity swaps and tests."""

    needs_text = False

    def __init__(self, by_key: dict[str, np.ndarray], label: str = "stored") -> None:
        self.by_key = by_key
        self.label = label

    @classmethod
    def from_arrays(cls, sequences: list[Sequence], patterns: list[np.ndarray], label: str = "stored") -> "StoredPatterns":
        return cls({s.key: np.asarray(p, dtype=np.float32) for s, p in zip(sequences, patterns)}, label)

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        width = max(s.n for s in sequences)
        out = np.zeros((len(sequences), width, width), dtype=np.float32)
        for b, s in enumerate(sequences):
            p = self.by_key.get(s.key)
            if p is None:
                raise NotFoundError(f"{self.label}: no stored pattern for {s!r}; it only covers the sequences it was "
                               "built from")
            out[b, : s.n, : s.n] = p
        return out


class ZeroPatterns:
    """All-zero attention: the head contributes nothing but its output bias (zero ablation)."""

    needs_text = False

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        width = max(s.n for s in sequences)
        return np.zeros((len(sequences), width, width), dtype=np.float32)


class UniformPatterns:
    """Uniform attention over every visible key (uniform-causal for decoders)."""

    needs_text = False

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        width = max(s.n for s in sequences)
        out = np.zeros((len(sequences), width, width), dtype=np.float32)
        for b, s in enumerate(sequences):
            out[b, : s.n, : s.n] = renormalize(np.ones((s.n, s.n), np.float32), s.n, causal)
        return out


class MeanPatterns:
    """The mean pattern per (query position, key position) over a reference corpus, renormalized per row."""

    needs_text = False

    def __init__(self, reference: list[np.ndarray]) -> None:
        if not reference:
            raise InputError("mean ablation needs at least one reference pattern")
        width = max(p.shape[0] for p in reference)
        total = np.zeros((width, width), np.float64)
        count = np.zeros((width, 1), np.float64)
        for p in reference:
            n = p.shape[0]
            total[:n, :n] += p
            count[:n] += 1
        self.mean = (total / np.maximum(count, 1)).astype(np.float32)

    @classmethod
    def from_mean(cls, mean: np.ndarray) -> "MeanPatterns":
        """From a mean pattern already accumulated (headsurgeon/surgery/measure/head_costs.py streams it batch by batch)."""
        out = cls.__new__(cls)
        out.mean = np.asarray(mean, dtype=np.float32)
        return out

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        width = max(s.n for s in sequences)
        if width > self.mean.shape[0]:
            raise InputError(f"mean pattern covers {self.mean.shape[0]} positions but a sequence has {width}; "
                             "use a reference corpus with windows at least as long")
        out = np.zeros((len(sequences), width, width), dtype=np.float32)
        for b, s in enumerate(sequences):
            out[b, : s.n, : s.n] = renormalize(self.mean, s.n, causal)
        return out


class ResamplePatterns:
    """The pattern the head had on another reference sequence (at least as long; cropped, renormalized)."""

    needs_text = False

    def __init__(self, reference: list[np.ndarray], seed: int = 0) -> None:
        if not reference:
            raise InputError("resample ablation needs at least one reference pattern")
        self.reference = reference
        self.rng = np.random.default_rng(seed)

    def patterns(self, sequences: list[Sequence], causal: bool) -> np.ndarray:
        width = max(s.n for s in sequences)
        out = np.zeros((len(sequences), width, width), dtype=np.float32)
        lengths = np.array([p.shape[0] for p in self.reference])
        for b, s in enumerate(sequences):
            pool = np.flatnonzero(lengths >= s.n)
            if pool.size == 0:
                raise InputError(f"no reference pattern is as long as a {s.n}-token sequence; use longer references")
            src = self.reference[int(self.rng.choice(pool))]
            out[b, : s.n, : s.n] = renormalize(src, s.n, causal)
        return out


class MeanOutputs:
    """Mean head output z per position over a reference corpus (output-level: replaces z, not the pattern)."""

    needs_text = False

    output_level = True

    def __init__(self, mean_z: np.ndarray) -> None:
        self.mean_z = np.asarray(mean_z, dtype=np.float32)  # [positions, d_head]

    def outputs(self, n: int) -> "torch.Tensor":
        import torch

        if n > self.mean_z.shape[0]:
            raise InputError(f"mean output covers {self.mean_z.shape[0]} positions but the input has {n}; "
                             "use a reference corpus with windows at least as long")
        return torch.from_numpy(self.mean_z[:n])


def as_provider(source: Any, cache: TensorCache | None = None) -> Any:
    """Turn a Program, program text/JSON, or provider into a provider; anything else is a clear error."""
    if isinstance(source, Program):
        return ProgramPatterns(source, cache)
    if isinstance(source, str):
        return ProgramPatterns(Program.parse(source), cache)
    if isinstance(source, dict):  # program JSON is DSL only: Python programs come as Program.python(source)
        return ProgramPatterns(Program.from_dsl_json(source), cache)
    if isinstance(source, PatternProvider) or getattr(source, "output_level", False):
        return source
    raise TypeError(f"cannot replace a head with a {type(source).__name__}: give a Program, DSL text, program "
                    "JSON, or an object with patterns(sequences, causal)")
