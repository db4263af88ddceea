"""Gate chains fitted to what a head moves: ``gate(P1, MIX1, gate(P2, MIX2, MIX3))`` whose mixtures of ``first()`` and
the induction rules are fitted to α_ij·‖v_j W_O‖ rather than to α_ij.

A head adds Σ_j α_ij v_j W_O to the residual stream (headsurgeon/surgery/patterns/value_norms.py), so an induction head that parks
most of its attention on the first token, whose value moves little, is still mostly its match by what it moves. The
searcher's mixtures are fitted to raw patterns, which the sink dominates, and they miss how much of each row goes to the
match; this depends on the query (a proper noun's match takes most of the row, punctuation's almost none). Here each
row and component is weighed by the store's value norms, the mixture weights of a group of query rows are the
nonnegative least-squares fit of those weighted rows (the norms stand in for the value vectors: their squared error
is what swapping the head changes, were the vectors orthogonal), and query predicates split the rows greedily, the
split that lowers the error most first (headsurgeon/synth/search/enumerative/library.py ``query_predicates``, and sets of
query tokens learned from the rows, :func:`token_set_gates`).
"""
from __future__ import annotations

import itertools
from typing import Protocol, runtime_checkable

import numpy as np

from ... import dsl
from ...program import Program
from .fitset import MIN_WINDOWS, FitSet
from ....core import Head

__all__ = ["MOVED_CORES", "NormSource", "moved_gate_chains", "cell_keys", "cell_norms", "nonneg_lstsq",
           "token_set_gates", "TOKEN_SET_MAX"]

#: the rules mixed with ``first()`` in the chains' leaves (those present in the searcher's library)
MOVED_CORES: tuple[str, ...] = ("induction()", "ngram_induction(2)")
_FIRST = "first()"
#: the most query tokens a learned token-set gate names, so that its program stays readable
TOKEN_SET_MAX = 6
#: a token seen in fewer query rows is never named by a learned set (its own fit is noise)
_MIN_TOKEN_ROWS = 3


@runtime_checkable
class NormSource(Protocol):
    """A store that may hold each key's value norm per head (headsurgeon/surgery/patterns/value_norms.py)."""

    @property
    def has_value_norms(self) -> bool:
        """Whether the norms were captured."""

    def norm_batch(self, indices: list[int], heads: list[Head]) -> np.ndarray:
        """Value norms [H, B, N] of ``heads`` on sequences ``indices``."""


def cell_keys(fs: FitSet) -> tuple[np.ndarray, np.ndarray]:
    """Each fit-set cell's sequence (its split position, ``fs.order``) and key position: where its value norm is."""
    seq_of_row = np.repeat(np.arange(fs.B), np.diff(fs.seq_row_start))
    query = np.arange(fs.R) - fs.seq_row_start[seq_of_row]
    seq = seq_of_row[fs.row_of_cell]
    return fs.order[seq].astype(np.int64), (query[fs.row_of_cell] - fs.cell_d).astype(np.int64)


def cell_norms(keys: tuple[np.ndarray, np.ndarray], norms: np.ndarray) -> np.ndarray:
    """The value norm of each cell's key, float64 [C], from one head's ``norms`` [B, N] (the split's order)."""
    return norms[keys[0], keys[1]].astype(np.float64)


def nonneg_lstsq(G: np.ndarray, g: np.ndarray, yy: float) -> tuple[np.ndarray, float]:
    """Weights w >= 0 minimising ``yy - 2 w·g + wᵀGw`` (a few components: every support tried), and that error."""
    k = G.shape[0]
    best_w, best_e = np.zeros(k), float(yy)
    for r in range(1, k + 1):
        for sup in itertools.combinations(range(k), r):
            s = list(sup)
            try:
                w_s = np.linalg.solve(G[np.ix_(s, s)] + 1e-12 * np.eye(r), g[s])
            except np.linalg.LinAlgError:
                continue
            if (w_s < 0).any():
                continue
            w = np.zeros(k)
            w[s] = w_s
            e = float(yy - 2 * w @ g + w @ G @ w)
            if e < best_e - 1e-12:
                best_w, best_e = w, e
    return best_w, best_e


