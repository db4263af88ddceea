"""Benchmark: the enumerative searcher's hot paths, compiled (headsurgeon/kernels/cell_kernels.py, and the mixtures'
NNLS in headsurgeon/kernels/nnls.py) vs the numpy passes they replaced (kept in tests/kernels/test_cell_kernels.py
and tests/kernels/test_nnls.py), side by side in one process.

Workload: stories260K (``../shared/data``) captured on TinyStories windows of at most 128 tokens (``--synth``
synth and ``--select`` select windows, split by document, seeded), the enumerative search fitted on ``--fit`` of
the synth windows. Two parts:

* the passes alone on the real fit set of head 0 (medians of ``--repeats``, after a warm-up): IoU + JSD of a
  block of 24 patterns, row normalization of that block, one IPF step of a softmax table (its rows' mass per
  key token), ``sum``'s saturating accumulation, the mixture beam's NNLS fit on a 4-component support;
* the whole search on the first ``--heads`` heads, once through the numpy passes (put back by patching, as
  the test does), once with only the NNLS in numpy, and once compiled, in that order, each after a warm-up
  search: wall and CPU seconds, their ratios, and whether the runs keep the same candidates and pick the same
  best select-IoU program per head.

The machine is shared (2 cores, other people's runs): the load average is printed before and after.
Run: ``python benchmarks/searcher_passes.py [--synth 120 --select 40 --fit 96 --heads 8 --repeats 5]``.
Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data"
CORPUS = SHARED / "corpora" / "tinystories-valid.txt"
MODEL = SHARED / "models" / "stories260K" / "stories260K.bin"
TOKENIZER = SHARED / "models" / "stories260K" / "tok512.model"


def load() -> str:
    """The load averages, for the record."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


@contextmanager
def numpy_passes() -> Iterator[None]:
    """The searcher with the numpy passes it had before the compiled ones (tests/kernels/test_cell_kernels.py)."""
    import pytest

    ref = reference()
    from headsurgeon.synth.dsl import cell_combinators
    from headsurgeon.synth.search.enumerative import FitSet, tables

    with pytest.MonkeyPatch.context() as m:
        m.setattr(FitSet, "row_sums", ref.np_row_sums)
        m.setattr(FitSet, "rownorm", ref.np_rownorm)
        m.setattr(FitSet, "row_softmax", ref.np_row_softmax)
        m.setattr(FitSet, "scores", lambda fs, q, h, iou=True, jsd=True: (ref.np_iou(fs, q, h), ref.np_jsd(fs, q, h)))
        m.setattr(tables, "table_mass", ref.np_table_mass)
        m.setattr(tables, "table_l1", ref.np_table_l1)
        m.setattr(cell_combinators, "saturating_add", ref.np_saturating_add)
        with numpy_nnls():
            yield


@contextmanager
def numpy_nnls() -> Iterator[None]:
    """The mixtures' NNLS fit as it was in numpy (tests/kernels/test_nnls.py), the other passes compiled."""
    import pytest

    from headsurgeon.synth.search.enumerative import GramStats

    with pytest.MonkeyPatch.context() as m:
        m.setattr(GramStats, "fit", reference("test_nnls").numpy_fit)
        yield


def reference(module: str = "test_cell_kernels") -> Any:
    """A module of tests/kernels/, the one copy of the numpy passes (test_cell_kernels) and of the numpy NNLS
    (test_nnls)."""
    import importlib

    tests = HERE.parent / "tests"
    if str(tests) not in sys.path:
        sys.path[:0] = [str(tests / "kernels"), str(tests)]  # the test modules, and tests/support/ they import
    return importlib.import_module(module)


