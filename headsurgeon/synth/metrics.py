"""How well a program's pattern matches a real head's pattern (exact definitions: docs/architecture.md).

All metrics compare a real pattern ``p`` and a program pattern ``q`` on the same *masked* n x n grid of
one sequence: query rows ``i < n`` and keys ``j < n`` (padding beyond the sequence length never counts),
and ``j <= i`` when ``causal`` (decoders). Entries outside the grid are ignored whatever they hold.

* **soft IoU** (Ruzicka similarity, the paper's IoU): ``sum min(p, q) / sum max(p, q)`` over the grid,
  per sequence; two all-zero patterns score 1. Higher is better; this selects and reports.
* **JSD distance**: per query row, ``sqrt(1/2 KL(p_i || m_i) + 1/2 KL(q_i || m_i))`` with natural logs,
  ``m = (p + q) / 2`` and ``0 log 0 = 0``; averaged over the rows that have at least one visible key
  (every row ``i < n``, causal or not), giving one value per sequence. Range ``[0, sqrt(ln 2)]`` for
  row-normalized inputs; lower is better; this ranks candidates during synthesis. (Computed through an
  exact rearrangement in float64; identical patterns give 0 up to ~1e-8, the square root of rounding.)
* **top-q IoU** (secondary): each pattern keeps its ``q`` largest *positive* grid cells,
  ``q = ceil(0.025 * visible cells)`` by default (visible cells = n(n+1)/2 causal, n^2 otherwise);
  ties at the threshold go to the earlier cell in row-major order, zero cells are never kept (so a
  sparse program may keep fewer than q); the score is ``|A & B| / |A | B|`` (two empty sets score 1).

Every function returns per-sequence values or, from :func:`score_many`, their plain mean over
sequences (each sequence weighs the same, whatever its length). Inputs are expected to be attention
patterns: non-negative, finite (checked), rows summing to 1 over the grid (not enforced, not rescaled).
float16 and float32 inputs are read in place (float16 is never copied to float32 as a whole); float64
inputs are cast to float32 once (the kernels are compiled for float16 and float32 only).

Candidates may also come as a list with one entry per program: a dense [B,N,N] array or a sparse
``SparseRows`` (headsurgeon/kernels/sparse.py, what ``synth.tensors.program_rows`` returns for programs of small
support). Sparse ones are scored from their stored keys in O(nnz + n) per triple
(headsurgeon/kernels/sparse_metrics.py), never densified; the numbers equal the dense path's to float tolerance.
"""
from __future__ import annotations

import math
from collections.abc import Sequence as _Seq

import numpy as np

from ..kernels import metrics_kernels, sparse_metrics
from ..kernels.metrics_kernels import BlockScores, PackedRows, RealRows, TopqSets, Wanted
from ..core import InputError, METRICS, Metric
from ..kernels.sparse import SparseRows, stack_rows

__all__ = ["METRICS", "TOPQ_FRAC", "RealPatterns", "score_many", "soft_iou", "jsd_distance", "topq_iou",
           "topq_count", "visible_cells"]

TOPQ_FRAC: float = 0.025
#: largest non-zero count packed into one candidate block (16 bytes each: key, value, v log 2v).
DEFAULT_MAX_NNZ: int = 1 << 25
#: bound on the per-block (head x program x sequence) output and row-count buffers.
_BLOCK_CELLS: int = 1 << 24


def visible_cells(length: int, causal: bool) -> int:
    """Number of grid cells a sequence of ``length`` tokens exposes (n(n+1)/2 causal, n^2 otherwise)."""
    n = int(length)
    return n * (n + 1) // 2 if causal else n * n


def topq_count(n_visible: int, frac: float = TOPQ_FRAC) -> int:
    """q for the top-q IoU: ``ceil(frac * n_visible)`` (at least 1 when any cell is visible)."""
    if n_visible <= 0:
        return 0
    return max(1, math.ceil(frac * n_visible - 1e-9))


