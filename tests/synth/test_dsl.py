"""The DSL's text/JSON forms, validation errors, and the Program facade."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Fallback, Gate, Mix, Mul, Pred, Prim, Sharpen
from headsurgeon.synth.errors import ProgramExecutionError, ProgramValidationError
from headsurgeon.synth.program import Program
from headsurgeon.synth.sequence import Sequence

# ------------------------------------------------------------------------------------------
# random trees (structure only)
# ------------------------------------------------------------------------------------------

preds = st.one_of(
    st.sampled_from(dsl.FLAGS).map(lambda f: Pred("flag", f)),
    st.sampled_from(dsl.KNOWN_POS_TAGS).map(lambda t: Pred("pos", t)),
    st.lists(st.integers(0, 60000), min_size=1, max_size=4).map(lambda v: Pred("ids", tuple(sorted(set(v))))),
)
numbers = st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def prims(draw) -> Prim:
    name = draw(st.sampled_from(sorted(dsl.PRIMITIVES)))
    make = dsl.make_prim
    if name in ("prev", "next"):
        return make(name, [draw(st.integers(1, 1000))], {})
    if name == "window":
        a, b = sorted(draw(st.tuples(st.integers(-50, 50), st.integers(-50, 50))))
        return make(name, [a, b], {})
    if name == "decay":
        return make(name, [draw(st.floats(1e-9, 1.0, exclude_min=False))], {})
    if name == "key_in_set":
        return make(name, [draw(st.lists(st.integers(0, 60000), min_size=1, max_size=5))], {})
    if name == "recent":
        return Prim("recent", (("pred", draw(preds)),))
    if name == "profile":
        w = draw(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=8))
        kw = {"w": w, "tail": draw(st.floats(0.0, 1e3))}
        if draw(st.booleans()):
            kw["bos"] = draw(st.floats(0.0, 1e3))
        return make(name, [], kw)
    if name == "key_weight":
        table = draw(st.dictionaries(st.integers(0, 60000), st.floats(0.0, 1e6), min_size=1, max_size=5))
        return make(name, [], {"w": [[k, v] for k, v in table.items()], "default": draw(st.floats(0.0, 10.0))})
    if name == "class_weight":
        def classes(label: dict) -> list:
            return [sorted(t for t, c in label.items() if c == k) for k in sorted(set(label.values()))]
        q = classes(draw(st.dictionaries(st.integers(0, 60000), st.integers(0, 3), min_size=1, max_size=6)))
        k = classes(draw(st.dictionaries(st.integers(0, 60000), st.integers(0, 3), min_size=1, max_size=6)))
        w = [[draw(st.floats(0.0, 1e6)) for _ in k] for _ in q]
        return make(name, [], {"q": q, "k": k, "w": w, "default": draw(st.floats(0.0, 10.0))})
    if name == "match":
        q = draw(st.sampled_from(dsl.MATCH_FEATURES))
        k = draw(st.sampled_from(dsl.MATCH_FEATURES))
        val = lambda f: st.one_of(st.integers(-5, 500), st.sampled_from(dsl.KNOWN_POS_TAGS)) if f == "pos" \
            else st.integers(-5, 500)  # noqa: E731
        pairs = draw(st.lists(st.tuples(val(q), val(k)), min_size=1, max_size=5))
        return make(name, [], {"q": q, "k": k, "pairs": [list(p) for p in pairs],
                               "select": draw(st.sampled_from(dsl.SELECTS))})
    return make(name, [], {})


trees = st.recursive(
    prims(),
    lambda c: st.one_of(
        st.lists(st.tuples(numbers, c), min_size=1, max_size=3).map(lambda t: Mix(tuple(t))),
        st.lists(c, min_size=2, max_size=3).map(lambda a: Fallback(tuple(a))),
        st.tuples(preds, c, c).map(lambda t: Gate(*t)),
        st.tuples(c, numbers).map(lambda t: Sharpen(*t)),
        st.tuples(c, numbers, st.dictionaries(st.integers(0, 60000), st.integers(0, 2), min_size=1, max_size=6),
                  st.lists(numbers, min_size=3, max_size=3)).map(
            lambda t: dsl.make_sharpen(t[0], t[1], [[t[3][k], sorted(i for i, c in t[2].items() if c == k)]
                                                     for k in sorted(set(t[2].values()))])),
        st.lists(c, min_size=2, max_size=3).map(lambda a: Mul(tuple(a))),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(tree=trees)
def test_text_and_json_round_trip(tree) -> None:
    text = dsl.to_text(tree)
    assert dsl.parse(text) == tree
    assert dsl.to_text(dsl.parse(text)) == text
    obj = json.loads(json.dumps(dsl.to_json(tree)))
    assert dsl.from_json(obj) == tree
    assert dsl.from_json(json.dumps(obj)) == tree
    p = Program.from_node(tree)
    assert Program.parse(text) == p and Program.from_json(obj) == p
    assert Program.parse(text).hash == p.hash == Program.from_json(p.to_json()).hash


# ------------------------------------------------------------------------------------------
# documented forms
# ------------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_design_example_json_and_text() -> None:
    p = Program.parse("0.7*prev(1) + 0.3*first()")
    assert p.to_json() == {"mix": [[0.7, {"prev": 1}], [0.3, {"first": {}}]]}
    assert Program.from_json({"mix": [[0.7, {"prev": 1}], [0.3, {"first": {}}]]}) == p
    assert p.kind == "dsl" and p.text == "0.7*prev(1) + 0.3*first()"
    assert len(p.hash) == 64 and int(p.hash, 16) >= 0


@pytest.mark.parametrize("text, canonical", [
    ("fallback(same_token_recent(), first())", "fallback(same_token_recent(), first())"),
    ("match(q=token, k=token, pairs=[[3,5]], select=closest)",
     "match(q=token, k=token, pairs=[[3, 5]], select=closest)"),
    ("match(q=pos, k=pos, pairs=[[noun, 'DET'], [1, 2], [1, 2]])",
     "match(q=pos, k=pos, pairs=[[1, 2], [NOUN, DET]], select=closest)"),
    ("  prev( k = 2 )", "prev(2)"),
    ("prev()", "prev(1)"),
    ("window(-2, 2)", "window(-2, 2)"),
    ("window(a=1, b=3)", "window(1, 3)"),
    ("decay(rate=0.50)", "decay(0.5)"),
    ("key_in_set(ids=[9, 3, 3])", "key_in_set(ids=[3, 9])"),
    ("key_in_set([4])", "key_in_set(ids=[4])"),
    ("recent(punct)", "recent(punct)"),
    ("recent(pos=propn)", "recent(pos=PROPN)"),
    ("recent(pred=sent_end)", "recent(sent_end)"),
    ("recent(ids=[13])", "recent(ids=[13])"),
    ("gate(ids=[5, 2], prev(1), self())", "gate(ids=[2, 5], prev(1), self())"),
    ("gate(pos=NOUN, dep_head(), fallback(dep_children(), first()))",
     "gate(pos=NOUN, dep_head(), fallback(dep_children(), first()))"),
    ("sharpen(decay(0.9), t=3)", "sharpen(decay(0.9), 3)"),
    ("sharpen(decay(0.9), 2, by=[[3, [9, 4]], [0.5, [1]]])", "sharpen(decay(0.9), 2, by=[[0.5, [1]], [3, [4, 9]]])"),
    ("sharpen(decay(0.9), 2, by=[])", "sharpen(decay(0.9), 2)"),
    ("prev(1) + first()", "1*prev(1) + 1*first()"),
    ("prev(1)*0.25 + 2e-3*uniform()", "0.25*prev(1) + 0.002*uniform()"),
    ("0.5*(0.5*prev(1) + 0.5*prev(2)) + 0.5*self()", "0.5*(0.5*prev(1) + 0.5*prev(2)) + 0.5*self()"),
    ("(prev(1))", "prev(1)"),
    ("mul(uniform(), key_in_set(ids=[1]))", "mul(uniform(), key_in_set(ids=[1]))"),
    ("fallback(induction(), same_word(), sentence_start())", "fallback(induction(), same_word(), sentence_start())"),
    ("ngram_induction()", "ngram_induction(2)"),
    ("sum(4*first(), induction(), ngram_induction(n=3))", "sum(4*first(), induction(), ngram_induction(3))"),
    ("profile([1, 0.50], 0.1)", "profile(w=[1, 0.5], tail=0.1)"),
    ("profile(w=[2], bos=0.3)", "profile(w=[2], tail=0, bos=0.3)"),
    ("key_weight(w=[[9, 2], [3, 0.5]])", "key_weight(w=[[3, 0.5], [9, 2]], default=1)"),
    ("mul(profile(w=[1, 0.5], tail=0.01), key_weight(w=[[4, 3]], default=0.5))",
     "mul(profile(w=[1, 0.5], tail=0.01), key_weight(w=[[4, 3]], default=0.5))"),
])
def test_text_forms(text: str, canonical: str) -> None:
    node = dsl.parse(text)
    assert dsl.to_text(node) == canonical
    assert Program.parse(text) == Program.parse(canonical)


def test_ngram_induction_json_form_and_bounds() -> None:
    """The n-gram induction writes as ``{"ngram_induction": n}``, reads back, and refuses n outside 2..8 by name."""
    p = Program.parse("0.9*first() + 0.1*ngram_induction(2)")
    assert p.to_json() == {"mix": [[0.9, {"first": {}}], [0.1, {"ngram_induction": 2}]]}
    assert Program.from_json(json.dumps(p.to_json())) == p and Program.from_json({"ngram_induction": {"n": 2}}) == \
        Program.parse("ngram_induction(2)")
    assert Program.parse("ngram_induction(2)") != Program.parse("ngram_induction(3)")
    for bad in ("ngram_induction(1)", "ngram_induction(9)"):
        with pytest.raises(ProgramValidationError, match=r"2 <= n <= 8 \(n=1 is induction\(\)\)"):
            Program.parse(bad)


def test_equivalent_spellings_share_hash_and_others_differ() -> None:
    a = Program.parse("key_in_set(ids=[3, 1])")
    b = Program.from_json('{"key_in_set": {"ids": [1, 3, 3]}}')
    c = Program.from_json({"dsl": "key_in_set(ids=[1,3])"})
    assert a == b == c and a.hash == b.hash == c.hash and len({a, b, c}) == 1
    assert Program.from_json({"prev": {"k": 2}}) == Program.parse("prev(2)")
    assert Program.parse("prev(1)") != Program.parse("prev(2)")
    assert Program.parse("prev(1)").hash != Program.parse("next(1)").hash


def test_features_needed() -> None:
    assert Program.parse("0.5*prev(1) + 0.5*induction()").features_needed == frozenset()
    p = Program.parse("gate(pos=NOUN, recent(punct), fallback(same_word(), sentence_start(), dep_head()))")
    assert p.features_needed == {"pos", "punct", "word", "sent", "dep_head"}
    assert Program.parse("match(q=cap, k=position, pairs=[[1, 0]])").features_needed == {"cap"}
    assert Program.parse("gate(ids=[3], word_start(), recent(newline))").features_needed == {"word", "newline"}


# ------------------------------------------------------------------------------------------
# validation errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("foo()", "unknown primitive 'foo'"),
    ("prev(0)", "offset >= 1"),
    ("prev(1.5)", "must be an integer"),
    ("prev(1, 2)", "takes 1 argument"),
    ("prev(j=2)", "no parameter 'j'"),
    ("prev(1, k=2)", "twice"),
    ("self(1)", "takes 0 argument"),
    ("decay(2)", r"\(0, 1\]"),
    ("decay()", "missing parameter 'rate'"),
    ("window(3, 1)", "a <= b"),
    ("key_in_set(ids=[])", "non-empty list"),
    ("key_in_set(ids=[-1])", ">= 0"),
    ("recent(bogus)", "expected a predicate"),
    ("recent(pos=FOO)", "POS tag"),
    ("recent()", "one predicate"),
    ("match(q=bogus, k=token, pairs=[[1, 2]])", "must be a feature"),
    ("match(q=token, k=token, pairs=[[1, 2]], select=nearest)", "closest, all"),
    ("match(q=token, k=token, pairs=[[1]])", r"\[query value, key value\]"),
    ("match(q=token, k=token, pairs=[[NOUN, 1]])", "must be an integer"),
    ("match(q=token, k=token)", "missing parameter 'pairs'"),
    ("fallback(prev(1))", "at least 2"),
    ("mul(prev(1), 3)", "only expressions"),
    ("gate(punct, prev(1))", "takes 3 arguments"),
    ("gate(prev(1), prev(1), self())", "gate\\(PRED, A, B\\)"),
    ("gate(bogus, prev(1), self())", "expected a predicate"),
    ("sharpen(prev(1))", "sharpen\\(A, t\\)"),
    ("sharpen(prev(1), 0)", "t > 0"),
    ("sharpen(prev(1), 2, by=[[0, [3]]])", "exponents must be > 0"),
    ("sharpen(prev(1), 2, by=[[1, [3]], [2, [3, 4]]])", "two classes"),
    ("sharpen(prev(1), 2, by=[[1, []]])", "non-empty list of token ids"),
    ("sharpen(prev(1), 2, by=[1, 2])", r"\[t, \[token ids\]\]"),
    ("sharpen(prev(1), 2, bye=[[1, [2]]])", "sharpen\\(A, t\\)"),
    ("prev(prev(1))", "does not take expressions"),
    ("prev(1", r"expected '\)'"),
    ("prev(1))", r"unexpected '\)'"),
    ("0.7 prev(1)", "weight"),
    ("0*prev(1)", "must be > 0"),
    ("-0.5*prev(1)", "expected a primitive"),
    ("prev", "parentheses"),
    ("prev(1) $ first()", "unexpected character"),
    ("", "empty DSL program"),
    ("mix(prev(1))", "w1\\*A"),
    ("(" * 70 + "prev(1)" + ")" * 70, "deeper than"),
    ("profile()", "missing parameter 'w'"),
    ("profile(w=[])", "non-empty list of weights"),
    ("profile(w=[1, -0.5])", "must be >= 0"),
    ("profile(w=[1e40])", "at most"),
    ("profile(w=[1], tail=-1)", "must be >= 0"),
    ("key_weight(w=[3, 4])", r"\[token id, weight\]"),
    ("key_weight(w=[[3, 1], [3, 2]])", "twice"),
    ("key_weight(w=[[-3, 1]])", "token ids must be >= 0"),
    ("key_weight(w=[[3, -1]])", "must be >= 0"),
    ("key_weight(w=[[3, 1]], default=-2)", "must be >= 0"),
    ("class_weight(q=[[1], [1, 2]], k=[[3]], w=[[1], [1]])", "two classes"),
    ("class_weight(q=[[1]], k=[[3], [4]], w=[[1]])", "1 rows .* of 2 weights"),
    ("class_weight(q=[[1]], k=[[3]], w=[[-1]])", "must be >= 0"),
    ("class_weight(q=[], k=[[3]], w=[])", "non-empty list of token classes"),
])
def test_text_validation_errors(text: str, message: str) -> None:
    with pytest.raises(ProgramValidationError, match=message):
        dsl.parse(text)
    with pytest.raises(ProgramValidationError):
        Program.parse(text)


def _nest(depth: int):
    node: object = {"self": {}}
    for _ in range(depth):
        node = {"sharpen": [node, 2]}
    return node


@pytest.mark.parametrize("obj, message", [
    ({"prev": 1, "next": 1}, "exactly one key"),
    ([1, 2], "exactly one key"),
    ({"nope": {}}, "unknown primitive 'nope'"),
    ({"prev": {"j": 2}}, "no parameter 'j'"),
    ({"prev": "x"}, "must be an integer"),
    ({"prev": True}, "must be an integer"),
    ({"mix": []}, "non-empty list"),
    ({"mix": [[0.5]]}, r"\[weight, node\]"),
    ({"mix": [[float("nan"), {"self": {}}]]}, "finite"),
    ({"mix": [["a", {"self": {}}]]}, "must be a number"),
    ({"fallback": [{"self": {}}]}, "at least 2"),
    ({"gate": ["punct", {"self": {}}]}, r"\[predicate, node, node\]"),
    ({"gate": [{"colour": "red"}, {"self": {}}, {"self": {}}]}, "unknown predicate"),
    ({"sharpen": [{"self": {}}, -1]}, "t > 0"),
    ({"sharpen": [{"self": {}}, 2, [[1, [3]], [1, [3]]]]}, "two classes"),
    ({"sharpen": [{"self": {}}, 2, [], 4]}, "expects \\[node, t\\]"),
    ({"recent": 3}, "a predicate is a flag name"),
    ({"window": {"a": 1}}, "missing parameter 'b'"),
    (_nest(80), "deeper than"),
    ("{not json", "does not parse"),
    ({"profile": {"w": [1, "x"]}}, "must be a number"),
    ({"key_weight": {"w": [[1.5, 2]]}}, "must be an integer"),
])
def test_json_validation_errors(obj, message: str) -> None:
    with pytest.raises(ProgramValidationError, match=message):
        Program.from_json(obj)


def test_pos_tags_agree_with_features_module() -> None:
    features = pytest.importorskip("headsurgeon.synth.features")
    assert set(features.POS_TAGS) == set(dsl.KNOWN_POS_TAGS)


# ------------------------------------------------------------------------------------------
# Program.evaluate over Sequences
# ------------------------------------------------------------------------------------------


def _seq(text: str) -> Sequence:
    """A character-level Sequence with a BOS at position 0 (one token per character)."""
    tokens = ["<s>"] + list(text)
    offsets = [(0, 0)] + [(i, i + 1) for i in range(len(text))]
    ids = [1] + [ord(c) for c in text]
    return Sequence(ids=np.array(ids), tokens=tokens, text=text, offsets=np.array(offsets), has_bos=True)


def test_evaluate_sequences_matches_arrays_and_fetches_only_needed_features(monkeypatch) -> None:
    seqs = [_seq("abcab"), _seq("xyx")]
    p = Program.parse("0.6*fallback(induction(), first()) + 0.4*prev(2)")
    got = p.evaluate(seqs)
    assert got.shape == (2, 6, 6) and got.dtype == np.float32
    ids = np.zeros((2, 6), np.int64)
    ids[0], ids[1, :4] = seqs[0].ids, seqs[1].ids
    np.testing.assert_array_equal(got, p.evaluate_arrays(ids, np.array([6, 4])))
    np.testing.assert_allclose(got.sum(-1), [[1] * 6, [1] * 4 + [0] * 2], rtol=1e-6)

    import headsurgeon.synth.features as features

    calls: list[list[str]] = []
    fake = {"word": np.array([[0, 1, 1, 2, 3, 3], [0, 1, 1, 2, -1, -1]]),
            "punct": np.array([[0, 0, 1, 0, 0, 1], [0, 1, 0, 0, -1, -1]])}
    monkeypatch.setattr(features, "batch_feature_arrays",
                        lambda s, names: calls.append(sorted(names)) or {k: fake[k] for k in names})
    q = Program.parse("fallback(recent(punct), word_start())")
    out = q.evaluate(seqs)
    assert calls == [["punct", "word"]]
    np.testing.assert_array_equal(out, q.evaluate_arrays(ids, np.array([6, 4]), fake))
    calls.clear()
    q.evaluate(seqs, features={"punct": fake["punct"]})
    assert calls == [["word"]]
    assert Program.parse("prev(1)").evaluate(seqs).shape == (2, 6, 6) and calls == [["word"]]


def test_evaluate_with_real_feature_module() -> None:
    """Basic (non-spaCy) features from the features module feed the kernels."""
    pytest.importorskip("headsurgeon.synth.features")
    seqs = [_seq("Hi there. Bye now.")]
    p = Program.parse("sentence_start()")
    got = p.evaluate(seqs, causal=True)[0]
    # every query attends to exactly one key at or before it, the start of its own sentence
    keys = got.argmax(-1)
    assert (got.max(-1) == 1).all() and (keys <= np.arange(len(keys))).all()
    assert len(set(keys.tolist())) >= 2  # two sentences at least


PREV_SOURCE = '''
def prev_token(seq):
    n = seq.n
    out = np.zeros((n, n))
    for i in range(1, n):
        out[i, i - 1] = 1.0
    return out
'''


def test_python_programs() -> None:
    pytest.importorskip("headsurgeon.synth.sandbox")
    p = Program.python(PREV_SOURCE)
    assert p.kind == "python" and p.to_json() == {"python": p.text}
    assert p.features_needed == frozenset()
    assert Program.from_json(json.dumps(p.to_json())) == p
    assert Program.python(PREV_SOURCE.replace("\n", "\r\n") + "\n\n") == p  # canonical source
    assert p != Program.parse("prev(1)")
    seqs = [_seq("abcab"), _seq("xyx")]
    np.testing.assert_array_equal(p.evaluate(seqs), Program.parse("prev(1)").evaluate(seqs))
    with pytest.raises(ProgramValidationError):
        Program.python("import os\ndef f(seq):\n    return os.listdir('.')\n")
    bad = Program.python("def f(seq):\n    raise ValueError('boom')\n")
    with pytest.raises(ProgramExecutionError, match="sequence 0"):
        bad.evaluate(seqs)
    with pytest.raises(TypeError):
        p.evaluate_arrays(np.zeros((1, 2), np.int64), np.array([2]))
