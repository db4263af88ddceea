"""The sparse program-tensor form: per query row, its keys (ascending) and float32 weights.

A ``SparseRows`` holds a padded batch [B, N, N] as compressed rows: row (b, i) owns entries
``rowptr[b*N + i] : rowptr[b*N + i + 1]`` of ``cols`` (int32 key indices, strictly ascending) and
``vals`` (float32). Cells not listed are 0, so ``to_dense()`` is the dense array cell for cell. The DSL
evaluates programs of small support this way (headsurgeon/synth/dsl/sparse.py); normalization
(``kernels.normalize.normalize_rows``), the metrics (headsurgeon/kernels/sparse_metrics.py), the tensor cache and
the hybrid's hook consume it without densifying (docs/architecture.md, "Normalization").

One sequence's rows travel as a single int32 array (``pack_sequence``): a header ``[PACK_TAG, n, nnz,
mode]``, the local row pointer (n + 1), then the keys and the weights' bits, each in the smaller of two
forms: keys as a list (nnz) or, when every row's keys are consecutive (a band: prev, window, first), as
each row's first key (n); weights as a list (nnz) or, when every row holds one value (a normalized
indicator), as one per row (n). The tensor cache stores that array as is; its dtype (int32 against the
dense float32 n x n) tells the two forms apart.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from ..core import InputError

__all__ = ["SparseRows", "RowsBuffer", "PACK_TAG", "pack_sequence", "pack_sequences", "packed_valid",
           "is_packed", "from_packed", "empty_rows_like",
           "rows_from_counts", "stack_rows", "from_dense"]

#: first int32 of a packed sequence (format tag and version).
PACK_TAG = 0x53505232  # "SPR2"
_BAND, _ROWVAL = 1, 2  # mode bits: keys stored as each row's first key; weights as one value per row


@dataclass(frozen=True)
class SparseRows:
    """A [B, N, N] program tensor as compressed rows (module docstring); arrays are owned, C-contiguous."""

    rowptr: np.ndarray  # int64 [B*N + 1]
    cols: np.ndarray  # int32 [nnz], ascending within a row
    vals: np.ndarray  # float32 [nnz]
    lengths: np.ndarray  # int64 [B]
    n: int
    normalized: bool = False  # True when the rows are attention already (normalization applied)

    def __post_init__(self) -> None:
        B = self.lengths.shape[0]
        if self.rowptr.shape != (B * self.n + 1,):
            raise InputError(f"rowptr must have B*N+1 = {B * self.n + 1} entries; got {self.rowptr.shape}")
        if self.cols.shape != self.vals.shape or self.cols.shape[0] != int(self.rowptr[-1]):
            raise InputError(f"cols {self.cols.shape} and vals {self.vals.shape} must both hold rowptr[-1] = "
                             f"{int(self.rowptr[-1])} entries")

    @property
    def shape(self) -> tuple[int, int, int]:
        """The dense shape [B, N, N]."""
        return (self.lengths.shape[0], self.n, self.n)

    @property
    def nnz(self) -> int:
        """Stored entries (explicit zeros included)."""
        return int(self.cols.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the three arrays."""
        return int(self.rowptr.nbytes + self.cols.nbytes + self.vals.nbytes)

    def to_dense(self, out: np.ndarray | None = None) -> np.ndarray:
        """The dense float32 [B, N, N] array (``out``: a C-contiguous float32 buffer to overwrite)."""
        shape = self.shape
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise InputError(f"out must be a C-contiguous float32 array of shape {shape}")
        if shape[0] and self.n:
            _scatter(self.rowptr, self.cols, self.vals, self.n, out)
        return out

    def row_counts(self) -> np.ndarray:
        """Entries per row, int64 [B, N]."""
        return np.diff(self.rowptr).reshape(self.shape[0], self.n)

    def take(self, indices) -> "SparseRows":
        """The sequences ``indices`` (in that order) as a new batch of the same width."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        counts = self.row_counts()[idx]
        rowptr = np.zeros(idx.size * self.n + 1, dtype=np.int64)
        np.cumsum(counts.reshape(-1), out=rowptr[1:])
        nnz = int(rowptr[-1])
        cols = np.empty(nnz, dtype=np.int32)
        vals = np.empty(nnz, dtype=np.float32)
        _gather_seqs(self.rowptr, self.cols, self.vals, self.n, idx, rowptr, cols, vals)
        return SparseRows(rowptr, cols, vals, np.ascontiguousarray(self.lengths[idx]), self.n, self.normalized)

    def widen(self, n: int) -> "SparseRows":
        """The same tensor padded to width ``n`` >= N (rows beyond N are empty)."""
        if n == self.n:
            return self
        if n < self.n:
            raise InputError(f"cannot narrow a sparse tensor from width {self.n} to {n}")
        counts = np.zeros((self.shape[0], n), dtype=np.int64)
        counts[:, : self.n] = self.row_counts()
        rowptr = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts.reshape(-1), out=rowptr[1:])
        return SparseRows(rowptr, self.cols, self.vals, self.lengths, n, self.normalized)


class RowsBuffer:
    """Reusable arrays for one ``SparseRows`` result at a time (headsurgeon/kernels/primitives/sparse_prims.py, normalize.py).

    A result built into a buffer is a view of it, valid until the buffer's next use; repeated evaluations
    then write into memory that is already mapped (no fresh page faults). Arrays grow, never shrink.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str, size: int, dtype: type) -> np.ndarray:
        """The first ``size`` entries of the buffer's array ``name`` (contents undefined)."""
        arr = self._arrays.get(name)
        if arr is None or arr.size < size or arr.dtype != dtype:
            arr = self._arrays[name] = np.empty(max(size, int(1.25 * arr.size) if arr is not None else size), dtype)
        return arr[:size]

    def zeros(self, name: str, size: int, dtype: type) -> np.ndarray:
        """``array`` set to zero."""
        arr = self.array(name, size, dtype)
        arr[:] = 0
        return arr

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(a.nbytes for a in self._arrays.values())


