"""CLI subcommands that drive a live model: ``headsurgeon ablate`` and ``headsurgeon eval``."""
from __future__ import annotations

import argparse
import json
from typing import Any


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Plain aligned text table; columns are (key, header, format)."""
    cells = [[h for _, h, _ in columns]] + [[format(r[k], f) if r.get(k) is not None else "-" for k, _, f in columns]
                                            for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="hub id, local HF directory, llama2c:PATH.bin, or tiny-stories")
    p.add_argument("corpus", help="text file; documents separated by blank lines")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--max-sequences", type=int, default=200, help="windows read from the corpus (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the document-level split")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _load(args: argparse.Namespace):
    from .corpus import load_corpus
    from .loading import load_model

    handle = load_model(args.model, tokenizer=args.tokenizer, device=args.device)
    splits = load_corpus(handle, args.corpus, max_len=args.max_len, max_sequences=args.max_sequences, seed=args.seed)
    return handle, splits


def cmd_ablate(args: argparse.Namespace) -> int:
    from .ablate import ablate
    from .evaluate import perplexity
    from .replace import head_name, parse_head

    handle, splits = _load(args)
    heads = [parse_head(h) for chunk in args.heads for h in chunk.split(",") if h.strip()]
    groups = [[h] for h in heads] if args.each else [heads]
    base = perplexity(handle, splits.test, progress=False)
    rows = [{"heads": "(none)", "kind": "-", "ppl": base, "delta_pct": 0.0}]
    programs = None
    if args.kind == "program":
        from ..synth.programset import ProgramSet

        if not args.programs:
            raise ValueError("--kind program needs --programs programs.json")
        programs = ProgramSet.load(args.programs)
    for group in groups:
        with ablate(handle, group, args.kind, reference=splits.synth, programs=programs, seed=args.seed) as hybrid:
            ppl = perplexity(hybrid, splits.test, progress=False)
        rows.append({"heads": ",".join(head_name(h) for h in group), "kind": args.kind, "ppl": ppl,
                     "delta_pct": 100 * (ppl / base - 1)})
    if args.json:
        print(json.dumps({"model": handle.name, "test_sequences": len(splits.test), "rows": rows}, indent=1))
    else:
        print(f"{handle.name}: {args.kind} ablation, perplexity on {len(splits.test)} test windows")
        print(_table(rows, [("heads", "heads", ""), ("kind", "kind", ""), ("ppl", "ppl", ".4f"),
                            ("delta_pct", "ΔPPL %", "+.2f")]))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..synth.programset import ProgramSet
    from .evaluate import per_head_delta_ppl, perplexity, replacement_sweep
    from .replace import head_name, replace_heads

    handle, splits = _load(args)
    base = perplexity(handle, splits.test, progress=False)
    report: dict[str, Any] = {"model": handle.name, "test_sequences": len(splits.test), "ppl": base}
    lines = [f"{handle.name}: perplexity {base:.4f} on {len(splits.test)} test windows"]
    if args.programs:
        programs = ProgramSet.load(args.programs)
        with replace_heads(handle, programs) as hybrid:
            ppl = perplexity(hybrid, splits.test, progress=False)
        report["hybrid_ppl"] = ppl
        report["hybrid_delta_pct"] = 100 * (ppl / base - 1)
        lines.append(f"all {len(programs)} program heads: perplexity {ppl:.4f} ({report['hybrid_delta_pct']:+.2f}%)")
        if args.per_head:
            deltas = per_head_delta_ppl(handle, programs, splits.test, base_ppl=base, progress=not args.json)
            rows = [{"head": head_name(h), "program": programs.entries[h].program.text[:60],
                     "iou": programs.entries[h].iou("test"), "delta_pct": 100 * d} for h, d in deltas.items()]
            report["per_head"] = rows
            lines.append(_table(rows, [("head", "head", ""), ("iou", "IoU(test)", ".3f"),
                                       ("delta_pct", "ΔPPL %", "+.2f"), ("program", "program", "")]))
        if args.sweep:
            order = programs.ranked("test")
            rows = replacement_sweep(handle, programs, splits.test, order=order, out_png=args.sweep,
                                     progress=not args.json)
            report["sweep"] = rows
            lines.append(_table([{**r, **{k: 100 * r[k] for k in r if k.startswith("delta")}} for r in rows],
                                [("fraction", "replaced", ".0%"), ("n_heads", "heads", "d"),
                                 ("delta", "ΔPPL % (IoU order)", "+.2f"),
                                 ("delta_random_order", "random order", "+.2f"),
                                 ("delta_random_program", "random programs", "+.2f")]))
            lines.append(f"sweep plot: {args.sweep}")
    print(json.dumps(report, indent=1) if args.json else "\n".join(lines))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="perplexity with heads ablated (zero, mean, mean_output, uniform, resample, program)")
    _common(p)
    p.add_argument("--heads", nargs="+", required=True, help="heads like L0H1 L3H5 (or comma-separated)")
    p.add_argument("--kind", default="zero", choices=["zero", "mean", "mean_output", "uniform", "resample", "program"])
    p.add_argument("--each", action="store_true", help="ablate each head on its own instead of all together")
    p.add_argument("--programs", default=None, help="programs.json for --kind program")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("eval", help="perplexity of the model and of the hybrid with programs.json swapped in")
    _common(p)
    p.add_argument("--programs", default=None, help="programs.json (a ProgramSet) to swap in")
    p.add_argument("--per-head", action="store_true", help="also ΔPPL with one head replaced at a time")
    p.add_argument("--sweep", default=None, metavar="PNG", help="run the replacement sweep and plot it here")
    p.set_defaults(func=cmd_eval)
