"""Softmax-like table programs fitted by iterative proportional fitting: ``mul(profile(..), key_weight(..),
class_weight(..))`` with query-class temperatures, query-group profiles and a query-predicate split."""
from __future__ import annotations

import numpy as np

from ....kernels import primitives
from ....kernels.cell_kernels import table_l1, table_mass
from ... import dsl
from .fitset import FitSet
from .util import significant

# token classes of the class tables and query groups with profiles of their own (chosen on stories260K with
# benchmarks/synthesis.py)
TABLE_CLASSES = 32
QUERY_PROFILES = 8


def kmeans(x: np.ndarray, weight: np.ndarray, k: int, iters: int = 25) -> np.ndarray:
    """Weighted k-means labels of the rows of x (deterministic: farthest-point start from the heaviest row)."""
    k = min(k, len(x))
    centers = [x[int(np.argmax(weight))]]
    for _ in range(1, k):
        d = np.min(((x[:, None, :] - np.asarray(centers)[None]) ** 2).sum(-1), axis=1)
        centers.append(x[int(np.argmax(d * weight))])
    cen = np.asarray(centers)
    lab = np.zeros(len(x), dtype=np.int64)
    for _ in range(iters):
        lab = np.argmin(((x[:, None, :] - cen[None]) ** 2).sum(-1), axis=1)
        for g in range(k):
            m = lab == g
            if m.any():
                cen[g] = (x[m] * weight[m, None]).sum(0) / weight[m].sum()
    return lab


def cluster_residual(p: np.ndarray, q: np.ndarray, rows: np.ndarray, cols: np.ndarray, n_rows: int,
             n_cols: int, k: int, side: str) -> np.ndarray:
    """k-means labels of the rows (``side="rows"``) or columns of the shrunk log-ratio of real to fitted
    attention mass per (row, column) cell group, over a rank-4 SVD: groups of tokens whose
    attention the fitted model misses in the same way. ``rows`` / ``cols`` [C]: cell indices."""
    real = np.bincount(rows * n_cols + cols, weights=p, minlength=n_rows * n_cols).reshape(n_rows, n_cols)
    fit = np.bincount(rows * n_cols + cols, weights=q, minlength=n_rows * n_cols).reshape(n_rows, n_cols)
    ratio = np.log((real + 1.0) / (fit + 1.0))  # one row's worth of mass as the prior: rare pairs ~0
    u, sv, vt = np.linalg.svd(ratio, full_matrices=False)
    r = min(4, len(sv))
    if side == "rows":
        return kmeans(u[:, :r] * sv[:r], real.sum(axis=1) + 1e-9, k)
    return kmeans(vt[:r].T * sv[:r], real.sum(axis=0) + fit.sum(axis=0) + 1e-9, k)


