"""Enumerative program search: every head of a model at once, no LLM (DESIGN sections 2-3, issue 5.1).

The search is deterministic for a seed and works in three stages, all heads together:

1. **Primitives.** A library of DSL primitives with parameter grids (``self``, ``first``, ``uniform``,
   ``prev(1..k)``, ``window(a, b)``, ``decay(r)``, ``same_token(_recent)``, ``induction``,
   ``recent(PRED)`` for flags and POS tags, ``sentence_start``, ``word_start``, ``same_word``,
   ``dep_head``, ``dep_children``, ``key_in_set`` over the split's frequent tokens and token classes)
   is evaluated on a seeded sample of the ``synth`` split (the *fit set*), chunk by chunk over sequences
   so that memory is bounded by one chunk, and scored against every head in one
   :func:`~headsurgeon.synth.metrics.score_many` call per chunk (heads x primitives x sequences).
   The same pass accumulates the Gram matrix of the row-normalized primitive patterns and their inner
   products with every head's real pattern, overall and within query groups (rows whose query token
   satisfies a predicate such as ``punct`` or ``pos=NOUN``).
2. **Compositions.** From those sufficient statistics, a beam search over supports fits non-negative
   mixture weights by least squares (NNLS on the row-normalized components against the real rows) for
   mixtures of up to ``max_terms`` primitives; per query predicate it fits one mixture for the rows
   whose query satisfies it and one for the others (``gate(PRED, A, B)``); it also proposes
   ``fallback(A, best)`` for sparse primitives A and ``sharpen(best, t)``. Weights are normalized to
   sum 1 and rounded to 2 decimals, so program text stays readable (``0.62*prev(1) + 0.38*first()``).
3. **Ranking and selection scores.** Every proposal is evaluated as a real DSL program (the kernels,
   exactly what replaces the head later) on the fit set and ranked by JSD; the ``top_k`` best per
   head get IoU and JSD on the whole ``synth`` split and on ``select``.

The result maps ``(layer, head)`` to a list of :class:`~headsurgeon.synth.candidate.Candidate`
(``source="enumerative"``) ordered by JSD on ``synth`` (best first), each with
``scores = {"synth": {"iou", "jsd"}, "select": {"iou", "jsd"}}``. Choosing among candidates (by IoU on
``select``) and reporting (on ``test``) is the caller's job; the searcher never sees ``test``.

The store is duck-typed (synth must not import surgery): it needs ``.sequences`` (list of
:class:`~headsurgeon.synth.sequence.Sequence`), ``.causal``, ``.heads`` and
``.batch(indices, heads) -> (patterns [H, B, N, N], lengths [B])``, as
``headsurgeon.surgery.store.AttentionStore`` has.
"""
from __future__ import annotations

import math
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


# ============================================================================ the library

