"""The shared vocabulary (headsurgeon/core/__init__.py): one head parser and formatter, the closed sets, the error base."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.core import (ABLATION_KINDS, METRICS, SPLITS, WHICHES, Head, HeadsurgeonError, InputError,
                                     check_choice)


@pytest.mark.parametrize("key", ["L3H5", "l3h5", " L3 H5 ", "3.5", " 3, 5", (3, 5), [3, 5], (np.int64(3), np.int32(5)),
                                 Head(3, 5)])
def test_every_accepted_spelling_gives_one_head(key):
    head = Head.parse(key)
    assert head == (3, 5) and str(head) == "L3H5" and Head.label(key) == "L3H5" and isinstance(head, Head)
    assert {(3, 5): "x"}[head] == "x"  # a tuple: plain (layer, head) keys find it


@pytest.mark.parametrize("key", ["3.5.1", "3.", "L3", "H5", "L3H5x", "L-1H2", (3,), (3, 5, 1), (True, 1), (-1, 2), (1.0, 2), None])
def test_other_spellings_are_one_clear_error(key):
    with pytest.raises(HeadsurgeonError, match="cannot read head"):
        Head.parse(key)


def test_closed_sets_and_their_check():
    assert SPLITS == ("synth", "select", "test") and WHICHES == ("replacement", "explanation")
    assert "resample" in ABLATION_KINDS
    assert check_choice("test", SPLITS, "split") == "test"
    with pytest.raises(HeadsurgeonError, match="split must be one of synth, select, test, not 'dev'"):
        check_choice("dev", SPLITS, "split")


def test_the_stages_use_the_cores_closed_sets():
    """One tuple per closed set: the stages and the CLI take theirs from headsurgeon/core/__init__.py (one definition, so no
    stage can miss a new member)."""
    import argparse

    from headsurgeon.surgery import corpus
    from headsurgeon.surgery.measure import ablate
    from headsurgeon.cli import measure as surgery_cli
    from headsurgeon.core import scores
    from headsurgeon.synth import metrics, select

    assert METRICS == ("iou", "jsd", "topq")
    assert metrics.METRICS is METRICS and scores.METRICS is METRICS and select.METRICS is METRICS
    assert corpus.SPLITS is SPLITS and ablate.KINDS is ABLATION_KINDS
    parser = argparse.ArgumentParser()
    surgery_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ablate", "m", "corpus.txt", "--heads", "L0H0", "--kind", "resample"])
    assert args.kind == "resample"
    with pytest.raises(InputError, match="unknown metrics.*choose from"):
        metrics.score_many(np.zeros((1, 1, 2, 2)), [np.zeros((1, 2, 2))], np.array([2]), True, ("kl",))


def test_every_library_exception_derives_from_the_error_base():
    """The CLI reports HeadsurgeonError as one line and lets anything else show its traceback (a bug)."""
    import importlib
    import pkgutil

    import headsurgeon

    skip = ("headsurgeon.harness", "headsurgeon.synth.sandbox.worker", "headsurgeon.scaleout.ray_run")
    strays = []
    names = ["headsurgeon"] + [info.name for info in pkgutil.walk_packages(headsurgeon.__path__, "headsurgeon.")]
    assert "headsurgeon.core" in names and "headsurgeon.synth.dsl.spec" in names
    for name in names:
        if name.startswith(skip):
            continue
        module = importlib.import_module(name)
        info = module
        for attr, obj in vars(module).items():
            if (isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == info.__name__
                    and not issubclass(obj, (HeadsurgeonError, Warning))):
                strays.append(f"{info.__name__}.{attr}")
    assert not strays, f"library exceptions outside HeadsurgeonError: {strays}"


def test_the_cli_reports_library_errors_in_one_line_and_keeps_bugs_tracebacks(capsys, monkeypatch):
    import headsurgeon.cli as cli

    def library_error(args):
        raise InputError("the window length must be positive; pass --max-len 64")

    def bug(args):
        raise ValueError("a bug, not bad input")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["info"].set_defaults(func=library_error)
    assert cli.main(["info", "tiny-stories"]) == 1
    assert "error: the window length must be positive" in capsys.readouterr().err
    parser._subparsers._group_actions[0].choices["info"].set_defaults(func=bug)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["info", "tiny-stories"])
