"""Benchmark: a SmolLM2-135M forward (1 x 128 tokens) with 1 and 2 torch threads, OpenMP's default wait policy and
``OMP_WAIT_POLICY=PASSIVE``, on an idle machine and beside busy processes.

OpenMP threads that wait at a barrier spin before they sleep; beside a busy process a spinning thread burns the time
slice its descheduled sibling needs, which is why two threads under load ran slower than one
(benchmarks/RESULTS.md, "Threads under a competing load"). Each configuration runs in a fresh process (the policy is
read when the OpenMP runtime starts), in an interleaved round so that every configuration sees the same machine;
ratios are printed against the idle two-thread default, and the load average before and after.

Run: ``python benchmarks/threads_load.py [--busy 2] [--rounds 3] [--repeats 15]``. Figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import json, sys, time, statistics
import torch
torch.set_num_threads(int(sys.argv[1]))
import headsurgeon as hs
handle = hs.load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
model = handle.model
ids = torch.randint(100, 20000, (1, 128), generator=torch.Generator().manual_seed(0))
times = []
with torch.inference_mode():
    for _ in range(3):
        model(ids)
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter()
        model(ids)
        times.append(time.perf_counter() - t0)
print(json.dumps({"median": statistics.median(times)}))
"""

SPIN = "while True: pass"


def run(threads: int, passive: bool, repeats: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "HEADSURGEON_THREADS")}
    env["OMP_NUM_THREADS"] = str(threads)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(repeats)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    configs = [(t, p) for t in (1, 2) for p in (False, True)]
    got: dict[tuple, list[float]] = {}
    print(f"load average before: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for r in range(args.rounds):
        for loaded in (False, True):
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy if loaded else 0)]
            time.sleep(2 if spinners else 0)
            try:
                for t, p in configs:
                    got.setdefault((loaded, t, p), []).append(run(t, p, args.repeats))
            finally:
                for s in spinners:
                    s.kill()
                    s.wait()
        print(f"round {r + 1} done", flush=True)
    print(f"load average after: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ref = statistics.median(got[(False, 2, False)])
    print(f"\nmedian forward seconds (median of {args.rounds} rounds); ratio to idle, 2 threads, default policy")
    print(f"{'machine':<22}{'threads':>8}{'default':>16}{'PASSIVE':>16}")
    for loaded in (False, True):
        for t in (1, 2):
            cells = []
            for p in (False, True):
                s = statistics.median(got[(loaded, t, p)])
                cells.append(f"{s:.3f} ({s / ref:.2f}x)")
            label = f"{args.busy} busy processes" if loaded else "idle"
            print(f"{label:<22}{t:>8}{cells[0]:>16}{cells[1]:>16}")


if __name__ == "__main__":
    main()