def stack_rows(rows: list[SparseRows], lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """P sparse programs over the same sequences (lengths ``lens``) as one block for the metric kernels:
    (rowptr [P, B*N+1] into the shared cols and vals, cols, vals, N = the widest)."""
    B = lens.shape[0]
    N = max(r.n for r in rows)
    for r in rows:
        if r.shape[0] != B:
            raise InputError(f"batch sizes disagree: real has {B} sequences, a sparse candidate {r.shape[0]}; "
                             "score the same sequences in the same order")
        if B and r.n < lens.max():
            raise InputError(f"a length {int(lens.max())} exceeds a sparse candidate's width {r.n}; "
                             "evaluate programs on the same sequences as the real patterns")
    rowptr = np.empty((len(rows), B * N + 1), dtype=np.int64)
    base = 0
    for k, r in enumerate(rows):
        rowptr[k] = r.widen(N).rowptr + base
        base += r.nnz
    cols = np.concatenate([r.cols for r in rows])
    vals = np.concatenate([r.vals for r in rows])
    return rowptr, cols, vals, N


def from_dense(dense: np.ndarray, lengths) -> SparseRows:
    """The non-zero cells of a padded [B, N, N] array inside each sequence's length, as compressed rows."""
    dense = np.ascontiguousarray(dense)
    lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
    B, n = dense.shape[0], dense.shape[-1]
    inside = np.arange(n)[None, :] < lengths[:, None]
    keep = (dense != 0) & inside[:, :, None] & inside[:, None, :]
    rowptr = rows_from_counts(keep.sum(axis=2))
    cols = np.nonzero(keep.reshape(B * n, n))[1].astype(np.int32)
    return SparseRows(rowptr, cols, dense[keep].astype(np.float32), lengths, int(n))


def rows_from_counts(counts: np.ndarray) -> np.ndarray:
    """Row pointer int64 [len+1] of per-row entry counts (flattened)."""
    rowptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts.reshape(-1), out=rowptr[1:])
    return rowptr


