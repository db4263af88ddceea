"""Benchmark: explain's per-head stage (search, select, ΔPPL) serially vs on Ray, and a cost model for big models.

Workload: stories260K (5 layers x 8 query heads = 40 heads) from ../shared/data over tinystories-valid.txt,
windows of at most ``--max-len`` tokens, ``--max-sequences`` windows split 60/20/20 by document (seeded), the
searchers of ``--searchers`` (default enumerative and learned), captured once. The per-head stage
(headsurgeon/scaleout/stage.py ``explain_store``) runs three times on the same store, each into a fresh
journal: serially in this process (all heads in one task, as one undivided batch), and on a
local Ray runtime of 1 and of 2 CPUs (one task per CPU); serially once more with numba's kernels on one thread,
as each Ray worker runs them. Wall time of each, speed-ups side by side, and a check
that the three select the same programs with the same scores.

Per-head costs: on a grid of context lengths (``--grid-len``) x windows (``--grid-windows``), a task of 1 head
and a task of ``--grid-heads`` heads (with ΔPPL) are timed serially; their difference separates a task's fixed
cost ``a`` (the searchers' shared work) from the marginal cost per head ``b``, per stage. Both are taken as
proportional to the pattern cells a head's windows hold (sum of n^2; the grid prints how well that holds) and
extrapolated to a workload of
``--target-len`` tokens x ``--target-windows`` windows, and the wall time on P workers of one task per worker is
``T(P) = s + a + b * ceil(H / P)`` (``s``: Ray's start-up, measured above), printed for GPT-2 small (144 heads)
and a Llama-3-8B-shaped model (32 x 32 = 1,024 query heads) on 8, 64 and 512 workers. Search and selection
read only patterns, so their cost does not depend on the model's size; ΔPPL does: a forward of the hybrid over the
test windows per head, printed as its FLOPs (2 x parameters x tokens, computed, not measured: stories260K's
forward is dominated by overheads, so its seconds do not scale) - a job for the accelerator, not CPU workers.

The machine may be shared: the load average is printed at the start and the end of each phase.

Run: ``python benchmarks/scaleout.py [--max-len 64 --max-sequences 150] [--quick]`` (needs ``pip install ray``).

Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS = SHARED / "corpora" / "tinystories-valid.txt"
MODEL = SHARED / "models" / "stories260K" / "stories260K.bin"
TOKENIZER = SHARED / "models" / "stories260K" / "tok512.model"
TARGETS = (("GPT-2 small", 144, 124e6), ("Llama-3-8B-shaped", 1024, 8.0e9))  # name, query heads, parameters
WORKERS = (8, 64, 512)


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def setup(max_len: int, max_sequences: int, root: Path):
    """The model, its splits and a captured store of ``max_sequences`` windows of ``max_len`` tokens."""
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import load_corpus
    from headsurgeon.surgery.models.loading import load_model

    handle = load_model(f"llama2c:{MODEL}", tokenizer=TOKENIZER)
    splits = load_corpus(handle, CORPUS, max_len=max_len, max_sequences=max_sequences, seed=0)
    store = capture(handle, splits.all, out=root / f"store-{max_len}-{max_sequences}", progress=False)
    return handle, splits, store


def stage(handle, splits, store, out: Path, searchers, **kw):
    """One run of the per-head stage into a fresh journal at ``out``; (wall seconds, HeadsResult)."""
    from headsurgeon.scaleout import explain_store
    from headsurgeon.scaleout.config import ScaleoutConfig
    from headsurgeon.synth.vocab import Vocabulary

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    got = explain_store(store, handle, splits.indices, searchers, options={}, seed=0,
                        vocab=Vocabulary.from_tokenizer(handle.tokenizer), out=out, progress=False,
                        model_spec=f"llama2c:{MODEL}", tokenizer=str(TOKENIZER), scaleout=ScaleoutConfig(**kw))
    return time.perf_counter() - t0, got


def make_job(handle, splits, store, searchers, delta=None):
    """The HeadJob explain_store would build for this store (headsurgeon/scaleout/task.py)."""
    from headsurgeon.scaleout.task import HeadJob
    from headsurgeon.synth.search.base import searcher_factory
    from headsurgeon.synth.vocab import Vocabulary

    return HeadJob(str(store.directory), splits.indices, tuple((s, searcher_factory(s)) for s in searchers), 0, {},
                   Vocabulary.from_tokenizer(handle.tokenizer), handle.name, delta)


def programs_json(result) -> dict:
    return result.programs.to_json()


def compare_executors(args, root: Path) -> dict:
    """Serial vs Ray with 1 and 2 CPUs on the same store: wall, speed-up, identical selections."""
    import ray

    handle, splits, store = setup(args.max_len, args.max_sequences, root)
    heads = len(store.heads)
    print(f"\n## serial vs Ray: stories260K, {heads} heads, {len(store.sequences)} windows of <= {args.max_len} tokens "
          f"({splits.sizes()}), searchers {', '.join(args.searchers)}")
    rows, results = [], {}
    from headsurgeon.scaleout import explain_heads

    explain_heads(make_job(handle, splits, store, args.searchers), store.heads[-1:])  # warm: numba kernels, features
    t0 = time.perf_counter()  # Ray's start-up as a run pays it: the runtime, a worker, its imports
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    ray.get(ray.remote(_import_task).remote())
    ray.shutdown()
    startup = time.perf_counter() - t0
    print(f"Ray start-up (init, one worker importing the task module, shutdown): {startup:.1f} s")
    print(f"load average before: {load()}")
    wall, res = stage(handle, splits, store, root / "serial", args.searchers, executor="local", heads_per_task=heads)
    rows.append(("serial (1 task of all heads)", wall, load()))
    results["serial"] = res
    for cpus in (2, 1):
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        try:
            wall, res = stage(handle, splits, store, root / f"ray{cpus}", args.searchers, executor="ray")
        finally:
            ray.shutdown()
        rows.append((f"Ray, {cpus} worker{'s' if cpus > 1 else ''} (1 task per worker)", wall, load()))
        results[f"ray{cpus}"] = res
    base = rows[0][1]
    print("\n| run | wall s | speed-up vs serial | load average after |\n|---|---|---|---|")
    for name, wall, after in rows:
        print(f"| {name} | {wall:.1f} | {base / wall:.2f}x | {after} |")
    same = all(programs_json(results[k]) == programs_json(results["serial"]) for k in ("ray1", "ray2"))
    print(f"\nthe other runs select the serial run's programs with the same scores: {same}")
    summed = {k: round(v, 1) for k, v in results["serial"].timings.items()}
    print(f"serial per-stage seconds: {summed}")
    return {"serial": base, "ray2": rows[1][1], "ray1": rows[2][1], "startup": startup,
            "same": same}


def _import_task() -> bool:
    import headsurgeon.scaleout.task  # noqa: F401 - what a worker imports before its first task

    return True


def per_head_costs(args, root: Path) -> list[dict]:
    """Per grid point: a task's fixed cost and the marginal cost per head, per stage (serial, in this process)."""
    from headsurgeon.scaleout import explain_heads
    from headsurgeon.scaleout.task import DeltaJob
    from headsurgeon.surgery.measure.evaluate import perplexity

    print(f"\n## per-head costs (tasks of 1 and {args.grid_heads} heads, serial; load average before: {load()})")
    print("\n| context n | windows W | stage | fixed per task a (s) | per head b (s) |\n|---|---|---|---|---|")
    points = []
    for n in args.grid_len:
        for w in args.grid_windows:
            handle, splits, store = setup(n, w, root)
            idx = splits.indices
            base = perplexity(handle, [store.sequences[i] for i in idx["test"]], progress=False)
            job = make_job(handle, splits, store, args.searchers, DeltaJob(None, None, base))
            heads = store.heads
            explain_heads(job, heads[-1:], handle=handle)  # warm-up: numba kernels, features
            cost = {}
            for k in (1, args.grid_heads):
                recs = explain_heads(job, heads[:k], handle=handle)
                sec = [r["seconds"] for r in recs]
                cost[k] = {**{s: sum(x["search"].get(s, 0.0) for x in sec) for s in args.searchers},
                           "select": sum(x["select"] for x in sec), "delta_ppl": sum(x["delta_ppl"] for x in sec)}
            k = args.grid_heads
            point = {"n": n, "windows": w, "cells": sum(s.n ** 2 for s in store.sequences),
                     "test_tokens": sum(store.sequences[i].n for i in idx["test"]), "stages": {}}
            for name in cost[1]:
                b = max(1e-6, (cost[k][name] - cost[1][name]) / (k - 1))
                a = max(0.0, cost[1][name] - b)
                point["stages"][name] = (a, b)
                print(f"| {n} | {w} | {name} | {a:.2f} | {b:.3f} |")
            points.append(point)
    return points


