"""Programs x sequences -> normalized attention patterns, through the content-addressed tensor cache.

Each (program, sequence, mask policy) pattern is cached on its own, unpadded, under
``cache_key(program.hash, sequence.key, mask_policy(causal))``; so a repeated call is all hits, and a
batch that is partly cached evaluates only the missing sequences (one evaluation per program on the
missing subset). DSL programs of small support (``dsl.is_sparse``: prev, first, window, same-token,
key sets, match and their combinations) are evaluated as compressed rows (headsurgeon/kernels/sparse.py) and cached
packed (one int32 array per sequence, a few percent of the dense n x n float32); the rest run as
``program.evaluate`` decides (numba kernels, or Python in the sandbox pool) and are cached dense.

``program_rows`` returns each program in its own form (consumers such as ``score_many`` and the
hybrid's hook use the sparse form as is); ``program_tensors`` densifies everything into [P, B, N, N].
"""
from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Mapping, Sequence as _Seq
from typing import Protocol, TypeGuard

import numpy as np

from ..kernels.cache import TensorCache, cache_key
from ..kernels.primitives.buffers import pad_rows
from ..kernels.sparse import RowsBuffer, SparseRows, from_packed, pack_sequences, packed_valid
from . import dsl
from .features import batch_feature_arrays
from .runcache import PatternCache
from . import sequence as _sequence
from .sequence import Sequence
from ..core import InputError

__all__ = ["program_tensors", "program_rows", "program_patterns", "ProgramTensor", "is_sparse_program", "mask_policy",
           "PatternProgram", "NORMALIZATION_VERSION"]

#: bump when the normalization rule changes, so old cache entries stop matching.
NORMALIZATION_VERSION = "norm1"

#: one program's patterns on a batch: compressed rows (sparse DSL programs) or a dense float32 [B, N, N].
ProgramTensor = SparseRows | np.ndarray


class PatternProgram(Protocol):
    """What :func:`program_tensors` needs from a program (``headsurgeon.synth.program.Program`` fits)."""

    @property
    def hash(self) -> str:
        """The program's content hash (the cache keys' program part)."""
        ...

    def evaluate(self, sequences: list[Sequence], causal: bool = True) -> np.ndarray:
        """Normalized patterns, float32 [B, N, N], padded to the longest of ``sequences``."""
        ...


class InProcessProgram(PatternProgram, Protocol):
    """A program this process's kernels evaluate (a DSL tree): it reads precomputed features and fills a buffer."""

    @property
    def node(self) -> dsl.Node:
        """The program's DSL tree."""
        ...

    def evaluate(self, sequences: list[Sequence], causal: bool = True,
                 features: Mapping[str, np.ndarray] | None = None, *, out: np.ndarray | None = None) -> np.ndarray:
        """Normalized patterns, float32 [B, N, N], written into ``out`` when given."""
        ...


def mask_policy(causal: bool) -> str:
    """The mask-policy part of a cache key: causal or bidirectional, plus the normalization version."""
    return f"{'causal' if causal else 'bidirectional'}/{NORMALIZATION_VERSION}"


def is_sparse_program(program: PatternProgram) -> TypeGuard[InProcessProgram]:
    """Whether ``program`` is evaluated as compressed rows (its backend says: DSL trees per ``dsl.is_sparse``)."""
    return bool(getattr(program, "sparse_rows", False))


def _in_process(program: PatternProgram) -> TypeGuard[InProcessProgram]:
    """Whether this process's kernels evaluate ``program`` (a Program whose backend is not sandboxed)."""
    return getattr(program, "sandboxed", True) is False


#: bytes of the per-thread scratch buffer dense DSL programs are evaluated into before the cache copies them.
SCRATCH_BYTES = 256 << 20
_local = threading.local()


