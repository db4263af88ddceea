"""The enumerative searcher: every head of a model at once, deterministic for a seed, no LLM.

Three stages, all heads together: (1) a library of DSL primitives with parameter grids
(:mod:`.library`) is evaluated by the kernels on a seeded sample of the ``synth`` split (the fit set,
:mod:`.fitset`) and kept as compact visible cells; (2) per head, compositions are proposed from Gram
statistics (:mod:`.compose`: NNLS mixtures, query gates, fallbacks, sharpening, softmax tables from
:mod:`.tables`) with readable rounded weights; (3) every proposal is evaluated on the fit set by an exact
re-implementation of the DSL semantics on those cells, the ``top_k`` best by JSD (and the two best by IoU)
are kept and scored on ``select``. Choosing among candidates and reporting on ``test`` is the caller's job.
Figures: benchmarks/synthesis.py.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import dsl
from ...scored import ScoredProgram
from ...program import Program
from ..base import CandidateMap, PatternSource, StopCheck
from ...splits import StoreSplits
from .blas import single_thread_blas
from .compose import hypothesis, propose, sparse_primitives, used_preds, used_primitives
from .fitset import FitSet
from .library import frequent_tokens, primitive_library, query_predicates
from .moved import cell_keys, cell_norms, moved_gate_chains
from .small import BANDS, keep_per_band, propose_small, rendered_chars, vocabulary_of
from .split import SplitArrays, features_for
from .util import default_splits, progress_bar, spacy_available
from ....core import Head, InputError

SOURCE = "enumerative"


@dataclass
class SearchStats:
    """Counts and timings of one search (``enumerative_search(..., stats=SearchStats())`` fills it)."""

    primitives: int = 0
    fit_sequences: int = 0
    proposals: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def enumerative_search(
    store: PatternSource,
    heads: list[tuple[int, int]] | None = None,
    synth_idx: Sequence[int] | None = None,
    select_idx: Sequence[int] | None = None,
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
    budget: float | None = None,
    cancel: threading.Event | None = None,
    small: int = 4,
    moved_depth: int = 3,
) -> dict[tuple[int, int], list[ScoredProgram]]:
    """Search DSL programs for every head at once; ``{(layer, head): [ScoredProgram, ...]}``, best JSD first.

    ``synth_idx`` / ``select_idx``: store indices of the sequences to fit/rank on and to score for
    selection (default: a seeded 75/25 split of the store's documents). ``beam``: supports kept per
    mixture size; ``max_terms``: most terms in a mixture; ``fit_sequences``: size of the seeded synth
    sample the search fits and ranks on (None: all of synth); ``top_k``: candidates returned per head
    (the best by JSD plus the two best by IoU on the fit set); ``gates``: query-gated proposals per
    head; ``tables``: also fit ``mul(profile(..), key_weight(..))`` programs (a softmax over offset and
    key-token logits, with query-token temperature gates) over the ``key_weights`` most frequent
    tokens (causal models only: a profile scores no key ahead of the query); ``library``: primitives to
    start from (default :func:`primitive_library`); ``spacy``: use spaCy features (POS, dependencies;
    default: when the spaCy model loads); ``cache``: a ``TensorCache`` for the primitives' (row-normalized,
    unmasked-to-BOS) score matrices, read and filled; ``stats``: a :class:`SearchStats` to fill;
    ``budget`` (seconds) / ``cancel``: stop composing for further heads and return the heads finished;
    ``small``: per finite size budget (headsurgeon/synth/program.py ``BUDGETS``, characters rendered with token strings),
    the ``small`` best small compositions by JSD and ``small // 2`` by IoU are kept too (:mod:`.small`; 0: none);
    ``moved_depth``: with value norms in the store, each head also keeps its chains of up to that many query gates over
    ``first()``/induction mixtures fitted to what it moves (:mod:`.moved`; 0: none).
    """
    with single_thread_blas():
        return _search(store, heads, synth_idx, select_idx, beam, max_terms, seed, progress, cache, top_k,
                       fit_sequences, library, gates, tables, key_weights, spacy, stats, StopCheck(budget, cancel),
                       small, moved_depth)


def _search(store: PatternSource, heads: Any, synth_idx: Any, select_idx: Any, beam: int, max_terms: int,
            seed: int, progress: bool, cache: Any, top_k: int, fit_sequences: int | None,
            library: list[Program] | None, gates: int, tables: bool, key_weights: int, spacy: bool | None,
            stats: SearchStats | None, stop: StopCheck, small: int = 4,
            moved_depth: int = 3) -> dict[tuple[int, int], list[ScoredProgram]]:
    """The body of :func:`enumerative_search` (arguments as there)."""
    t_start = time.perf_counter()
    stats = stats if stats is not None else SearchStats()
    heads = [(int(h[0]), int(h[1])) for h in (heads if heads is not None else store.heads)]
    if not heads:
        raise InputError("enumerative_search got no heads; pass heads=[(layer, head), ...] or None for all")
    if synth_idx is None or select_idx is None:
        d_synth, d_select = default_splits(store, seed)
        synth_idx = d_synth if synth_idx is None else synth_idx
        select_idx = d_select if select_idx is None else select_idx
    synth_idx, select_idx = [int(i) for i in synth_idx], [int(i) for i in select_idx]
    if not synth_idx or not select_idx:
        raise InputError("enumerative_search needs non-empty synth_idx and select_idx")
    overlap = set(synth_idx) & set(select_idx)
    if overlap:
        raise InputError(f"synth and select share {len(overlap)} sequences; select must be held out from synth")
    if beam < 1 or max_terms < 1 or top_k < 1 or small < 0:
        raise InputError(f"beam, max_terms and top_k must be >= 1 and small >= 0; got {beam}, {max_terms}, {top_k}, "
                         f"{small}")
    causal = bool(store.causal)
    rng = np.random.default_rng(seed)

    synth_seqs = [store.sequences[i] for i in synth_idx]
    vocab = vocabulary_of(synth_seqs) if small else None
    if spacy is None:
        spacy = spacy_available()
    if library is None:
        library = primitive_library(synth_seqs, causal, spacy=spacy)
    library = list(dict.fromkeys(library))
    bad = [p for p in library if not p.has_tree or not isinstance(p.node, dsl.Prim)]
    if bad:
        raise InputError(f"library entries must be single DSL primitives; got {bad[0]!r}")
    preds = query_predicates(synth_seqs, spacy=spacy) if gates > 0 else []
    n_fit = len(synth_idx) if fit_sequences is None else max(1, min(int(fit_sequences), len(synth_idx)))
    fit_pos = np.sort(rng.permutation(len(synth_idx))[:n_fit])
    fit_split = SplitArrays(store, [synth_idx[p] for p in fit_pos], features_for(library, preds))
    stats.primitives, stats.fit_sequences = len(library), len(fit_split)

    # ---- stage 1: every primitive on every head, compact components, Gram statistics
    t0 = time.perf_counter()
    fs = FitSet(fit_split, library, heads, preds, causal, progress, cache=cache)
    tot, groups = fs.stats()
    stats.seconds["primitives"] = time.perf_counter() - t0

    # ---- stages 2-3: compositions, ranked by JSD on the fit set (exact DSL semantics on compact cells)
    t0 = time.perf_counter()
    nodes = [p.node for p in library]
    sparse = sparse_primitives(library)
    # the tables' profiles score only keys behind the query: fitted for causal models only
    keys = np.asarray(sorted(frequent_tokens(list(fit_split.seqs), key_weights, min_sequences=3)), dtype=np.int64) \
        if tables and causal else None
    ranked: dict[tuple[int, int], list[tuple[Program, float, float]]] = {}
    # with value norms in the store, induction mixtures fitted to what each head moves join its kept candidates
    moved = bool(getattr(store, "has_value_norms", False)) and moved_depth > 0
    fit_norms = store.norm_batch([synth_idx[p] for p in fit_pos], heads) if moved else None
    keys_of_cells = cell_keys(fs) if moved else None
    bar = progress_bar(len(heads), "enumerative: compose", progress)
    for hi, head in enumerate(heads):
        if stop():
            break
        props = propose(fs, hi, tot, groups, nodes, sparse, beam, max_terms, gates, keys)
        if small:
            props = list(dict.fromkeys(props + propose_small(fs, hi, tot, groups, nodes, sparse, gates + 1)))
        stats.proposals += len(props)
        iou, jsd = score_proposals(fs, hi, props)
        by_jsd = sorted(range(len(props)), key=lambda k: (jsd[k], k))  # proposals come in a stable order
        by_iou = sorted(range(len(props)), key=lambda k: (-iou[k], k))
        n_iou = min(2, top_k - 1) if top_k > 1 else 0
        keep = list(dict.fromkeys(by_jsd[: top_k - n_iou] + by_iou[:n_iou]))
        for k in by_jsd:
            if len(keep) >= min(top_k, len(props)):
                break
            if k not in keep:
                keep.append(k)
        if small:  # a proposal too big for every band is neither wrapped nor rendered (Program prints its text)
            top = max(BANDS)
            chars = [size if size > top else rendered_chars(Program.from_node(n), vocab, top)
                     for n, size in ((n, dsl.size(n)) for n in props)]
            keep = list(dict.fromkeys(keep + keep_per_band(chars, jsd, iou, small, max(1, small // 2))))
        ranked[head] = [(Program.from_node(props[k]), float(iou[k]), float(jsd[k])) for k in keep]
        if fit_norms is not None and keys_of_cells is not None:
            chains = [n for n in moved_gate_chains(fs, hi, cell_norms(keys_of_cells, fit_norms[hi]), moved_depth)
                      if Program.from_node(n).hash not in {p.hash for p, _, _ in ranked[head]}]
            if chains:
                c_iou, c_jsd = score_proposals(fs, hi, chains)
                ranked[head] += [(Program.from_node(n), float(a), float(b)) for n, a, b in zip(chains, c_iou, c_jsd)]
        bar.update(1)
    bar.close()
    heads = heads[: len(ranked)]  # the heads composed before a stop (all of them without one)
    stats.seconds["compose"] = time.perf_counter() - t0
    del fs
    if not heads:
        return {}

    # ---- final: the kept candidates on select (the primitives they use, evaluated by the kernels there)
    t0 = time.perf_counter()
    used = used_primitives([p.node for v in ranked.values() for p, _, _ in v], library)
    gate_preds = used_preds([p.node for v in ranked.values() for p, _, _ in v], preds)
    select_split = SplitArrays(store, select_idx, features_for(used, gate_preds))
    fsel = FitSet(select_split, used, heads, gate_preds, causal, progress, score_singles=False,
                   desc="enumerative: select", cache=cache)
    sel: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    for hi, head in enumerate(heads):
        memo: dict = {}
        iou, jsd = fsel.scores(fsel.patterns([p.node for p, _, _ in ranked[head]], memo), hi)
        sel[head] = {"iou": iou, "jsd": jsd}
    del fsel
    result: dict[tuple[int, int], list[ScoredProgram]] = {}
    for head in heads:
        cands = []
        for k, (prog, iou_fit, jsd_fit) in enumerate(ranked[head]):
            scores = {"synth": {"iou": iou_fit, "jsd": jsd_fit},
                      "select": {"iou": float(sel[head]["iou"][k]), "jsd": float(sel[head]["jsd"][k])}}
            cands.append(ScoredProgram(prog, SOURCE, scores, hypothesis(prog)))
        cands.sort(key=lambda c: (c.scores["synth"]["jsd"], c.program.text))
        result[head] = cands
    stats.seconds["select"] = time.perf_counter() - t0
    stats.seconds["total"] = time.perf_counter() - t_start
    return result



def score_proposals(fs: FitSet, hi: int, props: list, block: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """IoU and JSD on the fit set of every proposal for head ``hi``, ``block`` patterns at a time (one buffer)."""
    memo: dict = {}
    ious, jsds = [], []
    buf = np.empty((min(block, len(props)), fs.C), dtype=np.float32)
    for s in range(0, len(props), block):
        iou, jsd = fs.scores(fs.patterns(props[s: s + block], memo, buf), hi)
        ious.append(iou)
        jsds.append(jsd)
    del buf
    return np.concatenate(ious), np.concatenate(jsds)


class EnumerativeSearcher:
    """The enumerative search as a :class:`~headsurgeon.synth.search.base.Searcher`; ``options`` are
    :func:`enumerative_search`'s keyword arguments (``beam``, ``top_k``, ``library``, ``cache``, ``stats`` ...)."""

    name = SOURCE

    def __init__(self, *, seed: int = 0, **options: Any) -> None:
        self.seed = seed
        self.options = options

    def search(self, store: PatternSource, splits: StoreSplits, *, heads: Sequence[Head] | None = None,
               progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Candidates per head, best synth JSD first (see :func:`enumerative_search`)."""
        synth, select = splits.checked("the enumerative searcher")
        return enumerative_search(store, None if heads is None else list(heads), synth, select, seed=self.seed,
                                  progress=progress, budget=budget, cancel=cancel, **self.options)

    def report(self) -> str:
        """Nothing to add to the run's notes."""
        return ""