def cost_model(points: list[dict], measured: dict, args) -> None:
    """Per stage, a and b per pattern cell (sum of n^2 over the windows) from the grid, extrapolated to the
    target workload; T(P) for the target models. The grid's spread of cost per cell is printed: the closer
    min and max, the better pattern cells explain the cost."""
    n, w = args.target_len, args.target_windows
    target_cells = w * n * n
    stages = list(points[0]["stages"])
    per_cell = {}
    print("\n| stage | a per Mcell (median, min..max over the grid) | b per Mcell (median, min..max) |\n|---|---|---|")
    for name in stages:
        ratios = [[p["stages"][name][i] / p["cells"] * 1e6 for p in points] for i in (0, 1)]
        per_cell[name] = tuple(float(np.median(r)) / 1e6 for r in ratios)
        print(f"| {name} | " + " | ".join(f"{np.median(r):.3f} s ({min(r):.3f}..{max(r):.3f})" for r in ratios) + " |")
    search = [x for x in stages if x != "delta_ppl"]
    a = sum(per_cell[x][0] for x in search) * target_cells
    b = sum(per_cell[x][1] for x in search) * target_cells
    s = measured.get("startup", 0.0)
    print(f"\n## cost model: {w} windows of {n} tokens ({target_cells / 1e6:.1f} M pattern cells per head); "
          f"search + select a = {a:.0f} s per task, b = {b:.0f} s per head; Ray start-up s = {s:.1f} s")
    print("\n| model | heads | workers | heads per task | search + select wall | speed-up vs 1 worker | "
          "ΔPPL per head: forward FLOPs |\n|---|---|---|---|---|---|---|")
    for label, heads, params in TARGETS:
        serial = a + b * heads
        for workers in WORKERS:
            k = math.ceil(heads / workers)
            wall = s + a + b * k
            print(f"| {label} | {heads} | {workers} | {k} | {wall / 60:.1f} min | {serial / wall:.1f}x | "
                  f"{2 * params * 0.2 * w * n / 1e12:.1f} TFLOP |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--max-sequences", type=int, default=150)
    ap.add_argument("--searchers", nargs="+", default=["enumerative", "learned"])
    ap.add_argument("--grid-len", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--grid-windows", type=int, nargs="+", default=[60, 120])
    ap.add_argument("--grid-heads", type=int, default=4)
    ap.add_argument("--target-len", type=int, default=128)
    ap.add_argument("--target-windows", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    ap.add_argument("--skip-compare", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.max_len, args.max_sequences, args.grid_len, args.grid_windows = 16, 24, [16, 24], [24, 36]
        args.grid_heads, args.searchers = 2, ["enumerative"]
    if not MODEL.is_file():
        print(f"{MODEL} is absent: this benchmark needs the ../shared folder beside the checkout", file=sys.stderr)
        return 1
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local runtimes only; ~/.ray/auth_token may be shared
    import torch

    torch.set_num_threads(1)
    print(f"# benchmarks/scaleout.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {load()}")
    with tempfile.TemporaryDirectory(prefix="hs-scaleout-") as tmp:
        root = Path(tmp)
        measured = {} if args.skip_compare else compare_executors(args, root)
        points = per_head_costs(args, root)
        cost_model(points, measured, args)
    print(f"\nload average at the end: {load()}")
    print(json.dumps({"measured": measured}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
