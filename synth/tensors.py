"""Programs x sequences -> normalized attention patterns, through the content-addressed tensor cache.

Each (program, sequence, mask policy) pattern is cached on its own, unpadded, under
``cache_key(program.hash, sequence.key, mask_policy(causal))``; so a repeated call is all hits, and a
batch that is partly cached evaluates only the missing sequences (one evaluation per program on the
missing subset). DSL programs of small support (``dsl.is_sparse``: prev, first, window, same-token,
key sets, match and their combinations) are evaluated as compressed rows (hskernels/sparse.py) and cached
packed (one int32 array per sequence, a few percent of the dense n x n float32); the rest run as
``program.evaluate`` decides (numba kernels, or Python in the sandbox pool) and are cached dense.

``program_rows`` returns each program in its own form (consumers such as ``score_many`` and the
hybrid's hook use the sparse form as is); ``program_tensors`` densifies everything into [P, B, N, N].
"""
from __future__ import annotations

import threading
from collections.abc import Sequence as _Seq
from typing import Protocol

import numpy as np

from ..kernels.cache import TensorCache, cache_key
from ..kernels.sparse import RowsBuffer, SparseRows, from_packed, is_packed, pack_sequence
from . import dsl
from .features import batch_feature_arrays
from .sequence import Sequence, pad_ids
from ..kernels.core import InputError

__all__ = ["program_tensors", "program_rows", "program_patterns", "ProgramTensor", "is_sparse_program", "mask_policy",
           "PatternProgram", "NORMALIZATION_VERSION"]

#: bump when the normalization rule changes, so old cache entries stop matching.
NORMALIZATION_VERSION = "norm1"

#: one program's patterns on a batch: compressed rows (sparse DSL programs) or a dense float32 [B, N, N].
ProgramTensor = SparseRows | np.ndarray


class PatternProgram(Protocol):
    """What :func:`program_tensors` needs from a program (``headsurgeon.synth.program.Program`` fits)."""

    hash: str

    def evaluate(self, sequences: list[Sequence], causal: bool = True) -> np.ndarray:
        """Normalized patterns, float32 [B, N, N], padded to the longest of ``sequences``."""
        ...


def mask_policy(causal: bool) -> str:
    """The mask-policy part of a cache key: causal or bidirectional, plus the normalization version."""
    return f"{'causal' if causal else 'bidirectional'}/{NORMALIZATION_VERSION}"


def is_sparse_program(program: PatternProgram) -> bool:
    """Whether ``program`` is evaluated as compressed rows (its backend says: DSL trees per ``dsl.is_sparse``)."""
    return bool(getattr(program, "sparse_rows", False))


def _in_process(program: PatternProgram) -> bool:
    """Whether this process's kernels evaluate ``program`` (a Program whose backend is not sandboxed)."""
    return getattr(program, "sandboxed", True) is False


#: bytes of the per-thread scratch buffer dense DSL programs are evaluated into before the cache copies them.
SCRATCH_BYTES = 256 << 20
_local = threading.local()


def _scratch(shape: tuple[int, int, int]) -> np.ndarray | None:
    """This thread's reusable float32 buffer of ``shape`` (None when it would exceed ``SCRATCH_BYTES``).

    Reused across calls, so a repeated evaluation writes into memory that is already mapped: no fresh
    page faults (they dominate simple programs; hskernels/primitives/buffers.py).
    """
    if 4 * shape[0] * shape[1] * shape[2] > SCRATCH_BYTES:
        return None
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < shape[0] * shape[1] * shape[2]:
        buf = _local.buf = np.empty(shape[0] * shape[1] * shape[2], dtype=np.float32)
    return buf[: shape[0] * shape[1] * shape[2]].reshape(shape)


def _rows_buffer() -> RowsBuffer:
    """This thread's ``RowsBuffer`` for sparse evaluations that are packed into the cache right away."""
    buf = getattr(_local, "rows", None)
    if buf is None:
        buf = _local.rows = RowsBuffer()
    return buf


def _evaluate(program: PatternProgram, seqs: list[Sequence], causal: bool, reuse: bool = False) -> np.ndarray:
    """Run ``program.evaluate`` and check it returned one padded square pattern per sequence.

    ``reuse``: a DSL program writes into this thread's scratch buffer (valid until the next such call).
    """
    width = max(s.n for s in seqs)
    buf = _scratch((len(seqs), width, width)) if reuse and _in_process(program) else None
    out = np.asarray(program.evaluate(seqs, causal=causal) if buf is None else program.evaluate(seqs, causal=causal,
                                                                                                  out=buf))
    n_max = max(s.n for s in seqs)
    if out.ndim != 3 or out.shape[0] != len(seqs) or out.shape[1] != out.shape[2] or out.shape[1] < n_max:
        raise InputError(
            f"program {program.hash[:12]} evaluate() returned shape {out.shape} for {len(seqs)} sequences "
            f"of max length {n_max}; it must return [B, N, N] with N >= {n_max}"
        )
    return out


def _evaluate_sparse(program: PatternProgram, seqs: list[Sequence], causal: bool,
                     features: dict[str, np.ndarray] | None = None, out: RowsBuffer | None = None) -> SparseRows:
    """The normalized compressed rows of a sparse DSL program on ``seqs`` (width: their longest);
    ``out``: a ``RowsBuffer`` to write them into (the result is a view of it)."""
    node = program.node
    ids, lengths = pad_ids(seqs)
    feats = dict(features or {})
    need = sorted(set(dsl.features_needed(node)) - set(feats))
    if need:
        feats.update(batch_feature_arrays(seqs, need))
    return dsl.evaluate_sparse(node, ids, lengths, feats, causal, out=out)


