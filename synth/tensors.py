"""Programs x sequences -> normalized attention patterns, through the content-addressed tensor cache.

Each (program, sequence, mask policy) pattern is cached on its own, unpadded (n x n float32), under
``cache_key(program.hash, sequence.key, mask_policy(causal))``; so a repeated call is all hits, and a
batch that is partly cached evaluates only the missing sequences (one ``program.evaluate`` call per
program on the missing subset; DSL programs run as numba kernels, Python programs in the sandbox pool,
as ``Program.evaluate`` decides).
"""
from __future__ import annotations

from collections.abc import Sequence as _Seq
from typing import Protocol

import numpy as np

from ..kernels.cache import TensorCache, cache_key
from .sequence import Sequence

__all__ = ["program_tensors", "mask_policy", "PatternProgram", "NORMALIZATION_VERSION"]

#: bump when the normalization rule changes, so old cache entries stop matching.
NORMALIZATION_VERSION = "norm1"


class PatternProgram(Protocol):
    """What :func:`program_tensors` needs from a program (``headsurgeon.synth.program.Program`` fits)."""

    hash: str

    def evaluate(self, sequences: list[Sequence], causal: bool = True) -> np.ndarray:
        """Normalized patterns, float32 [B, N, N], padded to the longest of ``sequences``."""
        ...


def mask_policy(causal: bool) -> str:
    """The mask-policy part of a cache key: causal or bidirectional, plus the normalization version."""
    return f"{'causal' if causal else 'bidirectional'}/{NORMALIZATION_VERSION}"


def _evaluate(program: PatternProgram, seqs: list[Sequence], causal: bool) -> np.ndarray:
    """Run ``program.evaluate`` and check it returned one padded square pattern per sequence."""
    out = np.asarray(program.evaluate(seqs, causal=causal))
    n_max = max(s.n for s in seqs)
    if out.ndim != 3 or out.shape[0] != len(seqs) or out.shape[1] != out.shape[2] or out.shape[1] < n_max:
        raise ValueError(
            f"program {program.hash[:12]} evaluate() returned shape {out.shape} for {len(seqs)} sequences "
            f"of max length {n_max}; it must return [B, N, N] with N >= {n_max}"
        )
    return out


def program_tensors(
    programs: _Seq[PatternProgram],
    sequences: _Seq[Sequence],
    causal: bool = True,
    cache: TensorCache | None = None,
    *,
    dtype: np.dtype | type = np.float32,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Patterns of every program on every sequence -> [P, B, N, N] (N = longest sequence, zero-padded).

    With a ``cache``, hits are read from it and only the misses are computed (then stored). ``dtype``
    float16 halves the result's memory; the cache always holds float32. ``out`` (shape [P, B, N, N])
    is filled and returned instead of a new array, e.g. one buffer reused across candidate blocks.
    """
    seqs = list(sequences)
    progs = list(programs)
    if not seqs:
        raise ValueError("program_tensors needs at least one sequence")
    lengths = [s.n for s in seqs]
    if min(lengths) < 1:
        raise ValueError("program_tensors got an empty sequence (length 0); drop it before scoring")
    N = max(lengths)
    shape = (len(progs), len(seqs), N, N)
    if out is None:
        out = np.zeros(shape, dtype=dtype)
    else:
        if out.shape != shape:
            raise ValueError(f"out has shape {out.shape}; program_tensors needs {shape} here")
        out[...] = 0
    if not progs:
        return out
    policy = mask_policy(causal)
    seq_keys = [s.key for s in seqs]
    first_of: dict[str, int] = {}
    for b, k in enumerate(seq_keys):
        first_of.setdefault(k, b)
    uniq = list(first_of.values())  # one representative index per distinct sequence

    for p, prog in enumerate(progs):
        if cache is None:
            pats = _evaluate(prog, [seqs[b] for b in uniq], causal)
            found = {seq_keys[b]: pats[r, : lengths[b], : lengths[b]] for r, b in enumerate(uniq)}
        else:
            keys = {seq_keys[b]: cache_key(prog.hash, seq_keys[b], policy) for b in uniq}
            found = {}
            missing: list[int] = []
            for b in uniq:
                arr = cache.get(keys[seq_keys[b]])
                if arr is not None and arr.shape == (lengths[b], lengths[b]):
                    found[seq_keys[b]] = arr
                else:
                    missing.append(b)
            if missing:
                pats = _evaluate(prog, [seqs[b] for b in missing], causal)
                fresh = {
                    seq_keys[b]: np.ascontiguousarray(pats[r, : lengths[b], : lengths[b]], dtype=np.float32)
                    for r, b in enumerate(missing)
                }
                cache.put_many({keys[k]: v for k, v in fresh.items()})
                found.update(fresh)
        for b, k in enumerate(seq_keys):
            n = lengths[b]
            out[p, b, :n, :n] = found[k]
    return out
