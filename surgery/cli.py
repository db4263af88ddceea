"""CLI subcommands that drive a live model: ``headsurgeon ablate`` and ``headsurgeon eval``."""
from __future__ import annotations

import argparse
import math
import json
from typing import Any

from ..kernels.argtypes import add_window_args, task_limit
from .scorable import require_lm_head


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
    add_window_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_programs(path: str) -> Any:
    """The ProgramSet of a --programs file (checked before parsing; synth/programs_file.py)."""
    from ..synth.programset import ProgramSet  # here: the CLI starts without the program stack

    return ProgramSet.load(path)


def trusted(programs: Any, trust: bool) -> Any:
    """``programs`` after the trust gate (synth/trust.py): Python programs in any slot need --trust-programs."""
    from ..synth.trust import CLI_FLAG

    return programs.trusted(trust, flag=CLI_FLAG)


def _load(args: argparse.Namespace):
    from .corpus import load_corpus
    from .loading import load_model

    handle = load_model(args.model, tokenizer=args.tokenizer, device=args.device)
    splits = load_corpus(handle, args.corpus, max_len=args.max_len, max_sequences=args.max_sequences, seed=args.seed)
    return handle, splits


def cmd_ablate(args: argparse.Namespace) -> int:
    from .ablate import ablate
    from .evaluate import perplexity
    from .replace import SurgeryError, head_name, parse_head

    heads = [parse_head(h) for chunk in args.heads for h in chunk.split(",") if h.strip()]
    groups = [[h] for h in heads] if args.each else [heads]
    programs = None
    if args.kind == "program":
        if not args.programs:
            raise SurgeryError("--kind program needs --programs programs.json")
        programs = load_programs(args.programs)
        missing = [head_name(h) for h in heads if h not in programs]
        if missing:
            raise SurgeryError(f"{args.programs} has no program for {', '.join(missing[:20])}; ablate only heads "
                               "it covers")
        programs = trusted(programs.subset(heads), args.trust_programs)
    handle, splits = _load(args)
    if not handle.has_lm_head:
        return _ablate_headless(args, handle, splits, groups, programs)
    base = perplexity(handle, splits.test, progress=False)
    rows = [{"heads": "(none)", "kind": "-", "ppl": base, "delta_pct": 0.0}]
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


def _ablate_headless(args: argparse.Namespace, handle: Any, splits: Any, groups: list, programs: Any) -> int:
    """Ablations of an encoder without an LM head: the embedding distance to the base, not a perplexity."""
    from .ablate import ablate
    from .embedding import embedding_distance
    from .replace import head_name

    rows = []
    for group in groups:
        with ablate(handle, group, args.kind, reference=splits.synth, programs=programs, seed=args.seed) as hybrid:
            rows.append({"heads": ",".join(head_name(h) for h in group), "kind": args.kind,
                         "embedding_distance": embedding_distance(handle, hybrid, splits.test)})
    if args.json:
        print(json.dumps({"model": handle.name, "test_sequences": len(splits.test), "rows": rows}, indent=1))
    else:
        print(f"{handle.name} has no language-model head: embedding distance (1 - cosine of mean-pooled final "
              f"hidden states) to the base on {len(splits.test)} test windows")
        print(_table(rows, [("heads", "heads", ""), ("kind", "kind", ""),
                            ("embedding_distance", "embedding distance", ".5f")]))
    return 0


def _eval_headless(args: argparse.Namespace, handle: Any, splits: Any, programs: Any) -> int:
    """eval for an encoder without an LM head: the embedding distance between base and hybrid."""
    from .embedding import embedding_distance
    from .replace import replace_heads

    report: dict[str, Any] = {"model": handle.name, "test_sequences": len(splits.test), "lm_head": False}
    lines = [f"{handle.name} has no language-model head: perplexity is undefined; the cost of a swap is the "
             "embedding distance (1 - cosine of mean-pooled final hidden states)"]
    if programs is not None:
        with replace_heads(handle, programs, which=args.which) as hybrid:
            report["embedding_distance"] = embedding_distance(handle, hybrid, splits.test)
        lines.append(f"all {len(programs)} program heads: embedding distance {report['embedding_distance']:.5f} on "
                     f"{len(splits.test)} test windows")
    print(json.dumps(report, indent=1) if args.json else "\n".join(lines))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import delta_ppl_interval, per_head_delta_ppl, replacement_sweep, window_losses
    from .replace import head_name, replace_heads

    programs = trusted(load_programs(args.programs), args.trust_programs) if args.programs else None
    handle, splits = _load(args)
    if args.tasks:
        require_lm_head(handle)  # before minutes of perplexity: lm-eval cannot score this model
    if not handle.has_lm_head:
        return _eval_headless(args, handle, splits, programs)
    base_losses = window_losses(handle, splits.test, progress=False)
    base = math.exp(base_losses[0].sum() / base_losses[1].sum())
    report: dict[str, Any] = {"model": handle.name, "test_sequences": len(splits.test), "ppl": base}
    lines = [f"{handle.name}: perplexity {base:.4f} on {len(splits.test)} test windows"]
    if programs is not None:
        with replace_heads(handle, programs, which=args.which) as hybrid:
            losses = window_losses(hybrid, splits.test, progress=False)
        ppl = math.exp(losses[0].sum() / losses[1].sum())
        delta, low, high = delta_ppl_interval(base_losses, losses, seed=args.seed)
        report.update(hybrid_ppl=ppl, hybrid_delta_pct=100 * delta, hybrid_delta_ci95_pct=[100 * low, 100 * high])
        lines.append(f"all {len(programs)} program heads: perplexity {ppl:.4f} ({100 * delta:+.2f}%, 95% bootstrap "
                     f"interval over windows {100 * low:+.2f}% .. {100 * high:+.2f}%)")
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
    if args.tasks:
        report["downstream"] = _downstream(args, handle, programs, lines)
        if args.sweep and programs is not None:
            report["downstream_sweep"] = _downstream_sweep(args, handle, programs, report["sweep"], lines)
    print(json.dumps(report, indent=1) if args.json else "\n".join(lines))
    return 0


