"""Benchmark: program synthesis for every head of stories260K over TinyStories.

Workload: ``../shared/data/corpora/tinystories-valid.txt`` cut into documents (blank lines), tokenized
with stories260K's tok512 into windows of at most 128 tokens (BOS first), split by document 60/20/20
into ``synth`` / ``select`` / ``test`` (seeded). Patterns of all 40 heads (5 layers x 8 query heads)
are captured on ``--synth`` / ``--select`` / ``--test`` windows of the three splits. Each searcher
(enumerative; learned unless ``--no-learned``; the LLM agent only with ``--llm`` and an endpoint
in the environment) proposes candidates per head fitted on ``synth``; per searcher
and combined (all candidates of a head compete) the candidate with the best IoU on ``select`` is
chosen and reported on ``test`` (never the same sequences). Reported: mean / median test IoU, the
share of heads with IoU >= 0.9 and >= 0.7, and for scale the best single template per head
(first / self / prev(1..8) / uniform / same_token / same_token_recent / induction, chosen on select).

Cost of the swap (combined programs): perplexity over the ``test`` windows (up to ``--ppl-windows``),
heads replaced in order of select IoU (best first) vs a random order and vs random programs
(``surgery.evaluate.replacement_sweep``, steps 0 / 25% / 50%); per-head ΔPPL (one head replaced at a
time) and Spearman(test IoU, per-head ΔPPL) with a bootstrap 95% interval. Wall times per stage.

Run: ``python benchmarks/synthesis.py [--synth 360 --select 120 --test 120 --fit 96 --seed 0]``
(``--no-learned`` skips the learned searcher, ``--llm`` adds the agent).

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
TEMPLATES = ("first()", "self()", "uniform()", "same_token()", "same_token_recent()", "induction()") + tuple(
    f"prev({k})" for k in range(1, 9))


def test_scores(store, heads, programs, test_idx):
    """IoU and JSD on the test windows of each head's chosen program, through the kernels."""
    from headsurgeon.synth.metrics import score_many

    seqs = [store.sequences[i] for i in test_idx]
    out = {}
    for head in heads:
        real, lengths = store.batch(test_idx, [head])
        cand = programs[head].evaluate(seqs, causal=store.causal)[None]
        sc = score_many(real, cand, lengths, store.causal, ("iou", "jsd"))
        out[head] = (float(sc["iou"][0, 0]), float(sc["jsd"][0, 0]))
    return out


def choose(cands_by_source, heads):
    """Per head, the candidate with the best select IoU among the given sources."""
    best = {}
    for head in heads:
        pool = [c for cands in cands_by_source for c in cands.get(head, [])]
        pool = [c for c in pool if c.scores.get("select", {}).get("iou") is not None]
        best[head] = max(pool, key=lambda c: (c.scores["select"]["iou"], -len(c.program.text)))
    return best


