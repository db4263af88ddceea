"""Healing settings compared on one built hybrid: learning rate, steps and how much text the norm gains train on.

    python benchmarks/heal_sweep.py MODEL CORPUS --heldout HELDOUT --programs PROGRAMS \
        (--checkpoint BUILD_OUT | --fraction F) [--max-len 128 --max-sequences 120] [--fresh 240]
        [--runs lr=5e-4 lr=5e-4,train=fresh,steps=120 lr=1e-4,params=norms+*.o_proj.weight ...] [--control]

The checkpoint is what ``headsurgeon build ... --out BUILD_OUT`` saved (its build.json names the heads, and the
control's heads when built with ``--control``); without one, ``--fraction F`` of the model's heads in select-IoU order
(build's control) are healed, which needs no per-head causal costs. Each run heals a fresh copy of the untuned hybrid with
``hs.heal(objective="kl")`` (distilled from the base, which is then its own control), early-stopped on the select
windows, and is judged on the test and held-out windows build judged on: KL(base ‖ hybrid) and ΔPPL per predicted
token with paired 95% bootstrap intervals over windows. ``train=synth`` trains on explain's synth windows (what
``build --heal`` does); ``train=fresh`` on ``--fresh`` windows of CORPUS read after explain's windows (never searched,
selected or tested on) plus the synth windows.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path


def _run_spec(text: str) -> dict:
    spec: dict = {"lr": 5e-4, "steps": 40, "train": "synth", "batch": 8, "params": "norms", "every": 5}
    for part in filter(None, text.split(",")):
        key, value = part.split("=")
        if key not in spec:
            raise SystemExit(f"unknown run key {key!r} in {text!r}: one of {sorted(spec)}")
        spec[key] = (value if key in ("train", "params") else
                     int(value) if key in ("steps", "batch", "every") else float(value))
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("corpus")
    ap.add_argument("--programs", required=True, help="explain's programs.json")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--fraction", type=float, default=None)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--max-sequences", type=int, default=120)
    ap.add_argument("--fresh", type=int, default=240)
    ap.add_argument("--runs", nargs="+", default=["lr=5e-4", "lr=5e-4,steps=120", "lr=5e-4,train=fresh,steps=120"],
                    help="comma-separated keys: lr, steps, batch, train (synth | fresh), every (steps between "
                         "checks), params (norms and/or parameter-name globs joined by +)")
    ap.add_argument("--control", action="store_true", help="heal the checkpoint's control (select-IoU order) too")
    ap.add_argument("--out", default=None, help="JSON lines of the results (default: CHECKPOINT.heal_sweep.jsonl beside it)")
    args = ap.parse_args()

    import torch

    from headsurgeon.build import more_windows
    from headsurgeon.configs import BuildConfig
    from headsurgeon.core import Head
    from headsurgeon.hub.checkpoint.load import load_hybrid
    from headsurgeon.surgery.corpus import load_corpus, make_sequences, read_documents
    from headsurgeon.surgery.measure.divergence import BaseDistributions, summarize, window_costs
    from headsurgeon.surgery.models.loading import load_model
    from headsurgeon.surgery.swap.heal import heal
    from headsurgeon.surgery.swap.replace import replace_heads
    from headsurgeon.synth.programset import ProgramSet

    torch.set_num_threads(1)
    programs = ProgramSet.load(args.programs)
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    build = json.loads((ckpt / "build.json").read_text()) if ckpt else None
    handle = load_model(args.model)
    cfg = BuildConfig.resolve(None, {"max_len": args.max_len, "max_sequences": args.max_sequences})
    splits = load_corpus(handle, args.corpus, **asdict(cfg.corpus))
    heldout = make_sequences(handle, read_documents(args.heldout), max_len=args.max_len,
                             max_sequences=args.max_sequences)
    fresh = more_windows(handle, args.corpus, cfg, args.fresh)
    measured = splits.test + heldout
    base = BaseDistributions(handle, measured)
    which = build["which"] if build else "explanation"
    if build is None:
        if args.fraction is None:
            raise SystemExit("give --checkpoint (a build's output) or --fraction")
        entries = programs.programs(which)

        def select_iou(h) -> float:
            scored = programs.entries[h].explanation if which == "explanation" else programs.entries[h].replacement
            value = scored.iou("select") if scored is not None else None
            return -1.0 if value is None else value

        k = int(round(args.fraction * handle.n_layers * handle.n_heads))
        iou_heads = sorted(entries, key=lambda h: (-select_iou(h), h))[:k]
    # a checkpoint folder holds only the files its manifest lists
    out = Path(args.out or (ckpt.with_name(ckpt.name + ".heal_sweep.jsonl") if ckpt else
                            Path(args.programs).with_name(f"heal_sweep_iou{args.fraction}.jsonl")))
    n_heads = len(build["heads"]) if build else len(iou_heads)
    print(f"{n_heads} heads; windows: synth {len(splits.synth)}, fresh {len(fresh)}, select "
          f"{len(splits.select)}, measured {len(measured)}; load average {os.getloadavg()}", flush=True)

    def judge(hybrid) -> dict:
        return summarize(window_costs(base, hybrid, hybrid.register_sequences)).to_json()

    def hybrids():
        if build is None:
            yield "iou order", replace_heads(handle, programs.subset(iou_heads), which=which, copy=True)
            return
        yield "causal", load_hybrid(ckpt)
        if args.control and build.get("control"):
            yield "control", replace_heads(handle, programs.subset([Head.parse(h) for h in build["control"]["heads"]]),
                                           which=which, copy=True)

    for text in ["none"] + args.runs:
        spec = None if text == "none" else _run_spec(text)
        for name, hybrid in hybrids():
            t0 = time.perf_counter()
            report = None
            if spec is not None:
                train = splits.synth + (fresh if spec["train"] == "fresh" else [])
                params = spec["params"].split("+")  # "norms+*.o_proj.weight": the norm gains and every o_proj
                report = heal(hybrid, train, params=params[0] if len(params) == 1 else params, steps=spec["steps"],
                              lr=spec["lr"], objective="kl", batch_size=spec["batch"], validation=splits.select,
                              check_every=spec["every"], progress=False)
            summary = judge(hybrid)
            row = {"run": text, "hybrid": name, "test": summary, "seconds": time.perf_counter() - t0,
                   "heal": None if report is None else report.to_json(), "load": os.getloadavg()[0]}
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            best = None if report is None else row["heal"].get("best_step")
            print(f"{text:40s} {name:8s} ΔPPL {summary['delta_ppl_pct']:+.2f}% "
                  f"[{summary['delta_ppl_ci95_pct'][0]:+.2f}, {summary['delta_ppl_ci95_pct'][1]:+.2f}]  "
                  f"KL {summary['kl']:.4f} [{summary['kl_ci95'][0]:.4f}, {summary['kl_ci95'][1]:.4f}]  "
                  f"kept step {best}  {row['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
