"""Benchmark: streaming attention capture vs a plain forward (throughput, where time goes) and run_with_cache (memory).

Models: stories260K (llama2.c, 5 layers x 8 heads, d_head 8) from ../shared/data, and a randomly
initialised GPT-2-small-shaped model (transformers GPT2Config defaults: 12 x 12 heads, d_model 768)
with the real GPT-2 BPE tokenizer from ../shared/data/tokenizers/gpt2. Text: tinystories-valid.txt,
documents split on blank lines, windows from ``make_sequences`` (stories260K: 256 tokens, GPT-2: 64).

Throughput, side by side in one process over the same windows (capture's own batches: shards sorted by
length): a plain forward without hooks, the forward with no-op pattern hooks, ``capture(..., out=DIR)``
dense and top-q (float16 cast / torch.topk inside the hooks, top-q selections in a worker thread, shards
and the manifest written by a background thread), and the previous capture path (float32 patterns to
numpy, ``AttentionStore.put``, shard and manifest written in line) for comparison; the two paths' shards
are checked bit-identical. Methods are interleaved, their order rotated each repeat. Per method:
ratio = median over repeats of t(plain)/t(method) in wall time (the goal, >= 0.8); the same ratio in
main-thread CPU time (what the forward's thread pays: the wall ratio when a second core is free) and in
process CPU time (all threads: the wall ratio on one core). The profile splits each capture's time by
thread (main, top-q selector, shard writer) and part.

Memory: one fresh subprocess per (model, method, corpus size); peak RSS (VmHWM, reset through
/proc/self/clear_refs after loading, warm-up and gc) minus the RSS at that point. Methods: streaming
capture to disk (dense, top-q) vs ``run_with_cache(names_filter=hook_pattern)`` keeping every batch's
cache in a list (as a naive user would; run under no_grad, which favours it). Corpus sizes N and 4N.

The machine may be shared: the load average is printed at the start and the end.

Run: ``python benchmarks/capture.py [--quick] [--threads 1] [--models stories,gpt2] [--skip-memory]``.

Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared"
DATA = SHARED / "data"
CORPUS = DATA / "corpora" / "tinystories-valid.txt"
STORIES_BIN = DATA / "models" / "stories260K" / "stories260K.bin"
STORIES_TOK = DATA / "models" / "stories260K" / "tok512.model"
GPT2_TOK = DATA / "tokenizers" / "gpt2"
MB = 1024 * 1024
GOAL = 0.8
# Fixed glibc mmap threshold: freed large tensors go back to the OS at once, so RSS follows live memory
# (with the default dynamic threshold, freed blocks linger in the heap and the peak depends on history).
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Config:
    """Workload of one model: window length, batching, and how many windows each part uses."""

    model: str  # "stories" or "gpt2"
    max_len: int
    batch_size: int
    shard_size: int
    n_throughput: int
    repeats: int
    n_memory: int  # N (two shards by default, the most capture holds at once); memory is also measured at 4N
    mem_len: int  # memory runs use only full windows of exactly this many tokens (same batch shapes at N and 4N)


def configs(quick: bool) -> dict[str, Config]:
    """Default and --quick workloads: capture's default batch (16) and shard (64) sizes for stories260K; GPT-2 is
    ~100x costlier per token, so it runs a few batches only."""
    if quick:
        return {"stories": Config("stories", 256, 16, 64, 192, 2, 32, 128),
                "gpt2": Config("gpt2", 64, 8, 16, 16, 1, 8, 64)}
    return {"stories": Config("stories", 256, 16, 64, 512, 3, 128, 128),
            "gpt2": Config("gpt2", 64, 8, 16, 32, 2, 32, 64)}


# --------------------------------------------------------------------------- models and data
def build_gpt2_dir(directory: Path) -> Path:
    """Save a seeded random GPT-2-small (GPT2Config defaults) with the real GPT-2 tokenizer into ``directory``."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    torch.manual_seed(0)
    tokenizer = GPT2TokenizerFast.from_pretrained(str(GPT2_TOK))
    model = GPT2LMHeadModel(GPT2Config())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load(model: str, gpt2_dir: str | None) -> Any:
    """Load stories260K (llama2.c) or the saved random GPT-2 as a ModelHandle."""
    from headsurgeon.surgery.models.loading import load_model

    if model == "stories":
        return load_model(f"llama2c:{STORIES_BIN}", tokenizer=str(STORIES_TOK))
    if gpt2_dir is None:
        raise ValueError("the gpt2 workload needs the directory written by build_gpt2_dir")
    return load_model(gpt2_dir)


