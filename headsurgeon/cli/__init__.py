"""The ``headsurgeon`` command line: one subcommand per pipeline stage."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Callable

from ..core.configs import add_flags, from_flags
from ..core import SPLITS, HeadsurgeonError
from ..surgery.configs import MODEL_HELP, CaptureConfig, CorpusConfig, ModelConfig

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}
MESSAGE_LIMIT = 1000


def _model_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    """MODEL and the model's flags (headsurgeon/surgery/configs.py ModelConfig)."""
    if optional:
        p.add_argument("model", nargs="?", default="tiny-stories", help=MODEL_HELP)
    else:
        p.add_argument("model", help=MODEL_HELP)
    add_flags(p, ModelConfig)


def _load_model(args: argparse.Namespace):
    """The handle for MODEL with the model flags' settings."""
    from headsurgeon.surgery.models.loading import load_model

    return load_model(args.model, **asdict(from_flags(ModelConfig, args)))


def cmd_info(args: argparse.Namespace) -> int:
    handle = _load_model(args)
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
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents

    documents = read_documents(args.corpus, args.separator)  # a missing corpus fails before the model loads
    handle = _load_model(args)
    seqs = make_sequences(handle, documents, max_len=args.max_len, max_sequences=args.max_sequences)
    store = capture(handle, seqs, out=args.out, **asdict(from_flags(CaptureConfig, args)))
    print(f"captured {len(store)} sequences × {handle.n_layers * handle.n_heads} heads ({args.mode}) -> {args.out}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from headsurgeon.configs import ExplainConfig, ScaleoutConfig
    from headsurgeon.explain_measure import format_timings
    from headsurgeon.pipeline import explain

    # --library files are untrusted: explain parses and validates them, they run only in the sandbox (headsurgeon/synth/eaps.py)
    scaleout = ScaleoutConfig.from_ray_flag(args.address, workers=args.workers, heads_per_task=args.heads_per_task,
                                            store_url=args.store_url)
    result = explain(args.model, args.corpus, args.out, config=from_flags(ExplainConfig, args, scaleout=scaleout))
    if args.capture_only:
        print(f"captured {len(result.store)} windows into {result.out / 'store'}; run the same command without "
              "--capture-only (on this machine or a Ray driver that sees OUT) to search, select and report")
        return 0
    print(result.summary_table())
    for note in result.notes:
        print(note)
    print(format_timings(result.timings))
    print(f"wrote {result.out / 'programs.json'} and {result.out / 'report.html'}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from headsurgeon.surgery.corpus import load_corpus
    from headsurgeon.surgery.measure.score import score
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.vocab import Vocabulary

    handle = _load_model(args)
    program = Program.parse(args.program, vocab=Vocabulary.from_tokenizer(handle.tokenizer))
    splits = load_corpus(handle, args.corpus, **asdict(from_flags(CorpusConfig, args)))
    windows = splits.synth + splits.select + splits.test if args.split == "all" else getattr(splits, args.split)
    got = score(program, handle, args.head, sequences=windows)
    if args.json:
        print(json.dumps({"head": args.head, "program": program.text, "split": args.split, **got}, indent=1))
    else:
        print(f"{args.head} vs {program.text}: soft IoU {got['iou']:.3f}, JSD {got['jsd']:.3f}, top-q IoU "
              f"{got['topq']:.3f} on {got['n']} {args.split} windows")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from headsurgeon.build import build_hybrid
    from headsurgeon.configs import BuildConfig

    result = build_hybrid(args.model, args.corpus, args.programs, args.out, config=from_flags(BuildConfig, args),
                          trust_programs=args.trust_programs)
    print(json.dumps(result.to_json(), indent=1) if args.json else result.format())
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
    add_flags(p, CorpusConfig)
    add_flags(p, CaptureConfig)
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("explain", help="capture → program search → selection → replacement sweep → HTML report")
    p.add_argument("model", nargs="?", default="tiny-stories", help=MODEL_HELP)
    p.add_argument("corpus", nargs="?", default=None, help="text file (default: the embedded demo corpus)")
    p.add_argument("out", nargs="?", default="headsurgeon-explain", help="output directory")
    from headsurgeon.configs import ExplainConfig  # the search and scale-out configs import the program stack

    add_flags(p, ExplainConfig)  # every setting of every stage (headsurgeon/configs.py)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("build", help="swap as many heads as fit a share or a ΔPPL budget, cheapest causal cost "
                                     "first; optionally heal; save the hybrid with build.json")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("corpus", help="text file, split by document as explain splits it (use explain's corpus flags)")
    p.add_argument("--programs", required=True, help="programs.json from explain")
    p.add_argument("--out", default=None, help="checkpoint folder to write (with build.json)")
    p.add_argument("--trust-programs", action="store_true",
                   help="run Python programs from --programs (untrusted code, even in the sandbox; DSL needs no trust)")
    from headsurgeon.configs import BuildConfig

    add_flags(p, BuildConfig)
    p.add_argument("--json", action="store_true", help="print build.json's record instead of the summary")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("demo", help="the whole pipeline on the embedded tiny-stories model, offline (a few minutes)")
    p.add_argument("--out", default="headsurgeon-demo", help="output directory")
    add_flags(p, CorpusConfig, only=("max_len", "max_sequences", "seed"))
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
    add_flags(p, CorpusConfig)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_score)

    from .measure import register as register_measure  # here, not at the top: importing the CLI loads no numpy
    from .tp import register as register_tp

    register_measure(sub)
    register_tp(sub)
    for subparser in sub.choices.values():  # every --help shows the defaults
        subparser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    _no_abbreviations(parser)
    return parser


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's prefix matching in ``parser`` and every subcommand's: a flag is taken as written, so
    ``--heads`` can never be read as an abbreviation of a longer flag."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _no_abbreviations(subparser)


def expected_errors() -> tuple[type[BaseException], ...]:
    """Error types the CLI reports as one line: the library's own (headsurgeon/core/__init__.py) and a missing input path.
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


def check_inputs(args: argparse.Namespace) -> None:
    """What every subcommand can check from its arguments and the file system before a model loads: the corpus
    file and its separator (headsurgeon/surgery/corpus.py), and the heads named, against the model's config (headsurgeon/surgery/models/dims.py)."""
    from headsurgeon.surgery.corpus import check_corpus_source
    from headsurgeon.surgery.models.dims import check_heads_fit

    if getattr(args, "corpus", None) is not None or getattr(args, "separator", None) is not None:
        check_corpus_source(getattr(args, "corpus", None), getattr(args, "separator", None))
    heads = [args.head] if getattr(args, "head", None) else getattr(args, "heads", None) or []
    if heads and getattr(args, "model", None):
        check_heads_fit(args.model, [h for item in heads for h in str(item).split(",") if h.strip()])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, list(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        check_inputs(args)
        return int(args.func(args) or 0)
    except expected_errors() as e:
        print(f"headsurgeon {args.command}: error: {error_message(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # long commands journal what they finished (explain: OUT/heads) and resume from it
        print(f"headsurgeon {args.command}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except OSError as e:  # the file system refused (read-only, full, a file where a folder goes): no traceback
        print(f"headsurgeon {args.command}: error: {error_message(OSError(os_error_message(e)))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
