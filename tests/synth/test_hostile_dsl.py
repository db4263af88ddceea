"""Hostile DSL programs: every parameter is bounded and every accepted program costs O(cells) per sequence.

Each finding-reproducing case failed on the code before the bounds existed (accepted the program, ran for
minutes, used gigabytes, or ended in RecursionError / ValueError) and passes now.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest

from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Fallback, Gate, Mix, Mul, Pred, Prim, Sharpen
from headsurgeon.synth.errors import ProgramError, ProgramValidationError
from headsurgeon.synth.program import Program

HUGE = 2 ** 30
SHORT = 500  # an error message quoting hostile input stays under this many characters


def _refused(call, *, seconds: float = 2.0, peak_mb: float | None = None) -> ProgramValidationError:
    """Run ``call``; assert it raises ProgramValidationError quickly (and within ``peak_mb`` of new memory).

    Quickly in this process's CPU time, not wall time: a refusal that parses a hostile input whole costs seconds of
    CPU whatever the load, while other processes on a busy machine only stretch the wall clock."""
    if peak_mb is not None:
        tracemalloc.start()
    start = time.process_time()
    try:
        with pytest.raises(ProgramValidationError) as info:
            call()
    finally:
        elapsed = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1] / 2 ** 20 if peak_mb is not None else 0.0
        if peak_mb is not None:
            tracemalloc.stop()
    assert elapsed < seconds, f"refusal took {elapsed:.1f} s of CPU"
    if peak_mb is not None:
        assert peak < peak_mb, f"refusal allocated {peak:.0f} MiB"
    assert len(str(info.value)) < SHORT, str(info.value)[:1000]
    return info.value


def _nested_json_text(depth: int) -> str:
    return '{"sharpen": [' * depth + '{"self": {}}' + ", 2]}" * depth


# ------------------------------------------------------------------------------------------
# window(-2**30, 2**30): refused from text, JSON and trees; the kernel is O(n) per row anyway
# ------------------------------------------------------------------------------------------


def test_huge_window_refused_from_text() -> None:
    err = _refused(lambda: Program.parse(f"window(-{HUGE}, {HUGE})"))
    assert "window(a=...)" in str(err) and str(dsl.MAX_OFFSET) in str(err)


@pytest.mark.parametrize("form", ["object", "string", "wrapped"])
def test_huge_window_refused_from_json(form: str) -> None:
    obj = {"window": {"a": -HUGE, "b": HUGE}}
    arg = {"object": obj, "string": json.dumps(obj), "wrapped": {"dsl": obj}}[form]
    _refused(lambda: Program.from_json(arg))


def test_huge_window_refused_from_a_built_tree() -> None:
    node = Prim("window", (("a", -HUGE), ("b", HUGE)))
    _refused(lambda: Program.from_node(node))
    _refused(lambda: dsl.evaluate(node, np.array([[1, 2, 3]]), np.array([3])))


def test_offsets_at_the_bound_are_accepted() -> None:
    m = dsl.MAX_OFFSET
    assert Program.parse(f"window(-{m}, {m})").node.param("b") == m
    assert Program.parse(f"prev({m})").node.param("k") == m
    _refused(lambda: Program.parse(f"prev({m + 1})"))
    _refused(lambda: Program.parse(f"next({m + 1})"))


_KERNEL_SCRIPT = """
import time, numpy as np
from headsurgeon.kernels import primitives as K
lengths = np.array([7, 5], dtype=np.int64)
K.score_window(lengths, 7, 0, 1, True)  # compile first
for causal in (True, False):
    start = time.perf_counter()
    got = K.score_window(lengths, 7, -2**30, 2**30, causal)
    took = time.perf_counter() - start
    i = np.arange(7)
    want = np.zeros((2, 7, 7), np.float32)
    for b, n in enumerate(lengths):
        vis = (i[:, None] < n) & (i[None, :] < n) & ((i[None, :] <= i[:, None]) | (not causal))
        want[b][vis] = 1.0
    assert np.array_equal(got, want), (causal, got)
    assert took < 1.0, took