def empty_rows_like(lengths: np.ndarray, n: int) -> SparseRows:
    """An all-zero batch (no entries)."""
    lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
    return SparseRows(np.zeros(lengths.shape[0] * n + 1, dtype=np.int64), np.zeros(0, np.int32),
                      np.zeros(0, np.float32), lengths, int(n))


@njit(cache=True)
def _scatter(rowptr, cols, vals, n, out):  # pragma: no cover - compiled
    """Dense [B, N, N] of compressed rows (every cell written)."""
    for b in range(out.shape[0]):
        out[b] = 0.0
        for i in range(n):
            r = b * n + i
            for k in range(rowptr[r], rowptr[r + 1]):
                out[b, i, cols[k]] = vals[k]


@njit(cache=True)
def _gather_seqs(rowptr, cols, vals, n, idx, new_ptr, new_cols, new_vals):  # pragma: no cover - compiled
    for t in range(idx.shape[0]):
        b = idx[t]
        src = rowptr[b * n]
        dst = new_ptr[t * n]
        m = rowptr[(b + 1) * n] - src
        for k in range(m):  # element loops, not slice copies: a slice copy compiles numpy's shape-error path
            new_cols[dst + k] = cols[src + k]
            new_vals[dst + k] = vals[src + k]


@njit(cache=True)
def _pack_mode(rowptr, cols, vbits, r0, L):  # pragma: no cover - compiled
    """Mode bits of rows r0..r0+L: band when every row's keys are consecutive, rowval when each row has one value."""
    band = True
    rowval = True
    for r in range(r0, r0 + L):
        k0, k1 = rowptr[r], rowptr[r + 1]
        if k1 > k0:
            if cols[k1 - 1] - cols[k0] != k1 - k0 - 1:
                band = False
            for k in range(k0 + 1, k1):
                if vbits[k] != vbits[k0]:
                    rowval = False
                    break
    return (_BAND if band else 0) | (_ROWVAL if rowval else 0)


@njit(cache=True)
def _pack(rowptr, cols, vbits, r0, L, mode, out):  # pragma: no cover - compiled
    lo = rowptr[r0]
    nnz = rowptr[r0 + L] - lo
    for i in range(L + 1):
        out[4 + i] = rowptr[r0 + i] - lo
    c = 5 + L
    if mode & _BAND:
        for i in range(L):
            out[c + i] = cols[rowptr[r0 + i]] if rowptr[r0 + i + 1] > rowptr[r0 + i] else 0
        c += L
    else:
        for k in range(nnz):
            out[c + k] = cols[lo + k]
        c += nnz
    if mode & _ROWVAL:
        for i in range(L):
            out[c + i] = vbits[rowptr[r0 + i]] if rowptr[r0 + i + 1] > rowptr[r0 + i] else 0
    else:
        for k in range(nnz):
            out[c + k] = vbits[lo + k]


def _packed_size(L: int, nnz: int, mode: int) -> int:
    return 5 + L + (L if mode & _BAND else nnz) + (L if mode & _ROWVAL else nnz)


@njit(cache=True)
def _pack_plan(rowptr, cols, vbits, lengths, n, idx, modes, sizes):  # pragma: no cover - compiled
    """Mode and packed size of each sequence ``idx[t]`` (a per-row form only where it is smaller than the list)."""
    for t in range(idx.shape[0]):
        b = idx[t]
        L = lengths[b]
        nnz = rowptr[b * n + L] - rowptr[b * n]
        mode = _pack_mode(rowptr, cols, vbits, b * n, L) if L < nnz else 0
        modes[t] = mode
        sizes[t] = 5 + L + (L if mode & _BAND else nnz) + (L if mode & _ROWVAL else nnz)


