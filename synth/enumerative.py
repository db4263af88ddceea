"""Enumerative program search: every head of a model at once, no LLM (DESIGN sections 2-3, issue 5.1).

Deterministic for a seed; three stages, all heads together:

1. **Primitives.** A library of DSL primitives with parameter grids (:func:`primitive_library`:
   ``self``, ``first``, ``uniform``, ``prev(1..8)``, ``window(a, b)``, ``decay(r)``,
   ``same_token(_recent)``, ``induction``, ``recent(PRED)`` for flags and POS tags, ``sentence_start``,
   ``word_start``, ``same_word``, ``dep_head``, ``dep_children``, ``key_in_set`` over frequent tokens and
   token classes) is evaluated by the kernels on a seeded sample of the ``synth`` split (the *fit set*),
   chunk by chunk over sequences (memory bounded by one chunk), and scored against every head in one
   :func:`~headsurgeon.synth.metrics.score_many` call per chunk. The visible cells of the row-normalized
   primitive patterns and of the real patterns are kept in a compact [P, cells] form.
2. **Compositions**, per head, from those cells:

   * *mixtures*: from the Gram matrix of the components and their inner products with the real
     head (overall and within query groups: rows whose query satisfies ``punct``, ``pos=NOUN`` ...), a
     beam search over supports fits non-negative weights by least squares (NNLS on the row-normalized
     components against the real rows) for up to ``max_terms`` terms; the best mixture's weights are
     then refined by coordinate search on IoU;
   * *query gates* ``gate(PRED, A, B)``: one mixture for the rows whose query satisfies PRED, one for
     the others; ``fallback(A, best)`` for sparse primitives A; ``sharpen(best, t)``;
   * *tables* (``tables=True``): ``mul(profile(w=[..], tail, bos), key_weight(w=[[id, x], ..]))``, a
     softmax over offset, first-key and key-token logits fitted by iterative proportional fitting
     (maximum likelihood), with a temperature per query-token class
     (``sharpen(M, t, by=[[t1, [ids..]], ..])``, chosen by L1 distance); then the same with a
     query-class x key-class logit table (``class_weight``, ``TABLE_CLASSES`` token classes per side
     clustered from the per-token-pair residual), once with a profile per query-token group
     (``QUERY_PROFILES`` groups, nested ``gate(ids=[..], ..)``) and once with a profile per side of the
     query predicate that splits the rows best (``gate(PRED, M1, M2)``); the best table also enters the
     mixtures as one more component (``0.9*table + 0.1*same_token_recent()``).

   Mixture weights are normalized to sum 1 and rounded to 2 decimals, table weights to 3 significant
   digits, so that program text stays readable (``0.62*prev(1) + 0.38*first()``).
3. **Ranking.** Every proposal is evaluated on the fit set by an exact re-implementation of the DSL
   semantics on the compact cells (tests check it against the kernels and ``score_many``), ranked by JSD
   (the ``top_k`` best, including the two best by IoU), and those are scored on ``select`` the same way
   (their primitives evaluated there by the kernels).

The result maps ``(layer, head)`` to a list of :class:`~headsurgeon.synth.candidate.Candidate`
(``source="enumerative"``) ordered by JSD on ``synth`` (best first), each with
``scores = {"synth": {"iou", "jsd"}, "select": {"iou", "jsd"}}`` (``synth``: on the fit set, a seeded
sample of the synth split). Choosing among candidates (by IoU on ``select``) and reporting (on
``test``) is the caller's job; the searcher never sees ``test``.

Measured on stories260K (all 40 heads, 128-token TinyStories windows, fit on 96 synth windows; see
``benchmarks/synthesis.py`` for the figures and what limits them): mean test IoU of the chosen
program about 0.45 (best single template 0.24), a few minutes for all heads on 2 busy cores.

The store is duck-typed (synth must not import surgery): it needs ``.sequences`` (list of
:class:`~headsurgeon.synth.sequence.Sequence`), ``.causal``, ``.heads`` and
``.batch(indices, heads) -> (patterns [H, B, N, N], lengths [B])``, as
``headsurgeon.surgery.store.AttentionStore`` has.
"""
from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable, Sequence as _Seq
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..kernels import primitives as K
from . import dsl
from .candidate import Candidate
from .metrics import score_many
from .program import Program
from .sequence import Sequence, pad_ids

__all__ = [
    "enumerative_search", "primitive_library", "query_predicates", "SearchStats", "round_weights",
    "nnls_gram",
]

SOURCE = "enumerative"
#: flags that exist without spaCy (rule-based features)
_BASIC_FLAGS = ("punct", "sent_end", "newline", "cap", "word_start")
#: POS tags tried in recent(pos=TAG) and as query gates
_POS_TAGS = ("NOUN", "VERB", "ADJ", "DET", "PRON", "PROPN", "ADP", "AUX", "ADV", "CCONJ", "PUNCT")
#: bytes of candidate patterns held at once per chunk (sets the chunk size)
_CHUNK_BYTES = 192 << 20


