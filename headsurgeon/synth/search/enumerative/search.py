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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import dsl
from ....kernels.cache import TensorCache
from ...scored import ScoredProgram
from ...program import Program
from ..base import CandidateMap, PatternSource, StopCheck
from ...splits import StoreSplits
from .blas import single_thread_blas
from .config import EnumerativeConfig
from .compose import fallback_rules, hypothesis, propose, used_preds, used_primitives
from .fitset import FitSet
from .former import is_current, read_former
from .library import frequent_tokens, primitive_library, query_predicates
from .moved import NormSource, cell_keys, cell_norms, moved_gate_chains
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
    splits: StoreSplits | Mapping[str, Sequence[int]] | Any = None,
    config: EnumerativeConfig | None = None,
    *former: Any,
    heads: Sequence[Head] | None = None,
    progress: bool = True,
    cache: TensorCache | None = None,
    stats: SearchStats | None = None,
    budget: float | None = None,
    cancel: threading.Event | None = None,
    **former_keywords: Any,
) -> CandidateMap:
    """Search DSL programs for every head at once; ``{(layer, head): [ScoredProgram, ...]}``, best JSD first.

    ``splits``: fits and ranks on ``splits.synth``, scores on ``splits.select`` (a :class:`StoreSplits`, a corpus
    ``Splits`` or a mapping of split name to store indices; None: a seeded 75/25 split of the store's documents).
    ``config``: what is fitted and kept (:class:`EnumerativeConfig`; default its defaults). ``heads``: default
    every head of the store. ``cache``: a ``TensorCache`` for the primitives' (row-normalized, unmasked-to-BOS)
    score matrices, read and filled; ``stats``: a :class:`SearchStats` to fill; ``budget`` (seconds) / ``cancel``:
    stop composing for further heads and return the heads finished. The former form, ``(store, heads, synth_idx,
    select_idx, beam, ..., top_k=..., spacy=...)``, still works for one release with a DeprecationWarning
    (headsurgeon/synth/search/enumerative/former.py).
    """
    if former or former_keywords or not is_current(splits, config):
        splits, config, plumbing = read_former(store, (splits, config, *former), former_keywords)
        heads, progress, cache = (plumbing.get("heads", heads), plumbing.get("progress", progress),
                                  plumbing.get("cache", cache))
    cfg = config or EnumerativeConfig()
    chosen = StoreSplits(*default_splits(store, cfg.seed)) if splits is None else StoreSplits.of(splits)
    with single_thread_blas():
        return _search(store, heads, chosen, cfg, progress, cache, stats if stats is not None else SearchStats(),
                       StopCheck(budget, cancel))


