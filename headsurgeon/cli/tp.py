"""``headsurgeon tp ...``: train Transformer Programs and decompile them.

``register(subparsers)`` adds the ``tp`` command group to an argparse subparsers object; every leaf sets
``func``, so the caller dispatches with ``sys.exit(args.func(args))``. ``main(argv)`` runs it standalone.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core.argtypes import non_negative_int, positive_float, positive_int
from ..tp.tasks import TASKS

_SHAPE_FLAGS = {
    "layers": "n_layers",
    "heads_cat": "n_heads_cat",
    "heads_num": "n_heads_num",
    "cat_mlps": "n_cat_mlps",
    "num_mlps": "n_num_mlps",
    "d_mlp": "d_mlp",
}


def _defaults_table() -> str:
    from ..tp.shapes import PAPER_ACCURACY, TASK_CONFIGS

    rows = ["task         layers  heads(cat+num)  MLPs(cat+num)  paper acc"]
    for t, c in TASK_CONFIGS.items():
        acc = f"{PAPER_ACCURACY[t]:.2f}" if t in PAPER_ACCURACY else "-"
        rows.append(
            f"{t:<12} {c['n_layers']:>6}  {c['n_heads_cat']:>5}+{c['n_heads_num']:<9} "
            f"{c['n_cat_mlps']:>4}+{c['n_num_mlps']:<9} {acc:>8}"
        )
    return "\n".join(rows)


def cmd_train(args: argparse.Namespace) -> int:
    """Train one task, write the run directory, print the metrics."""
    import torch

    from ..tp.resume import STATE_FILE
    from ..tp.rundir import check_run_folder, save_run
    from ..tp.train import default_configs, train

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {
        "seed": args.seed,
        "data_seed": args.data_seed,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "tau_init": args.tau_init,
        "tau_end": args.tau_end,
        "dataset_size": args.dataset_size,
        "eval_every": args.eval_every,
    }
    shape = {field: getattr(args, flag) for flag, field in _SHAPE_FLAGS.items() if getattr(args, flag) is not None}
    if args.count_only:
        shape["num_value_gate"] = False
    _, tc = default_configs(args.task, **overrides)
    out = Path(args.out) if args.out else Path("runs") / "tp" / args.task / f"s{tc.seed}"
    check_run_folder(out, overwrite=args.overwrite)  # before training: a finished run is never replaced silently
    result = train(args.task, tc, progress=not args.no_progress, state_dir=out, resume=args.resume, **shape)
    save_run(result, out)
    (out / STATE_FILE).unlink(missing_ok=True)  # the finished run's files replace the per-epoch state
    m = result.metrics
    print(
        f"{args.task}: test acc {100 * m['test_acc']:.2f}% (val {100 * m['val_acc']:.2f}%, "
        f"train {100 * m['train_acc']:.2f}%) in {m['train_seconds']:.0f}s -> {out}"
    )
    return 0


def cmd_decompile(args: argparse.Namespace) -> int:
    """(Re)write ``program.json`` / ``program.py`` of a run directory, or print the source with ``--stdout``."""
    from ..tp.decompile import decompile
    from ..tp.rundir import load_run, write_program

    run = load_run(args.run_dir)
    if args.stdout:
        sys.stdout.write(decompile(run.discretize()))
        return 0
    _, py = write_program(run)
    if args.out:
        Path(args.out).write_text(py.read_text())
        py = Path(args.out)
    print(f"wrote {py}")
    return 0


def cmd_failures(args: argparse.Namespace) -> int:
    """A run's wrong answers on a split, grouped by the input pattern a correct algorithm needs."""
    from ..tp.failures import failure_groups, format_failures
    from ..tp.rundir import load_program, load_run
    from ..tp.tasks import make_task

    run = load_run(args.run_dir)
    tc = run.train_config
    data = make_task(run.task, size=tc.dataset_size, seed=tc.seed if tc.data_seed is None else tc.data_seed)
    print(format_failures(failure_groups(load_program(args.run_dir), data, args.split), top=args.top))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    """List the tasks with their default (paper Table 1) shapes."""
    print(_defaults_table())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Accuracy of a run's discretized program on a freshly generated split (same task and data seed)."""
    from ..tp.rundir import load_program, load_run
    from ..tp.tasks import make_task
    from ..tp.train import accuracy

    run = load_run(args.run_dir)
    tc = run.train_config
    data = make_task(run.task, size=tc.dataset_size, seed=tc.seed if tc.data_seed is None else tc.data_seed)
    split = getattr(data, args.split)
    acc = accuracy(load_program(args.run_dir).predict(split.x), split.y)
    print(json.dumps({"task": run.task, "split": args.split, "acc": acc}))
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``tp`` command group (train / decompile / eval / tasks) to an argparse subparsers object."""
    tp = subparsers.add_parser(
        "tp",
        help="Learning Transformer Programs: train, decompile",
        description="Learning Transformer Programs (Friedman, Wettig & Chen 2023): train programs on the RASP "
        "tasks and decompile them to standalone Python.",
    )
    sub = tp.add_subparsers(dest="tp_command", metavar="{train,decompile,eval,failures,tasks}")
    sub.required = True

    tr = sub.add_parser(
        "train",
        help="train a Transformer Program on a task",
        description="Train a Transformer Program with the paper's recipe (Adam 5e-2, batch 512, Gumbel tau "
        "3.0 -> 0.01 geometric per step, then argmax) and the task's Table 1 shape; writes config.json, "
        "model.safetensors, metrics.json, program.json and program.py into the run directory.",
        epilog="default shapes:\n" + _defaults_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tr.add_argument("task", choices=TASKS, help="task to train")
    tr.add_argument("--out", metavar="RUN_DIR", help="run directory (default runs/tp/TASK/sSEED)")
    tr.add_argument("--resume", action="store_true",
                    help="continue a killed run from the state saved in RUN_DIR after every epoch")
    tr.add_argument("--overwrite", action="store_true",
                    help="replace the finished run in RUN_DIR (without it, a RUN_DIR holding one is refused)")
    tr.add_argument("--seed", type=non_negative_int, default=None,
                    help="seed for initialization, Gumbel noise and data (default 0)")
    tr.add_argument("--data-seed", type=non_negative_int, default=None, help="seed for the data only (default: --seed)")
    tr.add_argument("--epochs", type=positive_int, default=None, help="epochs (default 250; induction 500)")
    tr.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default 512)")
    tr.add_argument("--lr", type=positive_float, default=None, help="Adam learning rate (default 5e-2)")
    tr.add_argument("--tau-init", type=positive_float, default=None, help="initial Gumbel temperature (default 3.0)")
    tr.add_argument("--tau-end", type=positive_float, default=None, help="final Gumbel temperature (default 0.01)")
    tr.add_argument("--dataset-size", type=positive_int, default=None,
                    help="unique samples before the split (default 20000)")
    tr.add_argument("--eval-every", type=non_negative_int, default=None,
                    help="validate every N epochs, 0 = only at the end")
    tr.add_argument("--layers", type=positive_int, default=None, help="override the number of layers")
    tr.add_argument("--heads-cat", type=non_negative_int, default=None, help="override categorical heads per layer")
    tr.add_argument("--heads-num", type=non_negative_int, default=None, help="override numerical heads per layer")
    tr.add_argument("--cat-mlps", type=non_negative_int, default=None, help="override categorical MLPs per layer")
    tr.add_argument("--num-mlps", type=non_negative_int, default=None, help="override numerical MLPs per layer")
    tr.add_argument("--d-mlp", type=positive_int, default=None, help="MLP hidden width (default 64)")
    tr.add_argument("--count-only", action="store_true",
                    help="ablation: numerical heads only count matching keys (default: they sum a gated "
                         "numerical variable, the same model for every task)")
    tr.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    tr.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    tr.set_defaults(func=cmd_train)

    de = sub.add_parser(
        "decompile",
        help="decompile a run directory to Python",
        description="Discretize a trained run and write its standalone Python program (program.py) and "
        "program.json into the run directory.",
    )
    de.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by `tp train`")
    de.add_argument("--out", metavar="FILE", help="also copy the program to FILE")
    de.add_argument("--stdout", action="store_true", help="print the source instead of writing files")
    de.set_defaults(func=cmd_decompile)

    ev = sub.add_parser("eval", help="accuracy of a run's program on a split", description=cmd_eval.__doc__)
    ev.add_argument("run_dir", metavar="RUN_DIR")
    ev.add_argument("--split", choices=("train", "val", "test"), default="test")
    ev.set_defaults(func=cmd_eval)

    fa = sub.add_parser("failures", help="a run's wrong answers grouped by input pattern",
                        description=cmd_failures.__doc__)
    fa.add_argument("run_dir", metavar="RUN_DIR")
    fa.add_argument("--split", choices=("train", "val", "test"), default="test")
    fa.add_argument("--top", type=positive_int, default=15, help="patterns to print (default 15)")
    fa.set_defaults(func=cmd_failures)

    ta = sub.add_parser("tasks", help="list tasks and default shapes", description=cmd_tasks.__doc__)
    ta.set_defaults(func=cmd_tasks)
    return tp


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m headsurgeon.cli.tp tp train hist``."""
    parser = argparse.ArgumentParser(prog="headsurgeon")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
