"""Argument types for every command line of the library: numbers refused with a message that says what is allowed.

They sit in the bottom layer so that the subcommands of each package (headsurgeon/cli/measure.py, headsurgeon/cli/tp.py)
and the top-level CLI share one definition; the settings that use them, with their defaults, are config fields
(headsurgeon/core/configs.py).
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["task_limit", "int_at_least", "positive_int", "non_negative_int", "fraction", "positive_float",
           "non_negative_float"]


def _quote(text: str, limit: int = 60) -> str:
    """A command-line value quoted for an error message, cut so a huge argument is never echoed whole."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``, refused with a message that says what is allowed."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {_quote(text)}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def _finite_float(text: str) -> float:
    """A finite float from the command line, or an ArgumentTypeError naming the bad value."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {_quote(text)}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {_quote(text)}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a fraction in (0, 1], e.g. 0.025 for the top 2.5% of a pattern."""
    value = _finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], e.g. 0.025 for the top 2.5%; got {value:g}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value:g}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value:g}")
    return value


def task_limit(text: str) -> int | float:
    """--limit for lm-eval tasks: a whole number of examples, or a fraction below 1 (as lm-eval reads it)."""
    value = _finite_float(text)
    if not value > 0 or (value >= 1 and value != int(value)):
        raise argparse.ArgumentTypeError(f"--limit must be a whole number of examples or a fraction in (0, 1), "
                                         f"got {_quote(text)}")
    return int(value) if value >= 1 else value