def _kernel_view(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the array the kernels read (float16 as a uint16 view) and its decode table."""
    if x.dtype == np.float16:
        return x.view(np.uint16), metrics_kernels.F16_LUT
    if x.dtype == np.float32:
        return x, metrics_kernels.NO_LUT
    if x.dtype == np.float64:  # compiled for float16/float32 only: one cast (patterns are float32 anyway)
        return x.astype(np.float32), metrics_kernels.NO_LUT
    raise TypeError(f"{name} has dtype {x.dtype}; pass float16, float32 or float64 attention patterns")


_METRIC_BY_NAME: dict[str, Metric] = {m: m for m in METRICS}


def _metric_names(metrics: _Seq[Metric]) -> tuple[Metric, ...]:
    """Validate and de-duplicate requested metric names."""
    asked: _Seq[str] = (metrics,) if isinstance(metrics, str) else metrics
    wanted = tuple(dict.fromkeys(asked))
    unknown = [m for m in wanted if m not in METRICS]
    if unknown or not wanted:
        raise InputError(f"unknown metrics {unknown or list(asked)}; choose from {list(METRICS)}")
    return tuple(_METRIC_BY_NAME[m] for m in wanted)


def _raise_bad(bad: np.ndarray, name: str, b0: int) -> None:
    """Raise naming the first pattern with negative or non-finite visible entries (``bad`` [X, Bc])."""
    k, b = np.argwhere(bad)[0]
    raise InputError(
        f"{name}[{k}] sequence {b0 + b} has {int(bad[k, b])} negative or non-finite visible entries "
        f"({int(bad.sum())} in that block); metrics need attention patterns (normalize program output first)"
    )


class RealPatterns:
    """Real head patterns ``[H,B,N,N]`` prepared once for scoring many candidate blocks against them.

    Construction validates shapes, lengths and (``check``) values once; the top-q cell sets of the
    real patterns are computed on first use and kept (when they take at most ``topq_cache_bytes``),
    so a synthesis loop that scores candidates block by block pays the real-side work once.
    ``score_many`` is ``RealPatterns(real, lengths, causal).score(cand)``.
    """

    def __init__(self, real: np.ndarray, lengths, causal: bool, *, topq_frac: float = TOPQ_FRAC,
                 topq_q: int | None = None, check: bool = True, topq_cache_bytes: int = 256 << 20) -> None:
        real = np.asarray(real)
        if real.ndim != 4 or real.shape[2] != real.shape[3]:
            raise InputError(
                f"real patterns must be [H,B,N,N] (heads, sequences, query, key); got shape {real.shape} "
                "(for one pattern pair use soft_iou / jsd_distance / topq_iou)"
            )
        lens = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
        if lens.shape[0] != real.shape[1]:
            raise InputError(
                f"batch sizes disagree: real has {real.shape[1]} sequences, lengths {lens.shape[0]}; "
                "score the same sequences in the same order"
            )
        if lens.size and lens.min() < 1:
            raise InputError(f"every sequence needs length >= 1; got lengths min {int(lens.min())} "
                             "(drop empty sequences)")
        if lens.size and lens.max() > real.shape[2]:
            raise InputError(f"a length {int(lens.max())} exceeds the padded real pattern size N={real.shape[2]}; "
                             "pad patterns to the batch's longest sequence")
        self.real = real
        self.lengths = lens
        self.causal = bool(causal)
        self.check = bool(check)
        self._rx, self._rlut = _kernel_view(real, "real")
        H, B = real.shape[0], lens.shape[0]
        if topq_q is not None:
            if int(topq_q) < 1:
                raise InputError(f"topq_q must be >= 1; got {topq_q}")
            qs = [min(int(topq_q), visible_cells(n, self.causal)) for n in lens]
        else:
            if not 0.0 < topq_frac <= 1.0:
                raise InputError(f"topq_frac must be in (0, 1]; got {topq_frac}")
            qs = [topq_count(visible_cells(n, self.causal), topq_frac) for n in lens]
        self.qs = np.array(qs, dtype=np.int64)
        self.N = int(lens.max()) if B else 0
        self._topq_cache_bytes = int(topq_cache_bytes)
        self._topq: tuple[np.ndarray, np.ndarray] | None = None
        if self.check and H and B:
            step = max(1, _BLOCK_CELLS // (H * self.N))
            for b0 in range(0, B, step):
                _, bad = metrics_kernels.scan_rows(self._rx, self._rlut, lens, self.causal, 0, H, b0, min(B, b0 + step), self.N)
                if bad.any():
                    _raise_bad(bad, "real", b0)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the real pattern array [H, B, N, N]."""
        return tuple(self.real.shape)

    def _real_topq(self, b0: int, b1: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-q sets of every head on sequences [b0, b1): (idx [H, b1-b0, q], count [H, b1-b0])."""
        H, B = self.real.shape[0], self.lengths.shape[0]
        qmax = int(self.qs.max())
        if self._topq is None and H * B * qmax * 4 <= self._topq_cache_bytes:
            self._topq = metrics_kernels.topq_sets(self._rx, self._rlut, self.lengths, self.causal, 0, H, 0, B, self.qs, qmax)
        if self._topq is not None:
            idx, cnt = self._topq
            if (b0, b1) == (0, B):
                return idx, cnt
            return np.ascontiguousarray(idx[:, b0:b1]), np.ascontiguousarray(cnt[:, b0:b1])
        return metrics_kernels.topq_sets(self._rx, self._rlut, self.lengths, self.causal, 0, H, b0, b1, self.qs,
                            int(self.qs[b0:b1].max()))

    def score(self, cand: np.ndarray | _Seq[np.ndarray | SparseRows], metrics: _Seq[Metric] = METRICS, *,
              per_sequence: bool = False, max_nnz: int = DEFAULT_MAX_NNZ) -> dict[str, np.ndarray]:
        """Score candidates against every head -> ``{metric: [H,P]}`` (``[H,P,B]`` per sequence).

        ``cand``: dense patterns ``[P,B,N',N']``, or a list of P programs each a dense ``[B,N',N']`` array or
        a ``SparseRows`` (scored without densifying).
        """
        wanted = _metric_names(metrics)
        if isinstance(cand, np.ndarray):
            return self._score_dense(cand, wanted, per_sequence, max_nnz)
        sparse = [(k, c) for k, c in enumerate(cand) if isinstance(c, SparseRows)]
        dense = [(k, c) for k, c in enumerate(cand) if not isinstance(c, SparseRows)]
        if not sparse:
            return self._score_dense(_stack([c for _, c in dense]), wanted, per_sequence, max_nnz)
        P, B = len(cand), self.lengths.shape[0]
        H = self.real.shape[0]
        results: dict[str, np.ndarray] = {m: np.zeros((H, P, B) if per_sequence else (H, P), dtype=np.float64)
                                          for m in wanted}
        parts = [([k for k, _ in sparse], self._score_sparse([c for _, c in sparse], wanted, per_sequence))]
        if dense:
            parts.append(([k for k, _ in dense], self._score_dense(_stack([c for _, c in dense]), wanted, per_sequence,
                                                                   max_nnz)))
        for cols, got in parts:
            for m in wanted:
                results[m][:, cols] = got[m]
        return results

    def _score_sparse(self, rows: list[SparseRows], wanted: tuple[str, ...], per_sequence: bool
                      ) -> dict[str, np.ndarray]:
        """Metrics of sparse programs from their stored keys (headsurgeon/kernels/sparse_metrics.py)."""
        lens, causal = self.lengths, self.causal
        H, B, P = self.real.shape[0], lens.shape[0], len(rows)
        rowptr, cols, vals, N = stack_rows(rows, lens)
        out = {m: np.zeros((H, P, B), dtype=np.float64) for m in wanted}
        if H == 0 or B == 0:
            return out if per_sequence else {m: np.full((H, P), np.nan) for m in wanted}
        do_iou, do_jsd, do_topq = "iou" in wanted, "jsd" in wanted, "topq" in wanted
        qmax_all = int(self.qs.max()) if do_topq else 1
        b_step = max(1, min(B, _BLOCK_CELLS // (H * self.N), _BLOCK_CELLS // (max(H, P) * qmax_all)))
        dummy = np.zeros((1, 1, 1))
        vlog = sparse_metrics.entry_terms(vals) if do_jsd else np.zeros(vals.shape[0])
        for b0 in range(0, B, b_step):
            b1 = min(B, b0 + b_step)
            ctot, bad = sparse_metrics.sparse_totals(rowptr, cols, vals, lens, causal, N, b0, b1)
            if self.check and bad.any():
                _raise_bad(bad, "cand", b0)
            if do_iou or do_jsd:
                b_iou = np.zeros((H, P, b1 - b0)) if do_iou else dummy
                b_jsd = np.zeros((H, P, b1 - b0)) if do_jsd else dummy
                sparse_metrics.score_sparse_block(self._rx, self._rlut, lens, causal, b0, b1, N, rowptr, cols, vals,
                                                  vlog, ctot, do_iou, do_jsd, b_iou, b_jsd)
                for m, buf in (("iou", b_iou), ("jsd", b_jsd)):
                    if m in out:
                        out[m][:, :, b0:b1] = buf
            if do_topq:
                qs = self.qs
                c_idx, c_cnt = sparse_metrics.topq_sets_sparse(rowptr, cols, vals, lens, causal, N, b0, b1, qs,
                                                               int(qs[b0:b1].max()))
                r_idx, r_cnt = self._real_topq(b0, b1)
                buf = np.zeros((H, P, b1 - b0))
                no_rows = PackedRows(P, N, np.zeros(1, np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, np.float32),
                                     np.zeros(0), np.zeros((b1 - b0, P)))
                metrics_kernels.score_block(RealRows(self._rx, self._rlut, lens, causal), b0, b1, no_rows,
                                            Wanted(iou=False, jsd=False, topq=True), TopqSets(r_idx, r_cnt, c_idx, c_cnt),
                                            BlockScores(iou=dummy, jsd=dummy, topq=buf))
                out["topq"][:, :, b0:b1] = buf
        return out if per_sequence else {m: v.mean(axis=2) for m, v in out.items()}

    def _score_dense(self, cand: np.ndarray, wanted: tuple[str, ...], per_sequence: bool, max_nnz: int
                     ) -> dict[str, np.ndarray]:
        """Metrics of dense candidates [P,B,N',N'] (packed to their visible non-zeros block by block)."""
        cand = np.asarray(cand)
        if cand.ndim != 4 or cand.shape[2] != cand.shape[3]:
            raise InputError(f"candidate patterns must be [P,B,N,N]; got shape {cand.shape}")
        lens, causal = self.lengths, self.causal
        H, B, P = self.real.shape[0], lens.shape[0], cand.shape[0]
        if cand.shape[1] != B:
            raise InputError(
                f"batch sizes disagree: real has {B} sequences, cand {cand.shape[1]}; "
                "score the same sequences in the same order"
            )
        if B and lens.max() > cand.shape[2]:
            raise InputError(f"a length {int(lens.max())} exceeds the padded cand pattern size N={cand.shape[2]}; "
                             "pad patterns to the batch's longest sequence")
        cx, clut = _kernel_view(cand, "cand")
        out_shape = (H, P, B) if per_sequence else (H, P)
        results = {m: np.zeros(out_shape, dtype=np.float64) for m in wanted}
        if H == 0 or P == 0 or B == 0:
            if not per_sequence:
                for m in wanted:
                    results[m][:] = np.nan
            return results
        do_iou, do_jsd, do_topq = "iou" in wanted, "jsd" in wanted, "topq" in wanted
        N = self.N
        qs = self.qs
        empty_i = np.zeros((1, 1, 1), dtype=np.int32)
        empty_c = np.zeros((1, 1), dtype=np.int32)
        qmax_all = int(qs.max()) if do_topq else 1
        # Bound the row counts [Bc, P, N], the top-q sets [X, Bc, q] and the outputs per block.
        b_step = max(1, min(B, _BLOCK_CELLS // (P * N), _BLOCK_CELLS // (H * qmax_all), _BLOCK_CELLS // (H * P)))
        for b0 in range(0, B, b_step):
            b1 = min(B, b0 + b_step)
            Bc = b1 - b0
            row_counts, bad = metrics_kernels.scan_rows(cx, clut, lens, causal, 0, P, b0, b1, N)  # [Bc, P, N], [P, Bc]
            if self.check and bad.any():
                _raise_bad(bad, "cand", b0)
            per_prog = row_counts.sum(axis=(0, 2))
            r_idx, r_cnt = self._real_topq(b0, b1) if do_topq else (empty_i, empty_c)
            p0 = 0
            while p0 < P:
                p1, acc = p0 + 1, int(per_prog[p0])
                while (p1 < P and acc + int(per_prog[p1]) <= max_nnz
                       and (p1 - p0 + 1) * Bc * max(H, qmax_all) <= _BLOCK_CELLS):
                    acc += int(per_prog[p1])
                    p1 += 1
                Pc = p1 - p0
                if do_iou or do_jsd:
                    rowptr = np.zeros(Bc * Pc * N + 1, dtype=np.int64)
                    np.cumsum(row_counts[:, p0:p1, :].reshape(-1), out=rowptr[1:])
                    nnz = int(rowptr[-1])
                    cidx = np.empty(nnz, dtype=np.int32)
                    cval = np.empty(nnz, dtype=np.float32)
                    cwlog = np.empty(nnz, dtype=np.float64)
                    ctot = np.zeros((Bc, Pc), dtype=np.float64)
                    metrics_kernels.fill_csr(cx, clut, lens, causal, p0, p1, b0, b1, N, rowptr, cidx, cval, cwlog, ctot)
                else:
                    rowptr = np.zeros(1, dtype=np.int64)
                    cidx = np.zeros(0, dtype=np.int32)
                    cval = np.zeros(0, dtype=np.float32)
                    cwlog = np.zeros(0, dtype=np.float64)
                    ctot = np.zeros((Bc, Pc), dtype=np.float64)
                if do_topq:
                    c_idx, c_cnt = metrics_kernels.topq_sets(cx, clut, lens, causal, p0, p1, b0, b1, qs, int(qs[b0:b1].max()))
                else:
                    c_idx, c_cnt = empty_i, empty_c
                bufs: dict[str, np.ndarray] = {m: np.zeros((H, Pc, Bc), dtype=np.float64) if m in wanted
                                               else np.zeros((1, 1, 1)) for m in METRICS}
                metrics_kernels.score_block(RealRows(self._rx, self._rlut, lens, causal), b0, b1,
                                            PackedRows(Pc, N, rowptr, cidx, cval, cwlog, ctot),
                                            Wanted(do_iou, do_jsd, do_topq), TopqSets(r_idx, r_cnt, c_idx, c_cnt),
                                            BlockScores(bufs["iou"], bufs["jsd"], bufs["topq"]))
                for m in wanted:
                    if per_sequence:
                        results[m][:, p0:p1, b0:b1] = bufs[m]
                    else:
                        results[m][:, p0:p1] += bufs[m].sum(axis=2)
                p0 = p1
        if not per_sequence:
            for m in wanted:
                results[m] /= B
        return results


def _stack(cands: _Seq[np.ndarray]) -> np.ndarray:
    """Dense per-program patterns [B,N,N] (possibly of different widths) as one [P,B,N,N] array."""
    if not len(cands):
        return np.zeros((0, 0, 0, 0), dtype=np.float32)
    width = max(np.asarray(c).shape[-1] for c in cands)
    if all(np.asarray(c).shape[-1] == width for c in cands):
        return np.stack([np.asarray(c) for c in cands])
    out = np.zeros((len(cands),) + tuple(np.asarray(cands[0]).shape[:-2]) + (width, width), dtype=np.float32)
    for k, c in enumerate(cands):
        out[k, ..., : c.shape[-2], : c.shape[-1]] = c
    return out


def score_many(
    real: np.ndarray,
    cand: np.ndarray | _Seq[np.ndarray | SparseRows],
    lengths,
    causal: bool,
    metrics: _Seq[Metric] = METRICS,
    *,
    per_sequence: bool = False,
    topq_frac: float = TOPQ_FRAC,
    topq_q: int | None = None,
    check: bool = True,
    max_nnz: int = DEFAULT_MAX_NNZ,
) -> dict[str, np.ndarray]:
    """Score every head against every program on every sequence in one numba pass.

    ``real`` [H,B,N,N] and ``cand`` [P,B,N',N'] (float16/32/64, padded; N, N' >= max length),
    ``lengths`` [B]. Returns ``{metric: [H,P] float64}`` (means over sequences) or ``[H,P,B]`` with
    ``per_sequence=True``. ``topq_q`` fixes q for every sequence instead of ``topq_frac``. Candidates
    are packed (visible non-zeros only) in blocks of at most ``max_nnz`` entries, so memory stays
    bounded by the block, never [H,P,B,N,N]. ``check`` rejects negative or non-finite visible entries.
    To score several candidate blocks against the same heads, build one :class:`RealPatterns`.
    """
    wanted = _metric_names(metrics)
    real = np.asarray(real)
    if not isinstance(cand, np.ndarray) and any(isinstance(c, SparseRows) for c in cand):
        prepared = RealPatterns(real, lengths, causal, topq_frac=topq_frac, topq_q=topq_q, check=check)
        return prepared.score(cand, wanted, per_sequence=per_sequence, max_nnz=max_nnz)
    cand = np.asarray(cand)
    if real.ndim != 4 or cand.ndim != 4:
        raise InputError(
            f"score_many wants real [H,B,N,N] and cand [P,B,N,N]; got shapes {real.shape} and {cand.shape} "
            "(for one pattern pair use soft_iou / jsd_distance / topq_iou)"
        )
    prepared = RealPatterns(real, lengths, causal, topq_frac=topq_frac, topq_q=topq_q, check=check)
    return prepared.score(cand, wanted, per_sequence=per_sequence, max_nnz=max_nnz)


def _pair(p: np.ndarray, q: np.ndarray, lengths, causal: bool, metric: Metric, **kw) -> np.ndarray:
    """Per-sequence ``metric`` of one pattern pair [B,N,N] x [B,N,N] -> [B]."""
    p = np.asarray(p)
    q = np.asarray(q)
    if p.ndim != 3 or q.ndim != 3:
        raise InputError(f"expected padded patterns [B,N,N]; got shapes {p.shape} and {q.shape}")
    return score_many(p[None], q[None], lengths, causal, (metric,), per_sequence=True, **kw)[metric][0, 0]


def soft_iou(p: np.ndarray, q: np.ndarray, lengths, causal: bool = True) -> np.ndarray:
    """Soft IoU (Ruzicka) per sequence of two padded pattern batches [B,N,N] -> float64 [B]."""
    return _pair(p, q, lengths, causal, "iou")


def jsd_distance(p: np.ndarray, q: np.ndarray, lengths, causal: bool = True) -> np.ndarray:
    """Mean per-row Jensen-Shannon distance (natural log) per sequence, [B,N,N] x [B,N,N] -> [B]."""
    return _pair(p, q, lengths, causal, "jsd")


def topq_iou(
    p: np.ndarray,
    q: np.ndarray,
    lengths,
    causal: bool = True,
    *,
    frac: float = TOPQ_FRAC,
    count: int | None = None,
) -> np.ndarray:
    """IoU of the top-q cell sets per sequence (q = ceil(frac * visible) or ``count``) -> [B]."""
    return _pair(p, q, lengths, causal, "topq", topq_frac=frac, topq_q=count)
