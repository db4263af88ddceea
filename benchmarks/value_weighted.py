"""Measurement: does value-weighted fidelity (headsurgeon/synth/weighted.py) track what a swap costs, and what do the explanations
it selects cost? SmolLM2-135M-Instruct from its GGUF, windows of ``--corpus`` as ``explain --max-len 128
--max-sequences 120`` makes them (24 select windows).

``spearman``: every swap of a per-head cost file (headsurgeon/surgery/measure/head_costs.py ``head_costs(..., path=)``: the
explanation and 60-character frontier point of each head of ``--programs``) scored on the select windows of a store
captured with value norms, by IoU, JSD, value-weighted IoU and JSD; Spearman of each with the swap's KL per
predicted token and with its ratio to the head's mean-ablation KL, signed so that + means "better fidelity, lower
cost", with a bootstrap interval over swaps.

``costs``: per head, KL(base ‖ swapped) of each given program set's explanation over the KL of mean-ablating the head
(``HeadCosts.ratio``), on the select windows, with a paired bootstrap interval over windows (the windows hold
``tokens`` predicted tokens). One thread; the load average is printed (other jobs share this machine).

Run: ``python benchmarks/value_weighted.py spearman STORE PROGRAMS.json COSTS.json`` or
``python benchmarks/value_weighted.py costs LABEL=PROGRAMS.json [...] --heads L17H3,L18H6``. Figures: RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

import headsurgeon as hs
from headsurgeon.core import Head
from headsurgeon.surgery.measure.head_costs import head_costs
from headsurgeon.surgery.patterns.store import AttentionStore
from headsurgeon.synth.select import score_programs
from headsurgeon.synth.sequence import sequences_key

GGUF = Path("/tmp/hs-runs/gguf.path")
MEASURES = ("iou", "jsd", "vw_iou", "vw_jsd")


def _windows(model: object, corpus: str) -> object:
    return hs.load_corpus(model, corpus, max_len=128, max_sequences=120)


def _interval(values: np.ndarray, fn, n: int = 2000, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    boots = [fn(rng.integers(0, len(values), len(values))) for _ in range(n)]
    return [round(float(x), 3) for x in np.nanpercentile(boots, [2.5, 97.5])]


def spearman(store_dir: str, programs: str, costs_file: str, corpus: str) -> None:
    import json

    model = hs.load_model(GGUF.read_text().strip())
    store = AttentionStore.load(store_dir)
    splits = _windows(model, corpus)
    if sequences_key(splits.all) != sequences_key(store.sequences):
        raise SystemExit(f"{store_dir} holds other windows than --corpus makes; capture it from the same corpus")
    select = list(splits.indices["select"])
    swaps = json.loads(Path(costs_file).read_text())["swaps"]
    kl = {tuple(k.split(":")[:2]) + (k.split(":")[-1],): sum(v["kl"]) / max(sum(v["tokens"]), 1)
          for k, v in swaps.items()}
    mean = {h: v for (h, variant, _), v in kl.items() if variant == "mean"}
    rows = []
    for key, entry in hs.ProgramSet.load(programs).entries.items():
        name = f"L{key[0]}H{key[1]}"
        points = [("explanation", entry.explanation)] + [("frontier", f) for f in entry.frontier or [] if f.budget == 60]
        for variant, point in points:
            if point is None or (name, variant, point.program.hash) not in kl or not mean.get(name):
                continue
            got = score_programs(store, [key], [point.program], select)
            rows.append(([float(got[m][0, 0]) for m in MEASURES], kl[name, variant, point.program.hash],
                         kl[name, variant, point.program.hash] / mean[name]))
    scores = np.array([r[0] for r in rows])
    targets = {"kl": np.array([r[1] for r in rows]), "ratio": np.array([r[2] for r in rows])}
    print(f"{len(rows)} swaps with a measured KL (select windows: {len(select)})")
    for j, m in enumerate(MEASURES):
        sign = 1.0 if m.endswith("jsd") else -1.0  # + : better fidelity goes with lower cost
        parts = []
        for name, t in targets.items():
            rho = sign * spearmanr(scores[:, j], t).statistic
            ci = _interval(t, lambda i: sign * spearmanr(scores[i, j], t[i]).statistic)
            parts.append(f"vs {name}: {rho:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]")
        print(f"{m:7s} " + "   ".join(parts))


def costs(sets: list[str], heads: str, corpus: str) -> None:
    model = hs.load_model(GGUF.read_text().strip())
    windows = _windows(model, corpus).select
    labelled = [s.split("=", 1) for s in sets]
    programs = {label: hs.ProgramSet.load(path) for label, path in labelled}
    keys = [tuple(Head.parse(h)) for h in heads.split(",")]
    keys = [(int(a), int(b)) for a, b in keys]
    base = programs[labelled[0][0]]
    extra = {h: {label: ps.entries[h].explanation.program for label, ps in programs.items()
                 if ps.entries.get(h) and ps.entries[h].explanation is not None} for h in keys}
    got = head_costs(model, base, windows, heads=keys, which=("explanation",), extra=extra, progress=False)
    print(f"{len(windows)} select windows, {got.tokens} predicted tokens; load average {os.getloadavg()[0]:.1f}")
    for h in keys:
        mean = got.costs[h]["mean"]
        print(f"L{h[0]}H{h[1]}  mean-ablation KL {mean.kl.sum() / mean.tokens.sum():.5f} nats/token")
        for label, ps in programs.items():
            if label not in got.costs[h]:
                continue
            c = got.costs[h][label]
            ratio = c.kl.sum() / mean.kl.sum()
            ci = _interval(mean.kl, lambda i: c.kl[i].sum() / mean.kl[i].sum())
            print(f"    {label:8s} {ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]  {ps.entries[h].explanation.text}")


def main() -> None:
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("spearman")
    p.add_argument("store"), p.add_argument("programs"), p.add_argument("costs")
    p.add_argument("--corpus", default="/tmp/hs-runs/A.txt")
    c = sub.add_parser("costs")
    c.add_argument("sets", nargs="+", help="LABEL=programs.json; the first one's heads are measured")
    c.add_argument("--heads", required=True)
    c.add_argument("--corpus", default="/tmp/hs-runs/A.txt")
    args = parser.parse_args()
    if args.what == "spearman":
        spearman(args.store, args.programs, args.costs, args.corpus)
    else:
        costs(args.sets, args.heads, args.corpus)


if __name__ == "__main__":
    main()
