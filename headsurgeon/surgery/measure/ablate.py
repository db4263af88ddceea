"""Quick causal ablations of heads: zero, mean (pattern or output), uniform, resample, program.

Each returns the same HybridModel as replace_heads (permanent until ``restore()``, or a context manager).
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from ...synth.trust import TrustPrograms
from ...core import ABLATION_KINDS, AblationKind, HeadLike
from ...synth.programset import ProgramSet
from ...synth.sequence import Sequence
from ..batches import padded_batch
from ..patterns.capture import forward_patterns
from .evaluate import check_batch_size
from ..models.loading import ModelHandle, load_model
from ..swap.providers import (MeanOutputs, MeanPatterns, PatternProvider, ResamplePatterns, UniformPatterns,
                        ZeroPatterns)
from ..swap.errors import SurgeryError
from ..swap.hybrid import HybridModel
from ..swap.replace import replace_heads
from ...core import Head

KINDS = ABLATION_KINDS  # the closed set lives in headsurgeon/core/__init__.py


def reference_patterns(handle: ModelHandle, sequences: list[Sequence], heads: list[Head],
                       batch_size: int = 16) -> dict[Head, list[np.ndarray]]:
    """Each head's float32 pattern on every reference sequence."""
    check_batch_size(batch_size)
    out: dict[Head, list[np.ndarray]] = {Head(*h): [] for h in heads}
    for start in range(0, len(sequences), batch_size):
        for pats in forward_patterns(handle, sequences[start: start + batch_size]):
            for h in out:
                out[h].append(pats[h.layer, h.head])
    return out


def reference_outputs(handle: ModelHandle, sequences: list[Sequence], heads: list[Head],
                      batch_size: int = 16) -> dict[Head, np.ndarray]:
    """Each head's mean output z per position [positions, d_head] over the reference sequences."""
    check_batch_size(batch_size)
    if not sequences:
        raise SurgeryError("mean_output ablation needs at least one reference sequence")
    width = max(s.n for s in sequences)
    total = {Head(*h): np.zeros((width, handle.d_head), np.float64) for h in heads}
    count = np.zeros((width, 1), np.float64)
    layers = sorted({h[0] for h in heads})
    d = handle.d_head
    for start in range(0, len(sequences), batch_size):
        batch = sequences[start: start + batch_size]
        ids, _ = padded_batch(batch)
        seen: dict[int, torch.Tensor] = {}
        hooks = [handle.model.hook_dict[f"blocks.{layer}.attn.hook_z"].register_forward_hook(
            lambda m, i, z, layer=layer, seen=seen: seen.__setitem__(layer, z.detach().float().cpu())) for layer in layers]
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                handle.model(ids.to(handle.device))
        finally:
            for h in hooks:
                h.remove()
        for b, s in enumerate(batch):
            count[: s.n] += 1
            for h in total:
                z = seen[h.layer]
                z4 = z if z.ndim == 4 else z.reshape(z.shape[0], z.shape[1], -1, d)
                total[h][: s.n] += z4[b, : s.n, h.head].numpy()
    return {h: (t / np.maximum(count, 1)).astype(np.float32) for h, t in total.items()}


def ablate(model: Any, heads: Iterable[HeadLike], kind: AblationKind = "zero", reference: list[Sequence] | None = None,
           programs: ProgramSet | Mapping[Any, Any] | None = None, seed: int = 0, trust_programs: TrustPrograms = False) -> HybridModel:
    """Ablate ``heads`` (``"L3H5"`` or (3, 5)) by ``kind``; mean/mean_output/resample need ``reference`` sequences.

    zero: the head attends nowhere (output = bias only); mean: the mean pattern per position over
    ``reference``; mean_output: the mean head output z per position; uniform: uniform over visible keys
    (uniform-causal for decoders); resample: the head's pattern on another reference sequence;
    program: ``programs[head]`` (same as replace_heads; a ProgramSet read from a file passes the trust gate over
    the ablated heads' programs first, ``trust_programs`` as in replace_heads).
    """
    if kind not in KINDS:
        raise SurgeryError(f"unknown ablation {kind!r}; choose one of {', '.join(KINDS)}")
    handle = model.handle if isinstance(model, HybridModel) else load_model(model)
    keys = [Head.parse(h) for h in heads]
    if not keys:
        raise SurgeryError("no heads to ablate")
    if kind == "program":
        if programs is None:
            raise SurgeryError("kind='program' needs programs={head: program}")
        if isinstance(programs, ProgramSet):  # the trust gate (headsurgeon/synth/trust.py), over the heads ablated
            programs.subset([h for h in keys if h in programs]).require_trusted(trust_programs)
        chosen = {}
        for h in keys:
            match = [p for k, p in programs.items() if Head.parse(k) == h]
            if not match:
                raise SurgeryError(f"kind='program' but no program given for L{h[0]}H{h[1]}")
            chosen[h] = match[0]
        return replace_heads(model, chosen)
    if kind in ("mean", "mean_output", "resample") and not reference:
        raise SurgeryError(f"kind={kind!r} needs reference=[Sequence, ...] (e.g. splits.synth)")
    for h in keys:
        handle.check_head(*h)
    sources: dict[Head, PatternProvider | MeanOutputs]
    if kind == "zero":
        sources = {h: ZeroPatterns() for h in keys}
    elif kind == "uniform":
        sources = {h: UniformPatterns() for h in keys}
    elif reference is None:  # mean, mean_output and resample: refused above without a reference
        raise SurgeryError(f"kind={kind!r} needs reference=[Sequence, ...]")
    elif kind == "mean":
        ref = reference_patterns(handle, reference, keys)
        sources = {h: MeanPatterns(ref[h]) for h in keys}
    elif kind == "resample":
        ref = reference_patterns(handle, reference, keys)
        sources = {h: ResamplePatterns(ref[h], seed=seed + i) for i, h in enumerate(keys)}
    else:
        means = reference_outputs(handle, reference, keys)
        sources = {h: MeanOutputs(means[h]) for h in keys}
    return replace_heads(model, sources)
