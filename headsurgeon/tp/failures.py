"""Where a learned program departs from the task: its wrong answers grouped by an input pattern.

For hist, double_hist and dyck a pattern is all a correct algorithm needs at one position, so it fixes
the label (double_hist: the sorted symbol counts of the sequence and the count of the token there; dyck:
the prefix's stack state and depth and the token). There a group the program gets wholly wrong is a case
it never learned, and a partly wrong one means it reads something the task does not depend on (positions,
order). For reverse, sort and most_freq the pattern is a coarse key (length or counts, and position).
Predictions come from the decompiled Python module, i.e. the program a reader sees.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .decompile import decompile, load_module
from .discrete import DiscreteProgram
from .tasks import BOS, DYCK_PAIRS, EOS, PAD, TaskData

Pattern = Callable[[list[str], int], str]


def _profile(syms: list[str]) -> tuple[int, ...]:
    return tuple(sorted(Counter(syms).values(), reverse=True))


def _symbols(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t not in (BOS, EOS)]


def _count_pattern(tokens: list[str], i: int) -> str:
    syms = _symbols(tokens)
    return f"counts={_profile(syms)} count(x_i)={Counter(syms)[tokens[i]]}"


def _most_freq_pattern(tokens: list[str], i: int) -> str:
    return f"counts={_profile(_symbols(tokens))} position={i}"


def _length_pattern(tokens: list[str], i: int) -> str:
    return f"length={len(_symbols(tokens))} position={i}"


def _dyck_pattern(tokens: list[str], i: int) -> str:
    opener = {c: o for o, c in DYCK_PAIRS}
    stack: list[str] = []
    broken = False
    for t in tokens[1 : i + 1]:
        if t in opener:
            broken = broken or not stack or stack.pop() != opener[t]
        else:
            stack.append(t)
    state = "broken" if broken else ("balanced" if not stack else "open")
    return f"prefix {state} depth={len(stack)} token={tokens[i]}"


PATTERNS: dict[str, Pattern] = {
    "hist": _count_pattern,
    "double_hist": _count_pattern,
    "most_freq": _most_freq_pattern,
    "reverse": _length_pattern,
    "sort": _length_pattern,
    "dyck1": _dyck_pattern,
    "dyck2": _dyck_pattern,
}
"""Per task: ``pattern(tokens, i)`` for position ``i`` (default: length and position)."""


@dataclass
class FailureGroup:
    """Scored positions sharing one input pattern: how many, how many wrong, and a few wrong examples."""

    pattern: str
    n: int = 0
    wrong: int = 0
    answers: Counter = field(default_factory=Counter)
    examples: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return 1.0 - self.wrong / self.n if self.n else float("nan")


def group_failures(data: TaskData, predictions: list[list[str]], split: str = "test",
                   n_examples: int = 2) -> list[FailureGroup]:
    """Group the scored positions of ``split`` by input pattern, given predicted labels per sequence (as
    strings); groups with wrong answers first, most wrong first. ``answers`` counts the wrong ones'
    (expected, predicted) label pairs."""
    pattern = PATTERNS.get(data.name, _length_pattern)
    groups: dict[str, FailureGroup] = {}
    for (tokens, labels), pred in zip(data.raw[split], predictions, strict=True):
        for i, (want, got) in enumerate(zip(labels, pred)):
            if i == 0 or want == PAD:
                continue
            key = pattern(tokens, i)
            g = groups.setdefault(key, FailureGroup(key))
            g.n += 1
            if got != want:
                g.wrong += 1
                g.answers[(want, str(got))] += 1
                if len(g.examples) < n_examples:
                    g.examples.append((" ".join(tokens), f"position {i}: want {want}", f"got {got}"))
    return sorted(groups.values(), key=lambda g: (-g.wrong, -g.n, g.pattern))


def failure_groups(program: DiscreteProgram, data: TaskData, split: str = "test",
                   n_examples: int = 2) -> list[FailureGroup]:
    """``group_failures`` for the answers of a program's decompiled Python module on ``split``."""
    run = load_module(decompile(program))["run"]
    return group_failures(data, [run(list(tokens)) for tokens, _ in data.raw[split]], split, n_examples)


def format_failures(groups: list[FailureGroup], top: int = 15) -> str:
    """A text table of the ``top`` groups with errors, plus totals."""
    n = sum(g.n for g in groups)
    wrong = sum(g.wrong for g in groups)
    bad = [g for g in groups if g.wrong]
    lines = [f"{wrong} wrong of {n} scored positions ({100 * (1 - wrong / max(n, 1)):.2f}% right) in "
             f"{len(bad)} of {len(groups)} input patterns; fully wrong patterns: "
             f"{sum(g.wrong == g.n for g in bad)}"]
    for g in bad[:top]:
        answers = ", ".join(f"{w}->{p} x{c}" for (w, p), c in g.answers.most_common(3))
        lines.append(f"  {g.wrong:5d}/{g.n:<5d} wrong  {g.pattern:<40}  {answers}")
        for ex in g.examples[:1]:
            lines.append(f"        e.g. {ex[0]}  ({ex[1]}, {ex[2]})")
    return "\n".join(lines)


def accuracy_by_pattern(groups: list[FailureGroup]) -> dict[str, float]:
    """Pattern -> accuracy (for tests and JSON reports)."""
    return {g.pattern: float(np.round(g.accuracy, 6)) for g in groups}


__all__ = ["PATTERNS", "FailureGroup", "group_failures", "failure_groups", "format_failures", "accuracy_by_pattern"]
