"""The compact fit set: the visible cells of the primitives' and the real heads' patterns as [P, cells] arrays,
the DSL semantics on those cells (from the spec's ``cells`` adapters, headsurgeon/synth/dsl/cell_combinators.py) and the
metrics on them (tests check both against the kernels and ``score_many``)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ....kernels.cell_kernels import cell_scores, rownorm_segments, segment_sums, softmax_segments
from ....core import Head, InputError
from ... import dsl
from ...dsl.cell_combinators import Cells
from ...dsl.spec import CellsAdapter, combinator_for
from ...metrics import score_many
from ...program import Program
from .blas import row_products
from .mixtures import GramStats
from .split import SplitArrays, chunk_size, pred_mask
from .util import progress_bar

#: a rule learned from the fit set (a key token, a firing primitive, a query predicate) must be seen in at least this
#: many fit windows: one window's accident (a weak first token making position 1 a second sink) is not a rule
MIN_WINDOWS = 3


def cells_adapter(node: dsl.Node) -> CellsAdapter:
    """The ``cells`` adapter of a combinator node's spec, or an error saying what its declaration lacks."""
    spec = combinator_for(node)
    if spec is None:
        raise TypeError(f"not a DSL node: {node!r}")
    if spec.cells is None:
        raise InputError(f"combinator {spec.name!r} declares no cells adapter, so the enumerative fit set cannot "
                         "evaluate it: give its CombinatorSpec cells=CellsAdapter(values, raw) "
                         "(headsurgeon/synth/dsl/cell_combinators.py has the built-in ones)")
    return spec.cells


