"""Benchmark: streaming attention capture vs a plain forward (throughput) and vs run_with_cache (memory).

Models: stories260K (llama2.c, 5 layers x 8 heads, d_head 8) from ../shared/data, and a randomly
initialised GPT-2-small-shaped model (transformers GPT2Config defaults: 12 x 12 heads, d_model 768)
with the real GPT-2 BPE tokenizer from ../shared/data/tokenizers/gpt2. Text: tinystories-valid.txt,
documents split on blank lines, windows from ``make_sequences`` (stories260K: 256 tokens, GPT-2: 64).

Throughput: ``capture(..., out=DIR)`` (dense and top-q, streamed to safetensors shards) vs a plain
forward without hooks over the same padded batches (capture's own order: shards sorted by length).
Methods are interleaved within each repeat; ratio = median over repeats of t(plain)/t(method). The
capture runs are instrumented (time in ``forward_patterns`` / ``put`` / ``write_shard`` /
``save_manifest``) and a diagnostic section times the conversions inside ``put`` on real patterns.

Memory: one fresh subprocess per (model, method, corpus size); peak RSS (VmHWM, reset through
/proc/self/clear_refs after loading, warm-up and gc) minus the RSS at that point. Methods: streaming
capture to disk (dense, top-q) vs ``run_with_cache(names_filter=hook_pattern)`` keeping every batch's
cache in a list (as a naive user would; run under no_grad, which favours it). Corpus sizes N and 4N.

Run: ``python benchmarks/capture.py [--quick] [--threads 1] [--models stories,gpt2]``.

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
    n_memory: int  # N; memory is also measured at 4N
    mem_len: int  # memory runs use only full windows of exactly this many tokens (same batch shapes at N and 4N)


def configs(quick: bool) -> dict[str, Config]:
    """Default and --quick workloads (the GPT-2 part stays small: it is ~100x costlier per token)."""
    if quick:
        return {"stories": Config("stories", 256, 16, 32, 64, 3, 32, 128),
                "gpt2": Config("gpt2", 64, 8, 8, 8, 2, 8, 64)}
    return {"stories": Config("stories", 256, 16, 64, 128, 5, 64, 128),
            "gpt2": Config("gpt2", 64, 8, 16, 16, 3, 16, 64)}


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
    from headsurgeon.surgery.loading import load_model

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
    """Same forward arguments as capture's forward_patterns (mask only for bidirectional models)."""
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


@contextmanager
def instrument(acc: Counter) -> Iterator[None]:
    """Accumulate wall time spent in capture's forward_patterns and the store's put/write/manifest calls."""
    import headsurgeon.surgery.capture as cap
    from headsurgeon.surgery.store import AttentionStore

    targets = [(cap, "forward_patterns")] + [(AttentionStore, n) for n in ("put", "write_shard", "save_manifest")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets]

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += time.perf_counter() - t0
        return wrapper

    try:
        for obj, name, fn in saved:
            setattr(obj, name, timed(name, fn))
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


# --------------------------------------------------------------------------- throughput
def run_capture(handle: Any, seqs: list, cfg: Config, mode: str, out: Path, acc: Counter | None = None) -> float:
    """Seconds for one instrumented streaming capture to a fresh directory."""
    from headsurgeon.surgery.capture import capture

    shutil.rmtree(out, ignore_errors=True)
    with instrument(acc if acc is not None else Counter()):
        t0 = time.perf_counter()
        capture(handle, seqs, out=out, mode=mode, batch_size=cfg.batch_size, shard_size=cfg.shard_size,
                progress=False)
        return time.perf_counter() - t0