def bench_passes(fs: Any, repeats: int) -> None:
    """Each pass alone on the real fit set, numpy vs compiled."""
    from headsurgeon.kernels import cell_kernels
    from headsurgeon.synth.search.enumerative import GramStats

    ref, nnls_ref = reference(), reference("test_nnls")
    q = fs.X[:24].copy()
    q[:, fs.row_start[:-1]] += fs.empty[:24]  # empty rows attend to position 0, as patterns do
    acc = np.zeros(fs.C, dtype=np.float32)
    raw = fs.X[0] * fs.scale[0][fs.row_of_cell]
    rng = np.random.default_rng(0)
    keys = int(fs.cell_key.max()) + 1
    b, a, c = rng.uniform(-14, 0, 50), rng.uniform(-3, 3, keys), np.zeros(1)
    f_off = np.minimum(np.maximum(fs.cell_d, 0), 49).astype(np.int64)
    f_key, f_cls = fs.cell_key, np.zeros(fs.C, dtype=np.int64)
    behind = (fs.cell_d >= 0) | fs.cell_first
    X = fs.X[:24].astype(np.float64)
    stats, support = GramStats(X @ X.T, (X @ fs.real[0].astype(np.float64))[None], np.ones(1)), (0, 3, 7, 12)
    exps = (np.exp(b - b.max()), np.exp(a - a.max()), np.exp(c - c.max()), float(np.exp(-60 - b.max() - a.max())))
    cases = {
        "IoU + JSD, 24 patterns": (lambda: (ref.np_iou(fs, q, 0), ref.np_jsd(fs, q, 0)), lambda: fs.scores(q, 0)),
        "row normalization, 24 rows": (lambda: ref.np_rownorm(fs, q.copy()), lambda: fs.rownorm(q.copy())),
        "table IPF step (softmax + mass)": (
            lambda: ref.np_table_mass(fs.row_start, behind, f_off, f_key, f_cls, *exps, f_key, np.zeros(keys)),
            lambda: cell_kernels.table_mass(fs.row_start, behind, f_off, f_key, f_cls, *exps, f_key, np.zeros(keys))),
        "sum: saturating accumulation": (lambda: ref.np_saturating_add(acc, 0.5, raw),
                                         lambda: cell_kernels.saturating_add(acc, 0.5, raw)),
        "mixture NNLS, 4 of 24 components": (lambda: nnls_ref.numpy_fit(stats, 0, support),
                                             lambda: stats.fit(0, support)),
    }
    print(f"\n== the passes alone on the fit set ({fs.C:,} cells, {fs.R:,} rows, {fs.B} windows); load {load()}")
    print(f"  {'pass':<34} {'numpy ms':>9} {'compiled ms':>12} {'ratio':>7}")
    for name, (old, new) in cases.items():
        t_old, t_new = median_ms(old, repeats), median_ms(new, repeats)
        print(f"  {name:<34} {t_old:>9.2f} {t_new:>12.2f} {t_old / t_new:>6.1f}x", flush=True)


def bench_search(store: Any, heads: list, synth_idx: list[int], select_idx: list[int], fit: int) -> None:
    """The whole search on ``heads``, numpy passes then compiled, each after a warm-up."""
    from headsurgeon.synth.search.enumerative import EnumerativeConfig, SearchStats, enumerative_search
    from headsurgeon.synth.splits import StoreSplits

    splits, config = StoreSplits(synth_idx, select_idx), EnumerativeConfig(fit_sequences=fit)

    def run(label: str) -> dict:
        warm = EnumerativeConfig(fit_sequences=8)
        enumerative_search(store, splits, warm, heads=heads[:1], progress=False)  # warm-up (numba cache load)
        stats = SearchStats()
        l0, cpu0, t0 = load(), time.process_time(), time.perf_counter()
        result = enumerative_search(store, splits, config, heads=heads, progress=False, stats=stats)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(f"  {label:<10} wall {wall:6.1f} s, CPU {cpu:6.1f} s (compose {stats.seconds['compose']:.1f} s, "
              f"{stats.proposals} proposals); load {l0} -> {load()}", flush=True)
        return {"wall": wall, "cpu": cpu, "result": {h: {c.program.canonical: c.scores for c in v}
                                                      for h, v in result.items()}}

    print(f"\n== the enumerative search, {len(heads)} heads, fit on {fit} windows")
    with numpy_passes():
        old = run("numpy")
    with numpy_nnls():
        mid = run("numpy NNLS")
    new = run("compiled")
    print(f"  speed-up: wall {old['wall'] / new['wall']:.2f}x, CPU {old['cpu'] / new['cpu']:.2f}x; the NNLS alone "
          f"(numpy NNLS / compiled): wall {mid['wall'] / new['wall']:.2f}x, CPU {mid['cpu'] / new['cpu']:.2f}x")
    compare(old, new, "numpy / compiled")
    compare(mid, new, "numpy NNLS / compiled")