def _downstream_sweep(args: argparse.Namespace, handle: Any, programs: Any, ppl_rows: list[dict],
                      lines: list[str]) -> list[dict[str, Any]]:
    """``eval --tasks --sweep``: task scores at 0/25/50/100% of heads replaced, plotted beside the ΔPPL sweep."""
    from .downstream_sweep import downstream_sweep, plot_downstream_sweep

    rows = downstream_sweep(handle, programs, args.tasks, order=programs.ranked("test"), seed=args.seed,
                            limit=args.limit, include_path=args.include_path, batch_size=args.batch_size,
                            progress=not args.json)
    plot_downstream_sweep(rows, args.sweep, ppl_rows, title=f"{handle.name}: heads replaced in order of test IoU")
    lines.append("downstream sweep (same examples at every step):")
    lines.append(_table(rows, [("task", "task", ""), ("metric", "metric", ""), ("fraction", "replaced", ".0%"),
                               ("n_heads", "heads", "d"), ("value", "IoU order", ".4f"),
                               ("value_random_order", "random order", ".4f"),
                               ("value_random_program", "random programs", ".4f")]))
    lines.append(f"sweep plot (ΔPPL beside the tasks): {args.sweep}")
    return rows


def _downstream(args: argparse.Namespace, handle: Any, programs: Any, lines: list[str]) -> dict[str, Any]:
    """``eval --tasks``: lm-eval tasks on the base and the hybrid, same examples (surgery/downstream.py)."""
    from .downstream import downstream

    result = downstream(handle, args.tasks, programs, which=args.which, trust_programs=args.trust_programs,
                        limit=args.limit,
                        include_path=args.include_path, batch_size=args.batch_size, seed=args.seed)
    rows = [{**r, "base_se": r["base_stderr"], "hybrid_se": r.get("hybrid_stderr"),
             "ci": f"{r['delta_ci95'][0]:+.4f} .. {r['delta_ci95'][1]:+.4f}" if "delta_ci95" in r else None}
            for r in result["rows"]]
    columns = [("task", "task", ""), ("metric", "metric", ""), ("n", "n", "d"), ("base", "base", ".4f"),
               ("base_se", "± se", ".4f")]
    if programs is not None:
        columns += [("hybrid", "hybrid", ".4f"), ("hybrid_se", "± se", ".4f"), ("delta", "Δ", "+.4f"),
                    ("ci", "95% paired bootstrap", "")]
    lines.append(f"downstream (lm-eval, {'all' if args.limit is None else args.limit} examples per task, seed "
                 f"{args.seed}; se = lm-eval's standard error):")
    lines.append(_table(rows, columns))
    return result


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="perplexity with heads ablated (zero, mean, mean_output, uniform, resample, program)")
    _common(p)
    p.add_argument("--heads", nargs="+", required=True, help="heads like L0H1 L3H5 (or comma-separated)")
    p.add_argument("--kind", default="zero", choices=["zero", "mean", "mean_output", "uniform", "resample", "program"])
    p.add_argument("--each", action="store_true", help="ablate each head on its own instead of all together")
    p.add_argument("--programs", default=None, help="programs.json for --kind program")
    p.add_argument("--trust-programs", action="store_true",
                   help="run Python programs from --programs (untrusted code, even in the sandbox; DSL needs no trust)")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("eval", help="perplexity of the model and of the hybrid with programs.json swapped in")
    _common(p)
    p.add_argument("--programs", default=None, help="programs.json (a ProgramSet) to swap in")
    p.add_argument("--trust-programs", action="store_true",
                   help="run Python programs from --programs (untrusted code, even in the sandbox; DSL needs no trust)")
    p.add_argument("--which", choices=("replacement", "explanation"), default="replacement",
                   help="swap in each head's most faithful program, or its readable explanation")
    p.add_argument("--per-head", action="store_true", help="also ΔPPL with one head replaced at a time")
    p.add_argument("--sweep", default=None, metavar="PNG",
                   help="run the replacement sweep (ΔPPL; with --tasks also task scores at 0/25/50/100%%) and plot it here")
    p.add_argument("--tasks", default=None, help="lm-eval tasks, comma-separated: base and hybrid on the same "
                                                  "examples (needs pip install 'headsurgeon[eval]')")
    p.add_argument("--limit", type=task_limit, default=None, help="examples per task (or a fraction), for --tasks")
    p.add_argument("--include-path", action="append", default=None, metavar="DIR",
                   help="folder of local lm-eval task YAML files, for --tasks (repeatable)")
    p.add_argument("--batch-size", type=int, default=16, help="requests per forward pass, for --tasks")
    p.set_defaults(func=cmd_eval)