def program_patterns(program: PatternProgram, sequences: _Seq[Sequence], causal: bool = True,
                     features: dict[str, np.ndarray] | None = None) -> ProgramTensor:
    """One program's normalized patterns, no cache: ``SparseRows`` for sparse DSL programs, else ``evaluate``'s array.

    ``features``: padded feature arrays already computed for ``sequences`` (missing ones are computed).
    """
    seqs = list(sequences)
    _check_sequences(seqs)
    if is_sparse_program(program):
        return _evaluate_sparse(program, seqs, causal, features)
    if features is not None and _in_process(program):
        return program.evaluate(seqs, causal=causal, features=features)
    return _evaluate(program, seqs, causal)


def _check_sequences(seqs: list[Sequence]) -> list[int]:
    if not seqs:
        raise InputError("program_tensors needs at least one sequence")
    lengths = [s.n for s in seqs]
    if min(lengths) < 1:
        raise InputError("program_tensors got an empty sequence (length 0); drop it before scoring")
    return lengths


def program_rows(programs: _Seq[PatternProgram], sequences: _Seq[Sequence], causal: bool = True,
                 cache: TensorCache | None = None) -> list[ProgramTensor]:
    """Per program, its patterns on ``sequences`` (width N = the longest): ``SparseRows`` or float32 [B, N, N].

    Sparse DSL programs (``is_sparse_program``) come as compressed rows, the others dense. With a
    ``cache``, hits are read from it and only the misses are computed (then stored: sparse ones packed).
    """
    seqs = list(sequences)
    lengths = _check_sequences(seqs)
    N = max(lengths)
    policy = mask_policy(causal)
    seq_keys = [s.key for s in seqs]
    first_of: dict[str, int] = {}
    for b, k in enumerate(seq_keys):
        first_of.setdefault(k, b)
    uniq = list(first_of.values())  # one representative index per distinct sequence
    result: list[ProgramTensor] = []
    for prog in programs:
        sparse = is_sparse_program(prog)
        if cache is None:
            if sparse:
                rows = _evaluate_sparse(prog, [seqs[b] for b in uniq], causal).widen(N)
                where = {seq_keys[b]: r for r, b in enumerate(uniq)}
                result.append(rows if len(uniq) == len(seqs) else rows.take([where[k] for k in seq_keys]))
                continue
            if len(uniq) == len(seqs) and _in_process(prog):  # zero-padded by the kernels:
                result.append(_evaluate(prog, seqs, causal))                    # the evaluation is the result
                continue
            pats = _evaluate(prog, [seqs[b] for b in uniq], causal, reuse=True)
            found = {seq_keys[b]: pats[r, : lengths[b], : lengths[b]] for r, b in enumerate(uniq)}
        else:
            keys = {seq_keys[b]: cache_key(prog.hash, seq_keys[b], policy) for b in uniq}
            found = {}
            missing: list[int] = []
            for b in uniq:
                arr = cache.get(keys[seq_keys[b]])
                ok = arr is not None and (
                    (is_packed(arr) and int(arr[1]) == lengths[b]) if sparse else arr.shape == (lengths[b], lengths[b]))
                if ok:
                    found[seq_keys[b]] = arr
                else:
                    missing.append(b)
            if missing:
                if sparse:
                    rows = _evaluate_sparse(prog, [seqs[b] for b in missing], causal, out=_rows_buffer())
                    fresh = {seq_keys[b]: pack_sequence(rows, r) for r, b in enumerate(missing)}
                else:
                    pats = _evaluate(prog, [seqs[b] for b in missing], causal, reuse=True)
                    fresh = {
                        seq_keys[b]: np.ascontiguousarray(pats[r, : lengths[b], : lengths[b]], dtype=np.float32)
                        for r, b in enumerate(missing)
                    }
                cache.put_many({keys[k]: v for k, v in fresh.items()})
                found.update(fresh)
            if sparse:
                result.append(from_packed([found[k] for k in seq_keys], N))
                continue
        dense = np.zeros((len(seqs), N, N), dtype=np.float32)
        for b, k in enumerate(seq_keys):
            dense[b, : lengths[b], : lengths[b]] = found[k]
        result.append(dense)
    return result


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

    The dense view of :func:`program_rows` (which consumers that can read the sparse form should call).
    ``dtype`` float16 halves the result's memory; the cache holds float32 or packed sparse rows. ``out``
    (shape [P, B, N, N]) is filled and returned instead of a new array, e.g. one buffer reused across
    candidate blocks.
    """
    seqs = list(sequences)
    progs = list(programs)
    lengths = _check_sequences(seqs)
    N = max(lengths)
    shape = (len(progs), len(seqs), N, N)
    if out is None:
        out = np.empty(shape, dtype=dtype)
    elif out.shape != shape:
        raise InputError(f"out has shape {out.shape}; program_tensors needs {shape} here")
    for p, t in enumerate(program_rows(progs, seqs, causal, cache)):
        if isinstance(t, SparseRows):
            if out.dtype == np.float32 and out.flags.c_contiguous:
                t.to_dense(out=out[p])
            else:
                out[p] = t.to_dense()
        else:
            out[p] = t
    return out