print("ok")
"""


def test_window_kernel_clips_offsets_to_the_sequence() -> None:
    """The numba kernel cannot be interrupted, so it runs in a child process with a deadline."""
    try:
        res = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT], capture_output=True, text=True,
                             timeout=240, cwd="/tmp")
    except subprocess.TimeoutExpired:
        pytest.fail("score_window with offsets +-2**30 did not finish in 240 s")
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


def test_window_wider_than_the_sequence_matches_the_clipped_window() -> None:
    ids, lengths = np.array([[1, 2, 3, 4, 5, 6]]), np.array([6])
    for causal in (True, False):
        wide = dsl.evaluate(dsl.parse(f"window(-{dsl.MAX_OFFSET}, {dsl.MAX_OFFSET})"), ids, lengths,
                            causal=causal)
        narrow = dsl.evaluate(dsl.parse("window(-5, 5)"), ids, lengths, causal=causal)
        np.testing.assert_array_equal(wide, narrow)


# ------------------------------------------------------------------------------------------
# sizes: match pairs, sharpen classes, profile weights, token tables
# ------------------------------------------------------------------------------------------


def test_200k_match_pairs_refused_without_allocating() -> None:
    pairs = [[i, i] for i in range(200_000)]
    obj = {"match": {"q": "token", "k": "token", "pairs": pairs}}
    err = _refused(lambda: Program.from_json(obj), peak_mb=20)
    assert "pairs" in str(err) and str(dsl.MAX_PAIRS) in str(err)
    text = "match(q=token, k=token, pairs=[" + ", ".join(f"[{i}, {i}]" for i in range(200_000)) + "])"
    _refused(lambda: Program.parse(text), peak_mb=40)


def test_match_pairs_at_the_bound_evaluate_fast() -> None:
    pairs = [[i, i + 1] for i in range(dsl.MAX_PAIRS)]
    prog = Program.from_json({"match": {"q": "token", "k": "token", "pairs": pairs, "select": "all"}})
    start = time.perf_counter()
    prog.evaluate_arrays(np.array([[0, 1, 2, 3, 4]]), np.array([5]))
    assert time.perf_counter() - start < 5.0


def test_million_sharpen_classes_refused() -> None:
    by = [[1.5, [i]] for i in range(10 ** 6)]
    err = _refused(lambda: Program.from_json({"sharpen": [{"uniform": {}}, 2, by]}), peak_mb=20)
    assert "by" in str(err) and str(dsl.MAX_CLASSES) in str(err)
    _refused(lambda: dsl.make_sharpen(Prim("uniform"), 2.0, by))


def test_sharpen_classes_at_the_bound_evaluate_fast() -> None:
    per = dsl.MAX_IDS // dsl.MAX_CLASSES
    by = [[1.0 + c / 100, list(range(c * per, (c + 1) * per))] for c in range(dsl.MAX_CLASSES)]
    prog = Program.from_json({"sharpen": [{"uniform": {}}, 2, by]})
    ids = np.arange(64).reshape(2, 32) * 37
    start = time.perf_counter()
    for _ in range(5):
        got = prog.evaluate_arrays(ids, np.array([32, 32]))
    assert time.perf_counter() - start < 5.0
    assert np.allclose(got.sum(-1), 1.0)


def test_ten_million_weight_profile_text_refused_fast_and_small() -> None:
    text = "profile(w=[" + "0," * 10 ** 7 + "0])"
    err = _refused(lambda: Program.parse(text), seconds=1.0, peak_mb=30)
    assert str(dsl.MAX_TEXT_CHARS) in str(err)


def test_long_profile_under_the_text_limit_refused_early() -> None:
    text = "profile(w=[" + "0," * 1_000_000 + "0])"
    assert len(text) <= dsl.MAX_TEXT_CHARS
    err = _refused(lambda: Program.parse(text), seconds=2.0, peak_mb=30)
    assert "at most" in str(err)
    _refused(lambda: Program.from_json({"profile": {"w": [0.5] * (dsl.MAX_PROFILE + 1)}}))


def test_huge_token_tables_refused() -> None:
    n = dsl.MAX_IDS + 1
    _refused(lambda: Program.from_json({"key_in_set": {"ids": list(range(n))}}))
    _refused(lambda: Program.from_json({"key_weight": {"w": [[i, 1.0] for i in range(n)]}}))
    _refused(lambda: Program.from_json({"recent": {"ids": list(range(n))}}))
    _refused(lambda: Program.from_json({"gate": [{"ids": list(range(n))}, {"self": {}}, {"first": {}}]}))
    many = [[i] for i in range(dsl.MAX_CLASSES + 1)]
    _refused(lambda: Program.from_json({"class_weight": {"q": many, "k": [[1]], "w": [[1.0]] * len(many)}}))


# ------------------------------------------------------------------------------------------
# nesting, literal length, node count and cost
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "profile(w=" + "[" * 10_000 + "1" + "]" * 10_000 + ")",
    "key_in_set(ids=" + "[" * 10_000 + "1" + "]" * 10_000 + ")",
    "(" * 10_000 + "self()" + ")" * 10_000,
    "sharpen(" * 10_000 + "self()" + ", 2)" * 10_000,
])
def test_ten_thousand_deep_text_raises_validation_error(text: str) -> None:
    _refused(lambda: Program.parse(text))


def test_ten_thousand_deep_json_raises_validation_error() -> None:
    _refused(lambda: Program.from_json(_nested_json_text(10_000)))
    _refused(lambda: dsl.from_json(_nested_json_text(10_000)))
    _refused(lambda: dsl.from_json("[" * 10_000 + "]" * 10_000))
    deep: object = 1.0
    for _ in range(10_000):
        deep = [deep]
    _refused(lambda: Program.from_json({"profile": {"w": deep}}))
    _refused(lambda: Program.from_json({"key_in_set": {"ids": deep}}))
    _refused(lambda: Program.from_json({"sharpen": [{"self": {}}, 2, deep]}))


def test_ten_thousand_deep_built_tree_raises_validation_error() -> None:
    node: object = Prim("self")
    for _ in range(10_000):
        node = Sharpen(node, 2.0)
    _refused(lambda: Program.from_node(node))
    _refused(lambda: dsl.to_text(node))


def test_five_thousand_digit_number_raises_validation_error() -> None:
    digits = "9" * 5000
    err = _refused(lambda: Program.parse(f"prev({digits})"))
    assert str(dsl.MAX_LITERAL_CHARS) in str(err)
    _refused(lambda: Program.parse(f"0.{digits}*prev(1)"))
    _refused(lambda: dsl.from_json('{"prev": ' + digits + "}"))
    big = 10 ** 5000 - 1  # a 5,000-digit integer, as a JSON reader without a digit limit returns it
    _refused(lambda: Program.from_json({"prev": big}))
    _refused(lambda: Program.from_json({"profile": {"w": [big]}}))
    _refused(lambda: Program.from_json({"mix": [[big, {"self": {}}]]}))
    _refused(lambda: Program.from_json({"key_in_set": {"ids": [big]}}))


def test_long_names_and_strings_refused() -> None:
    _refused(lambda: Program.parse("x" * 100_000 + "()"))
    _refused(lambda: Program.parse("match(q='" + "x" * 100_000 + "', k=token, pairs=[[1, 2]])"))


def test_too_many_nodes_refused_early() -> None:
    text = " + ".join(["self()"] * 100_000)
    err = _refused(lambda: Program.parse(text))
    assert str(dsl.MAX_NODES) in str(err)
    _refused(lambda: Program.from_json({"mix": [[1, {"self": {}}]] * 100_000}))
    _refused(lambda: Program.from_json({"fallback": [{"self": {}}] * 100_000}))
    _refused(lambda: Program.from_node(Mul(tuple(Prim("self") for _ in range(100_000)))))


def test_cost_bound_refuses_expensive_programs_and_admits_searcher_sized_ones() -> None:
    leaf = "sharpen(match(q=token, k=token, pairs=[[1, 2]]), 2)"
    heavy = " + ".join([leaf] * (dsl.MAX_NODES // 3))
    assert dsl.cost(dsl.from_json({"self": {}})) >= 1
    err = _refused(lambda: Program.parse(heavy))
    assert "cost" in str(err) and str(dsl.MAX_COST) in str(err)
    # a gated, sharpened mixture of the size the searchers build stays well inside the bound
    branch = ("mul(profile(w=[1, 0.5], tail=0.1, bos=1), key_weight(w=[[3, 2]]), "
              "class_weight(q=[[1]], k=[[2]], w=[[2]]))")
    text = branch
    for g in range(8):
        text = f"gate(ids=[{g}], {branch}, {text})"
    prog = Program.parse(f"sharpen({text}, 2, by=[[3, [1, 2]]])")
    assert dsl.cost(prog.node) <= dsl.MAX_COST // 4


# ------------------------------------------------------------------------------------------
# error messages never echo huge input
# ------------------------------------------------------------------------------------------

TEN_MB = "x" * (10 * 2 ** 20)


@pytest.mark.parametrize("make", [
    lambda: Program.parse(TEN_MB),
    lambda: Program.parse("prev(" + TEN_MB + ")"),
    lambda: Program.parse("prev(1)" + " " * (10 * 2 ** 20) + "$"),
    lambda: dsl.from_json(TEN_MB),
    lambda: dsl.from_json(json.dumps({"recent": TEN_MB})),
    lambda: Program.from_json({"recent": TEN_MB}),
    lambda: Program.from_json({TEN_MB: {}}),
    lambda: Program.from_json({"prev": TEN_MB}),
    lambda: Program.from_json({"profile": {"w": TEN_MB}}),
    lambda: Program.from_json({"profile": {"w": [TEN_MB]}}),
    lambda: Program.from_json({"match": {"q": TEN_MB, "k": "token", "pairs": [[1, 2]]}}),
    lambda: Program.from_json({"match": {"q": "pos", "k": "token", "pairs": [[TEN_MB, 2]]}}),
    lambda: Program.from_json({"key_in_set": {"ids": [TEN_MB]}}),
    lambda: Program.from_json({"gate": [{"pos": TEN_MB}, {"self": {}}, {"self": {}}]}),
    lambda: Program.from_json({"sharpen": [{"self": {}}, TEN_MB]}),
    lambda: Program.from_json({"mix": [[TEN_MB, {"self": {}}]]}),
    lambda: Program.from_json({"fallback": TEN_MB}),
    lambda: Program.from_json([TEN_MB]),
    lambda: Program.from_json({"profile": {"w": [1.0] * 10 ** 6 + [TEN_MB]}}),
])
def test_error_messages_stay_short_for_ten_megabyte_inputs(make) -> None:
    _refused(make, seconds=3.0)


# ------------------------------------------------------------------------------------------
# every parameter of every primitive and combinator has a declared, enforced bound
# ------------------------------------------------------------------------------------------

M = dsl
# kind -> a value just past its bound (a new parameter kind without an entry here fails the test)
OVER_BOUND = {
    "offset": lambda: M.MAX_OFFSET + 1,
    "int": lambda: M.MAX_OFFSET + 1,
    "rate": lambda: 1.5,
    "ids": lambda: list(range(M.MAX_IDS + 1)),
    "pred": lambda: "not_a_flag",
    "feature": lambda: "not_a_feature",
    "select": lambda: "not_a_mode",
    "nonneg": lambda: M.MAX_WEIGHT * 10,
    "optnonneg": lambda: M.MAX_WEIGHT * 10,
    "weights": lambda: [1.0] * (M.MAX_PROFILE + 1),
    "idweights": lambda: [[i, 1.0] for i in range(M.MAX_IDS + 1)],
    "idclasses": lambda: [[i] for i in range(M.MAX_CLASSES + 1)],
    "matrix": lambda: [[M.MAX_WEIGHT * 10]],
    "pairs": lambda: [[i, i] for i in range(M.MAX_PAIRS + 1)],
}
VALID = {
    "window": {"a": 0, "b": 1}, "decay": {"rate": 0.5}, "key_in_set": {"ids": [1]}, "recent": {"pred": "punct"},
    "profile": {"w": [1.0]}, "key_weight": {"w": [[1, 2.0]]},
    "class_weight": {"q": [[1]], "k": [[2]], "w": [[1.0]]},
    "match": {"q": "token", "k": "token", "pairs": [[1, 2]]},
}


def test_every_parameter_kind_has_a_declared_bound() -> None:
    for name, spec in dsl.PRIMITIVES.items():
        assert name in dsl.PRIMITIVE_COST, f"primitive {name} has no cost constant"
        for pname, kind, _ in spec:
            assert kind in dsl.KIND_BOUNDS, f"{name}({pname}=...) of kind {kind!r} declares no bound"
            assert kind in OVER_BOUND, f"no hostile value for kind {kind!r}: add one to OVER_BOUND"
            assert dsl.KIND_BOUNDS[kind] in dsl.__doc__, f"bound of {kind!r} is not in the module docstring"
    for comb in dsl.COMBINATORS:
        assert comb in dsl.COMBINATOR_BOUNDS and comb in dsl.COMBINATOR_COST
        assert dsl.COMBINATOR_BOUNDS[comb] in dsl.__doc__, f"bound of {comb} is not in the module docstring"
    for const in ("MAX_TEXT_CHARS", "MAX_LITERAL_CHARS", "MAX_DEPTH", "MAX_LIST_DEPTH", "MAX_NODES", "MAX_COST"):
        assert f"{const} ({getattr(dsl, const):,})" in dsl.__doc__ or f"{const} ({getattr(dsl, const)})" in dsl.__doc__


@pytest.mark.parametrize("name, pname, kind", [
    (name, pname, kind) for name, spec in sorted(dsl.PRIMITIVES.items()) for pname, kind, _ in spec
])
def test_each_parameter_past_its_bound_is_refused(name: str, pname: str, kind: str) -> None:
    params = dict(VALID.get(name, {}))
    params[pname] = OVER_BOUND[kind]()
    if name == "class_weight" and pname in ("q", "k"):
        params["w"] = [[1.0]] * len(params["q"]) if pname == "q" else [[1.0] * len(params["k"])]
    body = params["pred"] if name == "recent" else params
    err = _refused(lambda: Program.from_json({name: body}), peak_mb=200)
    assert isinstance(err, ProgramError)
    assert pname in str(err) or name in str(err)


@pytest.mark.parametrize("node", [
    Mix(((M.MAX_WEIGHT * 10, Prim("self")),)),
    Mix(((0.0, Prim("self")),)),
    Sharpen(Prim("self"), M.MAX_EXPONENT * 10),
    Sharpen(Prim("self"), 2.0, tuple((1.0, (i,)) for i in range(M.MAX_CLASSES + 1))),
    Sharpen(Prim("self"), 2.0, ((1.0, tuple(range(M.MAX_IDS + 1))),)),
    Gate(Pred("ids", tuple(range(M.MAX_IDS + 1))), Prim("self"), Prim("first")),
    Gate(Pred("flag", "bogus"), Prim("self"), Prim("first")),
    Fallback((Prim("self"),)),
    Mul(()),
    Prim("prev", (("k", HUGE),)),
    Prim("nope"),
    Prim("profile", (("w", (1.0,) * (M.MAX_PROFILE + 1)), ("tail", 0.0), ("bos", None))),
])
def test_combinator_and_built_tree_bounds(node) -> None:
    _refused(lambda: Program.from_node(node))
    _refused(lambda: dsl.validate(node))


def test_valid_programs_are_unchanged() -> None:
    for text in ["0.7*prev(1) + 0.3*first()", "window(-2, 3)", "sharpen(uniform(), 2, by=[[3, [1, 2]]])",
                 "gate(ids=[5], prev(2), self())", "profile(w=[1, 0.5], tail=0.1, bos=1)"]:
        prog = Program.parse(text)
        assert Program.from_json(prog.to_json()) == prog
        assert Program.parse(prog.text) == prog