class FitSet(Cells):
    """The fit sequences' visible cells: components [P, C], real patterns [H, C], row/sequence layout.

    Cells are stored in (sequence, query, key) order, so each query row is a contiguous segment
    starting at its key-0 (BOS) cell. Components are row-normalized raw scores with empty rows left
    at zero (their meaning inside a mix); ``empty`` [P, R] marks those rows and ``scale`` [P, R] holds each
    row's raw total (``sum`` adds raw scores: X * scale).
    """

    def __init__(self, split: SplitArrays, library: list[Program], heads: list[Head],
                 preds: list[dsl.Pred], causal: bool, progress: bool, score_singles: bool = True,
                 desc: str = "enumerative: primitives", cache: Any = None) -> None:
        P, H = len(library), len(heads)
        self.library, self.preds, self.causal = library, preds, causal
        self.index = {p.node: k for k, p in enumerate(library)}
        self.pred_index = {pr: g for g, pr in enumerate(preds)}
        width = int(split.lengths.max())
        comps, reals, empties, scales, prows, row_len, seq_rows = [], [], [], [], [], [], []
        cell_d, cell_key, row_tok = [], [], []
        iou_seq: list[np.ndarray] = []  # [H, P, Bc] per chunk, summed once at the end: the same sum for any chunking
        jsd_seq: list[np.ndarray] = []
        chunks = split.chunks(chunk_size(P + H, width, 64))
        bar = progress_bar(len(chunks), desc, progress)
        for pos in chunks:
            n = int(split.lengths[pos].max())
            tot = np.zeros((P, len(pos), n), dtype=np.float32)
            cand = split.components(library, pos, causal, cache, tot)  # [P, Bc, Nc, Nc]; rows sum to 1 or empty
            real, lens = split.real(pos, heads)
            ids_c, _, feats_c = split.arrays(pos)
            ar = np.arange(n)
            inside = ar[None, :] < lens[:, None]  # [Bc, Nc] query rows
            vis = inside[:, :, None] & inside[:, None, :]
            if causal:
                vis &= ar[None, None, :] <= ar[None, :, None]
            comps.append(cand[:, vis])
            reals.append(real[:, vis])
            cell_d.append(np.broadcast_to(ar[None, :, None] - ar[None, None, :], vis.shape)[vis].astype(np.int32))
            cell_key.append(np.broadcast_to(ids_c[:, None, :], vis.shape)[vis])
            row_tok.append(ids_c[inside])
            empty = cand.sum(axis=3) <= 0  # [P, Bc, Nc]
            empties.append(empty[:, inside])
            scales.append(tot[:, inside])
            prows.append(np.stack([pred_mask(pr, ids_c, feats_c)[inside] for pr in preds])
                         if preds else np.zeros((0, int(inside.sum())), dtype=bool))
            for ln in lens:
                row_len.append(np.arange(1, ln + 1) if causal else np.full(ln, ln))
                seq_rows.append(int(ln))
            if score_singles:
                cand[..., 0] += empty & inside[None]  # standalone programs: empty rows attend to position 0
                sc = score_many(real, cand, lens, causal, ("iou", "jsd"), per_sequence=True)
                iou_seq.append(sc["iou"])
                jsd_seq.append(sc["jsd"])
            del cand, real
            bar.update(1)
        bar.close()
        self.B = len(split)
        self.order = np.concatenate(chunks)  # split positions of the sequences, in cell order
        self.X = np.ascontiguousarray(np.concatenate(comps, axis=1))
        self.real = np.ascontiguousarray(np.concatenate(reals, axis=1))
        self.empty = np.concatenate(empties, axis=1)
        self.scale = np.concatenate(scales, axis=1)
        self.pred_rows = np.concatenate(prows, axis=1)
        lengths = np.concatenate(row_len).astype(np.int64)
        self.R = lengths.shape[0]
        self.C = self.X.shape[1]
        self.row_start = np.zeros(self.R + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.row_start[1:])
        self.row_of_cell = np.repeat(np.arange(self.R), lengths)
        self.seq_row_start = np.zeros(self.B + 1, dtype=np.int64)
        np.cumsum(seq_rows, out=self.seq_row_start[1:])
        self.prim_iou, self.prim_jsd = ((np.concatenate(v, axis=2).sum(axis=2) if v else np.zeros((H, P))) / self.B
                                        for v in (iou_seq, jsd_seq))
        self.cell_d = np.concatenate(cell_d)  # query position - key position
        self.cell_key = np.concatenate(cell_key).astype(np.int64)  # key token id
        self.row_tok = np.concatenate(row_tok).astype(np.int64)  # query token id
        self.cell_first = np.zeros(self.C, dtype=bool)  # key 0 (BOS when the model uses one)
        self.cell_first[self.row_start[:-1]] = True
        self.row_window = np.repeat(np.arange(self.B), np.diff(self.seq_row_start))  # [R] each row's fit window
        self.prim_windows = self.windows_with(~self.empty)  # [P] windows where each primitive's rows are not all empty
        self.pred_windows = self.windows_with(self.pred_rows)  # [G] windows where each query predicate holds

    def token_windows(self, rows: np.ndarray, size: int) -> np.ndarray:
        """[size] for each token id below ``size``, the number of fit windows in which it is the query token of a
        row set in the boolean mask ``rows`` [R]."""
        r = np.flatnonzero(rows)
        tok = self.row_tok[r]
        keep = tok < size
        pairs = np.unique(self.row_window[r[keep]] * np.int64(size) + tok[keep])
        return np.bincount(pairs % size, minlength=size)

    def windows_with(self, rows: np.ndarray) -> np.ndarray:
        """[X] the number of fit windows in which a boolean row mask [X, R] is set in some row."""
        hit = np.zeros((rows.shape[0], self.B), dtype=bool)
        x, r = np.nonzero(rows)
        hit[x, self.row_window[r]] = True
        return hit.sum(axis=1)

    def stats(self) -> tuple["GramStats", list["GramStats"]]:
        """Gram statistics overall and for the rows of each query predicate."""
        X, Rl = self.X, self.real
        tot = GramStats((X @ X.T).astype(np.float64), row_products(Rl, X).astype(np.float64),
                     np.einsum("hc,hc->h", Rl, Rl, dtype=np.float64))
        groups = []
        for g in range(len(self.preds)):
            cm = self.pred_rows[g][self.row_of_cell]
            Xg, Rg = X[:, cm], Rl[:, cm]
            groups.append(GramStats((Xg @ Xg.T).astype(np.float64), row_products(Rg, Xg).astype(np.float64),
                                 np.einsum("hc,hc->h", Rg, Rg, dtype=np.float64)))
        return tot, groups

    # ------------------------------------------------------------ DSL semantics on compact cells
    def rownorm(self, v: np.ndarray) -> np.ndarray:
        """Divide each row segment of v ([C] or [K, C]) by its sum, in place; empty rows stay 0."""
        rownorm_segments(v if v.ndim == 2 else v[None], self.row_start, np.empty(1, dtype=v.dtype))
        return v

    def row_sums(self, v: np.ndarray) -> np.ndarray:
        """Each row segment's sum of v ([C] -> [R], [K, C] -> [K, R])."""
        out = np.empty((*v.shape[:-1], self.R), dtype=v.dtype)
        segment_sums(v if v.ndim == 2 else v[None], self.row_start, out if out.ndim == 2 else out[None])
        return out

    def values(self, node: dsl.Node, memo: dict) -> tuple[np.ndarray, np.ndarray]:
        """(row-normalized scores [C] with empty rows 0, empty rows [R]) of a tree, as the kernels compute: library
        primitives from their kernels, the others and the combinators through the spec's ``cells`` adapters."""
        hit = memo.get(node)
        if hit is not None:
            return hit
        if isinstance(node, dsl.Prim):
            k = self.index.get(node)
            if k is not None:
                out = (self.X[k], self.empty[k])
            else:
                v = self.rownorm(self.cell_scores(node))
                out = (v, self.row_sums(v) <= 0)
        else:
            out = cells_adapter(node).values(node, self, memo)
        memo[node] = out
        return out

    def raw(self, node: dsl.Node, memo: dict) -> np.ndarray:
        """Raw scores [C] of a tree as the kernels hand them to ``sum`` (headsurgeon/synth/dsl/catalog.py): unnormalized
        primitives, mixes, gates, fallbacks and products; ``sum`` and ``sharpen`` come row-normalized."""
        key = ("raw", node)
        hit = memo.get(key)
        if hit is not None:
            return hit
        if isinstance(node, dsl.Prim):
            k = self.index.get(node)
            out = self.X[k] * self.scale[k][self.row_of_cell] if k is not None else self.cell_scores(node)
        else:
            out = cells_adapter(node).raw(node, self, memo)
        memo[key] = out
        return out

    def cell_scores(self, node: dsl.Prim) -> np.ndarray:
        """Raw scores [C] of a primitive outside the search library, by its spec's ``cells`` (profile, key_weight,
        class_weight, key_in_set)."""
        cells = dsl.PRIMITIVE_SPECS[node.name].cells
        if cells is None:
            raise KeyError(f"{dsl.to_text(node)} is not in the search library (and {node.name} declares no cells=)")
        return cells(node, self)

    def row_softmax(self, logits: np.ndarray) -> np.ndarray:
        """exp(logits) normalized within each row segment ([C] -> [C])."""
        out = np.empty_like(logits)
        softmax_segments(logits, self.row_start, out)
        return out

    def query_rows(self, pred: dsl.Pred) -> np.ndarray:
        """Boolean [R]: query rows satisfying ``pred`` (search predicates, or any ``ids=`` set)."""
        g = self.pred_index.get(pred)
        if g is not None:
            return self.pred_rows[g]
        if pred.kind == "ids":
            return np.isin(self.row_tok, np.asarray(pred.value, dtype=np.int64))
        raise KeyError(f"gate predicate {pred} is not among the search's query predicates")

    def pattern(self, node: dsl.Node, memo: dict) -> np.ndarray:
        """The normalized pattern [C] of a tree (empty rows attend to position 0)."""
        return self.patterns([node], memo)[0]

    def patterns(self, nodes: Sequence[dsl.Node], memo: dict, out: np.ndarray | None = None) -> np.ndarray:
        """The normalized patterns [K, C] of trees, written into ``out`` (a float32 [>= K, C] buffer reused from
        block to block, or None for a new one)."""
        out = np.empty((len(nodes), self.C), dtype=np.float32) if out is None else out[: len(nodes)]
        starts = self.row_start[:-1]
        for i, node in enumerate(nodes):
            v, e = self.values(node, memo)
            out[i] = v
            out[i, starts[e]] = 1.0
        return out

    # ------------------------------------------------------------ metrics on compact cells
    def scores(self, q: np.ndarray, h: int, iou: bool = True, jsd: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(soft IoU, mean row JSD) per candidate (q [K, C] float32) against head h, each the mean over the fit
        sequences, in one compiled pass (headsurgeon/kernels/cell_kernels.py); a metric not asked for comes back as zeros."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        q2 = q if q.ndim == 2 else q[None]
        per_iou = np.zeros((q2.shape[0], self.B))
        per_jsd = np.zeros((q2.shape[0], self.B))
        p = self.real[h]
        plogp = np.zeros(self.C) if not jsd else p * np.log(np.where(p > 0, p, 1.0), dtype=np.float64)
        cell_scores(q2, p, plogp, self.row_start, self.seq_row_start, iou, jsd, per_iou, per_jsd)
        out_iou, out_jsd = per_iou.mean(axis=-1), per_jsd.mean(axis=-1)
        return (out_iou, out_jsd) if q.ndim == 2 else (out_iou[0], out_jsd[0])

    def iou(self, q: np.ndarray, h: int) -> np.ndarray:
        """Soft IoU per candidate (q [K, C]), mean over the fit sequences."""
        return self.scores(q, h, jsd=False)[0]

    def jsd(self, q: np.ndarray, h: int) -> np.ndarray:
        """Mean per-row Jensen-Shannon distance per candidate (q [K, C]), mean over the fit sequences."""
        return self.scores(q, h, iou=False)[1]

    def refine(self, h: int, support: tuple[int, ...], w: np.ndarray, sweeps: int = 2,
               factors: tuple[float, ...] = (0.5, 0.8, 1.25, 2.0)) -> np.ndarray:
        """Coordinate search on IoU over a mixture's weights (multiplicative steps), from ``w``."""
        XS = self.X[np.asarray(support, dtype=np.int64)]
        ES = self.empty[np.asarray(support, dtype=np.int64)].all(axis=0)
        bos = self.row_start[:-1][ES]

        def score(wt: np.ndarray) -> float:
            q = self.rownorm((wt.astype(np.float32) @ XS))
            q[bos] = 1.0
            return float(self.iou(q, h))

        w = np.asarray(w, dtype=np.float64) / max(float(np.sum(w)), 1e-30)
        best = score(w)
        for _ in range(sweeps):
            improved = False
            for k in range(len(w)):
                for f in factors:
                    trial = w.copy()
                    trial[k] *= f
                    val = score(trial)
                    if val > best + 1e-6:
                        best, w, improved = val, trial / trial.sum(), True
            if not improved:
                break
        return w