def corpus_sequences(handle: Any, max_len: int, count: int | None, full_only: bool = False) -> list:
    """The first ``count`` windows (all when None) of tinystories-valid.txt with the model's tokenizer and BOS.

    ``full_only`` keeps only windows of exactly ``max_len`` tokens (from the longer stories).
    """
    from headsurgeon.surgery.corpus import make_sequences, read_documents

    seqs = make_sequences(handle, read_documents(CORPUS), max_len=max_len,
                          max_sequences=None if full_only else count)
    if full_only:
        seqs = [s for s in seqs if s.n == max_len][:count]
    if count is not None and len(seqs) < count:
        raise SystemExit(f"the corpus gave only {len(seqs)} windows, {count} needed; lower the counts")
    return seqs


def capture_batches(sequences: list, batch_size: int, shard_size: int) -> list[list]:
    """The batches capture() forms: per shard, sequences sorted by length, cut into batch_size groups."""
    batches = []
    for lo in range(0, len(sequences), shard_size):
        order = sorted(range(lo, min(lo + shard_size, len(sequences))), key=lambda i: sequences[i].n)
        batches.extend([sequences[i] for i in order[s: s + batch_size]] for s in range(0, len(order), batch_size))
    return batches


def forward_kwargs(handle: Any, mask: torch.Tensor) -> dict:
    """Same forward arguments as capture's forward (mask only for bidirectional models)."""
    return {} if handle.causal else {"attention_mask": mask}