class AttentionStoreLike(Protocol):
    """What the searcher reads from a store (``AttentionStore`` fits)."""

    sequences: list[Sequence]
    causal: bool

    @property
    def heads(self) -> list[tuple[int, int]]: ...

    def batch(self, indices: list[int] | None = None, heads: list[tuple[int, int]] | None = None,
              dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class SearchStats:
    """Counts and timings of one search (``enumerative_search(..., stats=SearchStats())`` fills it)."""

    primitives: int = 0
    fit_sequences: int = 0
    proposals: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


# ============================================================================ BLAS threads

_BLAS_HOOKS: list | None = None


def _blas_hooks() -> list:
    """(get, set) thread-count functions of the OpenBLAS libraries numpy/scipy loaded (may be empty)."""
    global _BLAS_HOOKS
    if _BLAS_HOOKS is not None:
        return _BLAS_HOOKS
    import ctypes
    import glob
    import os

    paths: set[str] = set()
    try:
        with open("/proc/self/maps") as f:
            paths |= {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        pass
    paths |= set(glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*")))
    hooks = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", "_64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype = ctypes.c_int
                    put.argtypes = [ctypes.c_int]
                    hooks.append((get, put))
                    break
            else:
                continue
            break
    _BLAS_HOOKS = hooks
    return hooks


class _single_thread_blas:
    """Run BLAS calls single-threaded: the Gram products here are small and OpenBLAS threads on busy
    machines made them 30-80x slower (measured on 2 shared cores); a no-op where OpenBLAS is not found."""

    def __enter__(self) -> None:
        self.saved = []
        for get, put in _blas_hooks():
            try:
                self.saved.append((put, int(get())))
                put(1)
            except Exception:  # noqa: BLE001 - best effort only
                pass

    def __exit__(self, *exc: Any) -> None:
        for put, n in self.saved:
            try:
                put(n)
            except Exception:  # noqa: BLE001
                pass


# ============================================================================ the library

def _frequent_tokens(seqs: list[Sequence], count: int, skip_first: bool = True, min_sequences: int = 1) -> list[int]:
    """The ``count`` most frequent token ids of the sequences (BOS excluded; each in at least
    ``min_sequences`` sequences), ties by id."""
    c: Counter[int] = Counter()
    spread: Counter[int] = Counter()
    for s in seqs:
        ids = s.ids[1:] if (skip_first and s.has_bos) else s.ids
        c.update(int(t) for t in ids)
        spread.update({int(t) for t in ids})
    ranked = sorted((kv for kv in c.items() if spread[kv[0]] >= min_sequences), key=lambda kv: (-kv[1], kv[0]))
    return [t for t, _ in ranked[:count]]


def _flag_token_ids(seqs: list[Sequence], feats: dict[str, np.ndarray], flag: str, lengths: np.ndarray,
                    ids: np.ndarray, min_share: float = 0.5) -> list[int]:
    """Token ids that carry ``flag`` in at least ``min_share`` of their occurrences (a token class)."""
    arr = feats.get(flag)
    if arr is None:
        return []
    inside = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    tok = ids[inside]
    fl = arr[inside] > 0
    if tok.size == 0:
        return []
    hits = np.bincount(tok, weights=fl.astype(np.float64), minlength=int(tok.max()) + 1)
    total = np.bincount(tok, minlength=int(tok.max()) + 1)
    keep = np.flatnonzero((total > 0) & (hits >= min_share * np.maximum(total, 1)) & (hits > 0))
    return [int(t) for t in keep]


def primitive_library(sequences: list[Sequence], causal: bool = True, *, key_tokens: int = 16,
                      max_prev: int = 8, spacy: bool = True) -> list[Program]:
    """The primitives with their parameter grids that the search scores on every head.

    ``key_tokens``: how many of the sequences' most frequent tokens get a ``key_in_set`` of their own
    (token classes such as punctuation or sentence ends get one each too). ``spacy=False`` leaves out
    everything that needs spaCy (POS tags, dependency heads).
    """
    seqs = list(sequences)
    texts: list[str] = ["self()", "first()", "uniform()"]
    texts += [f"prev({k})" for k in range(1, max_prev + 1)]
    if not causal:
        texts += [f"next({k})" for k in range(1, max_prev + 1)]
        texts += ["window(-2, 2)", "window(-4, 4)", "window(-8, -1)"]
    texts += [f"window({a}, {b})" for a, b in ((0, 1), (0, 2), (1, 2), (1, 3), (2, 4), (1, 5), (3, 8),
                                                (5, 12), (9, 16), (13, 32), (17, 48), (33, 128))]
    texts += [f"decay({r})" for r in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98)]
    texts += ["same_token()", "same_token_recent()", "induction()", "sentence_start()", "word_start()",
              "same_word()"]
    texts += [f"recent({f})" for f in _BASIC_FLAGS]
    if spacy:
        texts += ["dep_head()", "dep_children()"]
        texts += [f"recent(pos={t})" for t in _POS_TAGS]
    if seqs:
        ids, lengths = pad_ids(seqs)
        from .features import batch_feature_arrays

        feats = batch_feature_arrays(seqs, [f for f in ("punct", "sent_end", "newline", "cap")])
        for flag in ("punct", "sent_end", "newline", "cap"):
            group = _flag_token_ids(seqs, feats, flag, lengths, ids)
            if group:
                texts.append(f"key_in_set(ids=[{', '.join(map(str, group))}])")
        for t in _frequent_tokens(seqs, key_tokens):
            texts.append(f"key_in_set(ids=[{t}])")
    out: list[Program] = []
    seen: set[str] = set()
    for t in texts:
        p = Program.parse(t)
        if p.hash not in seen:
            seen.add(p.hash)
            out.append(p)
    return out


def query_predicates(sequences: list[Sequence], *, spacy: bool = True, key_tokens: int = 6) -> list[dsl.Pred]:
    """Query predicates tried as gates: the flags, POS tags (with spaCy) and the most frequent tokens."""
    preds = [dsl.Pred("flag", f) for f in _BASIC_FLAGS]
    if spacy:
        preds += [dsl.Pred("pos", t) for t in _POS_TAGS if t != "PUNCT"]
    preds += [dsl.Pred("ids", (t,)) for t in _frequent_tokens(list(sequences), key_tokens)]
    return preds


# ============================================================================ split data

class _Split:
    """Padded ids, lengths and feature arrays of one split, sliced per chunk of sequences."""

    def __init__(self, store: AttentionStoreLike, indices: list[int], feature_names: Iterable[str]) -> None:
        self.store = store
        self.indices = [int(i) for i in indices]
        self.seqs = [store.sequences[i] for i in self.indices]
        self.ids, self.lengths = pad_ids(self.seqs)
        names = sorted(set(feature_names))
        if names:
            from .features import batch_feature_arrays

            self.features = batch_feature_arrays(self.seqs, names)
        else:
            self.features = {}

    def __len__(self) -> int:
        return len(self.indices)

    def chunks(self, per_chunk: int) -> list[np.ndarray]:
        """Positions (into this split) grouped in chunks of at most ``per_chunk``, similar lengths together."""
        order = np.argsort(self.lengths, kind="stable")
        return [order[i: i + per_chunk] for i in range(0, len(order), max(1, per_chunk))]

    def arrays(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """ids [Bc, Nc], lengths [Bc], features [Bc, Nc] of a chunk (Nc = its longest sequence)."""
        lens = self.lengths[pos]
        width = int(lens.max())
        ids = np.ascontiguousarray(self.ids[pos, :width])
        feats = {k: np.ascontiguousarray(v[pos, :width]) for k, v in self.features.items()}
        return ids, lens, feats

    def real(self, pos: np.ndarray, heads: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Real patterns [H, Bc, Nc, Nc] (float32) and lengths of a chunk."""
        pats, lens = self.store.batch([self.indices[p] for p in pos], heads)
        return np.ascontiguousarray(pats, dtype=np.float32), np.asarray(lens, dtype=np.int64)

    def components(self, programs: list[Program], pos: np.ndarray, causal: bool, cache: Any = None) -> np.ndarray:
        """Row-normalized raw scores [P, Bc, Nc, Nc] of a chunk: empty rows stay empty (as inside a mix).

        With a ``TensorCache``, each (program, sequence) matrix is looked up and stored under its own
        key (mask policy ``rownorm/...``, distinct from normalized patterns).
        """
        ids, lens, feats = self.arrays(pos)
        width = ids.shape[1]
        out = np.zeros((len(programs), len(pos), width, width), dtype=np.float32)
        for k, prog in enumerate(programs):
            todo = np.arange(len(pos))
            keys: list[str] = []
            if cache is not None:
                from ..kernels.cache import cache_key
                from .tensors import mask_policy

                policy = "rownorm/" + mask_policy(causal)
                keys = [cache_key(prog.hash, self.seqs[p].key, policy) for p in pos]
                missing = []
                for b, key in enumerate(keys):
                    hit = cache.get(key)
                    n = int(lens[b])
                    if hit is not None and hit.shape == (n, n):
                        out[k, b, :n, :n] = hit
                    else:
                        missing.append(b)
                todo = np.asarray(missing, dtype=np.int64)
                if todo.size == 0:
                    continue
            if todo.size == len(pos):
                prog.evaluate_arrays(ids, lens, feats, causal, normalize=False, out=out[k])
                K.row_normalize(out[k])
            else:
                sub = prog.evaluate_arrays(ids[todo], lens[todo], {name: v[todo] for name, v in feats.items()},
                                           causal, normalize=False)
                K.row_normalize(sub)
                out[k, todo] = sub
            if cache is not None:
                cache.put_many({keys[b]: out[k, b, : lens[b], : lens[b]] for b in todo})
        return out


def _chunk_size(n_items: int, width: int, limit: int) -> int:
    """Sequences per chunk so that ``n_items`` patterns of ``width``^2 float32 stay under _CHUNK_BYTES."""
    per_seq = max(1, n_items) * width * width * 4
    return int(max(1, min(limit, _CHUNK_BYTES // per_seq)))


def _features_for(programs: Iterable[Program], preds: Iterable[dsl.Pred]) -> set[str]:
    need: set[str] = set()
    for p in programs:
        need |= set(p.features_needed)
    for pr in preds:
        if pr.kind == "flag":
            need.add(pr.value)
        elif pr.kind == "pos":
            need.add("pos")
    return need


def _pred_mask(pred: dsl.Pred, ids: np.ndarray, feats: dict[str, np.ndarray]) -> np.ndarray:
    """Boolean [Bc, Nc]: queries satisfying ``pred`` (same rule as the DSL's gate)."""
    if pred.kind == "flag":
        return feats[pred.value] > 0
    if pred.kind == "pos":
        from .features import POS_TAGS

        return feats["pos"] == POS_TAGS.index(pred.value)
    return np.isin(ids, np.asarray(pred.value, dtype=np.int64))


# ============================================================================ NNLS on Gram matrices

def nnls_gram(gram: np.ndarray, rhs: np.ndarray, ridge: float = 1e-9, iters: int = 0) -> np.ndarray:
    """Non-negative least squares ``min_w w'Gw - 2 r'w, w >= 0`` from the normal equations (Lawson-Hanson).

    ``gram`` [K, K] symmetric positive semi-definite, ``rhs`` [K]. A tiny ridge keeps duplicate
    components (e.g. ``window(1, 1)`` and ``prev(1)``) solvable; the solution is deterministic.
    """
    G = np.asarray(gram, dtype=np.float64)
    r = np.asarray(rhs, dtype=np.float64)
    k = r.shape[0]
    if k == 0:
        return np.zeros(0)
    G = G + ridge * max(float(np.trace(G)) / k, 1e-30) * np.eye(k)
    w = np.zeros(k)
    passive = np.zeros(k, dtype=bool)
    max_iter = iters or 3 * k + 10
    for _ in range(max_iter):
        grad = r - G @ w
        cand = np.where(~passive, grad, -np.inf)
        j = int(np.argmax(cand))
        if cand[j] <= 1e-12 * max(1.0, float(np.abs(r).max())):
            break
        passive[j] = True
        while True:
            idx = np.flatnonzero(passive)
            z = np.zeros(k)
            z[idx] = np.linalg.solve(G[np.ix_(idx, idx)], r[idx])
            if (z[idx] > 0).all():
                w = z
                break
            neg = idx[z[idx] <= 0]
            alpha = np.min(w[neg] / np.maximum(w[neg] - z[neg], 1e-300))
            w = w + alpha * (z - w)
            passive &= w > 1e-15
            w[~passive] = 0.0
    return w


@dataclass
class _Stats:
    """Sufficient statistics of one row group: Gram [P,P], inner products [H,P], sum p^2 [H]."""

    G: np.ndarray
    R: np.ndarray
    pp: np.ndarray

    def loss(self, h: int, support: tuple[int, ...], w: np.ndarray) -> float:
        s = np.asarray(support, dtype=np.int64)
        return float(self.pp[h] - 2.0 * self.R[h, s] @ w + w @ self.G[np.ix_(s, s)] @ w)

    def fit(self, h: int, support: tuple[int, ...]) -> tuple[np.ndarray, float]:
        s = np.asarray(support, dtype=np.int64)
        w = nnls_gram(self.G[np.ix_(s, s)], self.R[h, s])
        return w, self.loss(h, support, w)

    def __sub__(self, other: "_Stats") -> "_Stats":
        return _Stats(self.G - other.G, self.R - other.R, self.pp - other.pp)


def _beam_mixtures(st: _Stats, h: int, allowed: np.ndarray, beam: int, max_terms: int,
                   expand: int) -> list[tuple[float, tuple[int, ...], np.ndarray]]:
    """Greedy beam over supports: every size's best ``beam`` states as (loss, support, weights)."""
    states: list[tuple[float, tuple[int, ...], np.ndarray]] = [(float(st.pp[h]), (), np.zeros(0))]
    found: dict[tuple[int, ...], tuple[float, tuple[int, ...], np.ndarray]] = {}
    for _size in range(max_terms):
        fresh: dict[tuple[int, ...], tuple[float, tuple[int, ...], np.ndarray]] = {}
        for _loss, sup, w in states:
            s = np.asarray(sup, dtype=np.int64)
            grad = st.R[h] - (st.G[:, s] @ w if len(sup) else 0.0)
            grad = np.where(allowed, grad, -np.inf)
            if len(sup):
                grad[s] = -np.inf
            order = np.argsort(-grad, kind="stable")[:expand]
            for j in order:
                if not np.isfinite(grad[j]) or grad[j] <= 0:
                    break
                new = tuple(sorted(sup + (int(j),)))
                if new in fresh or new in found:
                    continue
                w2, loss2 = st.fit(h, new)
                keep = w2 > 1e-9
                if not keep.all():  # the new term made another redundant: keep the reduced support
                    new = tuple(int(x) for x, k in zip(new, keep) if k)
                    w2 = w2[keep]
                    if not new or new in fresh or new in found:
                        continue
                fresh[new] = (loss2, new, w2)
        if not fresh:
            break
        states = sorted(fresh.values(), key=lambda x: (x[0], x[1]))[:beam]
        for stt in states:
            found[stt[1]] = stt
    return sorted(found.values(), key=lambda x: (x[0], x[1]))


def round_weights(weights: _Seq[float], decimals: int = 2) -> list[float]:
    """Normalize to sum 1 and round to ``decimals`` (largest remainders keep the sum at 1); zeros stay."""
    w = np.asarray(weights, dtype=np.float64)
    w = np.where(w > 0, w, 0.0)
    if w.sum() <= 0:
        return [0.0] * len(w)
    scale = 10 ** decimals
    x = w / w.sum() * scale
    base = np.floor(x)
    rest = int(round(scale - base.sum()))
    order = np.argsort(-(x - base), kind="stable")
    base[order[:rest]] += 1
    return [float(v / scale) for v in base]


def _mix_node(terms: list[tuple[float, dsl.Node]]) -> dsl.Node | None:
    """A mix node with weights rounded to 2 decimals (terms rounding to 0 dropped), or its only term."""
    if not terms:
        return None
    ws = round_weights([w for w, _ in terms])
    kept = [(w, n) for w, (_, n) in zip(ws, terms) if w > 0]
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0][1]
    kept.sort(key=lambda t: (-t[0], dsl.to_text(t[1])))
    return dsl.Mix(tuple(kept))


# ============================================================================ the compact fit set

# token classes of the class tables and query groups with profiles of their own (measured on stories260K,
# benchmarks/synthesis.py: mean test IoU 0.489 without either, 0.516 / 0.528 with 16 / 32 classes, 0.545 with
# the gated split sharing them, 0.556 / 0.563 adding 4 / 8 profile groups)
TABLE_CLASSES = 32
QUERY_PROFILES = 8


def _kmeans(x: np.ndarray, weight: np.ndarray, k: int, iters: int = 25) -> np.ndarray:
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


class _FitSet:
    """The fit sequences' visible cells: components [P, C], real patterns [H, C], row/sequence layout.

    Cells are stored in (sequence, query, key) order, so each query row is a contiguous segment
    starting at its key-0 (BOS) cell. Components are row-normalized raw scores with empty rows left
    at zero (their meaning inside a mix); ``empty`` [P, R] marks those rows.
    """

    def __init__(self, split: _Split, library: list[Program], heads: list[tuple[int, int]],
                 preds: list[dsl.Pred], causal: bool, progress: bool, score_singles: bool = True,
                 desc: str = "enumerative: primitives", cache: Any = None) -> None:
        P, H = len(library), len(heads)
        self.library, self.preds, self.causal = library, preds, causal
        self.index = {p.node: k for k, p in enumerate(library)}
        self.pred_index = {pr: g for g, pr in enumerate(preds)}
        width = int(split.lengths.max())
        comps, reals, empties, prows, row_len, seq_rows = [], [], [], [], [], []
        cell_d, cell_key, row_tok = [], [], []
        iou_sum, jsd_sum = np.zeros((H, P)), np.zeros((H, P))
        chunks = split.chunks(_chunk_size(P + H, width, 64))
        bar = _progress(len(chunks), desc, progress)
        for pos in chunks:
            cand = split.components(library, pos, causal, cache)  # [P, Bc, Nc, Nc]; rows sum to 1 or are empty
            real, lens = split.real(pos, heads)
            ids_c, _, feats_c = split.arrays(pos)
            n = cand.shape[2]
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
            prows.append(np.stack([_pred_mask(pr, ids_c, feats_c)[inside] for pr in preds])
                         if preds else np.zeros((0, int(inside.sum())), dtype=bool))
            for ln in lens:
                row_len.append(np.arange(1, ln + 1) if causal else np.full(ln, ln))
                seq_rows.append(int(ln))
            if score_singles:
                cand[..., 0] += empty & inside[None]  # standalone programs: empty rows attend to position 0
                sc = score_many(real, cand, lens, causal, ("iou", "jsd"), per_sequence=True)
                iou_sum += sc["iou"].sum(axis=2)
                jsd_sum += sc["jsd"].sum(axis=2)
            del cand, real
            bar.update(1)
        bar.close()
        self.B = len(split)
        self.order = np.concatenate(chunks)  # split positions of the sequences, in cell order
        self.X = np.ascontiguousarray(np.concatenate(comps, axis=1))
        self.real = np.ascontiguousarray(np.concatenate(reals, axis=1))
        self.empty = np.concatenate(empties, axis=1)
        self.pred_rows = np.concatenate(prows, axis=1)
        lengths = np.concatenate(row_len).astype(np.int64)
        self.R = lengths.shape[0]
        self.C = self.X.shape[1]
        self.row_start = np.zeros(self.R + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.row_start[1:])
        self.row_of_cell = np.repeat(np.arange(self.R), lengths)
        self.seq_row_start = np.zeros(self.B + 1, dtype=np.int64)
        np.cumsum(seq_rows, out=self.seq_row_start[1:])
        self.seq_cell_start = self.row_start[self.seq_row_start]
        self.rows_per_seq = np.asarray(seq_rows, dtype=np.float64)
        self.prim_iou, self.prim_jsd = iou_sum / self.B, jsd_sum / self.B
        self.cell_d = np.concatenate(cell_d)  # query position - key position
        self.cell_key = np.concatenate(cell_key).astype(np.int64)  # key token id
        self.row_tok = np.concatenate(row_tok).astype(np.int64)  # query token id
        self.cell_first = np.zeros(self.C, dtype=bool)  # key 0 (BOS when the model uses one)
        self.cell_first[self.row_start[:-1]] = True

    # ------------------------------------------------------------ statistics for least squares
    def stats(self) -> tuple["_Stats", list["_Stats"]]:
        """Gram statistics overall and for the rows of each query predicate."""
        X, Rl = self.X, self.real
        tot = _Stats((X @ X.T).astype(np.float64), (Rl @ X.T).astype(np.float64),
                     np.einsum("hc,hc->h", Rl, Rl, dtype=np.float64))
        groups = []
        for g in range(len(self.preds)):
            cm = self.pred_rows[g][self.row_of_cell]
            Xg, Rg = X[:, cm], Rl[:, cm]
            groups.append(_Stats((Xg @ Xg.T).astype(np.float64), (Rg @ Xg.T).astype(np.float64),
                                 np.einsum("hc,hc->h", Rg, Rg, dtype=np.float64)))
        return tot, groups

    # ------------------------------------------------------------ DSL semantics on compact cells
    def rownorm(self, v: np.ndarray) -> np.ndarray:
        """Divide each row segment of v ([C] or [K, C]) by its sum, in place; empty rows stay 0."""
        s = np.add.reduceat(v, self.row_start[:-1], axis=-1)
        inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
        v *= inv[..., self.row_of_cell]
        return v

    def values(self, node: dsl.Node, memo: dict) -> tuple[np.ndarray, np.ndarray]:
        """(row-normalized scores [C] with empty rows 0, empty rows [R]) of a tree, as the kernels compute."""
        hit = memo.get(node)
        if hit is not None:
            return hit
        if isinstance(node, dsl.Prim):
            k = self.index.get(node)
            if k is not None:
                out = (self.X[k], self.empty[k])
            elif node.name in ("profile", "key_weight", "class_weight"):
                v = self.rownorm(self.cell_scores(node))
                out = (v, np.add.reduceat(v, self.row_start[:-1]) <= 0)
            else:
                raise KeyError(f"{dsl.to_text(node)} is not in the search library")
        elif isinstance(node, dsl.Mix):
            acc = np.zeros(self.C, dtype=np.float32)
            emp = np.ones(self.R, dtype=bool)
            for w, t in node.terms:
                v, e = self.values(t, memo)
                acc += np.float32(w) * v
                emp &= e
            out = (self.rownorm(acc), emp)
        elif isinstance(node, dsl.Gate):
            rows = self.query_rows(node.pred)
            va, ea = self.values(node.then, memo)
            vb, eb = self.values(node.other, memo)
            out = (np.where(rows[self.row_of_cell], va, vb), np.where(rows, ea, eb))
        elif isinstance(node, dsl.Fallback):
            v, e = self.values(node.args[0], memo)
            for alt in node.args[1:]:
                va, ea = self.values(alt, memo)
                v = np.where(e[self.row_of_cell], va, v)
                e = e & ea
            out = (v, e)
        elif isinstance(node, dsl.Sharpen):
            v, e = self.values(node.arg, memo)
            if node.by:
                texp = np.full(self.R, node.t, dtype=np.float32)
                for tk, ids in node.by:
                    texp[np.isin(self.row_tok, np.asarray(ids, dtype=np.int64))] = tk
                out = (self.rownorm(np.power(v, texp[self.row_of_cell])), e)
            else:
                out = (self.rownorm(np.power(v, np.float32(node.t))), e)
        elif isinstance(node, dsl.Mul):
            v, _ = self.values(node.args[0], memo)
            v = v.copy()
            for other in node.args[1:]:
                v *= self.values(other, memo)[0]
            s = np.add.reduceat(v, self.row_start[:-1])
            out = (self.rownorm(v), s <= 0)
        else:
            raise TypeError(f"not a DSL node: {node!r}")
        memo[node] = out
        return out

    def cell_scores(self, node: dsl.Prim) -> np.ndarray:
        """Raw scores [C] of the table primitives ``profile`` and ``key_weight`` (kernel semantics)."""
        if node.name == "profile":
            w = np.asarray(node.param("w"), dtype=np.float32)
            d = self.cell_d
            v = np.where(d < len(w), w[np.clip(d, 0, len(w) - 1)], np.float32(node.param("tail")))
            v = np.where(d < 0, np.float32(0.0), v).astype(np.float32)
            if node.param("bos") is not None:
                v[self.cell_first] = np.float32(node.param("bos"))
            return v
        if node.name == "class_weight":
            qc, kc, table = dsl.class_tables(node, self.row_tok, self.cell_key)
            return table[qc[self.row_of_cell], kc]
        table = node.param("w")
        tids = np.array([t for t, _ in table], dtype=np.int64)
        wts = np.array([w for _, w in table], dtype=np.float32)
        idx = K.value_index(self.cell_key, tids)
        return np.where(idx >= 0, wts[np.maximum(idx, 0)], np.float32(node.param("default"))).astype(np.float32)

    def row_softmax(self, logits: np.ndarray) -> np.ndarray:
        """exp(logits) normalized within each row segment ([C] -> [C])."""
        mx = np.maximum.reduceat(logits, self.row_start[:-1])
        q = np.exp(logits - mx[self.row_of_cell])
        return self.rownorm(q)

    def loglinear(self, h: int, keys: np.ndarray, offsets: int = 48, sweeps: int = 15,
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
        p = self.real[h].astype(np.float64)
        d = self.cell_d
        n_prof = offsets + 2  # offsets 0..offsets-1, the tail, the first key
        f_off = np.where(self.cell_first, offsets + 1, np.minimum(d, offsets)).astype(np.int64)
        if split is not None:
            f_off += n_prof * self.query_rows(split)[self.row_of_cell]
        n_off = n_prof * (2 if split is not None else 1)
        behind = (d >= 0) | self.cell_first
        kidx = K.value_index(self.cell_key, keys)
        f_key = np.where(kidx >= 0, kidx, len(keys)).astype(np.int64)
        b = np.zeros(n_off)
        a = np.zeros(len(keys) + 1)
        eps = 1e-9 * max(float(p.sum()), 1.0)
        p_off = np.bincount(f_off, weights=p, minlength=n_off)
        p_key = np.bincount(f_key, weights=p, minlength=len(keys) + 1)
        temps = np.asarray(temperatures, dtype=np.float64)
        toks, inv = np.unique(self.row_tok, return_inverse=True)
        count = np.bincount(inv, minlength=len(toks))

        n_cls = classes + 1  # the last class: tokens outside ``keys`` (table weight fixed at 1)
        f_cls = np.zeros_like(f_key)
        c = np.zeros(n_cls * n_cls)
        listed = np.zeros(n_cls * n_cls, dtype=bool)
        if classes:
            listed.reshape(n_cls, n_cls)[:-1, :-1] = True

        def logits() -> np.ndarray:
            return np.where(behind, b[f_off] + a[f_key] + c[f_cls], -60.0)

        def ipf(with_classes: bool) -> None:
            nonlocal a, b, c
            for _ in range(sweeps):
                q = self.row_softmax(logits())
                b += np.log((p_off + eps) / (np.bincount(f_off, weights=q, minlength=n_off) + eps))
                b = np.clip(b - b.max(), -14.0, 0.0)
                q = self.row_softmax(logits())
                a += np.log((p_key + eps) / (np.bincount(f_key, weights=q, minlength=len(keys) + 1) + eps))
                a = np.clip(a - a[-1], -14.0, 14.0)
                if with_classes:
                    q = self.row_softmax(logits())
                    c += np.log((p_cls + eps) / (np.bincount(f_cls, weights=q, minlength=n_cls * n_cls) + eps))
                    c = np.where(listed, np.clip(c, -14.0, 14.0), 0.0)

        nk = len(keys)
        kq = K.value_index(self.row_tok, keys)
        f_qtok = np.where(kq >= 0, kq, nk)[self.row_of_cell]  # query token index of each cell (nk: outside)
        q_cls = k_cls = q_grp = None
        ipf(False)
        if classes:
            q = self.row_softmax(logits())
            q_cls = np.append(self._cluster(p, q, f_qtok, f_key, nk + 1, nk + 1, classes, "rows")[:nk], classes)
            k_cls = np.append(self._cluster(p, q, f_qtok, f_key, nk + 1, nk + 1, classes, "cols")[:nk], classes)
            f_cls = q_cls[f_qtok] * n_cls + k_cls[f_key]
            p_cls = np.bincount(f_cls, weights=p, minlength=n_cls * n_cls)
            ipf(True)
        if profiles and split is None:
            # query-token groups that each get an offset profile of their own
            q = self.row_softmax(logits())
            lab = self._cluster(p, q, f_qtok, f_off, nk + 1, n_prof, profiles, "rows")
            mass = np.bincount(lab, weights=np.bincount(f_qtok, weights=p, minlength=nk + 1), minlength=profiles)
            heavy = int(np.argmax(mass))
            lab[nk] = heavy  # tokens outside ``keys`` read the last (else) branch: the heaviest group
            q_grp = lab
            f_off = f_off + n_prof * q_grp[f_qtok]
            n_off = n_prof * profiles
            b = np.tile(b, profiles)
            p_off = np.bincount(f_off, weights=p, minlength=n_off)
            ipf(q_cls is not None)
        lg = logits()
        l1 = np.stack([np.add.reduceat(np.abs(self.row_softmax(t * lg) - p), self.row_start[:-1])
                       for t in temps])  # [T, R]
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
            return dsl._make_prim("profile", [], {"w": [_sig(x) for x in np.exp(bb[:offsets])],
                                                  "tail": _sig(np.exp(bb[offsets])),
                                                  "bos": _sig(np.exp(bb[offsets + 1]))})

        table = [[int(t), _sig(np.exp(x))] for t, x in zip(keys, a[:-1]) if abs(x) >= 0.05]
        kw = dsl._make_prim("key_weight", [], {"w": table, "default": 1.0}) if table else None

        factors: list[dsl.Node] = [kw] if kw is not None else []
        if q_cls is not None:
            groups = [[int(t) for t in keys[lab == g]] for lab in (q_cls[:-1], k_cls[:-1]) for g in range(classes)]
            qg, kg = groups[:classes], groups[classes:]
            qkeep = [g for g in range(classes) if qg[g]]
            kkeep = [g for g in range(classes) if kg[g]]
            tab = np.exp(c.reshape(n_cls, n_cls))
            if qkeep and kkeep:
                factors.append(dsl._make_prim("class_weight", [], {
                    "q": [qg[g] for g in qkeep], "k": [kg[g] for g in kkeep],
                    "w": [[_sig(tab[i, j]) for j in kkeep] for i in qkeep], "default": 1.0}))

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
        classes = [[float(temps[t]), [int(x) for x in toks[tok_t == t]]] for t in sorted({int(x) for x in tok_t})
                   if t != t0]
        if classes:
            out.append(dsl._make_sharpen(M, float(temps[t0]), classes))
        return out

    def _cluster(self, p: np.ndarray, q: np.ndarray, rows: np.ndarray, cols: np.ndarray, n_rows: int,
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
            return _kmeans(u[:, :r] * sv[:r], real.sum(axis=1) + 1e-9, k)
        return _kmeans(vt[:r].T * sv[:r], real.sum(axis=0) + fit.sum(axis=0) + 1e-9, k)

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
        v, e = self.values(node, memo)
        q = v.copy()
        q[self.row_start[:-1][e]] = 1.0
        return q

    # ------------------------------------------------------------ metrics on compact cells
    def iou(self, q: np.ndarray, h: int) -> np.ndarray:
        """Soft IoU per candidate (q [K, C]), mean over the fit sequences."""
        p = self.real[h]
        mn = np.add.reduceat(np.minimum(q, p), self.seq_cell_start[:-1], axis=-1, dtype=np.float64)
        mx = np.add.reduceat(np.maximum(q, p), self.seq_cell_start[:-1], axis=-1, dtype=np.float64)
        return np.mean(np.divide(mn, mx, out=np.ones_like(mn), where=mx > 0), axis=-1)

    def jsd(self, q: np.ndarray, h: int) -> np.ndarray:
        """Mean per-row Jensen-Shannon distance per candidate (q [K, C]), mean over the fit sequences."""
        p = self.real[h]
        m = 0.5 * (p + q)  # > 0 wherever p or q is
        pos_m = m > 0  # False also where q is so small (subnormal) that q/2 underflows: such cells add 0
        ratio = np.divide(q, m, out=np.ones_like(m), where=(q > 0) & pos_m)
        t = q * np.log(ratio, out=ratio)  # q log(q/m): float32 ratios, no cancellation between big terms
        ratio = np.divide(p, m, out=np.ones_like(m), where=(p > 0) & pos_m)
        t += p * np.log(ratio, out=ratio)
        rows = np.sqrt(np.maximum(0.5 * np.add.reduceat(t, self.row_start[:-1], axis=-1, dtype=np.float64), 0.0))
        per_seq = np.add.reduceat(rows, self.seq_row_start[:-1], axis=-1) / self.rows_per_seq
        return per_seq.mean(axis=-1)

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


# ============================================================================ the search

def _default_splits(store: AttentionStoreLike, seed: int) -> tuple[list[int], list[int]]:
    """Split the store's sequences by document (75% synth, 25% select), seeded, when none are given."""
    docs = sorted({s.doc for s in store.sequences})
    if len(docs) < 2:
        raise ValueError(
            "enumerative_search needs synth_idx and select_idx (or a store with at least 2 documents to "
            "split by document); pass the store indices of your synth and select splits"
        )
    perm = np.random.default_rng(seed).permutation(len(docs))
    n_synth = min(len(docs) - 1, max(1, int(round(0.75 * len(docs)))))
    synth_docs = {docs[i] for i in perm[:n_synth]}
    synth = [i for i, s in enumerate(store.sequences) if s.doc in synth_docs]
    select = [i for i, s in enumerate(store.sequences) if s.doc not in synth_docs]
    return synth, select


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)


def _spacy_available() -> bool:
    """True when the spaCy English model loads (POS / dependency features are then usable)."""
    try:
        from .features import load_spacy

        load_spacy()
        return True
    except Exception:  # noqa: BLE001 - any failure means: search without spaCy features
        warnings.warn("spaCy model unavailable: the enumerative search skips POS/dependency primitives",
                      RuntimeWarning, stacklevel=3)
        return False


def _sparse_primitives(library: list[Program]) -> list[int]:
    """Library positions of primitives whose rows may be empty (candidates for ``fallback``)."""
    dense = {"self", "first", "uniform", "decay", "sentence_start", "word_start", "same_word"}
    return [k for k, p in enumerate(library) if isinstance(p.node, dsl.Prim) and p.node.name not in dense]


def _hypothesis(program: Program) -> str:
    """A one-line description of a found program."""
    node = program.node
    if isinstance(node, dsl.Prim):
        return f"attends by the single rule {program.text}"
    if isinstance(node, dsl.Mix):
        return f"a fitted mixture of {len(node.terms)} rules"
    if isinstance(node, dsl.Gate):
        return "query-dependent: one mixture where the query satisfies the gate, another elsewhere"
    if isinstance(node, dsl.Fallback):
        return "a sparse rule where it applies, a fitted mixture elsewhere"
    if isinstance(node, dsl.Sharpen):
        return "a fitted mixture with sharpened/flattened rows"
    return "composed rule"


def _walk(node: dsl.Node) -> Iterable[dsl.Node]:
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        stack.extend(dsl._children(cur))


def _used_primitives(nodes: list[dsl.Node], library: list[Program]) -> list[Program]:
    """The library primitives appearing in the trees, in library order."""
    seen = {n for node in nodes for n in _walk(node) if isinstance(n, dsl.Prim)}
    return [p for p in library if p.node in seen]


def _used_preds(nodes: list[dsl.Node], preds: list[dsl.Pred]) -> list[dsl.Pred]:
    """The query predicates gating the trees, in ``preds`` order."""
    seen = {n.pred for node in nodes for n in _walk(node) if isinstance(n, dsl.Gate)}
    return [p for p in preds if p in seen]


def _sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (program text stays short)."""
    x = float(x)
    return float(f"{x:.{digits}g}") if x > 0 else 0.0


def _best_single_loss(st: _Stats, h: int) -> float:
    """Least-squares loss of the best one-primitive fit (``pp - r_k^2 / G_kk`` over r_k > 0)."""
    diag = np.diag(st.G)
    gain = np.where((st.R[h] > 0) & (diag > 0), st.R[h] ** 2 / np.where(diag > 0, diag, 1.0), 0.0)
    return float(st.pp[h] - gain.max(initial=0.0))


def _mixture(nodes: list[dsl.Node], support: tuple[int, ...], w: np.ndarray) -> dsl.Node | None:
    return _mix_node([(float(x), nodes[j]) for x, j in zip(w, support)])


def _extend(st: _Stats, fs: _FitSet, h: int, m: np.ndarray) -> _Stats:
    """Head h's statistics with one more component ``m`` [C] (row-normalized) appended."""
    P = st.G.shape[0]
    gm = (fs.X @ m).astype(np.float64)
    G = np.empty((P + 1, P + 1))
    G[:P, :P] = st.G
    G[:P, P] = G[P, :P] = gm
    G[P, P] = float(m.astype(np.float64) @ m)
    R = np.concatenate([st.R[h], [float(fs.real[h].astype(np.float64) @ m)]])[None]
    return _Stats(G, R, st.pp[h: h + 1])


def _propose(fs: _FitSet, hi: int, tot: _Stats, groups: list[_Stats], nodes: list[dsl.Node],
             sparse: list[int], beam: int, max_terms: int, gates: int,
             keys: np.ndarray | None = None) -> list[dsl.Node]:
    """Every composition the search tries for one head (DSL trees, deduplicated, in a stable order)."""
    P = len(nodes)
    allowed = np.ones(P, dtype=bool)
    props: list[dsl.Node] = []
    gated: list = []
    if gates > 0 and groups:
        # cheap screen: the best single-primitive fit inside and outside each query group
        screen = []
        for g, grp in enumerate(groups):
            inn, out = grp, tot - grp
            if inn.pp[hi] <= 0 or out.pp[hi] <= 0:
                continue
            screen.append((_best_single_loss(inn, hi) + _best_single_loss(out, hi), g))
        screen.sort()
        for _proxy, g in screen[: 2 * gates]:
            inn, out = groups[g], tot - groups[g]
            a = _beam_mixtures(inn, hi, allowed, 2, max_terms, 4)
            b = _beam_mixtures(out, hi, allowed, 2, max_terms, 4)
            if a and b:
                gated.append((a[0][0] + b[0][0], g, a[0], b[0]))
        gated.sort(key=lambda x: (x[0], x[1]))
        for _loss, g, a, b in gated[:gates]:
            na, nb = _mixture(nodes, a[1], a[2]), _mixture(nodes, b[1], b[2])
            if na is not None and nb is not None and na != nb:
                props.append(dsl.Gate(fs.preds[g], na, nb))
    if keys is not None:
        # softmax-like tables (positional profile x key-token weights, tempered per query class) ...
        loglin = fs.loglinear(hi, keys)
        loglin += fs.loglinear(hi, keys, classes=TABLE_CLASSES)
        loglin += fs.loglinear(hi, keys, classes=TABLE_CLASSES, profiles=QUERY_PROFILES)
        if gated:  # the query split that best separates two behaviours gets a profile per side
            loglin += fs.loglinear(hi, keys, split=fs.preds[gated[0][1]], classes=TABLE_CLASSES)[-1:]
        memo: dict = {}
        pats = np.stack([fs.pattern(n, memo) for n in loglin])
        top = int(np.argmax(fs.iou(pats, hi)))
        props += loglin
        # ... and the best of them as one more component of the mixtures below
        ext = _extend(tot, fs, hi, fs.values(loglin[top], memo)[0])
        ext_nodes = nodes + [loglin[top]]
        for _loss, sup, w in _beam_mixtures(ext, 0, np.ones(P + 1, dtype=bool), 2, min(max_terms, 4), 6)[:6]:
            if P in sup and len(sup) > 1:
                node = _mixture(ext_nodes, sup, w)
                if node is not None:
                    props.append(node)
        del memo, pats
    props += [nodes[int(p)] for p in np.argsort(fs.prim_jsd[hi], kind="stable")[:3]]
    props += [nodes[int(p)] for p in np.argsort(-fs.prim_iou[hi], kind="stable")[:2]]
    mixes = _beam_mixtures(tot, hi, allowed, beam, max_terms, max(2 * beam, 4))
    per_size: dict[int, int] = {}
    best: list[tuple[tuple[int, ...], np.ndarray]] = []
    for _loss, sup, w in mixes:
        if per_size.get(len(sup), 0) >= 2:
            continue
        node = _mixture(nodes, sup, w)
        if node is None:
            continue
        per_size[len(sup)] = per_size.get(len(sup), 0) + 1
        props.append(node)
        if len(best) < 2 and len(sup) > 1:
            best.append((sup, w))
    refined = []
    for sup, w in best[:1]:
        node = _mixture(nodes, sup, fs.refine(hi, sup, w))
        if node is not None:
            props.append(node)
            refined.append(node)
    anchors = refined[:1] or [p for p in props if isinstance(p, dsl.Mix)][:1]
    for anchor in anchors:
        for p in sorted(sparse, key=lambda j: fs.prim_jsd[hi, j])[:2]:
            props.append(dsl.Fallback((nodes[p], anchor)))
        for t in (0.5, 1.5, 2.0, 3.0):
            props.append(dsl.Sharpen(anchor, t))
    return list(dict.fromkeys(props))


def enumerative_search(
    store: AttentionStoreLike,
    heads: list[tuple[int, int]] | None = None,
    synth_idx: _Seq[int] | None = None,
    select_idx: _Seq[int] | None = None,
    beam: int = 6,
    max_terms: int = 5,
    seed: int = 0,
    progress: bool = True,
    cache: Any = None,
    *,
    top_k: int = 5,
    fit_sequences: int | None = 96,
    library: list[Program] | None = None,
    gates: int = 3,
    tables: bool = True,
    key_weights: int = 256,
    spacy: bool | None = None,
    stats: SearchStats | None = None,
) -> dict[tuple[int, int], list[Candidate]]:
    """Search DSL programs for every head at once; ``{(layer, head): [Candidate, ...]}``, best JSD first.

    ``synth_idx`` / ``select_idx``: store indices of the sequences to fit/rank on and to score for
    selection (default: a seeded 75/25 split of the store's documents). ``beam``: supports kept per
    mixture size; ``max_terms``: most terms in a mixture; ``fit_sequences``: size of the seeded synth
    sample the search fits and ranks on (None: all of synth); ``top_k``: candidates returned per head
    (the best by JSD plus the two best by IoU on the fit set); ``gates``: query-gated proposals per
    head; ``tables``: also fit ``mul(profile(..), key_weight(..))`` programs (a softmax over offset and
    key-token logits, with query-token temperature gates) over the ``key_weights`` most frequent
    tokens; ``library``: primitives to start from (default :func:`primitive_library`); ``spacy``: use spaCy
    features (POS, dependencies; default: when the spaCy model loads); ``cache``: a ``TensorCache`` for the
    primitives' (row-normalized, unmasked-to-BOS) score matrices, read and filled; ``stats``: a :class:`SearchStats` to fill.
    """
    with _single_thread_blas():
        return _search(store, heads, synth_idx, select_idx, beam, max_terms, seed, progress, cache, top_k,
                       fit_sequences, library, gates, tables, key_weights, spacy, stats)


def _search(store: AttentionStoreLike, heads: Any, synth_idx: Any, select_idx: Any, beam: int, max_terms: int,
            seed: int, progress: bool, cache: Any, top_k: int, fit_sequences: int | None,
            library: list[Program] | None, gates: int, tables: bool, key_weights: int, spacy: bool | None,
            stats: SearchStats | None) -> dict[tuple[int, int], list[Candidate]]:
    """The body of :func:`enumerative_search` (arguments as there)."""
    import time

    t_start = time.perf_counter()
    stats = stats if stats is not None else SearchStats()
    heads = [(int(h[0]), int(h[1])) for h in (heads if heads is not None else store.heads)]
    if not heads:
        raise ValueError("enumerative_search got no heads; pass heads=[(layer, head), ...] or None for all")
    if synth_idx is None or select_idx is None:
        d_synth, d_select = _default_splits(store, seed)
        synth_idx = d_synth if synth_idx is None else synth_idx
        select_idx = d_select if select_idx is None else select_idx
    synth_idx, select_idx = [int(i) for i in synth_idx], [int(i) for i in select_idx]
    if not synth_idx or not select_idx:
        raise ValueError("enumerative_search needs non-empty synth_idx and select_idx")
    overlap = set(synth_idx) & set(select_idx)
    if overlap:
        raise ValueError(f"synth and select share {len(overlap)} sequences; select must be held out from synth")
    if beam < 1 or max_terms < 1 or top_k < 1:
        raise ValueError(f"beam, max_terms and top_k must be >= 1; got {beam}, {max_terms}, {top_k}")
    causal = bool(store.causal)
    rng = np.random.default_rng(seed)

    synth_seqs = [store.sequences[i] for i in synth_idx]
    if spacy is None:
        spacy = _spacy_available()
    if library is None:
        library = primitive_library(synth_seqs, causal, spacy=spacy)
    library = list(dict.fromkeys(library))
    bad = [p for p in library if p.kind != "dsl" or not isinstance(p.node, dsl.Prim)]
    if bad:
        raise ValueError(f"library entries must be single DSL primitives; got {bad[0]!r}")
    preds = query_predicates(synth_seqs, spacy=spacy) if gates > 0 else []
    n_fit = len(synth_idx) if fit_sequences is None else max(1, min(int(fit_sequences), len(synth_idx)))
    fit_pos = np.sort(rng.permutation(len(synth_idx))[:n_fit])
    fit_split = _Split(store, [synth_idx[p] for p in fit_pos], _features_for(library, preds))
    stats.primitives, stats.fit_sequences = len(library), len(fit_split)

    # ---- stage 1: every primitive on every head, compact components, Gram statistics
    t0 = time.perf_counter()
    fs = _FitSet(fit_split, library, heads, preds, causal, progress, cache=cache)
    tot, groups = fs.stats()
    stats.seconds["primitives"] = time.perf_counter() - t0

    # ---- stages 2-3: compositions, ranked by JSD on the fit set (exact DSL semantics on compact cells)
    t0 = time.perf_counter()
    nodes = [p.node for p in library]
    sparse = _sparse_primitives(library)
    keys = np.asarray(sorted(_frequent_tokens(list(fit_split.seqs), key_weights, min_sequences=3)), dtype=np.int64) \
        if tables else None
    ranked: dict[tuple[int, int], list[tuple[Program, float, float]]] = {}
    bar = _progress(len(heads), "enumerative: compose", progress)
    for hi, head in enumerate(heads):
        props = _propose(fs, hi, tot, groups, nodes, sparse, beam, max_terms, gates, keys)
        stats.proposals += len(props)
        memo: dict = {}
        pats = np.stack([fs.pattern(node, memo) for node in props])
        del memo
        iou, jsd = fs.iou(pats, hi), fs.jsd(pats, hi)
        del pats
        by_jsd = sorted(range(len(props)), key=lambda k: (jsd[k], k))  # proposals come in a stable order
        by_iou = sorted(range(len(props)), key=lambda k: (-iou[k], k))
        n_iou = min(2, top_k - 1) if top_k > 1 else 0
        keep = list(dict.fromkeys(by_jsd[: top_k - n_iou] + by_iou[:n_iou]))
        for k in by_jsd:
            if len(keep) >= min(top_k, len(props)):
                break
            if k not in keep:
                keep.append(k)
        ranked[head] = [(Program.from_node(props[k]), float(iou[k]), float(jsd[k])) for k in keep]
        bar.update(1)
    bar.close()
    stats.seconds["compose"] = time.perf_counter() - t0
    del fs

    # ---- final: the kept candidates on select (the primitives they use, evaluated by the kernels there)
    t0 = time.perf_counter()
    used = _used_primitives([p.node for v in ranked.values() for p, _, _ in v], library)
    used_preds = _used_preds([p.node for v in ranked.values() for p, _, _ in v], preds)
    select_split = _Split(store, select_idx, _features_for(used, used_preds))
    fsel = _FitSet(select_split, used, heads, used_preds, causal, progress, score_singles=False,
                   desc="enumerative: select", cache=cache)
    sel: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    for hi, head in enumerate(heads):
        memo: dict = {}
        pats = np.stack([fsel.pattern(p.node, memo) for p, _, _ in ranked[head]])
        sel[head] = {"iou": fsel.iou(pats, hi), "jsd": fsel.jsd(pats, hi)}
    del fsel
    result: dict[tuple[int, int], list[Candidate]] = {}
    for head in heads:
        cands = []
        for k, (prog, iou_fit, jsd_fit) in enumerate(ranked[head]):
            scores = {"synth": {"iou": iou_fit, "jsd": jsd_fit},
                      "select": {"iou": float(sel[head]["iou"][k]), "jsd": float(sel[head]["jsd"][k])}}
            cands.append(Candidate(head, prog, SOURCE, _hypothesis(prog), scores))
        cands.sort(key=lambda c: (c.scores["synth"]["jsd"], c.program.text))
        result[head] = cands
    stats.seconds["select"] = time.perf_counter() - t0
    stats.seconds["total"] = time.perf_counter() - t_start
    return result