def compare(old: dict, new: dict, label: str) -> None:
    """Whether two runs keep the same candidates, in the same order, with the same best select-IoU program."""
    same_sets = all(old["result"][h].keys() == new["result"][h].keys() for h in old["result"])
    same_order = all(list(old["result"][h]) == list(new["result"][h]) for h in old["result"])

    def best(scored: dict) -> str:
        return max(scored, key=lambda p: scored[p]["select"]["iou"])

    same_best = all(best(old["result"][h]) == best(new["result"][h]) for h in old["result"])
    diff = max(abs(old["result"][h][p][s][m] - new["result"][h][p][s][m]) for h in old["result"]
               for p in old["result"][h] if p in new["result"][h] for s in ("synth", "select") for m in ("iou", "jsd"))
    print(f"  {label}: same candidates per head: {same_sets}; same order: {same_order}; same best select-IoU program: "
          f"{same_best}; largest score difference {diff:.1e}")
    for h in old["result"]:
        a, b = old["result"][h], new["result"][h]
        if a.keys() != b.keys():
            print(f"  head {h}: {len(a.keys() - b.keys())} of {len(a)} candidates differ; {describe(a, b)}")


def describe(a: dict, b: dict) -> str:
    """What differs between two runs' candidates of a head: each one kept by only one run, its synth JSD and the
    closest synth JSD among the other run's candidates, and where its text departs from the closest text there."""
    def first_diff(x: str, y: str) -> int:
        return next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))

    parts = []
    for label, mine, other in (("numpy only", a, b), ("compiled only", b, a)):
        for prog in mine.keys() - other.keys():
            jsd = mine[prog]["synth"]["jsd"]
            near = min(other, key=lambda p: abs(other[p]["synth"]["jsd"] - jsd))
            close = max(other, key=lambda p: first_diff(prog, p))
            parts.append(f"{label}: JSD {jsd:.9f} (closest there {other[near]['synth']['jsd']:.9f}), {len(prog)} "
                         f"chars, text equal to another's for {first_diff(prog, close)}")
    return "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", type=int, default=120)
    ap.add_argument("--select", type=int, default=40)
    ap.add_argument("--fit", type=int, default=96)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not (CORPUS.exists() and MODEL.exists()):
        print(f"skipped: {SHARED} is absent (the ../shared data beside the checkout)")
        return 0
    import torch

    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents, split_sequences
    from headsurgeon.surgery.models.loading import load_model
    from headsurgeon.synth.search.enumerative import FitSet, SplitArrays, primitive_library, query_predicates
    from headsurgeon.synth.search.enumerative.split import features_for
    from headsurgeon.synth.search.enumerative.util import spacy_available

    torch.set_num_threads(1)
    print(f"load average {load()}; {os.cpu_count()} CPUs (shared with other people's runs)", flush=True)
    model = load_model(f"llama2c:{MODEL}", tokenizer=TOKENIZER)
    splits = split_sequences(make_sequences(model, read_documents(CORPUS), max_len=128), (0.6, 0.2, 0.2), args.seed)
    rng = np.random.default_rng(args.seed)

    def sample(seqs: list, k: int) -> list:
        return [seqs[i] for i in np.sort(rng.permutation(len(seqs))[:k])]

    synth, select = sample(splits.synth, args.synth), sample(splits.select, args.select)
    store = capture(model, synth + select, progress=False)
    synth_idx = list(range(len(synth)))
    select_idx = list(range(len(synth), len(synth) + len(select)))
    heads = store.heads[: args.heads]

    spacy = spacy_available()
    library = primitive_library(synth[: args.fit], True, spacy=spacy)
    preds = query_predicates(synth[: args.fit], spacy=spacy)
    fs = FitSet(SplitArrays(store, synth_idx[: args.fit], features_for(library, preds)), library, heads[:1], preds, True,
                progress=False)
    bench_passes(fs, args.repeats)
    del fs
    bench_search(store, heads, synth_idx, select_idx, args.fit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