def _scratch(shape: tuple[int, int, int]) -> np.ndarray | None:
    """This thread's reusable float32 buffer of ``shape`` (None when it would exceed ``SCRATCH_BYTES``).

    Reused across calls, so a repeated evaluation writes into memory that is already mapped: no fresh
    page faults (they dominate simple programs; headsurgeon/kernels/primitives/buffers.py).
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
    if reuse and _in_process(program):
        out = np.asarray(program.evaluate(seqs, causal=causal, out=_scratch((len(seqs), width, width))))
    else:
        out = np.asarray(program.evaluate(seqs, causal=causal))
    n_max = max(s.n for s in seqs)
    if out.ndim != 3 or out.shape[0] != len(seqs) or out.shape[1] != out.shape[2] or out.shape[1] < n_max:
        raise InputError(
            f"program {program.hash[:12]} evaluate() returned shape {out.shape} for {len(seqs)} sequences "
            f"of max length {n_max}; it must return [B, N, N] with N >= {n_max}"
        )
    return out


def _evaluate_sparse(program: InProcessProgram, seqs: list[Sequence], causal: bool,
                     features: dict[str, np.ndarray] | None = None, out: RowsBuffer | None = None,
                     batch: "_Batch | None" = None) -> SparseRows:
    """The normalized compressed rows of a sparse DSL program on ``seqs`` (width: their longest);
    ``out``: a ``RowsBuffer`` to write them into (the result is a view of it); ``batch``: ``seqs`` prepared
    (padded ids, features computed so far), shared by the programs of one call."""
    node = program.node
    batch = batch or _Batch(seqs)
    feats = batch.features
    if features:
        feats.update((k, v) for k, v in features.items() if k not in feats)
    need = sorted(set(dsl.features_needed(node)) - set(feats))
    if need:
        feats.update(batch_feature_arrays(seqs, need))
    return dsl.evaluate_sparse(node, batch.ids, batch.lengths, feats, causal, out=out)


class _Batch:
    """Sequences as the kernels take them, prepared once per batch of sequences (``_Prepared``): token ids padded
    with 0 to [B, N] int64 (``pad_rows``: one compiled copy), lengths, and the feature arrays computed so far."""

    def __init__(self, seqs: list[Sequence], lengths: np.ndarray | None = None) -> None:
        self.lengths = _lengths(seqs) if lengths is None else lengths
        width = int(self.lengths.max()) if len(seqs) else 0
        self.ids = pad_rows(np.concatenate([s.ids for s in seqs]) if seqs else np.zeros(0, np.int64), self.lengths,
                            width)
        self.features: dict[str, np.ndarray] = {}
        self._distinct: tuple[list[str], list[int], list[int]] | None = None

    def distinct(self, seqs: list[Sequence]) -> tuple[list[str], list[int], list[int]]:
        """The sequences' keys, one representative index per distinct sequence, and each sequence's distinct one
        (computed once per batch: ``_Prepared`` hands out a batch only for the same sequences and ``ids``)."""
        if self._distinct is None:
            keys = [_seq_key(s) for s in seqs]
            slot: dict[str, int] = {}  # sequence key -> its index among the distinct sequences
            uniq: list[int] = []
            for b, k in enumerate(keys):
                if k not in slot:
                    slot[k] = len(uniq)
                    uniq.append(b)
            self._distinct = (keys, uniq, [slot[k] for k in keys])
        return self._distinct


class _Prepared:
    """The last few whole batches ``program_rows`` prepared, by the identity of their sequences, so a consumer that
    scores many programs on the same sequences (a search, a benchmark) pads ids and computes features once.

    An entry holds its list of Sequence objects; a hit needs the same objects in the same order (a list comparison
    that stops at identity, so no Sequence is read) while no Sequence's ``ids`` was replaced since
    (headsurgeon/synth/sequence.py ``IDS_REPLACED``; a Sequence's tokens are fixed once built, which its lazily cached
    features rely on too). Reading each Sequence's ``ids`` to check it cost more than the kernels on cold caches.
    """

    def __init__(self, size: int = 4, max_bytes: int = 16 << 20) -> None:
        self.size = size
        self.max_bytes = max_bytes  # a batch whose padded ids are larger is not kept: its preparation is small next
        # to evaluating programs on it, and its padded features would stay in memory
        self._held: list[tuple[list[Sequence], int, _Batch]] = []  # most recent last
        self._lock = threading.Lock()

    def get(self, seqs: list[Sequence]) -> _Batch:
        """The prepared batch of ``seqs`` (after ``_check_sequences`` on a miss)."""
        replaced = _sequence.IDS_REPLACED
        with self._lock:
            for t in range(len(self._held) - 1, -1, -1):
                held, seen, batch = self._held[t]
                if seen == replaced and len(held) == len(seqs) and held == seqs:
                    if t != len(self._held) - 1:
                        self._held.append(self._held.pop(t))
                    return batch
        batch = _Batch(seqs, _check_sequences(seqs))
        if batch.ids.nbytes > self.max_bytes:
            return batch
        with self._lock:
            self._held.append((list(seqs), replaced, batch))
            del self._held[: max(0, len(self._held) - self.size)]
        return batch

    def clear(self) -> None:
        """Drop every prepared batch (the next call on any sequences prepares its batch again)."""
        with self._lock:
            self._held.clear()


_PREPARED = _Prepared()


def _lengths(seqs: list[Sequence]) -> np.ndarray:
    """int64 [B]: each sequence's length."""
    return np.fromiter((s.ids.shape[0] for s in seqs), np.int64, len(seqs))


_SEQ_KEYS: "weakref.WeakKeyDictionary[Sequence, tuple[np.ndarray, str]]" = weakref.WeakKeyDictionary()


def _seq_key(seq: Sequence) -> str:
    """``seq.key``, hashed once per Sequence (again only if its ``ids`` array is replaced: a Sequence's tokens are
    fixed once built, which its lazily cached features rely on too, headsurgeon/synth/sequence.py)."""
    got = _SEQ_KEYS.get(seq)
    if got is None or got[0] is not seq.ids:
        got = _SEQ_KEYS[seq] = (seq.ids, seq.key)
    return got[1]


#: ``cache_key`` memoized: a batch's keys are asked for again by every call on the same sequences.
_cache_key = functools.lru_cache(maxsize=1 << 16)(cache_key)


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