def _frequent_tokens(seqs: list[Sequence], count: int, skip_first: bool = True) -> list[int]:
    """The ``count`` most frequent token ids of the sequences (BOS excluded), ties by id."""
    c: Counter[int] = Counter()
    for s in seqs:
        ids = s.ids[1:] if (skip_first and s.has_bos) else s.ids
        c.update(int(t) for t in ids)
    return [t for t, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


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

    def patterns(self, programs: list[Program], pos: np.ndarray, causal: bool, cache: Any) -> np.ndarray:
        """Program patterns [P, Bc, Nc, Nc] float32 of a chunk (through ``cache`` when given)."""
        ids, lens, feats = self.arrays(pos)
        if cache is not None:
            from .tensors import program_tensors

            return program_tensors(programs, [self.seqs[p] for p in pos], causal, cache)
        width = ids.shape[1]
        out = np.empty((len(programs), len(pos), width, width), dtype=np.float32)
        for k, prog in enumerate(programs):
            prog.evaluate_arrays(ids, lens, feats, causal, out=out[k])
        return out

    def components(self, programs: list[Program], pos: np.ndarray, causal: bool) -> np.ndarray:
        """Row-normalized raw scores [P, Bc, Nc, Nc] of a chunk: empty rows stay empty (as inside a mix)."""
        ids, lens, feats = self.arrays(pos)
        width = ids.shape[1]
        out = np.empty((len(programs), len(pos), width, width), dtype=np.float32)
        for k, prog in enumerate(programs):
            prog.evaluate_arrays(ids, lens, feats, causal, normalize=False, out=out[k])
            K.row_normalize(out[k])
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
    fit_sequences: int = 96,
    library: list[Program] | None = None,
    gates: int = 3,
    spacy: bool | None = None,
    stats: SearchStats | None = None,
) -> dict[tuple[int, int], list[Candidate]]:
    """Search DSL programs for every head at once; ``{(layer, head): [Candidate, ...]}`` best JSD first.

    ``synth_idx`` / ``select_idx``: store indices of the sequences to fit/rank on and to score for
    selection (default: a seeded 75/25 split of the store's documents). ``beam``: supports kept per
    mixture size; ``max_terms``: most terms in a mixture; ``fit_sequences``: size of the seeded synth
    sample the search fits and ranks on; ``top_k``: candidates returned per head (scored on all of
    ``synth`` and on ``select``); ``gates``: query-gated proposals per head; ``library``: primitives to
    start from (default :func:`primitive_library`); ``spacy``: use spaCy features (POS, dependencies;
    default: when the spaCy model loads); ``cache``: a ``TensorCache`` for program patterns.
    """
    import time

    t_start = time.perf_counter()
    stats = stats if stats is not None else SearchStats()
    heads = [tuple(map(int, h)) for h in (heads if heads is not None else store.heads)]
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
    causal = bool(store.causal)
    rng = np.random.default_rng(seed)

    synth_seqs = [store.sequences[i] for i in synth_idx]
    if spacy is None:
        spacy = _spacy_available()
    if library is None:
        library = primitive_library(synth_seqs, causal, spacy=spacy)
    library = list(dict.fromkeys(library))
    preds = query_predicates(synth_seqs, spacy=spacy) if gates > 0 else []
    need = _features_for(library, preds)

    fit_pos = np.sort(rng.permutation(len(synth_idx))[: max(1, min(fit_sequences, len(synth_idx)))])
    fit_split = _Split(store, [synth_idx[p] for p in fit_pos], need)
    stats.primitives, stats.fit_sequences = len(library), len(fit_split)
    H, P = len(heads), len(library)
    width = int(fit_split.lengths.max())

    # ---- stage 1: every primitive on every head; Gram statistics overall and per query group
    t0 = time.perf_counter()
    iou_sum = np.zeros((H, P))
    jsd_sum = np.zeros((H, P))
    tot = _Stats(np.zeros((P, P)), np.zeros((H, P)), np.zeros(H))
    groups = [_Stats(np.zeros((P, P)), np.zeros((H, P)), np.zeros(H)) for _ in preds]
    chunks = fit_split.chunks(_chunk_size(P + H, width, 64))
    bar = _progress(len(chunks), "enumerative: primitives", progress)
    for pos in chunks:
        real, lens = fit_split.real(pos, heads)
        cand = fit_split.components(library, pos, causal)  # rows sum to 1 or are empty
        ids_c, _, feats_c = fit_split.arrays(pos)
        inside = np.arange(cand.shape[2])[None, :] < lens[:, None]  # [Bc, Nc] real query rows
        X = cand.reshape(P, -1)
        Rl = real.reshape(H, -1)
        tot.G += (X @ X.T).astype(np.float64)
        tot.R += (Rl @ X.T).astype(np.float64)
        tot.pp += np.einsum("hk,hk->h", Rl, Rl, dtype=np.float64)
        for g, pred in enumerate(preds):
            m = _pred_mask(pred, ids_c, feats_c) & inside
            if not m.any():
                continue
            Xg = np.ascontiguousarray(cand[:, m, :]).reshape(P, -1)
            Rg = np.ascontiguousarray(real[:, m, :]).reshape(H, -1)
            groups[g].G += (Xg @ Xg.T).astype(np.float64)
            groups[g].R += (Rg @ Xg.T).astype(np.float64)
            groups[g].pp += np.einsum("hk,hk->h", Rg, Rg, dtype=np.float64)
        # as standalone programs, empty rows attend to position 0 (the normalization rule)
        empty = (cand.sum(axis=3) <= 0) & inside[None]
        cand[..., 0] += empty
        sc = score_many(real, cand, lens, causal, ("iou", "jsd"), per_sequence=True)
        iou_sum += sc["iou"].sum(axis=2)
        jsd_sum += sc["jsd"].sum(axis=2)
        del cand, real, X, Rl
        bar.update(1)
    bar.close()
    n_fit = len(fit_split)
    prim_iou, prim_jsd = iou_sum / n_fit, jsd_sum / n_fit
    stats.seconds["primitives"] = time.perf_counter() - t0

    # ---- stage 2: compositions from the statistics
    t0 = time.perf_counter()
    nodes = [p.node for p in library]
    allowed = np.ones(P, dtype=bool)
    expand = max(2 * beam, 4)
    proposals: dict[tuple[int, int], list[Program]] = {}
    sparse = _sparse_primitives(library)
    for hi, head in enumerate(heads):
        props: list[Program] = []
        for p in np.argsort(prim_jsd[hi], kind="stable")[:3]:
            props.append(library[int(p)])
        for p in np.argsort(-prim_iou[hi], kind="stable")[:2]:
            props.append(library[int(p)])
        mixes = _beam_mixtures(tot, hi, allowed, beam, max_terms, expand)
        best_node = None
        by_size: dict[int, int] = {}
        for loss, sup, w in mixes:
            if by_size.get(len(sup), 0) >= 2:
                continue
            node = _mix_node([(float(x), nodes[j]) for x, j in zip(w, sup)])
            if node is None:
                continue
            by_size[len(sup)] = by_size.get(len(sup), 0) + 1
            props.append(Program.from_node(node))
            if best_node is None:
                best_node = node
        if gates > 0 and preds:
            gated = []
            for g, pred in enumerate(preds):
                inn, out = groups[g], tot - groups[g]
                if inn.pp[hi] <= 0 or out.pp[hi] <= 0:
                    continue
                a = _beam_mixtures(inn, hi, allowed, 2, max_terms, 4)
                b = _beam_mixtures(out, hi, allowed, 2, max_terms, 4)
                if not a or not b:
                    continue
                gated.append((a[0][0] + b[0][0], g, a[0], b[0]))
            gated.sort(key=lambda x: (x[0], x[1]))
            for _loss, g, a, b in gated[:gates]:
                na = _mix_node([(float(x), nodes[j]) for x, j in zip(a[2], a[1])])
                nb = _mix_node([(float(x), nodes[j]) for x, j in zip(b[2], b[1])])
                if na is not None and nb is not None and na != nb:
                    props.append(Program.from_node(dsl.Gate(preds[g], na, nb)))
        if best_node is not None:
            for p in sorted(sparse, key=lambda j: prim_jsd[hi, j])[:2]:
                props.append(Program.from_node(dsl.Fallback((nodes[p], best_node))))
            for t in (0.5, 2.0):
                props.append(Program.from_node(dsl.Sharpen(best_node, t)))
        proposals[head] = list(dict.fromkeys(props))
    stats.proposals = sum(len(v) for v in proposals.values())
    stats.seconds["compose"] = time.perf_counter() - t0

    # ---- stage 3: rank every proposal by JSD on the fit set, then score the best on synth and select
    t0 = time.perf_counter()
    fit_scores = _score_per_head(fit_split, heads, proposals, causal, cache, progress, "enumerative: rank")
    ranked: dict[tuple[int, int], list[Program]] = {}
    for head in heads:
        progs = proposals[head]
        jsd = fit_scores[head]["jsd"]
        order = sorted(range(len(progs)), key=lambda k: (jsd[k], progs[k].text))
        ranked[head] = [progs[k] for k in order[:top_k]]
    stats.seconds["rank"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if len(fit_split) == len(synth_idx):
        synth_split = fit_split
    else:
        synth_split = _Split(store, synth_idx, _features_for([p for v in ranked.values() for p in v], []))
    select_split = _Split(store, select_idx, _features_for([p for v in ranked.values() for p in v], []))
    synth_scores = _score_per_head(synth_split, heads, ranked, causal, cache, progress, "enumerative: synth")
    select_scores = _score_per_head(select_split, heads, ranked, causal, cache, progress, "enumerative: select")
    result: dict[tuple[int, int], list[Candidate]] = {}
    for head in heads:
        cands = []
        for k, prog in enumerate(ranked[head]):
            scores = {
                "synth": {"iou": float(synth_scores[head]["iou"][k]), "jsd": float(synth_scores[head]["jsd"][k])},
                "select": {"iou": float(select_scores[head]["iou"][k]), "jsd": float(select_scores[head]["jsd"][k])},
            }
            cands.append(Candidate(head, prog, SOURCE, _hypothesis(prog), scores))
        cands.sort(key=lambda c: (c.scores["synth"]["jsd"], c.program.text))
        result[head] = cands
    stats.seconds["score"] = time.perf_counter() - t0
    stats.seconds["total"] = time.perf_counter() - t_start
    return result


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
    out = []
    for k, p in enumerate(library):
        node = p.node
        if isinstance(node, dsl.Prim) and node.name not in dense:
            out.append(k)
    return out


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


def _score_per_head(split: _Split, heads: list[tuple[int, int]], programs: dict[tuple[int, int], list[Program]],
                    causal: bool, cache: Any, progress: bool, desc: str) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """IoU and JSD (means over the split's sequences) of each head's own programs."""
    width = int(split.lengths.max())
    most = max(len(v) for v in programs.values())
    chunks = split.chunks(_chunk_size(most + len(heads), width, 64))
    sums = {h: {"iou": np.zeros(len(programs[h])), "jsd": np.zeros(len(programs[h]))} for h in heads}
    bar = _progress(len(chunks) * len(heads), desc, progress)
    for pos in chunks:
        real, lens = split.real(pos, heads)
        for hi, head in enumerate(heads):
            progs = programs[head]
            if progs:
                cand = split.patterns(progs, pos, causal, cache)
                sc = score_many(real[hi: hi + 1], cand, lens, causal, ("iou", "jsd"), per_sequence=True)
                sums[head]["iou"] += sc["iou"][0].sum(axis=1)
                sums[head]["jsd"] += sc["jsd"][0].sum(axis=1)
            bar.update(1)
    bar.close()
    n = len(split)
    return {h: {k: v / n for k, v in d.items()} for h, d in sums.items()}