@njit(cache=True)
def _pack_all(rowptr, cols, vbits, lengths, n, idx, modes, starts, flat):  # pragma: no cover - compiled
    for t in range(idx.shape[0]):
        b = idx[t]
        L = lengths[b]
        out = flat[starts[t]: starts[t + 1]]
        out[0] = PACK_TAG
        out[1] = L
        out[2] = rowptr[b * n + L] - rowptr[b * n]
        out[3] = modes[t]
        _pack(rowptr, cols, vbits, b * n, L, modes[t], out)


def pack_sequences(rows: SparseRows, indices=None) -> list[np.ndarray]:
    """``pack_sequence`` of each sequence in ``indices`` (default: all), in two compiled passes over the batch.

    The arrays are consecutive views of one int32 buffer (the tensor cache copies what it keeps).
    """
    idx = np.arange(rows.shape[0], dtype=np.int64) if indices is None else np.asarray(indices, np.int64).reshape(-1)
    modes = np.empty(idx.shape[0], dtype=np.int64)
    sizes = np.empty(idx.shape[0], dtype=np.int64)
    vbits = rows.vals.view(np.int32)
    _pack_plan(rows.rowptr, rows.cols, vbits, rows.lengths, rows.n, idx, modes, sizes)
    starts = np.zeros(idx.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    flat = np.empty(int(starts[-1]), dtype=np.int32)
    _pack_all(rows.rowptr, rows.cols, vbits, rows.lengths, rows.n, idx, modes, starts, flat)
    bounds = starts.tolist()
    return [flat[bounds[t]: bounds[t + 1]] for t in range(idx.shape[0])]


def pack_sequence(rows: SparseRows, b: int) -> np.ndarray:
    """Sequence ``b`` of ``rows``, unpadded (its length L), as one int32 array (module docstring)."""
    return pack_sequences(rows, [b])[0].copy()


def is_packed(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a packed sequence (rather than a dense n x n pattern)."""
    return arr.dtype == np.int32 and arr.ndim == 1 and arr.shape[0] >= 5 and int(arr[0]) == PACK_TAG


def packed_length(arr: np.ndarray) -> int:
    """The sequence length a packed array covers."""
    return int(arr[1])


@njit(cache=True)
def _packed_check(flat, starts, lengths, ok):  # pragma: no cover - compiled
    """Per packed array: whether it is whole and consistent (tag, sizes, a row pointer from 0 to nnz that never
    decreases, listed keys inside the length, a band inside it); ``lengths`` gets each header's length."""
    for t in range(starts.shape[0] - 1):
        s, e = starts[t], starts[t + 1]
        ok[t] = False
        lengths[t] = -1
        if e - s < 5 or flat[s] != PACK_TAG:
            continue
        L, nnz, mode = flat[s + 1], flat[s + 2], flat[s + 3]
        if L < 0 or nnz < 0 or mode < 0 or mode > (_BAND | _ROWVAL):
            continue
        if e - s != 5 + L + (L if mode & _BAND else nnz) + (L if mode & _ROWVAL else nnz):
            continue
        good = flat[s + 4] == 0 and flat[s + 4 + L] == nnz
        for i in range(L):
            if flat[s + 5 + i] < flat[s + 4 + i]:
                good = False
        c = s + 5 + L
        if good and mode & _BAND:
            for i in range(L):
                m = flat[s + 5 + i] - flat[s + 4 + i]
                if m > 0 and (flat[c + i] < 0 or flat[c + i] + m > L):
                    good = False
        elif good:
            for k in range(nnz):
                if flat[c + k] < 0 or flat[c + k] >= L:
                    good = False
        ok[t] = good
        lengths[t] = L


def _flatten(packed: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """The arrays end to end (int32) and their start offsets; None when one is not a flat int32 array."""
    if any(p.dtype != np.int32 or p.ndim != 1 for p in packed):
        return None
    starts = np.zeros(len(packed) + 1, dtype=np.int64)
    np.cumsum(np.fromiter((p.shape[0] for p in packed), np.int64, len(packed)), out=starts[1:])
    return (np.concatenate(packed) if packed else np.zeros(0, np.int32)), starts


def packed_valid(packed: list[np.ndarray], lengths: np.ndarray) -> np.ndarray:
    """Boolean per array: a whole packed sequence of length ``lengths[t]`` (what ``from_packed`` accepts)."""
    ok = np.zeros(len(packed), dtype=np.bool_)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    ints = [t for t, p in enumerate(packed) if p.dtype == np.int32 and p.ndim == 1]
    if not ints:
        return ok
    flattened = _flatten([packed[t] for t in ints])
    assert flattened is not None  # ints holds the flat int32 arrays only
    flat, starts = flattened
    good = np.empty(len(ints), dtype=np.bool_)
    found = np.empty(len(ints), dtype=np.int64)
    _packed_check(flat, starts, found, good)
    sel = np.asarray(ints, dtype=np.int64)
    ok[sel] = good & (found == lengths[sel])
    return ok


def from_packed(packed: list[np.ndarray], n: int, lengths: np.ndarray | None = None) -> SparseRows:
    """A batch of width ``n`` from packed sequences (``pack_sequence``'s output), one per sequence; ``lengths``:
    the sequence lengths they must cover (``packed_valid``'s test in the same pass), else any."""
    flat_starts = _flatten(packed)
    if flat_starts is None:
        raise InputError("not a packed sparse sequence (headsurgeon/kernels/sparse.py pack_sequence makes them)")
    flat, starts = flat_starts
    want = lengths
    lengths = np.empty(len(packed), dtype=np.int64)
    ok = np.empty(len(packed), dtype=np.bool_)
    _packed_check(flat, starts, lengths, ok)
    if not ok.all():
        raise InputError("not a packed sparse sequence (headsurgeon/kernels/sparse.py pack_sequence makes them)")
    if want is not None and not np.array_equal(lengths, want):
        raise InputError("packed sequences of other lengths than the batch's: evaluate them again")
    if lengths.size and lengths.max() > n:
        raise InputError(f"a packed sequence of length {int(lengths.max())} does not fit width {n}")
    counts = np.zeros((len(packed), n), dtype=np.int64)
    _packed_counts(flat, starts, counts)
    rowptr = rows_from_counts(counts)
    nnz = int(rowptr[-1])
    cols = np.empty(nnz, dtype=np.int32)
    vbits = np.empty(nnz, dtype=np.int32)
    _unpack(flat, starts, n, rowptr, cols, vbits)
    return SparseRows(rowptr, cols, vbits.view(np.float32), lengths, int(n))


@njit(cache=True)
def _packed_counts(flat, starts, counts):  # pragma: no cover - compiled
    for b in range(starts.shape[0] - 1):
        s = starts[b]
        L = flat[s + 1]
        for i in range(L):
            counts[b, i] = flat[s + 5 + i] - flat[s + 4 + i]


@njit(cache=True)
def _unpack(flat, starts, n, rowptr, cols, vbits):  # pragma: no cover - compiled
    """Each sequence's keys and weights, in the form its mode says (the mode is tested once per sequence)."""
    for b in range(starts.shape[0] - 1):
        s = starts[b]
        L = flat[s + 1]
        nnz = flat[s + 2]
        mode = flat[s + 3]
        dst = rowptr[b * n]
        ptr = s + 4
        c = s + 5 + L
        v = c + (L if mode & _BAND else nnz)
        if mode & _BAND:
            for i in range(L):
                k0, k1 = flat[ptr + i], flat[ptr + i + 1]
                for k in range(k0, k1):
                    cols[dst + k] = flat[c + i] + (k - k0)
        else:
            for k in range(nnz):
                cols[dst + k] = flat[c + k]
        if mode & _ROWVAL:
            for i in range(L):
                k0, k1 = flat[ptr + i], flat[ptr + i + 1]
                for k in range(k0, k1):
                    vbits[dst + k] = flat[v + i]
        else:
            for k in range(nnz):
                vbits[dst + k] = flat[v + k]