def fit_loglinear(fs: FitSet, h: int, keys: np.ndarray, offsets: int = 48, sweeps: int = 15,
              temperatures: tuple[float, ...] = (0.4, 0.55, 0.7, 0.85, 1.0, 1.2, 1.4, 1.7, 2.0, 2.5, 3.0),
              min_rows: int = 10, split: dsl.Pred | None = None, classes: int = 0,
              profiles: int = 0) -> list[dsl.Node]:
    """Fit ``mul(profile(..), key_weight(..))`` (a softmax over offset + key-token logits) to head h.

    Iterative proportional fitting of the offset, first-key and key-token logits (maximum
    likelihood against the real rows), then a temperature per query token chosen on the grid by
    L1 distance on its rows (tokens seen in fewer than ``min_rows`` rows keep the global one): the
    query tokens sharing a temperature form one class of ``sharpen(M, t, by=[[t1, [ids..]], ..])``
    (refitting the logits under those temperatures measured no better on stories260K). Returns the
    plain, the globally tempered and the query-gated programs. ``split``: a query predicate whose rows get a profile of their own
    (``gate(PRED, mul(profile1, kw), mul(profile2, kw))``). ``classes`` > 0: the query and key tokens
    (of ``keys``) are also grouped into that many classes each, from a rank-4 SVD of the per-token-pair
    residual log-ratios (k-means), and a class x class logit table is fitted with the others
    (``mul(profile, key_weight, class_weight(..))``): the token-pair interaction that offset and key
    weights miss. ``profiles`` > 1 (without ``split``): query tokens are grouped the same way by how
    their offset preference departs from the fit, and each group gets its own profile (nested
    ``gate(ids=[..], ..)``, the heaviest group last).
    """
    p = fs.real[h].astype(np.float64)
    d = fs.cell_d
    n_prof = offsets + 2  # offsets 0..offsets-1, the tail, the first key
    f_off = np.where(fs.cell_first, offsets + 1, np.minimum(d, offsets)).astype(np.int64)
    if split is not None:
        f_off += n_prof * fs.query_rows(split)[fs.row_of_cell]
    n_off = n_prof * (2 if split is not None else 1)
    behind = (d >= 0) | fs.cell_first
    kidx = primitives.value_index(fs.cell_key, keys)
    f_key = np.where(kidx >= 0, kidx, len(keys)).astype(np.int64)
    b = np.zeros(n_off)
    a = np.zeros(len(keys) + 1)
    eps = 1e-9 * max(float(p.sum()), 1.0)
    p_off = np.bincount(f_off, weights=p, minlength=n_off)
    p_key = np.bincount(f_key, weights=p, minlength=len(keys) + 1)
    temps = np.asarray(temperatures, dtype=np.float64)
    toks, inv = np.unique(fs.row_tok, return_inverse=True)
    count = np.bincount(inv, minlength=len(toks))

    n_cls = classes + 1  # the last class: tokens outside ``keys`` (table weight fixed at 1)
    f_cls = np.zeros_like(f_key)
    c = np.zeros(n_cls * n_cls)
    listed = np.zeros(n_cls * n_cls, dtype=bool)
    if classes:
        listed.reshape(n_cls, n_cls)[:-1, :-1] = True

    def logits() -> np.ndarray:
        return np.where(behind, b[f_off] + a[f_key] + c[f_cls], -60.0)

    def row_mass(index: np.ndarray, n: int) -> np.ndarray:
        # the table's rows and their mass per parameter in one compiled pass (headsurgeon/kernels/cell_kernels.py), from
        # the exps of the logits' parts: np.bincount(index, weights=fs.row_softmax(logits()), minlength=n)
        shift = -60.0 - b.max() - a.max() - c.max()
        counts = np.zeros(n)
        table_mass(fs.row_start, behind, f_off, f_key, f_cls, np.exp(b - b.max()), np.exp(a - a.max()),
                   np.exp(c - c.max()), float(np.exp(shift)), index, counts)
        return counts

    def ipf(with_classes: bool) -> None:
        nonlocal a, b, c
        for _ in range(sweeps):
            b += np.log((p_off + eps) / (row_mass(f_off, n_off) + eps))
            b = np.clip(b - b.max(), -14.0, 0.0)
            a += np.log((p_key + eps) / (row_mass(f_key, len(keys) + 1) + eps))
            a = np.clip(a - a[-1], -14.0, 14.0)
            if with_classes:
                c += np.log((p_cls + eps) / (row_mass(f_cls, n_cls * n_cls) + eps))
                c = np.where(listed, np.clip(c, -14.0, 14.0), 0.0)

    nk = len(keys)
    kq = primitives.value_index(fs.row_tok, keys)
    f_qtok = np.where(kq >= 0, kq, nk)[fs.row_of_cell]  # query token index of each cell (nk: outside)
    q_cls = k_cls = q_grp = None
    ipf(False)
    if classes:
        q = fs.row_softmax(logits())
        q_cls = np.append(cluster_residual(p, q, f_qtok, f_key, nk + 1, nk + 1, classes, "rows")[:nk], classes)
        k_cls = np.append(cluster_residual(p, q, f_qtok, f_key, nk + 1, nk + 1, classes, "cols")[:nk], classes)
        f_cls = q_cls[f_qtok] * n_cls + k_cls[f_key]
        p_cls = np.bincount(f_cls, weights=p, minlength=n_cls * n_cls)
        ipf(True)
    if profiles and split is None:
        # query-token groups that each get an offset profile of their own
        q = fs.row_softmax(logits())
        lab = cluster_residual(p, q, f_qtok, f_off, nk + 1, n_prof, profiles, "rows")
        mass = np.bincount(lab, weights=np.bincount(f_qtok, weights=p, minlength=nk + 1), minlength=profiles)
        heavy = int(np.argmax(mass))
        lab[nk] = heavy  # tokens outside ``keys`` read the last (else) branch: the heaviest group
        q_grp = lab
        f_off = f_off + n_prof * q_grp[f_qtok]
        n_off = n_prof * profiles
        b = np.tile(b, profiles)
        p_off = np.bincount(f_off, weights=p, minlength=n_off)
        ipf(q_cls is not None)
    l1 = np.zeros((len(temps), fs.R))  # [T, R]: each row's L1 distance to the real one, per temperature
    for i, t in enumerate(temps):
        table_l1(fs.row_start, behind, b, f_off, a, f_key, c, f_cls, float(t), p, l1[i])
    t0 = int(np.argmin(l1.sum(axis=1)))
    per_tok = np.stack([np.bincount(inv, weights=l1[t], minlength=len(toks)) for t in range(len(temps))])
    tok_t = np.argmin(per_tok, axis=0)
    gain = per_tok[t0] - per_tok[tok_t, np.arange(len(toks))]
    tok_t = np.where((count >= min_rows) & (gain > 0.02 * count), tok_t, t0)
    if not (f_key == len(keys)).any():
        # every key token has its own weight, so the default is unconstrained: give it the median
        # weight, the best guess for tokens never seen while fitting
        a[:-1] -= np.median(a[:-1])
    # the program: weights relative to the largest offset weight and to the default key weight
    def profile(bb: np.ndarray) -> dsl.Node:
        bb = bb - bb.max()
        return dsl.make_prim("profile", [], {"w": [significant(x) for x in np.exp(bb[:offsets])],
                                              "tail": significant(np.exp(bb[offsets])),
                                              "bos": significant(np.exp(bb[offsets + 1]))})

    table = [[int(t), significant(np.exp(x))] for t, x in zip(keys, a[:-1]) if abs(x) >= 0.05]
    kw = dsl.make_prim("key_weight", [], {"w": table, "default": 1.0}) if table else None

    factors: list[dsl.Node] = [kw] if kw is not None else []
    if q_cls is not None and k_cls is not None:
        groups = [[int(t) for t in keys[lab == g]] for lab in (q_cls[:-1], k_cls[:-1]) for g in range(classes)]
        qg, kg = groups[:classes], groups[classes:]
        qkeep = [g for g in range(classes) if qg[g]]
        kkeep = [g for g in range(classes) if kg[g]]
        tab = np.exp(c.reshape(n_cls, n_cls))
        if qkeep and kkeep:
            factors.append(dsl.make_prim("class_weight", [], {
                "q": [qg[g] for g in qkeep], "k": [kg[g] for g in kkeep],
                "w": [[significant(tab[i, j]) for j in kkeep] for i in qkeep], "default": 1.0}))

    def times_keys(prof: dsl.Node) -> dsl.Node:
        return dsl.Mul((prof, *factors)) if factors else prof

    M: dsl.Node = times_keys(profile(b[:n_prof]))
    if q_grp is not None:  # one branch per query group, the heaviest last (tokens in no group read it)
        M = times_keys(profile(b[heavy * n_prof:(heavy + 1) * n_prof]))
        for g in sorted(set(range(profiles)) - {heavy}, reverse=True):
            toks_g = [int(t) for t in keys[q_grp[:nk] == g]]
            if toks_g:
                M = dsl.Gate(dsl.Pred("ids", tuple(toks_g)), times_keys(profile(b[g * n_prof:(g + 1) * n_prof])), M)
    if split is not None:  # each query row reads one branch, so each profile is scaled on its own
        M = dsl.Gate(split, times_keys(profile(b[n_prof:])), M)

    base = M if temps[t0] == 1.0 else dsl.Sharpen(M, float(temps[t0]))
    out = [M, base] if base is not M else [M]
    by_temp = [[float(temps[t]), [int(x) for x in toks[tok_t == t]]] for t in sorted({int(x) for x in tok_t})
               if t != t0]
    if by_temp:
        out.append(dsl.make_sharpen(M, float(temps[t0]), by_temp))
    return out