def _search(store: PatternSource, wanted: Sequence[Head] | None, splits: StoreSplits, cfg: EnumerativeConfig,
            progress: bool, cache: TensorCache | None, stats: SearchStats, stop: StopCheck) -> CandidateMap:
    """The body of :func:`enumerative_search` (arguments as there)."""
    t_start = time.perf_counter()
    heads = [Head(int(h[0]), int(h[1])) for h in (wanted if wanted is not None else store.heads)]
    if not heads:
        raise InputError("enumerative_search got no heads; pass heads=[(layer, head), ...] or None for all")
    synth_idx, select_idx = splits.checked("enumerative_search")
    causal = bool(store.causal)
    rng = np.random.default_rng(cfg.seed)

    synth_seqs = [store.sequences[i] for i in synth_idx]
    vocab = vocabulary_of(synth_seqs) if cfg.small else None
    spacy = spacy_available() if cfg.spacy is None else cfg.spacy
    library = list(dict.fromkeys(primitive_library(synth_seqs, causal, spacy=spacy) if cfg.library is None
                                 else cfg.library))
    bad = [p for p in library if not p.has_tree or not isinstance(p.node, dsl.Prim)]
    if bad:
        raise InputError(f"library entries must be single DSL primitives; got {bad[0]!r}")
    preds = query_predicates(synth_seqs, spacy=spacy) if cfg.gates > 0 else []
    n_fit = len(synth_idx) if cfg.fit_sequences is None else max(1, min(int(cfg.fit_sequences), len(synth_idx)))
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
    sparse = fallback_rules(fs, library)
    # the tables' profiles score only keys behind the query: fitted for causal models only
    keys = np.asarray(sorted(frequent_tokens(list(fit_split.seqs), cfg.key_weights, min_sequences=3)),
                      dtype=np.int64) if cfg.tables and causal else None
    ranked: dict[Head, list[tuple[Program, float, float]]] = {}
    # with value norms in the store, induction mixtures fitted to what each head moves join its kept candidates
    norms = store if isinstance(store, NormSource) and store.has_value_norms and cfg.moved_depth > 0 else None
    fit_norms = norms.norm_batch([synth_idx[p] for p in fit_pos], heads) if norms is not None else None
    keys_of_cells = cell_keys(fs) if norms is not None else None
    bar = progress_bar(len(heads), "enumerative: compose", progress)
    for hi, head in enumerate(heads):
        if stop():
            break
        props = propose(fs, hi, tot, groups, nodes, sparse, cfg.beam, cfg.max_terms, cfg.gates, keys)
        if cfg.small:
            props = list(dict.fromkeys(props + propose_small(fs, hi, tot, groups, nodes, sparse, cfg.gates + 1)))
        stats.proposals += len(props)
        iou, jsd = score_proposals(fs, hi, props)
        by_jsd = sorted(range(len(props)), key=lambda k: (jsd[k], k))  # proposals come in a stable order
        by_iou = sorted(range(len(props)), key=lambda k: (-iou[k], k))
        n_iou = min(2, cfg.top_k - 1) if cfg.top_k > 1 else 0
        keep = list(dict.fromkeys(by_jsd[: cfg.top_k - n_iou] + by_iou[:n_iou]))
        for k in by_jsd:
            if len(keep) >= min(cfg.top_k, len(props)):
                break
            if k not in keep:
                keep.append(k)
        if cfg.small:  # a proposal too big for every band is neither wrapped nor rendered (Program prints its text)
            top = max(BANDS)
            chars = [size if size > top else rendered_chars(Program.from_node(n), vocab, top)
                     for n, size in ((n, dsl.size(n)) for n in props)]
            keep = list(dict.fromkeys(keep + keep_per_band(chars, jsd, iou, cfg.small, max(1, cfg.small // 2))))
        ranked[head] = [(Program.from_node(props[k]), float(iou[k]), float(jsd[k])) for k in keep]
        if fit_norms is not None and keys_of_cells is not None:
            chains = [n for n in moved_gate_chains(fs, hi, cell_norms(keys_of_cells, fit_norms[hi]),
                                                        cfg.moved_depth)
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
    sel: dict[Head, dict[str, np.ndarray]] = {}
    for hi, head in enumerate(heads):
        memo: dict = {}
        iou, jsd = fsel.scores(fsel.patterns([p.node for p, _, _ in ranked[head]], memo), hi)
        sel[head] = {"iou": iou, "jsd": jsd}
    del fsel
    result: CandidateMap = {}
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
    """The enumerative search as a :class:`~headsurgeon.synth.search.base.Searcher`: ``config`` its settings,
    ``cache`` / ``stats`` as :func:`enumerative_search` takes them."""

    name = SOURCE

    def __init__(self, config: EnumerativeConfig | None = None, *, cache: TensorCache | None = None,
                 stats: SearchStats | None = None) -> None:
        self.config = config or EnumerativeConfig()
        self.cache = cache
        self.stats = stats

    def search(self, store: PatternSource, splits: StoreSplits, *, heads: Sequence[Head] | None = None,
               progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Candidates per head, best synth JSD first (see :func:`enumerative_search`)."""
        return enumerative_search(store, splits, self.config, heads=heads, progress=progress, cache=self.cache,
                                  stats=self.stats, budget=budget, cancel=cancel)

    def report(self) -> str:
        """Nothing to add to the run's notes."""
        return ""