# --------------------------------------------------------------------------- timed methods
def plain_forward(handle: Any, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Forward every batch without hooks."""
    with torch.no_grad():
        for ids, mask in batches:
            handle.model(ids, **forward_kwargs(handle, mask))


def noop_hooks(handle: Any, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Forward every batch with do-nothing pattern hooks (hook-dispatch cost only)."""
    hooks = [(handle.pattern_hook(layer), lambda pattern, hook: pattern) for layer in range(handle.n_layers)]
    with torch.no_grad():
        for ids, mask in batches:
            handle.model.run_with_hooks(ids, fwd_hooks=hooks, **forward_kwargs(handle, mask))


def capture_now(handle: Any, seqs: list, cfg: Config, mode: str, out: Path) -> None:
    """Today's capture to a fresh directory."""
    from headsurgeon.surgery.patterns.capture import capture

    capture(handle, seqs, out=out, mode=mode, batch_size=cfg.batch_size, shard_size=cfg.shard_size, progress=False)


def capture_previous(handle: Any, seqs: list, cfg: Config, mode: str, out: Path) -> None:
    """The capture loop before the in-hook conversion and the writer thread: float32 patterns to numpy,
    ``AttentionStore.put``, then ``write_shard`` and ``save_manifest`` in line after each shard."""
    from headsurgeon.surgery.patterns.capture import forward_patterns
    from headsurgeon.surgery.patterns.store import AttentionStore

    store = AttentionStore(seqs, handle.n_layers, handle.n_heads, mode, 0.025, handle.causal, handle.name, out,
                           cfg.shard_size)
    out.mkdir(parents=True)
    store.save_sequences()
    done: set[int] = set()
    store.save_manifest(done)
    for shard in range(store.n_shards):
        lo, hi = shard * cfg.shard_size, min((shard + 1) * cfg.shard_size, len(seqs))
        order = sorted(range(lo, hi), key=lambda i: seqs[i].n)
        entries: dict[str, np.ndarray] = {}
        for start in range(0, len(order), cfg.batch_size):
            idx = order[start: start + cfg.batch_size]
            for i, pattern in zip(idx, forward_patterns(handle, [seqs[i] for i in idx])):
                entries.update(store.put(i, pattern))
        store.write_shard(shard, entries)
        done.add(shard)
        store.save_manifest(done)


# --------------------------------------------------------------------------- profile
def thread_kind() -> str:
    """Which of capture's threads runs this: main, the top-q selector or the shard writer."""
    name = threading.current_thread().name
    if name.startswith("headsurgeon topq"):
        return "selector"
    return "writer" if name.startswith("headsurgeon shard writer") else "main"


PARTS = {  # (module, object, attribute) -> part label
    ("headsurgeon.surgery.patterns.capture", None, "_hooked_forward"): "forward incl. hooks",
    ("headsurgeon.surgery.patterns.pattern_entries", "EntryBuilder", "take"): "  of which: conversion in the hooks",
    ("headsurgeon.surgery.patterns.pattern_entries", "EntryBuilder", "_select"): "top-q selection (torch.topk)",
    ("headsurgeon.surgery.patterns.pattern_entries", "EntryBuilder", "_finish_jobs"): "finishing / waiting for selections",
    ("headsurgeon.surgery.patterns.store", "AttentionStore", "put"): "store.put (numpy -> torch, cast / topk)",
    ("headsurgeon.surgery.patterns.shard_writer", "ShardWriter", "submit"): "waiting to hand a shard over",
    ("headsurgeon.surgery.patterns.shard_writer", "ShardWriter", "__exit__"): "waiting for the last shard's write",
    ("headsurgeon.surgery.patterns.store", "AttentionStore", "write_shard"): "write_shard (serialize, fsync, sha256)",
    ("headsurgeon.surgery.patterns.store", "AttentionStore", "save_manifest"): "save_manifest",
    ("headsurgeon.surgery.patterns.store", "AttentionStore", "save_sequences"): "save_sequences",
}


@contextmanager
def instrument(acc: Counter) -> Iterator[None]:
    """Accumulate wall seconds per (thread, part) in capture's functions while the block runs."""
    import importlib

    saved = []
    for (module, owner, attr), label in PARTS.items():
        obj = importlib.import_module(module)
        obj = getattr(obj, owner) if owner else obj
        saved.append((obj, attr, obj.__dict__[attr], label))

    def timed_fn(label: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[(thread_kind(), label)] += time.perf_counter() - t0
        return wrapper

    try:
        for obj, attr, fn, label in saved:
            setattr(obj, attr, timed_fn(label, fn))
        yield
    finally:
        for obj, attr, fn, _ in saved:
            setattr(obj, attr, fn)


@dataclass
class Clock:
    """Wall, main-thread CPU and process CPU seconds of one run."""

    wall: float
    main_cpu: float
    cpu: float


def clocked(fn: Callable[[], Any]) -> Clock:
    """Run ``fn`` once and time it three ways."""
    w, t, c = time.perf_counter(), time.thread_time(), time.process_time()
    fn()
    return Clock(time.perf_counter() - w, time.thread_time() - t, time.process_time() - c)


# --------------------------------------------------------------------------- throughput
def same_stores(a: Path, b: Path) -> bool:
    """Whether two store directories hold bit-identical shards."""
    from headsurgeon.surgery.patterns.store import AttentionStore

    x, y = AttentionStore.load(a), AttentionStore.load(b)
    for shard in range(x.n_shards):
        sx, sy = x.read_shard(shard), y.read_shard(shard)
        if set(sx) != set(sy) or any(sx[k].tobytes() != sy[k].tobytes() for k in sx):
            return False
    return True


def throughput(handle: Any, cfg: Config, repeats: int, tmp: Path) -> dict:
    """Interleaved repeats of every method; medians, ratios and the per-thread profile of the capture runs."""
    from headsurgeon.surgery.patterns.capture import padded_batch

    seqs = corpus_sequences(handle, cfg.max_len, cfg.n_throughput)
    batches = [padded_batch(b) for b in capture_batches(seqs, cfg.batch_size, cfg.shard_size)]
    capture_methods = {"capture dense": ("dense", capture_now), "capture topq": ("topq", capture_now),
                       "previous dense": ("dense", capture_previous), "previous topq": ("topq", capture_previous)}
    profiles: dict[str, Counter] = {name: Counter() for name in capture_methods}

    def run_capture(name: str) -> Clock:
        mode, fn = capture_methods[name]
        out = tmp / name.replace(" ", "_")
        shutil.rmtree(out, ignore_errors=True)
        with instrument(profiles[name]):
            return clocked(lambda: fn(handle, seqs, cfg, mode, out))

    methods: dict[str, Callable[[], Clock]] = {
        "plain forward": lambda: clocked(lambda: plain_forward(handle, batches)),
        "pattern hooks (no-op)": lambda: clocked(lambda: noop_hooks(handle, batches)),
        **{name: (lambda name=name: run_capture(name)) for name in capture_methods},
    }
    plain_forward(handle, batches[:1])  # warm-up
    runs: dict[str, list[Clock]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each repeat
            runs[name].append(methods[name]())
    plain = runs["plain forward"]
    rows = {}
    for name, clocks in runs.items():
        walls = [c.wall for c in clocks]
        rows[name] = {"wall_s": statistics.median(walls), "mean_wall_s": statistics.fmean(walls),
                      "tok_s": sum(s.n for s in seqs) / statistics.median(walls)}
        for key in ("wall", "main_cpu", "cpu"):
            rows[name][key] = statistics.median(getattr(p, key) / getattr(c, key) for p, c in zip(plain, clocks))
    identical = {mode: same_stores(tmp / f"capture_{mode}", tmp / f"previous_{mode}") for mode in ("dense", "topq")}
    return {"tokens": sum(s.n for s in seqs), "padded_tokens": sum(int(ids.numel()) for ids, _ in batches),
            "sequences": len(seqs), "shards": -(-len(seqs) // cfg.shard_size), "repeats": repeats, "rows": rows,
            "profiles": {name: {k: v / repeats for k, v in acc.items()} for name, acc in profiles.items()},
            "plain_wall_s": rows["plain forward"]["mean_wall_s"], "identical": identical,
            "topk_rate": topk_rate(handle, batches[-1])}


def topk_rate(handle: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Elements per second torch.topk selects from on one real full-width batch (best of 3, this thread)."""
    from headsurgeon.surgery.patterns.store import stored_entries

    pats: list[torch.Tensor] = []
    hooks = [(handle.pattern_hook(layer), lambda p, hook: pats.append(p.detach().clone()))
             for layer in range(handle.n_layers)]
    with torch.no_grad():
        handle.model.run_with_hooks(batch[0], fwd_hooks=hooks, **forward_kwargs(handle, batch[1]))
    n = pats[0].shape[-1]
    rows = [p.reshape(p.shape[0], p.shape[1], n * n) for p in pats]
    q = stored_entries(n, 0.025)
    best = min(clocked(lambda: [torch.topk(r, q, dim=-1, sorted=True) for r in rows]).wall for _ in range(3))
    return sum(r.numel() for r in rows) / best


# --------------------------------------------------------------------------- memory (child processes)
def rss_bytes(field: str) -> int | None:
    """VmRSS / VmHWM of this process from /proc (None where unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(spec: dict) -> dict:
    """In a fresh process: load, warm up, reset the peak, run one method over N windows; report peak - baseline."""
    from headsurgeon.surgery.patterns.capture import capture, padded_batch

    torch.set_num_threads(spec["threads"])
    cfg = Config(**spec["cfg"])
    handle = load(cfg.model, spec.get("gpt2_dir"))
    seqs = corpus_sequences(handle, cfg.mem_len, spec["n"], full_only=True)
    method = spec["method"]
    mode = method.split("-")[-1]
    is_pattern = lambda name: name.endswith("hook_pattern")  # noqa: E731
    out_dir = Path(spec["tmp"]) / "store"
    with torch.no_grad():  # warm-up on one batch of the same method, so one-time allocations are not counted
        if method == "run_with_cache":
            ids, _ = padded_batch(seqs[: cfg.batch_size])
            _, cache = handle.model.run_with_cache(ids, names_filter=is_pattern)
            del cache, _
        else:
            capture(handle, seqs[: cfg.batch_size], out=None, mode=mode, progress=False)
    gc.collect()
    exact = reset_peak()
    base = rss_bytes("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    held = 0
    if method == "run_with_cache":
        caches = []
        with torch.no_grad():
            for lo in range(0, len(seqs), cfg.batch_size):  # corpus order, as a naive user would
                ids, _ = padded_batch(seqs[lo: lo + cfg.batch_size])
                _, cache = handle.model.run_with_cache(ids, names_filter=is_pattern)
                caches.append(cache)
        held = sum(t.numel() * t.element_size() for c in caches for t in c.values())
    else:
        capture(handle, seqs, out=out_dir, mode=mode, batch_size=cfg.batch_size, shard_size=cfg.shard_size,
                progress=False)
        held = sum(p.stat().st_size for p in out_dir.iterdir())
    elapsed = time.perf_counter() - t0
    peak = rss_bytes("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"model": cfg.model, "method": method, "n": len(seqs), "tokens": sum(s.n for s in seqs),
            "base_MB": base / MB, "peak_MB": (peak - base) / MB, "held_MB": held / MB, "seconds": elapsed,
            "exact_peak": exact, "f32_patterns_MB": sum(4 * handle.n_layers * handle.n_heads * s.n ** 2 for s in seqs) / MB}


def memory(cfg: Config, gpt2_dir: str | None, threads: int, tmp: Path) -> list[dict]:
    """Run every (method, corpus size) configuration in its own subprocess."""
    rows = []
    methods = ["stream-dense", "stream-topq", "run_with_cache"]
    for n in (cfg.n_memory, 4 * cfg.n_memory):
        for method in methods:
            work = tmp / f"mem_{cfg.model}_{method}_{n}"
            work.mkdir(parents=True, exist_ok=True)
            spec = {"cfg": asdict(cfg), "n": n, "method": method, "gpt2_dir": gpt2_dir, "threads": threads,
                    "tmp": str(work)}
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                                  capture_output=True, text=True, timeout=1800, env=CHILD_ENV)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"memory child {cfg.model}/{method}/{n} failed:\n{proc.stderr[-3000:]}")
            row = json.loads(lines[-1][len("RESULT "):])
            rows.append(row)
            print(f"  {row['method']:<17} {row['n']:>5} {row['tokens']:>7} {row['peak_MB']:>9.1f} {row['held_MB']:>9.1f} "
                  f"{row['f32_patterns_MB']:>10.1f} {row['seconds']:>7.1f}{'' if row['exact_peak'] else '  (ru_maxrss)'}",
                  flush=True)
            shutil.rmtree(work, ignore_errors=True)
    for method in methods:
        small, large = [r["peak_MB"] for r in rows if r["method"] == method]
        print(f"  growth {method:<17} 4N/N peak: {large / max(small, 1e-9):.2f}x  ({small:.1f} -> {large:.1f} MB)")
    return rows

# --------------------------------------------------------------------------- report
MAIN_ORDER = ["forward incl. hooks", "  of which: conversion in the hooks", "finishing / waiting for selections",
              "store.put (numpy -> torch, cast / topk)", "waiting to hand a shard over",
              "waiting for the last shard's write", "write_shard (serialize, fsync, sha256)", "save_manifest",
              "save_sequences"]


def report_throughput(name: str, res: dict, threads: int) -> None:
    """Print the ratio table of one model."""
    print(f"\n[{name}] throughput: {res['sequences']} windows in {res['shards']} shards, {res['tokens']} tokens "
          f"({res['padded_tokens']} padded), {res['repeats']} repeats, torch threads={threads}")
    print(f"  {'method':<24} {'tok/s':>9} {'wall s':>7} {'ratio':>6} {'main-CPU':>9} {'CPU':>6}   "
          "(ratios = t(plain) / t(method); main-CPU: the forward's thread only; CPU: all threads)")
    for method, row in res["rows"].items():
        flag = "" if not method.startswith(("capture", "previous")) else (
            "  goal met" if row["wall"] >= GOAL else f"  < {GOAL} goal")
        print(f"  {method:<24} {row['tok_s']:>9.0f} {row['wall_s']:>7.2f} {row['wall']:>6.2f} {row['main_cpu']:>9.2f} "
              f"{row['cpu']:>6.2f}{flag}")
    print(f"  stores bit-identical to the previous path: dense {res['identical']['dense']}, "
          f"top-q {res['identical']['topq']}")


def report_profile(name: str, res: dict) -> None:
    """Print where each capture's time goes, per thread, as seconds per capture and % of its wall time."""
    plain = res["plain_wall_s"]
    print(f"[{name}] where the time goes (s per capture and % of its wall time, means over repeats; plain forward "
          f"{plain:.2f} s)")
    for method, parts in res["profiles"].items():
        wall = res["rows"][method]["mean_wall_s"]
        print(f"  {method}: wall {wall:.2f} s = plain forward x {wall / plain:.2f}")
        main = {label: s for (thread, label), s in parts.items() if thread == "main"}
        top = sum(s for label, s in main.items() if not label.startswith(" "))
        for label in MAIN_ORDER:
            if label in main:
                print(f"    main      {label:<42} {main[label]:7.3f} {100 * main[label] / wall:5.0f}%")
        print(f"    main      {'other (sorting, bookkeeping, progress)':<42} {wall - top:7.3f} "
              f"{100 * (wall - top) / wall:5.0f}%")
        for thread in ("selector", "writer"):
            for (t, label), s in sorted(parts.items()):
                if t == thread:
                    print(f"    {thread:<9} {label:<42} {s:7.3f} {100 * s / wall:5.0f}%  (beside the main thread)")
    print(f"  torch.topk on real patterns (this thread alone): {res['topk_rate'] / 1e6:.0f} M elements/s")
    bound(res)


def bound(res: dict) -> None:
    """What bounds each capture: the main thread's own extra work, and the extra CPU work of all threads."""
    rows = res["rows"]
    for method in ("capture dense", "capture topq"):
        r = rows[method]
        print(f"  bound of {method}: main-thread CPU ratio {r['main_cpu']:.2f} (what the forward's thread pays; the "
              f"wall ratio when a second core is free for the selector and writer), all-thread CPU ratio "
              f"{r['cpu']:.2f} (the wall ratio on one core); measured wall {r['wall']:.2f}")


def main() -> None:
    """Parse arguments, run throughput (with its profile) and memory for each model, print everything."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller corpus counts and fewer repeats")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every measurement")
    p.add_argument("--models", default="stories,gpt2", help="comma list of: stories, gpt2")
    p.add_argument("--repeats", type=int, default=None, help="override the repeat count")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    missing = [str(f) for f in (CORPUS, STORIES_BIN, STORIES_TOK, GPT2_TOK / "vocab.json") if not f.exists()]
    if missing:
        raise SystemExit(f"benchmark data missing: {missing}; it expects ../shared/data beside the repository")
    from importlib.metadata import version

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load_avg = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__} "
          f"(threads={torch.get_num_threads()}), transformer-lens {version('transformer-lens')}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs, load average {load_avg} (1/5/15 min; the machine may be shared)")
    cfgs = configs(args.quick)
    with tempfile.TemporaryDirectory(prefix="hs_capbench_") as tmpdir:
        tmp = Path(tmpdir)
        gpt2_dir = None
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            if model not in cfgs:
                raise SystemExit(f"unknown model {model!r}; use stories and/or gpt2")
            cfg = cfgs[model]
            name = "stories260K" if model == "stories" else "GPT-2-small (random init)"
            if model == "gpt2":
                gpt2_dir = str(build_gpt2_dir(tmp / "gpt2_small_random"))
            if not args.skip_throughput:
                handle = load(model, gpt2_dir)
                res = throughput(handle, cfg, args.repeats or cfg.repeats, tmp / f"tp_{model}")
                report_throughput(name, res, args.threads)
                report_profile(name, res)
                del handle
                gc.collect()
            if not args.skip_memory:
                print(f"[{name}] memory: peak RSS above the post-load baseline, one fresh process per row "
                      f"(batch {cfg.batch_size}, shard {cfg.shard_size}, only full windows of {cfg.mem_len} tokens)")
                print(f"  {'method':<17} {'seqs':>5} {'tokens':>7} {'peak MB':>9} {'held MB':>9} {'f32 pats MB':>10} "
                      f"{'time s':>7}   (held: cache tensors kept / store bytes on disk)")
                memory(cfg, gpt2_dir, args.threads, tmp)
    print(f"\nload average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
