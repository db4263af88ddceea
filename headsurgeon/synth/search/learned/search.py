"""The learned searcher: per head, fit categorical predicates over Sequence features (:mod:`.fit`), decompile them
into DSL programs (:mod:`.head`), and score the candidates with the kernels on ``synth`` and ``select``.

Candidates per head: the single mixture, the query-gated mixture, each match term alone, and the pruned programs
of :mod:`.prune` (the heaviest one to three terms), so that candidates span the size budgets.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ...scored import ScoredProgram
from ...features import SPACY_FEATURES
from ...metrics import score_many
from ...tensors import program_patterns
from ...program import Program
from ...sequence import Sequence as TokenSequence, pad_ids
from ..base import CandidateMap, PatternSource, StopCheck
from ...splits import StoreSplits
from .config import ARRAY_FEATURES, LearnedConfig
from .fit import fit_head
from .model import make_data
from .prune import pruned_heads
from .rows import positional_specs
from .space import FeatureSpace, feature_arrays
from ....core import Head, InputError

SOURCE = "learned"


def _token_names(sequences: list[TokenSequence]) -> dict[int, str]:
    """The first token string seen for each token id."""
    names: dict[int, str] = {}
    for s in sequences:
        for i, t in zip(s.ids.tolist(), s.tokens):
            names.setdefault(int(i), t)
    return names


def _read_patterns(store: PatternSource, indices: list[int], heads: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``store.batch`` as float16 when the store supports a dtype (halves the memory), else as given."""
    batch: Callable[..., tuple[np.ndarray, np.ndarray]] = store.batch  # dtype= is optional (base.py PatternSource)
    try:
        return batch(indices, heads, dtype=np.float16)
    except TypeError:
        return batch(indices, heads)


def _score_chunk(store: PatternSource, heads: list[tuple[int, int]], programs: list[list[Program]], indices: list[int],
                 names: tuple[str, ...], chunk: int = 64) -> list[list[dict[str, float]]]:
    """IoU and JSD of each head's programs against that head over ``indices`` (kernel evaluation)."""
    tot = [np.zeros((2, len(p))) for p in programs]
    for start in range(0, len(indices), chunk):
        idx = indices[start: start + chunk]
        seqs = [store.sequences[i] for i in idx]
        real, lengths = _read_patterns(store, idx, heads)
        feats = feature_arrays(seqs, [n for n in names if n in ARRAY_FEATURES])
        for h in range(len(heads)):
            cand = [program_patterns(p, seqs, store.causal, feats) for p in programs[h]]  # sparse where it can
            got = score_many(real[h: h + 1], cand, lengths, store.causal, ("iou", "jsd"))
            tot[h][0] += got["iou"][0] * len(idx)
            tot[h][1] += got["jsd"][0] * len(idx)
    return [[{"iou": float(t[0, p] / len(indices)), "jsd": float(t[1, p] / len(indices))}
             for p in range(t.shape[1])] for t in tot]


def _spread(indices: list[int], k: int) -> list[int]:
    """At most ``k`` of ``indices``, evenly spaced (deterministic)."""
    if len(indices) <= k:
        return list(indices)
    pick = np.linspace(0, len(indices) - 1, k).round().astype(int)
    return [indices[i] for i in pick]


def learned_search(store: PatternSource, heads: Sequence[tuple[int, int]] | None = None, synth_idx: Sequence[int] | None = None,
                   select_idx: Sequence[int] | None = None, seed: int = 0, progress: bool = True,
                   steps: int | None = None, features: Sequence[str] | None = None,
                   config: LearnedConfig | None = None, threads: int | None = 1, head_chunk: int = 8,
                   return_models: bool = False, budget: float | None = None,
                   cancel: threading.Event | None = None) -> dict[tuple[int, int], list[ScoredProgram]]:
    """Fit a learned categorical-predicate program per head; candidates scored on ``synth`` and ``select``.

    ``store`` needs ``.sequences``, ``.causal``, ``.heads`` and ``.batch(indices, heads) -> ([H,B,N,N],
    lengths)``. ``synth_idx`` (default: every sequence) fits, ``select_idx`` (optional) is only scored.
    ``features`` (default :data:`DEFAULT_FEATURES`; add ``"pos"`` for spaCy tags) and ``steps`` override
    ``config``. Per head the candidates are the full mixture and each match term alone, with IoU and JSD
    (kernel evaluation, :func:`headsurgeon.synth.metrics.score_many`) under ``scores["synth"]`` and
    ``scores["select"]``. Deterministic for a ``seed`` (each head's fit depends only on the seed, the
    head and the synth data); torch runs on ``threads`` threads (restored afterwards); patterns are read
    ``head_chunk`` heads at a time. With ``return_models`` each head maps to ``(candidates, [LearnedHead,
    ...])`` (the single mixture, then the query-gated one). ``budget`` (seconds) / ``cancel``: no further chunk of
    heads starts once passed / set; the heads finished are returned.
    """
    cfg = config or LearnedConfig()
    if steps is not None:
        cfg = replace(cfg, steps=int(steps))
    if features is not None:
        cfg = replace(cfg, features=tuple(features))
    heads = [(int(h[0]), int(h[1])) for h in (store.heads if heads is None else heads)]
    synth_idx = list(range(len(store.sequences)) if synth_idx is None else synth_idx)
    select_idx = list(select_idx or [])
    if not synth_idx:
        raise InputError("learned_search needs synth sequences to fit on; pass synth_idx=[...]")
    if set(synth_idx) & set(select_idx):
        raise InputError("synth_idx and select_idx share sequences; fit and select on disjoint splits")
    old_threads = torch.get_num_threads()
    try:
        return _search(store, heads, synth_idx, select_idx, seed, progress, cfg, threads, head_chunk, return_models,
                       StopCheck(budget, cancel))
    finally:
        torch.set_num_threads(old_threads)


