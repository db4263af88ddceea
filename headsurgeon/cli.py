"""The ``headsurgeon`` command line: one subcommand per pipeline stage."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from .kernels.argtypes import add_window_args, fraction, non_negative_float, positive_int, task_limit
from .kernels.core import SPLITS, HeadsurgeonError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}
MESSAGE_LIMIT = 1000


def _model_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    if optional:
        p.add_argument("model", nargs="?", default="tiny-stories",
                       help="hub id, local HF directory, llama2c:PATH.bin, or tiny-stories (default)")
    else:
        p.add_argument("model", help="hub id, local HF directory, llama2c:PATH.bin, or tiny-stories")
    p.add_argument("--tokenizer", default=None, help="tokenizer path (sentencepiece .model, tokenizer.bin, HF dir)")
    p.add_argument("--device", default="cpu")


def _corpus_args(p: argparse.ArgumentParser) -> None:
    add_window_args(p)
    p.add_argument("--separator", default=None, help="document separator (default: blank lines)")


def cmd_info(args: argparse.Namespace) -> int:
    from headsurgeon.surgery.loading import load_model

    handle = load_model(args.model, tokenizer=args.tokenizer, device=args.device)
    info = handle.describe()
    sample = args.sample
    ids = handle.tokenizer(sample, add_special_tokens=False)["input_ids"]
    info["tokenizer_sample"] = {"text": sample, "ids": ids, "tokens": handle.tokenizer.convert_ids_to_tokens(ids)}
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"model        {info['name']}")
    print(f"layers       {info['n_layers']}")
    print(f"query heads  {info['n_heads']} per layer (key/value heads: {info['n_kv_heads']}), d_head {info['d_head']}")
    print(f"d_model      {info['d_model']}, vocab {info['vocab_size']}, context {info['n_ctx']}")
    print(f"attention    {info['attention']}; BOS id {info['bos_id']} (prepended: {info['prepend_bos']})")
    print(f"pattern hook {info['pattern_hooks'][0]} ... {info['pattern_hooks'][-1]}  [batch, head, query, key]")
    print(f"tokenizer    {sample!r} -> {info['tokenizer_sample']['tokens']}")
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    from headsurgeon.surgery.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents
    from headsurgeon.surgery.loading import load_model

    documents = read_documents(args.corpus, args.separator)  # a missing corpus fails before the model loads
    handle = load_model(args.model, tokenizer=args.tokenizer, device=args.device)
    seqs = make_sequences(handle, documents, max_len=args.max_len, max_sequences=args.max_sequences)
    store = capture(handle, seqs, out=args.out, mode=args.mode, q_frac=args.q, batch_size=args.batch_size,
                    shard_size=args.shard_size)
    print(f"captured {len(store)} sequences × {handle.n_layers * handle.n_heads} heads ({args.mode}) -> {args.out}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from headsurgeon.explain import explain

    agent_config = None
    if args.llm_model or args.llm_base_url:
        from headsurgeon.synth.search.llm import AgentConfig

        agent_config = AgentConfig(**{k: v for k, v in (("model", args.llm_model), ("base_url", args.llm_base_url),
                                                         ("cost_cap", args.llm_cost_cap)) if v is not None})
    library: list = []
    if args.library:  # untrusted files: parsed and validated here, run only in the sandbox (synth/eaps.py)
        from headsurgeon.synth.eaps import load_library

        library = load_library(args.library, budget=args.library_budget)
    result = explain(args.model, args.corpus, args.out, tokenizer=args.tokenizer, max_len=args.max_len,
                     max_sequences=args.max_sequences, seed=args.seed, searchers=args.searchers,
                     agent_config=agent_config, library=library,
                     executor="serial" if args.ray is None else "ray", address=args.ray or None,
                     heads_per_task=args.heads_per_task, delta_ppl=args.delta_ppl, store_url=args.store_url,
                     tasks=args.tasks, task_limit=args.limit, include_path=args.include_path, device=args.device,
                     capture_only=args.capture_only)
    if args.capture_only:
        print(f"captured {len(result.store)} windows into {result.out / 'store'}; run the same command without "
              "--capture-only (on this machine or a Ray driver that sees OUT) to search, select and report")
        return 0
    print(result.summary_table())
    for note in result.notes:
        print(note)
    print(f"wrote {result.out / 'programs.json'} and {result.out / 'report.html'}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from headsurgeon.surgery.corpus import load_corpus
    from headsurgeon.surgery.loading import load_model
    from headsurgeon.surgery.score import score
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.vocab import Vocabulary

    handle = load_model(args.model, tokenizer=args.tokenizer, device=args.device)
    program = Program.parse(args.program, vocab=Vocabulary.from_tokenizer(handle.tokenizer))
    splits = load_corpus(handle, args.corpus, max_len=args.max_len, max_sequences=args.max_sequences, seed=args.seed)
    windows = splits.synth + splits.select + splits.test if args.split == "all" else getattr(splits, args.split)
    got = score(program, handle, args.head, sequences=windows)
    if args.json:
        print(json.dumps({"head": args.head, "program": program.text, "split": args.split, **got}, indent=1))
    else:
        print(f"{args.head} vs {program.text}: soft IoU {got['iou']:.3f}, JSD {got['jsd']:.3f}, top-q IoU "
              f"{got['topq']:.3f} on {got['n']} {args.split} windows")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from headsurgeon.demo import format_summary, run_demo

    summary = run_demo(args.out, max_sequences=args.max_sequences, max_len=args.max_len)
    print(json.dumps({k: v for k, v in summary.items() if k != "table"}, indent=1) if args.json
          else format_summary(summary))
    if not summary["logits_identical_after_reload"]:
        print("headsurgeon demo: error: the reloaded hybrid's logits differ from the saved one's", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headsurgeon", description=__doc__)
    from headsurgeon import __version__

    parser.add_argument("--version", action="version", version=f"headsurgeon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", help="architecture, heads, hook names and a tokenizer sample")
    _model_args(p, optional=True)
    p.add_argument("--sample", default="Once upon a time, there was a little girl.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("capture", help="capture attention patterns over a corpus into a resumable store")
    _model_args(p)
    p.add_argument("corpus", help="text file; documents separated by blank lines")
    p.add_argument("out", help="output directory (re-run the same command to resume)")
    _corpus_args(p)
    p.add_argument("--mode", choices=["dense", "topq"], default="dense")
    p.add_argument("--q", type=fraction, default=0.025, help="top-q fraction of the n×n grid kept in topq mode")
    p.add_argument("--batch-size", type=positive_int, default=16, help="windows per forward pass (default 16)")
    p.add_argument("--shard-size", type=positive_int, default=64, help="windows per shard file (default 64)")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("explain", help="capture → program search → selection → replacement sweep → HTML report")
    p.add_argument("model", nargs="?", default="tiny-stories", help="model spec (default: the embedded tiny-stories)")
    p.add_argument("corpus", nargs="?", default=None, help="text file (default: the embedded demo corpus)")
    p.add_argument("out", nargs="?", default="headsurgeon-explain", help="output directory")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--device", default="cpu", help="where the model runs (capture, sweep), e.g. cuda")
    p.add_argument("--capture-only", action="store_true",
                   help="stop once OUT/store is complete; the same command without it later goes on from there")
    add_window_args(p)
    p.add_argument("--searchers", nargs="+", default=["enumerative", "learned", "llm"],
                   help="which searchers run (llm only when an endpoint is configured)")
    p.add_argument("--llm-model", default=None, help="chat model for the LLM agent (or HEADSURGEON_LLM_MODEL)")
    p.add_argument("--llm-base-url", default=None, help="OpenAI-compatible endpoint (or HEADSURGEON_LLM_BASE_URL)")
    p.add_argument("--llm-cost-cap", type=non_negative_float, default=None, help="stop LLM requests past this many USD")
    p.add_argument("--library", action="append", default=[], metavar="FILE.py",
                   help="program file in EAPS's style (prog(sentence, tokenizer) -> (label, matrix)); repeatable. "
                        "Its functions compete for every head; they run only in the sandbox. At most 256 programs "
                        "per file; the library search stops after --library-budget seconds")
    p.add_argument("--library-budget", type=non_negative_float, default=600.0, metavar="SECONDS",
                   help="time for the --library programs, in total across heads (default 600); past it the "
                        "programs scored so far compete and the report notes the rest")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="search and select on Ray: on the cluster at ADDRESS (HOST:PORT, e.g. 10.0.0.1:6379), or on a "
                        "local Ray runtime when no ADDRESS follows (pip install 'headsurgeon[ray]')")
    p.add_argument("--heads-per-task", type=positive_int, default=None,
                   help="heads per task (default: 64 serially; on Ray, the heads spread over the cluster's CPUs)")
    p.add_argument("--delta-ppl", action="store_true", help="also measure each head's ΔPPL on the test windows")
    p.add_argument("--tasks", default=None, help="lm-eval tasks, comma-separated: base and hybrid scores in "
                                                  "report.html (needs pip install 'headsurgeon[eval]')")
    p.add_argument("--limit", type=task_limit, default=None, help="examples per task (or a fraction), for --tasks")
    p.add_argument("--include-path", action="append", default=None, metavar="DIR",
                   help="folder of local lm-eval task YAML files, for --tasks (repeatable)")
    p.add_argument("--store-url", default=None, metavar="URL",
                   help="where Ray workers read OUT/store (a shared path or an fsspec URL) when not at OUT/store")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="the whole pipeline on the embedded tiny-stories model, offline (a few minutes)")
    p.add_argument("--out", default="headsurgeon-demo", help="output directory")
    add_window_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("score", help="how well one program reproduces one head (soft IoU, JSD, top-q IoU)")
    _model_args(p)
    p.add_argument("corpus", help="text file; documents separated by blank lines")
    p.add_argument("--head", required=True, help="the head, e.g. L0H1")
    p.add_argument("--program", required=True, help='a DSL program, e.g. "prev(1)" (token strings need the model\'s '
                                                    'vocabulary, which score uses)')
    p.add_argument("--split", choices=(*SPLITS, "all"), default="test",
                   help="which windows of the document-level split to score on")
    add_window_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_score)

    for register in _extensions():
        register(sub)
    for subparser in sub.choices.values():  # every --help shows the defaults
        subparser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    return parser


def _extensions() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Subcommands defined next to the code they drive (imported here because they import this module)."""
    from .surgery.cli import register as surgery_commands
    from .synth.tp.cli import register as tp_commands

    return [surgery_commands, tp_commands]