def _check_sequences(seqs: list[Sequence]) -> np.ndarray:
    """The sequences' lengths, int64 [B], after checking there is at least one and none is empty."""
    if not seqs:
        raise InputError("program_tensors needs at least one sequence")
    lengths = _lengths(seqs)
    if lengths.min() < 1:
        raise InputError("program_tensors got an empty sequence (length 0); drop it before scoring")
    return lengths


def program_rows(programs: _Seq[PatternProgram], sequences: _Seq[Sequence], causal: bool = True,
                 cache: PatternCache | None = None) -> list[ProgramTensor]:
    """Per program, its patterns on ``sequences`` (width N = the longest): ``SparseRows`` or float32 [B, N, N].

    Sparse DSL programs (``is_sparse_program``) come as compressed rows, the others dense. With a
    ``cache``, hits are read from it and only the misses are computed (then stored: sparse ones packed); a
    headsurgeon/synth/runcache.py ``RoutedCache`` picks the cache per program.
    The batch (sequence keys, padded ids, features) is prepared once for all programs.
    """
    seqs = sequences if type(sequences) is list else list(sequences)  # only read: a copy would touch every Sequence
    whole = _PREPARED.get(seqs)  # checked, padded once per batch of sequences (kept across calls)
    lengths = whole.lengths
    N = int(lengths.max())
    policy = mask_policy(causal)
    routed = cache if hasattr(cache, "for_program") else None  # headsurgeon/synth/runcache.py RoutedCache
    batches: dict[tuple[int, ...], _Batch] = {}

    def batch_of(idx: list[int]) -> _Batch:
        key = tuple(idx)
        if len(idx) == len(seqs) and idx == list(range(len(seqs))):
            return whole
        if key not in batches:
            batches[key] = _Batch([seqs[b] for b in idx], lengths[idx])
        return batches[key]

    result: list[ProgramTensor] = []
    for prog in programs:
        sparse = is_sparse_program(prog)
        cache = routed.for_program(prog) if routed is not None else cache
        if cache is None and (sparse or _in_process(prog)):
            # the kernels evaluate every sequence on its own, so a repeated sequence needs no deduplication
            result.append(_evaluate_sparse(prog, seqs, causal, batch=whole) if is_sparse_program(prog)  # width N
                          else _evaluate(prog, seqs, causal))  # zero-padded by the kernels: the result as is
            continue
        # keys and distinct sequences: for the cache, or a program not evaluated in this process (a repeat costs a
        # sandbox call)
        seq_keys, uniq, order = whole.distinct(seqs)
        if cache is None:
            pats = _evaluate(prog, [seqs[b] for b in uniq], causal, reuse=True)
            patterns = [pats[r, : lengths[b], : lengths[b]] for r, b in enumerate(uniq)]
        else:
            keys = [_cache_key(prog.hash, seq_keys[b], policy) for b in uniq]
            hits = cache.get_many(keys)
            found: list[np.ndarray | None] = [hits.get(k) for k in keys]
            if sparse and len(hits) == len(keys):  # all held: check and unpack them in one pass
                try:
                    result.append(from_packed([hits[keys[r]] for r in order], N, lengths))
                    continue
                except InputError:  # one is not what its key says: the general path evaluates it again
                    pass
            held = [r for r, a in enumerate(found) if a is not None]
            if sparse and held:
                ok = packed_valid(_filled([found[r] for r in held]), lengths[[uniq[r] for r in held]])
                for r in np.asarray(held)[~ok].tolist():
                    found[r] = None
            elif held:
                for r in held:
                    if getattr(found[r], "shape", None) != (lengths[uniq[r]], lengths[uniq[r]]):
                        found[r] = None
            missing = [r for r, a in enumerate(found) if a is None]
            if missing:
                idx = [uniq[r] for r in missing]
                if is_sparse_program(prog):
                    rows = _evaluate_sparse(prog, [seqs[b] for b in idx], causal, out=_rows_buffer(),
                                            batch=batch_of(idx))
                    fresh = pack_sequences(rows)
                else:
                    pats = _evaluate(prog, [seqs[b] for b in idx], causal, reuse=True)
                    fresh = [np.ascontiguousarray(pats[t, : lengths[b], : lengths[b]], dtype=np.float32)
                             for t, b in enumerate(idx)]
                cache.put_many({keys[r]: a for r, a in zip(missing, fresh)})
                for r, a in zip(missing, fresh):
                    found[r] = a
            patterns = _filled(found)
            if sparse:
                result.append(from_packed([patterns[r] for r in order], N))
                continue
        dense = np.zeros((len(seqs), N, N), dtype=np.float32)
        for b, r in enumerate(order):
            dense[b, : lengths[b], : lengths[b]] = patterns[r]
        result.append(dense)
    return result


def _filled(found: list[np.ndarray | None]) -> list[np.ndarray]:
    """``found`` once every entry was read from the cache or evaluated."""
    patterns = [a for a in found if a is not None]
    if len(patterns) != len(found):
        raise RuntimeError("a program's pattern was neither in the cache nor evaluated")
    return patterns


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
    N = int(lengths.max())
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