def throughput(handle: Any, cfg: Config, repeats: int, tmp: Path) -> dict:
    """Interleaved repeats of plain forward, no-op hooks and capture (dense, top-q); medians and ratios."""
    from headsurgeon.surgery.capture import padded_batch

    seqs = corpus_sequences(handle, cfg.max_len, cfg.n_throughput)
    tokens = sum(s.n for s in seqs)
    batches = [padded_batch(b) for b in capture_batches(seqs, cfg.batch_size, cfg.shard_size)]
    padded = sum(int(ids.numel()) for ids, _ in batches)
    breakdown = {"dense": Counter(), "topq": Counter()}
    methods: dict[str, Callable[[], float]] = {
        "plain forward": lambda: timed(lambda: plain_forward(handle, batches)),
        "pattern hooks (no-op)": lambda: timed(lambda: noop_hooks(handle, batches)),
        "capture dense -> disk": lambda: run_capture(handle, seqs, cfg, "dense", tmp / "dense",
                                                     acc=breakdown["dense"]),
        "capture topq -> disk": lambda: run_capture(handle, seqs, cfg, "topq", tmp / "topq", acc=breakdown["topq"]),
    }
    plain_forward(handle, batches[:1])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each repeat
            times[name].append(methods[name]())
    plain = times["plain forward"]
    rows = {name: {"tok_s": tokens / statistics.median(ts), "ratio": statistics.median(p / t for p, t in zip(plain, ts)),
                   "median_s": statistics.median(ts)} for name, ts in times.items()}
    for mode, acc in breakdown.items():
        total = sum(times[f"capture {mode} -> disk"])
        rows[f"capture {mode} -> disk"]["breakdown"] = {k: v / total for k, v in acc.items()}
    result = {"tokens": tokens, "padded_tokens": padded, "sequences": len(seqs), "repeats": repeats, "rows": rows}
    return result


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- diagnostics
def diagnose(handle: Any, cfg: Config, tmp: Path, manifest: bool = True) -> dict:
    """Time put's conversions on one real batch of patterns, and (``manifest``) one manifest save for the whole corpus."""
    from headsurgeon.surgery.capture import forward_patterns
    from headsurgeon.surgery.store import AttentionStore, topq_count

    seqs = corpus_sequences(handle, cfg.max_len, cfg.n_throughput)
    batch = capture_batches(seqs, cfg.batch_size, cfg.shard_size)[-1]  # longest windows
    pats = [np.ascontiguousarray(p) for p in forward_patterns(handle, batch)]
    elements = sum(p.size for p in pats)
    out: dict[str, Any] = {"elements": elements}
    t_np = best_of(lambda: [p.astype(np.float16) for p in pats])
    t_torch = best_of(lambda: [torch.from_numpy(p).half().numpy() for p in pats])
    out["f16_numpy_Mel_s"], out["f16_torch_Mel_s"] = elements / t_np / 1e6, elements / t_torch / 1e6
    out["f16_identical"] = all(np.array_equal(p.astype(np.float16), torch.from_numpy(p).half().numpy()) for p in pats)
    flat = np.concatenate([p.ravel() for p in pats])
    out["zero_frac"] = float((flat == 0).mean())
    out["f16_subnormal_frac"] = float(((flat > 0) & (flat < 6.104e-5)).mean())
    store = AttentionStore(batch, handle.n_layers, handle.n_heads, "topq")
    out["topq_put_Mel_s"] = elements / best_of(lambda: [store.put(i, p) for i, p in enumerate(pats)]) / 1e6
    out["q_example"] = (batch[-1].n, topq_count(batch[-1].n, store.q_frac))
    if not manifest:
        return out
    every = corpus_sequences(handle, cfg.max_len, None)
    full = AttentionStore(every, handle.n_layers, handle.n_heads, "dense", directory=tmp / "manifest",
                          shard_size=cfg.shard_size)
    full.directory.mkdir(parents=True, exist_ok=True)
    t_manifest = timed(lambda: full.save_manifest(range(full.n_shards // 2)))
    plain = timed(lambda: forward_patterns(handle, batch)) / len(batch)  # s per (long) sequence
    out.update(corpus_windows=len(every), n_shards=full.n_shards, manifest_s=t_manifest,
               manifest_MB=(full.directory / "manifest.json").stat().st_size / MB,
               manifest_total_s=t_manifest * (full.n_shards + 1), forward_total_s_upper=plain * len(every))
    return out


def best_of(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Fastest of a few calls (micro-benchmarks on a shared CPU)."""
    return min(timed(fn) for _ in range(repeats))


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
    from headsurgeon.surgery.capture import capture, padded_batch

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
def report_throughput(name: str, res: dict, threads: int) -> None:
    """Print the throughput table of one model."""
    print(f"\n[{name}] throughput: {res['sequences']} windows, {res['tokens']} tokens ({res['padded_tokens']} padded), "
          f"{res['repeats']} repeats, torch threads={threads}")
    print(f"  {'method':<24} {'tok/s':>9} {'ratio':>7}   breakdown of capture time")
    for method, row in res["rows"].items():
        parts = row.get("breakdown")
        detail = ""
        if parts:
            other = 1 - sum(parts.values())
            detail = ", ".join(f"{k} {100 * v:.0f}%" for k, v in parts.items()) + f", other {100 * other:.0f}%"
        flag = "" if method in ("plain forward", "pattern hooks (no-op)") else (
            "  OK" if row["ratio"] >= 0.8 else "  < 0.8 goal")
        print(f"  {method:<24} {row['tok_s']:>9.0f} {row['ratio']:>7.2f}{flag}   {detail}")


def report_diagnose(name: str, d: dict) -> None:
    """Print the diagnostic lines of one model."""
    print(f"[{name}] diagnostics on one batch of real patterns ({d['elements'] / 1e6:.1f} M elements; "
          f"{100 * d['zero_frac']:.0f}% exact zeros, {100 * d['f16_subnormal_frac']:.0f}% below float16's normal range)")
    print(f"  float32->float16: numpy astype {d['f16_numpy_Mel_s']:.0f} M el/s, torch .half() "
          f"{d['f16_torch_Mel_s']:.0f} M el/s (bit-identical: {d['f16_identical']})")
    print(f"  top-q select (n={d['q_example'][0]}, q={d['q_example'][1]}): store.put (torch.topk) "
          f"{d['topq_put_Mel_s']:.0f} M el/s")
    if "manifest_s" not in d:
        return
    print(f"  manifest: whole corpus = {d['corpus_windows']} windows, {d['n_shards']} shards; one save "
          f"{d['manifest_s']:.2f} s ({d['manifest_MB']:.1f} MB), rewritten after every shard -> "
          f"{d['manifest_total_s']:.0f} s per capture vs <= {d['forward_total_s_upper']:.0f} s of forward_patterns")


def main() -> None:
    """Parse arguments, run throughput, diagnostics and memory for each model, print everything."""
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
    print(f"torch {torch.__version__} (threads={torch.get_num_threads()}), transformer-lens {version('transformer-lens')}, "
          f"numpy {np.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared machine)")
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
                report_diagnose(name, diagnose(handle, cfg, tmp / f"diag_{model}", manifest=model == "stories"))
                del handle
                gc.collect()
            if not args.skip_memory:
                print(f"[{name}] memory: peak RSS above the post-load baseline, one fresh process per row "
                      f"(batch {cfg.batch_size}, shard {cfg.shard_size}, only full windows of {cfg.mem_len} tokens)")
                print(f"  {'method':<17} {'seqs':>5} {'tokens':>7} {'peak MB':>9} {'held MB':>9} {'f32 pats MB':>10} "
                      f"{'time s':>7}   (held: cache tensors kept / store bytes on disk)")
                memory(cfg, gpt2_dir, args.threads, tmp)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