def summary(ious):
    v = np.asarray(list(ious), dtype=float)
    return (f"mean {v.mean():.3f}  median {np.median(v):.3f}  >=0.9 {np.mean(v >= 0.9):.0%}  "
            f">=0.7 {np.mean(v >= 0.7):.0%}  min {v.min():.3f}  max {v.max():.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", type=int, default=360)
    ap.add_argument("--select", type=int, default=120)
    ap.add_argument("--test", type=int, default=120)
    ap.add_argument("--fit", type=int, default=96, help="synth windows the enumerative search fits on")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--ppl-windows", type=int, default=400, help="test windows for perplexity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-learned", action="store_true")
    ap.add_argument("--llm", action="store_true", help="also run the LLM agent (needs an endpoint in the env)")
    ap.add_argument("--no-ppl", action="store_true")
    args = ap.parse_args()
    if not CORPUS.exists() or not MODEL.exists():
        print(f"skipped: {SHARED} is absent (the ../shared data beside the checkout)")
        return 0

    import torch

    from headsurgeon.surgery.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents, split_sequences
    from headsurgeon.surgery.loading import load_model
    from headsurgeon.synth.enumerative import SearchStats, enumerative_search
    from headsurgeon.synth.program import Program

    torch.set_num_threads(2)
    walls: dict[str, float] = {}
    t0 = time.perf_counter()
    model = load_model(f"llama2c:{MODEL}", tokenizer=TOKENIZER)
    splits = split_sequences(make_sequences(model, read_documents(CORPUS), max_len=args.max_len),
                             (0.6, 0.2, 0.2), args.seed)
    rng = np.random.default_rng(args.seed)

    def sample(seqs, k):
        idx = np.sort(rng.permutation(len(seqs))[: min(k, len(seqs))])
        return [seqs[i] for i in idx]

    synth, select, test = sample(splits.synth, args.synth), sample(splits.select, args.select), \
        sample(splits.test, args.test)
    ppl_seqs = sample(splits.test, args.ppl_windows)
    seqs = synth + select + test
    synth_idx = list(range(len(synth)))
    select_idx = list(range(len(synth), len(synth) + len(select)))
    test_idx = list(range(len(synth) + len(select), len(seqs)))
    walls["load + corpus"] = time.perf_counter() - t0
    print(f"windows: synth {len(synth)}, select {len(select)}, test {len(test)} "
          f"(of {len(splits.synth)}/{len(splits.select)}/{len(splits.test)}); perplexity on {len(ppl_seqs)} "
          f"test windows ({sum(s.n for s in ppl_seqs)} tokens)", flush=True)

    t0 = time.perf_counter()
    store = capture(model, seqs, progress=False)
    walls["capture"] = time.perf_counter() - t0
    heads = store.heads

    sources: dict[str, dict] = {}
    t0 = time.perf_counter()
    stats = SearchStats()
    sources["enumerative"] = enumerative_search(store, synth_idx=synth_idx, select_idx=select_idx, seed=args.seed,
                                                fit_sequences=args.fit, progress=True, stats=stats)
    walls["search: enumerative"] = time.perf_counter() - t0
    print(f"enumerative: {stats.primitives} primitives, {stats.proposals} proposals, fit on "
          f"{stats.fit_sequences} windows; stages {', '.join(f'{k} {v:.0f}s' for k, v in stats.seconds.items())}",
          flush=True)

    if not args.no_learned:
        from headsurgeon.synth.learned import learned_search

        t0 = time.perf_counter()
        sources["learned"] = learned_search(store, heads=heads, synth_idx=synth_idx, select_idx=select_idx,
                                            seed=args.seed, progress=True)
        walls["search: learned"] = time.perf_counter() - t0
    if args.llm:
        from headsurgeon.synth.agent import AgentConfig, LLMAgent

        cfg = AgentConfig()
        if not cfg.base_url or not cfg.model:
            print("llm: skipped (set HEADSURGEON_LLM_BASE_URL and HEADSURGEON_LLM_MODEL)")
        else:
            t0 = time.perf_counter()
            sources["llm"] = LLMAgent(cfg).search(store, heads, synth_idx, select_idx)
            walls["search: llm"] = time.perf_counter() - t0

    # for scale: the best single template per head (chosen on select)
    t0 = time.perf_counter()
    templates = enumerative_search(store, synth_idx=synth_idx, select_idx=select_idx, seed=args.seed,
                                   fit_sequences=args.fit, progress=False, library=[Program.parse(t) for t in TEMPLATES],
                                   max_terms=1, gates=0, tables=False, top_k=len(TEMPLATES), spacy=False)
    walls["baseline: templates"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rows = {}
    chosen = {}
    for name, cands in list(sources.items()) + [("combined", None), ("single template", templates)]:
        pick = choose(list(sources.values()) if cands is None else [cands], heads)
        chosen[name] = pick
        rows[name] = test_scores(store, heads, {h: c.program for h, c in pick.items()}, test_idx)
    walls["test scoring"] = time.perf_counter() - t0

    print("\nbest program per head chosen by select IoU, reported on test:")
    for name, res in rows.items():
        print(f"  {name:16s} IoU {summary(v[0] for v in res.values())}  JSD mean "
              f"{np.mean([v[1] for v in res.values()]):.3f}")
    combined = chosen["combined"]
    print("\nper head (combined): test IoU, select IoU, source, program")
    for head in heads:
        c = combined[head]
        text = c.program.text
        print(f"  L{head[0]}H{head[1]}  {rows['combined'][head][0]:.3f}  {c.scores['select']['iou']:.3f}  "
              f"{c.source:11s} {text[:110]}{' ...' if len(text) > 110 else ''}")
    wins = {}
    for c in combined.values():
        wins[c.source] = wins.get(c.source, 0) + 1
    print(f"  heads won per source: {wins}")

    if not args.no_ppl:
        from headsurgeon.surgery.evaluate import per_head_delta_ppl, replacement_sweep, spearman_ci

        programs = {h: c.program for h, c in combined.items()}
        order = sorted(heads, key=lambda h: -combined[h].scores["select"]["iou"])
        t0 = time.perf_counter()
        sweep = replacement_sweep(model, programs, ppl_seqs, order=order, steps=(0.0, 0.25, 0.5), seed=args.seed,
                                  progress=False)
        walls["ppl: sweep"] = time.perf_counter() - t0
        print(f"\nreplacement sweep (perplexity on {len(ppl_seqs)} test windows; base {sweep[0]['ppl']:.3f}):")
        for r in sweep:
            print(f"  {r['fraction']:>4.0%} ({r['n_heads']:2d} heads)  by select IoU {r['delta']:+.1%}   random order "
                  f"{r['delta_random_order']:+.1%}   random programs {r['delta_random_program']:+.1%}")
        t0 = time.perf_counter()
        per_head = per_head_delta_ppl(model, programs, ppl_seqs, base_ppl=sweep[0]["ppl"], progress=False)
        walls["ppl: per head"] = time.perf_counter() - t0
        ious = [rows["combined"][h][0] for h in heads]
        deltas = [per_head[h] for h in heads]
        rho, lo, hi = spearman_ci(ious, deltas, seed=args.seed)
        print(f"  per-head ΔPPL: median {np.median(deltas):+.2%}, max {max(deltas):+.2%}; "
              f"Spearman(test IoU, ΔPPL) = {rho:+.2f} (95% CI {lo:+.2f} .. {hi:+.2f})")

    print("\nwall time: " + ", ".join(f"{k} {v:.0f}s" for k, v in walls.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
