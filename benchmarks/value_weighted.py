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

``profile``: where the given heads' moved mass (α_ij·‖v_j W_O‖, from a store captured with value norms) goes on the
store windows ``--windows A-B``, by key category: the first token, the keys after an earlier occurrence of the query's
token (``induction()``; of them, those whose two tokens before match the query's last two: ``ngram_induction(2)``),
the same after a case/space-insensitive match, the match's next key, earlier occurrences themselves, the query, the
previous key, punctuation and the key after it; then, on rows with an ``induction()`` match, the heads' mean non-sink
share by the query's part of speech.

Run: ``python benchmarks/value_weighted.py spearman STORE PROGRAMS.json COSTS.json``,
``python benchmarks/value_weighted.py costs LABEL=PROGRAMS.json [...] --heads L17H3,L18H6`` or
``python benchmarks/value_weighted.py profile STORE --heads L17H3,L18H6 --windows 72-96``. Figures: RESULTS.md.
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
        first, second = [label for label, _ in labelled[:2]] + [None] * (2 - min(2, len(labelled)))
        if second is not None and first in got.costs[h] and second in got.costs[h]:
            a, b = got.costs[h][first].kl, got.costs[h][second].kl
            d = (a.sum() - b.sum()) / mean.kl.sum()
            ci = _interval(mean.kl, lambda i: (a[i].sum() - b[i].sum()) / mean.kl[i].sum())
            print(f"    {first} - {second}: {d:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] (paired over windows)")


_CATEGORIES = ("sink", "2-gram match", "1-gram match", "fuzzy match", "match + 1", "same token", "self", "prev(1)",
               "punctuation", "after punctuation", "other")


def _norm(token: str) -> str:
    return token.replace("Ġ", "").replace("▁", "").lower()


def _punct(token: str) -> bool:
    t = _norm(token)
    return t != "" and all(ch in ".,!?;:\"'Ċ\n" for ch in t)


def _category(ids: np.ndarray, norm: list[str], tokens: list[str], q: int, j: int) -> str:
    """The first category of ``_CATEGORIES`` that key j of query q falls in."""
    if j == 0:
        return "sink"
    if ids[j - 1] == ids[q] and j - 1 < q:
        return "2-gram match" if j >= 2 and q >= 1 and ids[j - 2] == ids[q - 1] else "1-gram match"
    checks = (("fuzzy match", norm[j - 1] == norm[q] != ""), ("match + 1", j >= 2 and ids[j - 2] == ids[q]),
              ("same token", j < q and ids[j] == ids[q]), ("self", j == q), ("prev(1)", j == q - 1),
              ("punctuation", _punct(tokens[j])), ("after punctuation", _punct(tokens[j - 1])))
    return next((name for name, hit in checks if hit), "other")


def profile(store_path: str, heads: str, windows: str) -> None:
    from headsurgeon.surgery.patterns.store import AttentionStore
    from headsurgeon.synth.dsl.bounds import KNOWN_POS_TAGS
    from headsurgeon.synth.features import batch_feature_arrays

    store = AttentionStore.load(store_path)
    lo, hi = (int(x) for x in windows.split("-"))
    idx = list(range(lo, min(hi, len(store.sequences))))
    seqs = [store.sequences[i] for i in idx]
    pos = batch_feature_arrays(seqs, ["pos"])["pos"]
    print(f"{len(idx)} windows ({windows}), {sum(s.n - 1 for s in seqs)} query rows (row 0 left out); "
          f"load average {os.getloadavg()[0]:.1f}")
    print("moved share (raw share) of each key category, all rows:")
    for h in [tuple(Head.parse(x)) for x in heads.split(",")]:
        moved = dict.fromkeys(_CATEGORIES, 0.0)
        raw = dict.fromkeys(_CATEGORIES, 0.0)
        share: dict[str, list[float]] = {}
        for b, (i, s) in enumerate(zip(idx, seqs)):
            p, w = store.pattern(i, *h), store.norms(i)[h].astype(np.float64)
            norm = [_norm(t) for t in s.tokens]
            for q in range(1, s.n):
                for j in range(q + 1):
                    c = _category(s.ids, norm, s.tokens, q, j)
                    moved[c] += p[q, j] * w[j]
                    raw[c] += p[q, j]
                if any(s.ids[j - 1] == s.ids[q] for j in range(1, q + 1)):
                    tag = KNOWN_POS_TAGS[pos[b, q]] if pos[b, q] >= 0 else "-"
                    share.setdefault(tag, []).append(1.0 - float(p[q, 0]))
        total, rows = sum(moved.values()), sum(raw.values())
        print(f"  L{h[0]}H{h[1]}: " + ", ".join(f"{c} {moved[c] / total:.3f} ({raw[c] / rows:.3f})" for c in _CATEGORIES))
        tags = sorted(share, key=lambda t: -len(share[t]))[:7]
        print("    match rows' non-sink share by query POS: " +
              ", ".join(f"{t} {np.mean(share[t]):.2f} (n={len(share[t])})" for t in tags))


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
    f = sub.add_parser("profile")
    f.add_argument("store")
    f.add_argument("--heads", required=True)
    f.add_argument("--windows", default="72-96", help="store indices A-B (B excluded)")
    args = parser.parse_args()
    if args.what == "spearman":
        spearman(args.store, args.programs, args.costs, args.corpus)
    elif args.what == "profile":
        profile(args.store, args.heads, args.windows)
    else:
        costs(args.sets, args.heads, args.corpus)


if __name__ == "__main__":
    main()