def _search(store: PatternSource, heads: list[tuple[int, int]], synth_idx: list[int], select_idx: list[int], seed: int,
            progress: bool, cfg: LearnedConfig, threads: int | None, head_chunk: int,
            return_models: bool, stop: StopCheck) -> dict[tuple[int, int], Any]:
    """The body of :func:`learned_search` (which restores torch's thread count afterwards)."""
    if threads:
        torch.set_num_threads(int(threads))
    causal = bool(store.causal)
    fit_idx = _spread(synth_idx, cfg.max_synth)
    names = tuple(dict.fromkeys(cfg.features))
    fit_seqs = [store.sequences[i] for i in fit_idx]
    if any(n in SPACY_FEATURES for n in names):  # one spaCy pass over every sequence that will be read
        feature_arrays([store.sequences[i] for i in synth_idx + select_idx], [n for n in names if n in SPACY_FEATURES])
    _, fit_lengths = pad_ids(fit_seqs)
    fit_arrays = feature_arrays(fit_seqs, tuple(dict.fromkeys(names + cfg.query_gate)))
    space = FeatureSpace.fit(fit_arrays, fit_lengths, names, cfg.top_tokens, cfg.max_values)
    data = make_data(space, fit_arrays, fit_lengths, positional_specs(cfg, causal), causal, cfg.query_gate)
    tokens = _token_names(fit_seqs)

    out: dict[tuple[int, int], Any] = {}
    bar = tqdm(total=len(heads), desc="learned", unit="head", disable=not progress)
    try:
        for c0 in range(0, len(heads), max(1, head_chunk)):
            if stop():
                break
            chunk = heads[c0: c0 + max(1, head_chunk)]
            real, _ = _read_patterns(store, fit_idx, chunk)
            models = []
            for h, head in enumerate(chunk):
                head_seed = (int(seed) * 1_000_003 + head[0] * 10_007 + head[1]) % (1 << 62)
                models.append(fit_head(real[h], data, space, cfg, seed=head_seed))
                bar.update(1)
            del real
            programs, hypotheses = [], []
            for fits in models:  # per head: each fitted model's program, then each match term alone
                progs: dict[str, tuple[Program, str]] = {}
                for m in fits:
                    progs.setdefault(m.program.hash, (m.program, m.hypothesis(tokens)))
                for m in fits:
                    for p in m.match_programs():
                        progs.setdefault(p.hash, (p, "match term alone: " + _first_line(p.text)))
                for m in fits:  # small programs for the size budgets: the heaviest few terms
                    for small in pruned_heads(m):
                        progs.setdefault(small.program.hash, (small.program, "pruned: " + small.hypothesis(tokens)))
                programs.append([p for p, _ in progs.values()])
                hypotheses.append([h for _, h in progs.values()])
            scores = {"synth": _score_chunk(store, chunk, programs, synth_idx, names)}
            if select_idx:
                scores["select"] = _score_chunk(store, chunk, programs, select_idx, names)
            for h, (head, fits) in enumerate(zip(chunk, models)):
                cands = [ScoredProgram(prog, SOURCE, {s: v[h][p_i] for s, v in scores.items()},
                                       hypotheses[h][p_i])
                         for p_i, prog in enumerate(programs[h])]
                out[head] = (cands, fits) if return_models else cands
            if progress and select_idx:
                best = [max(c.scores["select"]["iou"] for c in (v[0] if return_models else v)) for v in out.values()]
                bar.set_postfix(mean_select_iou=f"{np.mean(best):.3f}")
    finally:
        bar.close()
    return out


def _first_line(text: str, width: int = 120) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= width else text[: width - 3] + "..."



class LearnedSearcher:
    """The learned search as a :class:`~headsurgeon.synth.search.base.Searcher`; ``options`` are
    :func:`learned_search`'s keyword arguments (``config``, ``steps``, ``features``, ``threads`` ...)."""

    name = SOURCE

    def __init__(self, *, seed: int = 0, **options: Any) -> None:
        if options.get("return_models"):
            raise InputError("a LearnedSearcher returns candidates only; call learned_search(return_models=True)")
        self.seed = seed
        self.options = options

    def search(self, store: PatternSource, splits: StoreSplits, *, heads: Sequence[Head] | None = None,
               progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Candidates per head scored on synth and select (see :func:`learned_search`)."""
        synth, select = splits.checked("the learned searcher")
        found = learned_search(store, heads, synth, select, seed=self.seed, progress=progress, budget=budget,
                               cancel=cancel, **self.options)
        return {Head(*h): cands for h, cands in found.items()}

    def report(self) -> str:
        """Nothing to add to the run's notes."""
        return ""
