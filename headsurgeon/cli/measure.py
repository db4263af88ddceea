"""CLI subcommands that drive a live model: ``headsurgeon ablate``, ``headsurgeon eval`` and ``headsurgeon heads``."""
from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from dataclasses import asdict

from ..core.configs import add_flags, from_flags
from ..core import ABLATION_KINDS, WHICHES
from ..surgery.configs import MODEL_HELP, CorpusConfig, MeasureConfig, ModelConfig
from ..core import Head

if TYPE_CHECKING:  # the CLI starts light: the measuring stack is imported inside the commands
    from ..surgery.corpus import Splits
    from ..surgery.models.handle import ModelHandle
    from ..synth.programset import ProgramSet
    from ..surgery.measure.divergence import CostSummary


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Plain aligned text table (headsurgeon/surgery/measure/eval_format.py; imported here so the CLI starts light)."""
    from ..surgery.measure.eval_format import table

    return table(rows, columns)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("corpus", help="text file; documents separated by blank lines")
    add_flags(p, ModelConfig)
    add_flags(p, CorpusConfig)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_programs(path: str) -> Any:
    """The ProgramSet of a --programs file (checked before parsing; headsurgeon/synth/programs_file.py)."""
    from ..synth.programset import ProgramSet  # here: the CLI starts without the program stack

    return ProgramSet.load(path)


def trusted(programs: ProgramSet, trust: bool) -> ProgramSet:
    """``programs`` after the trust gate (headsurgeon/synth/trust.py): Python programs in any slot need --trust-programs."""
    from ..synth.trust import CLI_FLAG

    return programs.trusted(trust, flag=CLI_FLAG)


def _load(args: argparse.Namespace):
    from ..surgery.corpus import load_corpus
    from ..surgery.models.loading import load_model

    handle = load_model(args.model, **asdict(from_flags(ModelConfig, args)))
    splits = load_corpus(handle, args.corpus, **asdict(from_flags(CorpusConfig, args)))
    return handle, splits


def cmd_ablate(args: argparse.Namespace) -> int:
    from ..surgery.measure.ablate import ablate
    from ..surgery.measure.divergence import BaseDistributions, base_costs, summarize, window_costs
    from ..surgery.swap.errors import SurgeryError

    heads = [Head.parse(h) for chunk in args.heads for h in chunk.split(",") if h.strip()]
    groups = [[h] for h in heads] if args.each else [heads]
    programs = None
    if args.kind == "program":
        if not args.programs:
            raise SurgeryError("--kind program needs --programs programs.json")
        programs = load_programs(args.programs)
        missing = [Head.label(h) for h in heads if h not in programs]
        if missing:
            raise SurgeryError(f"{args.programs} has no program for {', '.join(missing[:20])}; ablate only heads "
                               "it covers")
        programs = trusted(programs.subset(heads), args.trust_programs)
    handle, splits = _load(args)
    if not handle.has_lm_head:
        return _ablate_headless(args, handle, splits, groups, programs)
    base = BaseDistributions(handle, splits.test)  # one base pass: every ablation is compared with it
    own = base_costs(base)
    tokens = int(own.tokens.sum())
    rows = [{"heads": "(none)", "kind": "-", "ppl": math.exp(own.nll_base.sum() / tokens), "delta_pct": 0.0,
             "kl": 0.0}]
    for group in groups:
        with ablate(handle, group, args.kind, reference=splits.synth, programs=programs, seed=args.seed) as hybrid:
            costs = window_costs(base, hybrid)
        rows.append({"heads": ",".join(Head.label(h) for h in group), "kind": args.kind,
                     "ppl": math.exp(costs.nll_other.sum() / tokens), **_cost_row(summarize(costs, seed=args.seed))})
    if args.json:
        print(json.dumps({"model": handle.name, "test_sequences": len(splits.test), "test_tokens": tokens,
                          "rows": rows}, indent=1))
    else:
        _print_ablations(handle.name, args.kind, len(splits.test), tokens, rows)
    return 0


def _cost_row(s: CostSummary) -> dict[str, Any]:
    """An ablation's ΔPPL and KL(base ‖ ablated) with their intervals and wide flags (a headsurgeon/surgery/measure/divergence.py
    CostSummary)."""
    return {"delta_pct": 100 * s.delta_ppl, "delta_ci95_pct": [100 * x for x in s.delta_ppl_ci95], "kl": s.kl,
            "kl_ci95": list(s.kl_ci95), "delta_wide": s.delta_wide, "kl_wide": s.kl_wide}


def _print_ablations(model: str, kind: str, windows: int, tokens: int, rows: list[dict[str, Any]]) -> None:
    """The ablations as a table, then a line per ablation whose interval is wider than its effect."""
    from ..surgery.measure.eval_format import wide_note

    shown = [{**r, "delta_ci": _interval(r.get("delta_ci95_pct"), "+.2f"), "kl_ci": _interval(r.get("kl_ci95"), ".4g")}
             for r in rows]
    print(f"{model}: {kind} ablation on {windows} test windows ({tokens} predicted tokens): perplexity, ΔPPL and "
          "KL(base ‖ ablated) in nats/token, with 95% paired bootstrap intervals over windows")
    print(_table(shown, [("heads", "heads", ""), ("kind", "kind", ""), ("ppl", "ppl", ".4f"),
                         ("delta_pct", "ΔPPL %", "+.2f"), ("delta_ci", "95% interval", ""), ("kl", "KL", ".4g"),
                         ("kl_ci", "95% interval", "")]))
    for r in rows:
        note = wide_note(r.get("delta_wide"), r.get("kl_wide"))
        if note:
            print(f"{r['heads']}: {note}")


def _interval(ci: list[float] | None, spec: str) -> str | None:
    """The interval as low .. high formatted with ``spec`` (None, shown as "-", where there is none)."""
    return f"{format(ci[0], spec)} .. {format(ci[1], spec)}" if ci else None


def _ablate_headless(args: argparse.Namespace, handle: ModelHandle, splits: Splits, groups: list,
                     programs: ProgramSet | None) -> int:
    """Ablations of an encoder without an LM head: the embedding distance to the base, not a perplexity."""
    from ..surgery.measure.ablate import ablate
    from ..surgery.measure.embedding import embedding_distance

    rows = []
    for group in groups:
        with ablate(handle, group, args.kind, reference=splits.synth, programs=programs, seed=args.seed) as hybrid:
            rows.append({"heads": ",".join(Head.label(h) for h in group), "kind": args.kind,
                         "embedding_distance": embedding_distance(handle, hybrid, splits.test)})
    if args.json:
        print(json.dumps({"model": handle.name, "test_sequences": len(splits.test), "rows": rows}, indent=1))
    else:
        print(f"{handle.name} has no language-model head: embedding distance (1 - cosine of mean-pooled final "
              f"hidden states) to the base on {len(splits.test)} test windows")
        print(_table(rows, [("heads", "heads", ""), ("kind", "kind", ""),
                            ("embedding_distance", "embedding distance", ".5f")]))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..surgery.measure.eval_report import evaluate_programs

    programs = trusted(load_programs(args.programs), args.trust_programs) if args.programs else None
    handle, splits = _load(args)
    report = evaluate_programs(handle, splits, programs, which=args.which, delta_ppl=args.per_head,
                               sweep=bool(args.sweep), order=args.order, tasks=args.tasks, task_limit=args.task_limit,
                               include_path=args.include_path, batch_size=args.batch_size, seed=args.seed,
                               progress=not args.json)
    if args.sweep and any(kr.sweep for kr in report.kinds.values()):
        report.plot(args.sweep)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.format())
    return 0


def cmd_heads(args: argparse.Namespace) -> int:
    from ..surgery.measure.head_finders import head_scores
    from ..surgery.models.loading import load_model

    handle = load_model(args.model, **asdict(from_flags(ModelConfig, args)))
    found = [head_scores(handle, kind, length=args.length, count=args.count, seed=args.seed) for kind in args.kind]
    if args.plot:
        for scores in found:
            scores.plot(args.plot.replace("KIND", scores.kind) if len(found) > 1 else args.plot)
    if args.json:
        print(json.dumps({s.kind: {"queries": s.n_queries, "scores": s.scores.round(4).tolist(),
                                   "top": [[str(h), round(v, 4)] for h, v in s.top(args.top)]} for s in found}, indent=1))
        return 0
    for scores in found:
        print(scores.table() if args.table else f"{scores.kind} ({scores.n_queries} queries): "
              + ", ".join(f"{h} {v:.2f}" for h, v in scores.top(args.top)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..surgery.configs import HEAD_KINDS

    p = sub.add_parser("heads", help="find induction, previous-token, first-token, self and duplicate-token heads "
                                     "(scores on repeated random tokens, as TransformerLens's head detector)")
    p.add_argument("model", help=MODEL_HELP)
    add_flags(p, ModelConfig)
    p.add_argument("--kind", nargs="+", choices=HEAD_KINDS, default=list(HEAD_KINDS), help="which finders (default: all)")
    p.add_argument("--top", type=int, default=5, help="how many of the best heads to list per kind")
    p.add_argument("--table", action="store_true", help="print the whole layer x head table of each kind")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="save a layer x head heatmap (with several kinds, KIND in the name is replaced by each)")
    p.add_argument("--length", type=int, default=24, help="tokens in the probe's random block (said twice)")
    p.add_argument("--count", type=int, default=8, help="probe sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe's random tokens")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_heads)

    p = sub.add_parser("ablate", help=f"perplexity, ΔPPL and KL against the base with heads ablated "
                                            f"({', '.join(ABLATION_KINDS)})")
    _common(p)
    p.add_argument("--heads", nargs="+", required=True, help="heads like L0H1 L3H5 (or comma-separated)")
    p.add_argument("--kind", default="zero", choices=ABLATION_KINDS)
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
    p.add_argument("--which", choices=("both", *WHICHES), default="both",
                   help="which programs every measurement swaps in, labelled side by side: each head's most faithful "
                        "program (replacement), its readable one (explanation; heads without one stay neural and "
                        "are counted), or both; JSON: every kind under 'kinds', the top-level hybrid fields "
                        "repeat the first kind measured")
    p.add_argument("--per-head", action="store_true", help="also ΔPPL with one head replaced at a time")
    p.add_argument("--sweep", default=None, metavar="PNG",
                   help="run the replacement sweep (ΔPPL; with --tasks also task scores at 0/25/50/100%%) and plot it "
                        "here: one panel per kind, log-scaled")
    add_flags(p, MeasureConfig, only=("order", "tasks", "task_limit", "include_path"))
    p.add_argument("--batch-size", type=int, default=16, help="requests per forward pass, for --tasks")
    p.set_defaults(func=cmd_eval)
