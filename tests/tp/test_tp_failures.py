"""headsurgeon/tp/failures.py: wrong answers grouped by the input pattern a correct algorithm needs."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from headsurgeon.tp import tasks as T
from headsurgeon.tp.failures import PATTERNS, format_failures, group_failures


@pytest.fixture(scope="module")
def double_hist():
    return T.make_task("double_hist", size=600, seed=3)


def _double_hist_answer(tokens: list[str]) -> list[str]:
    counts = Counter(tokens[1:])
    return ["<pad>", *(str(sum(counts[d] == counts[c] for d in counts)) for c in tokens[1:])]


def _hist_answer(tokens: list[str]) -> list[str]:
    counts = Counter(tokens[1:])
    return ["<pad>", *(str(counts[c]) for c in tokens[1:])]


def test_a_correct_algorithm_has_no_failures(double_hist):
    preds = [_double_hist_answer(tokens) for tokens, _ in double_hist.raw["test"]]
    groups = group_failures(double_hist, preds)
    assert groups and sum(g.wrong for g in groups) == 0
    assert sum(g.n for g in groups) == int((double_hist.test.y != 0).sum())
    assert format_failures(groups).startswith("0 wrong of")


def test_patterns_separate_an_algorithmic_error_exactly(double_hist):
    """Answering hist (count of x_i) instead of double_hist is right exactly where as many symbols share
    x_i's count as that count, so every double_hist pattern is wholly right or wholly wrong."""
    preds = [_hist_answer(tokens) for tokens, _ in double_hist.raw["test"]]
    groups = group_failures(double_hist, preds)
    bad = [g for g in groups if g.wrong]
    assert bad and all(g.wrong in (0, g.n) for g in groups)
    for g in groups:  # pattern "counts=(a, b, ...) count(x_i)=c": wrong iff #{counts == c} != c
        found = re.fullmatch(r"counts=\(([\d, ]+?),?\) count\(x_i\)=(\d+)", g.pattern)
        profile, c = [int(v) for v in found.group(1).split(",")], int(found.group(2))
        assert (g.wrong == g.n) == (sum(v == c for v in profile) != c), g.pattern
    text = format_failures(groups, top=3)
    assert f"fully wrong patterns: {len(bad)}" in text and "e.g. <s>" in text


def test_every_rasp_task_has_a_pattern():
    for task in ("reverse", "hist", "double_hist", "sort", "most_freq", "dyck1", "dyck2"):
        data = T.make_task(task, size=60, seed=0)
        tokens, labels = data.raw["test"][0]
        assert isinstance(PATTERNS[task](tokens, 1), str)
        assert PATTERNS["dyck1"](["<s>", ")", "("], 2).startswith("prefix broken")
    # dyck2: a close bracket of the wrong type breaks the prefix for good
    assert PATTERNS["dyck2"](["<s>", "{", ")", "("], 3) == "prefix broken depth=1 token=("
    assert PATTERNS["dyck2"](["<s>", "{", "(", ")"], 3) == "prefix open depth=1 token=)"
    assert PATTERNS["dyck2"](["<s>", "{", "}"], 2) == "prefix balanced depth=0 token=}"


def test_dyck_patterns_determine_the_label():
    """Every dyck2 pattern holds one label only (the pattern is all a correct algorithm needs)."""
    data = T.make_task("dyck2", size=300, seed=1)
    labels: dict[str, set] = {}
    for tokens, tags in data.raw["test"] + data.raw["train"]:
        for i in range(1, len(tokens)):
            labels.setdefault(PATTERNS["dyck2"](tokens, i), set()).add(tags[i])
    assert all(len(v) == 1 for v in labels.values()), {k: v for k, v in labels.items() if len(v) > 1}