def expected_errors() -> tuple[type[BaseException], ...]:
    """Error types the CLI reports as one line: the library's own (kernels/core.py) and a missing input path.
    Anything else is a bug and keeps its traceback."""
    return (HeadsurgeonError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def error_message(error: BaseException, limit: int = MESSAGE_LIMIT) -> str:
    """The error's message on one line, cut to ``limit`` characters so a huge input is never echoed whole."""
    text = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else error
    text = " ".join(str(text).split("\n")).replace("\r", " ").strip() or type(error).__name__
    return text if len(text) <= limit else f"{text[:limit]}... (message cut at {limit} of {len(text)} characters)"


def os_error_message(error: OSError) -> str:
    """One line for a failure of the file system (an existing file where a folder goes, a read-only disk, no space)."""
    where = f" {error.filename!s}" if error.filename else ""
    what = error.strerror or error_message(error)
    if isinstance(error, FileExistsError):
        return (f"{what}:{where} (a file is in the way of a folder headsurgeon writes); pass another output path, "
                "or move the file away")
    return f"{what}:{where}; pass an output path you can write to (check its permissions, free space and mount)"


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse the command line; a subcommand's options may sit between its positionals (``explain M --tokenizer T C OUT``)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    position = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if position is None or argv[position] not in sub.choices or any(a in ("-h", "--help") for a in argv):
        return parser.parse_args(argv)  # help is printed by the plain parser (it shows positionals' defaults)
    command = argv[position]
    subparser = sub.choices[command]
    try:
        args = subparser.parse_intermixed_args(argv[position + 1:])
    except TypeError:  # a subcommand with its own subcommands (tp): plain parsing
        return parser.parse_args(argv)
    args.command = command
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, list(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except expected_errors() as e:
        print(f"headsurgeon {args.command}: error: {error_message(e)}", file=sys.stderr)
        return 1
    except OSError as e:  # the file system refused (read-only, full, a file where a folder goes): no traceback
        print(f"headsurgeon {args.command}: error: {error_message(OSError(os_error_message(e)))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
