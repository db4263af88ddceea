"""One selection over all sources: every searcher's candidates (plus a user library and baselines) compete
per head by soft IoU on ``select``; the winner is reported on ``test`` (never on the sequences it was chosen on).
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from tqdm.auto import tqdm

from ..kernels.cache import TensorCache
from .candidate import Candidate
from .metrics import score_many
from .program import Program
from .programset import ProgramSet
from .tensors import program_tensors

BASELINES = ("first()", "self()", "prev(1)", "uniform()")


def score_programs(store: Any, heads: list[tuple[int, int]], programs: list[Program], indices: list[int],
                   cache: TensorCache | None = None, chunk: int = 64) -> dict[str, np.ndarray]:
    """IoU / JSD / top-q IoU of every head × program over store sequences ``indices`` → arrays [H, P]."""
    if not indices:
        raise ValueError("cannot score on an empty split")
    totals = {m: np.zeros((len(heads), len(programs))) for m in ("iou", "jsd", "topq")}
    seqs = [store.sequences[i] for i in indices]
    for start in range(0, len(indices), chunk):
        idx = indices[start: start + chunk]
        real, lengths = store.batch(idx, heads)
        cand = program_tensors(programs, seqs[start: start + chunk], causal=store.causal, cache=cache)
        got = score_many(real, cand, lengths, store.causal)
        for m in totals:
            totals[m] += got[m] * len(idx)
    return {m: v / len(indices) for m, v in totals.items()}


def select_programs(store: Any, candidates: dict[tuple[int, int], list[Candidate]], select_idx: list[int],
                    test_idx: list[int], synth_idx: list[int] | None = None,
                    library: Iterable[Program | str] = (), baselines: bool = True,
                    cache: TensorCache | None = None, progress: bool = True, model: str = "") -> ProgramSet:
    """Pick per head the candidate with the best IoU on ``select`` (ties: lower JSD) and score it on ``test``.

    ``library`` programs (and, with ``baselines``, a few templates) compete for every head.
    """
    if set(select_idx) & set(test_idx):
        raise ValueError("select and test share sequences; selection and reporting must use disjoint splits")
    cache = cache if cache is not None else TensorCache(max_bytes=512 << 20)
    heads = sorted(set(candidates) | set(getattr(store, "heads", [])))
    extra = [p if isinstance(p, Program) else Program.parse(p) for p in library]
    extra_src = ["library"] * len(extra)
    if baselines:
        extra += [Program.parse(t) for t in BASELINES]
        extra_src += ["baseline"] * len(BASELINES)
    pool: dict[tuple[int, int], list[Candidate]] = {}
    for h in heads:
        mine = list(candidates.get(h, []))
        seen = {c.program.hash for c in mine}
        for p, src in zip(extra, extra_src):
            if p.hash not in seen:
                mine.append(Candidate(h, p, src))
                seen.add(p.hash)
        pool[h] = mine
    # score every distinct program once against all heads that consider it (select split)
    programs = list({c.program.hash: c.program for cs in pool.values() for c in cs}.values())
    column = {p.hash: i for i, p in enumerate(programs)}
    sel = {m: np.full((len(heads), len(programs)), np.nan) for m in ("iou", "jsd", "topq")}
    step = 32
    for start in tqdm(range(0, len(programs), step), desc="select", disable=not progress):
        block = programs[start: start + step]
        got = score_programs(store, heads, block, select_idx, cache)
        for m in sel:
            sel[m][:, start: start + len(block)] = got[m]
    result = ProgramSet(model=model, meta={"selected_on": "select", "reported_on": "test",
                                           "n_select": len(select_idx), "n_test": len(test_idx)})
    winners: dict[tuple[int, int], Candidate] = {}
    for r, h in enumerate(heads):
        best = None
        for c in pool[h]:
            col = column[c.program.hash]
            c.scores.setdefault("select", {}).update(iou=float(sel["iou"][r, col]), jsd=float(sel["jsd"][r, col]),
                                                     topq=float(sel["topq"][r, col]))
            key = (c.scores["select"]["iou"], -c.scores["select"]["jsd"])
            if best is None or key > best[0]:
                best = (key, c)
        winners[h] = best[1]
    # report the winners on test (and synth when given)
    for split, idx in (("test", test_idx), ("synth", synth_idx)):
        if not idx:
            continue
        for h, c in winners.items():
            got = score_programs(store, [h], [c.program], list(idx), cache)
            c.scores.setdefault(split, {}).update(iou=float(got["iou"][0, 0]), jsd=float(got["jsd"][0, 0]),
                                                  topq=float(got["topq"][0, 0]))
    for h, c in winners.items():
        result.add(h, c.program, c.source, c.scores, c.hypothesis)
    return result