def _batched_nonneg(G: np.ndarray, g: np.ndarray, yy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nonneg_lstsq` for T groups at once ([T, K, K], [T, K], [T]): the weights [T, K] and errors [T]."""
    T, K = g.shape
    best_e = yy.astype(np.float64).copy()
    best_w = np.zeros((T, K))
    for r in range(1, K + 1):
        for sup in itertools.combinations(range(K), r):
            s = list(sup)
            A = G[:, s][:, :, s] + 1e-12 * np.eye(r)
            try:
                w_s = np.linalg.solve(A, g[:, s, None])[..., 0]
            except np.linalg.LinAlgError:
                continue
            w = np.zeros((T, K))
            w[:, s] = w_s
            e = yy - 2 * np.einsum("tk,tk->t", w, g) + np.einsum("tk,tkl,tl->t", w, G, w)
            better = (w_s >= 0).all(axis=1) & (e < best_e - 1e-12)
            best_e = np.where(better, e, best_e)
            best_w[better] = w[better]
    return best_w, best_e


def _core_share(w: np.ndarray) -> np.ndarray:
    """The share of each row of mixture weights [..., K] that goes to the cores (components 1.., not ``first()``)."""
    total = w.sum(axis=-1)
    return np.where(total > 0, w[..., 1:].sum(axis=-1) / np.where(total > 0, total, 1.0), 0.0)


def token_set_gates(fs: FitSet, rows: np.ndarray, G: np.ndarray, g: np.ndarray, yy: np.ndarray,
                    min_rows: int) -> list[tuple[dsl.Pred, np.ndarray]]:
    """Query-token sets to gate ``rows`` by, with their row masks. Each query token's mixture is fitted on its own
    rows; the tokens whose fit gives the cores more than the rows' common fit does are ranked by how much their own
    fit lowers their rows' error, and each of the first ``TOKEN_SET_MAX`` prefixes is a set. What a head gives its
    match often follows the query's own token (a name's repeat takes most of the row, a function word's almost none),
    which no flag or part of speech names; a token whose rows never tell the mixtures apart is never named, nor one
    seen as a query in fewer than MIN_WINDOWS fit windows (a story's own name)."""
    idx = np.flatnonzero(rows)
    if not idx.size:
        return []
    uniq, inv, counts = np.unique(fs.row_tok[idx], return_inverse=True, return_counts=True)
    T = len(uniq)
    windows = fs.token_windows(rows, int(uniq[-1]) + 1)[uniq]
    Gt, gt, yt = np.zeros((T,) + G.shape[1:]), np.zeros((T, g.shape[1])), np.zeros(T)
    np.add.at(Gt, inv, G[idx])
    np.add.at(gt, inv, g[idx])
    np.add.at(yt, inv, yy[idx])
    w_all, _ = nonneg_lstsq(Gt.sum(0), gt.sum(0), float(yt.sum()))
    shared = yt - 2 * gt @ w_all + np.einsum("k,tkl,l->t", w_all, Gt, w_all)
    w_own, own = _batched_nonneg(Gt, gt, yt)
    gain = shared - own
    more = np.flatnonzero((_core_share(w_own) > _core_share(w_all)) & (gain > 1e-9 * max(float(yt.sum()), 1e-30))
                          & (counts >= _MIN_TOKEN_ROWS) & (windows >= MIN_WINDOWS))
    ranked = more[np.lexsort((uniq[more], -gain[more]))][:TOKEN_SET_MAX]
    out = []
    for k in range(1, len(ranked) + 1):
        tokens = tuple(sorted(int(t) for t in uniq[ranked[:k]]))
        mask = np.isin(fs.row_tok, np.asarray(tokens, dtype=np.int64))
        if min_rows <= int((rows & mask).sum()) <= int(rows.sum()) - min_rows:
            out.append((dsl.Pred("ids", tokens), mask))
    return out


def _mix_text(weights: np.ndarray, texts: list[str]) -> str | None:
    """The mixture of ``texts`` at ``weights`` (normalized, two digits); None when nothing is left."""
    total = float(weights.sum())
    if total <= 0:
        return None
    terms = [(round(float(w) / total, 2), t) for w, t in zip(weights, texts)]
    terms = [(w, t) for w, t in terms if w > 0]
    if not terms:
        return None
    if len(terms) == 1:
        return terms[0][1]
    return " + ".join(f"{w:g}*{t}" for w, t in terms)


def _row_stats(fs: FitSet, comps: list[int], y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per query row: the weighted components' Gram [R, K, K], their products with the weighted head row [R, K] and
    the head row's square [R]. A component's empty row counts as ``first()``'s (a mixture renormalizes over the
    components with keys, so ``a*first() + b*induction()`` is the first token alone where nothing matches)."""
    starts = fs.row_start[:-1]
    K = len(comps)
    Xw = np.empty((K, fs.C))
    for a, p in enumerate(comps):
        x = fs.X[p].astype(np.float64)
        empty_rows = np.flatnonzero(fs.empty[p])
        x[fs.row_start[empty_rows]] = 1.0  # the row's key-0 cell
        Xw[a] = x * w
    yw = y.astype(np.float64) * w
    G = np.empty((fs.R, K, K))
    for a in range(K):
        for b in range(a, K):
            G[:, a, b] = G[:, b, a] = np.add.reduceat(Xw[a] * Xw[b], starts) if fs.C else 0.0
    g = np.stack([np.add.reduceat(Xw[a] * yw, starts) for a in range(K)], axis=1) if fs.C else np.zeros((fs.R, K))
    yy = np.add.reduceat(yw * yw, starts) if fs.C else np.zeros(fs.R)
    return G, g, yy


def moved_gate_chains(fs: FitSet, hi: int, norms: np.ndarray, depth: int = 3, min_rows: int = 20,
                      cores: tuple[str, ...] = MOVED_CORES) -> list[dsl.Node]:
    """Head ``hi``'s gate chains of depth 0..``depth`` (a plain mixture, then one more query gate each), fitted to what
    it moves: ``norms`` [C] are the value norms of the fit set's cells' keys for this head (:func:`cell_norms`). Nothing
    when ``first()`` or every core is missing from the fit set's library, or when no core gets any weight overall."""
    texts = [_FIRST] + list(cores)
    comps = [fs.index.get(Program.parse(t).node) for t in texts]
    have = [k for k, c in enumerate(comps) if c is not None]
    if comps[0] is None or len(have) < 2:
        return []
    texts = [texts[k] for k in have]
    idx = [int(comps[k]) for k in have]  # type: ignore[arg-type]  # the None entries were left out above
    G, g, yy = _row_stats(fs, idx, fs.real[hi], norms)

    def fit(rows: np.ndarray) -> tuple[np.ndarray, float]:
        return nonneg_lstsq(G[rows].sum(0), g[rows].sum(0), float(yy[rows].sum()))

    rest = np.ones(fs.R, dtype=bool)
    w_all, e_rest = fit(rest)
    if w_all[1:].sum() <= 0:
        return []
    chain: list[tuple[dsl.Pred, np.ndarray, np.ndarray]] = []  # (predicate, its rows, the weights inside)
    for _ in range(depth):
        best = None
        tried = [(pred, mask) for pred, mask, seen in zip(fs.preds, fs.pred_rows, fs.pred_windows)
                 if seen >= MIN_WINDOWS] + token_set_gates(fs, rest, G, g, yy, min_rows)
        for pred, mask in tried:
            inside = rest & mask
            outside = rest & ~mask
            if inside.sum() < min_rows or outside.sum() < min_rows:
                continue
            (wi, ei), (_, eo) = fit(inside), fit(outside)
            if best is None or ei + eo < best[0]:
                best = (ei + eo, pred, mask, wi, outside, eo)
        if best is None or best[0] >= 0.97 * e_rest:  # a split that lowers the error by less than 3% is not kept
            break
        chain.append((best[1], best[2], best[3]))
        rest, e_rest = best[4], best[5]
    out: list[dsl.Node] = []
    for d in range(len(chain) + 1):
        rows = np.ones(fs.R, dtype=bool)
        for k in range(d):
            rows &= ~chain[k][1]
        text = _mix_text(fit(rows)[0], texts)
        parts = [(pred, _mix_text(w, texts)) for pred, _, w in chain[:d]]
        if text is None or any(m is None for _, m in parts):
            continue
        node = dsl.parse(text)
        for pred, m in reversed(parts):
            then = dsl.parse(m or _FIRST)
            node = node if then == node else dsl.Gate(pred, then, node)  # equal sides after rounding: no gate
        out.append(node)
    return list(dict.fromkeys(out))
