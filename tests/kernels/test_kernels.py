"""Every DSL primitive and combinator against a plain-Python (loops over lists) reference.

The references below are written from the DSL's documented semantics, cell by cell, and share no
code with the numba kernels. Batches are random, small and padded with junk beyond each length
(kernels must ignore it).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headsurgeon.kernels import primitives as K
from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Fallback, Gate, Mix, Mul, Pred, Prim, Sharpen, Sum

TAGS = list(dsl.KNOWN_POS_TAGS)  # tag name -> id used by these tests (passed as pos_tags)
FEATURE_NAMES = ("word", "sent", "punct", "cap", "newline", "sent_end", "word_start", "pos", "dep_head", "dep", "lemma",
                 "quote")
DEPS = list(dsl.dep_labels())  # label name -> index of the ``dep`` feature array

# ------------------------------------------------------------------------------------------
# the reference: one sequence at a time, Python lists and loops
# ------------------------------------------------------------------------------------------


def ref_visible(i: int, j: int, n: int, causal: bool) -> bool:
    return 0 <= j < n and 0 <= i < n and (j <= i or not causal)


def ref_value(seq: dict, feature: str, p: int):
    if feature == "token":
        return seq["ids"][p]
    if feature == "position":
        return p
    return seq[feature][p]


def ref_pred(seq: dict, pred: Pred, p: int) -> bool:
    if pred.kind == "flag":
        return seq[pred.value][p] != 0
    if pred.kind == "pos":
        return seq["pos"][p] == TAGS.index(pred.value)
    if pred.kind == "dep":
        return seq["dep"][p] == DEPS.index(pred.value)
    return seq["ids"][p] in pred.value


def ref_prim(node: Prim, seq: dict, causal: bool) -> list[list[float]]:
    """Raw scores of one primitive on one unpadded sequence."""
    ids = seq["ids"]
    n = len(ids)
    name = node.name
    p = dict(node.params)
    out = [[0.0] * n for _ in range(n)]
    for i in range(n):
        if name == "same_token_recent":
            earlier = [q for q in range(i) if ids[q] == ids[i]]
            target = {max(earlier)} if earlier else set()
        elif name == "recent":
            hits = [q for q in range(i + 1) if ref_pred(seq, p["pred"], q)]
            target = {max(hits)} if hits else set()
        elif name in ("sentence_start", "word_start"):
            g = seq["sent" if name == "sentence_start" else "word"]
            target = {min(q for q in range(n) if g[q] == g[i])}
        elif name == "induction":
            occ = [q for q in range(n) if q != i and ids[q] == ids[i] and (q < i or not causal)]
            target = {q + 1 for q in occ}
        elif name == "ngram_induction":
            g = p["n"]
            occ = [q for q in range(g - 1, n) if q != i and i >= g - 1 and (q < i or not causal)
                   and all(ids[q - k] == ids[i - k] for k in range(g))]
            target = {q + 1 for q in occ}
        elif name == "match":
            table = {(a if not isinstance(a, str) else TAGS.index(a),
                      b if not isinstance(b, str) else TAGS.index(b)) for a, b in p["pairs"]}
            hits = [j for j in range(n) if ref_visible(i, j, n, causal)
                    and (ref_value(seq, p["q"], i), ref_value(seq, p["k"], j)) in table]
            if p["select"] == "all" or not hits:
                target = set(hits)
            elif causal:
                target = {max(hits)}
            else:
                target = {min(hits, key=lambda j: (abs(i - j), j))}
        else:
            target = None
        for j in range(n):
            if not ref_visible(i, j, n, causal):
                continue
            if target is not None:
                v = 1.0 if j in target else 0.0
            elif name == "self":
                v = float(j == i)
            elif name == "prev":
                v = float(j == i - p["k"])
            elif name == "next":
                v = float(j == i + p["k"])
            elif name == "first":
                v = float(j == 0)
            elif name == "window":
                v = float(p["a"] <= i - j <= p["b"])
            elif name == "decay":
                v = p["rate"] ** abs(i - j)
            elif name == "uniform":
                v = 1.0
            elif name == "none":
                v = 0.0
            elif name == "same_token":
                v = float(j != i and ids[j] == ids[i])
            elif name == "key_in_set":
                v = float(ids[j] in p["ids"])
            elif name == "same_word":
                v = float(seq["word"][j] == seq["word"][i])
            elif name == "same_lemma":
                v = float(j != i and seq["lemma"][i] >= 0 and seq["lemma"][j] == seq["lemma"][i])
            elif name == "dep_head":
                v = float(j == seq["dep_head"][i])
            elif name == "dep_children":
                v = float(seq["dep_head"][j] == i)
            elif name == "profile":
                d = i - j
                if d < 0:
                    v = 0.0
                elif j == 0 and p["bos"] is not None:
                    v = p["bos"]
                else:
                    v = p["w"][d] if d < len(p["w"]) else p["tail"]
            elif name == "key_weight":
                v = dict(p["w"]).get(int(ids[j]), p["default"])
            elif name == "class_weight":
                qc = [c for c, cls in enumerate(p["q"]) if int(ids[i]) in cls]
                kc = [c for c, cls in enumerate(p["k"]) if int(ids[j]) in cls]
                v = p["w"][qc[0]][kc[0]] if qc and kc else p["default"]
            else:
                raise AssertionError(f"no reference for {name}")
            out[i][j] = v
    return out


def ref_rownorm(row: list[float]) -> list[float]:
    s = sum(row)
    return [v / s for v in row] if s > 0 else list(row)


def ref_eval(node, seq: dict, causal: bool) -> list[list[float]]:
    """Raw scores of a whole tree on one sequence."""
    n = len(seq["ids"])
    if isinstance(node, Prim):
        return ref_prim(node, seq, causal)
    if isinstance(node, Mix):
        out = [[0.0] * n for _ in range(n)]
        for w, t in node.terms:
            sub = ref_eval(t, seq, causal)
            for i in range(n):
                row = ref_rownorm(sub[i])
                for j in range(n):
                    out[i][j] += w * row[j]
        return out
    if isinstance(node, Sum):  # EAPS's idiom: add raw weighted scores, then normalize each row once
        out = [[0.0] * n for _ in range(n)]
        for w, t in node.terms:
            sub = ref_eval(t, seq, causal)
            for i in range(n):
                for j in range(n):
                    out[i][j] += w * sub[i][j]
        return [ref_rownorm(row) for row in out]
    if isinstance(node, Fallback):
        subs = [ref_eval(a, seq, causal) for a in node.args]
        out = []
        for i in range(n):
            chosen = next((s[i] for s in subs if sum(s[i]) > 0), subs[-1][i])
            out.append(list(chosen))
        return out
    if isinstance(node, Gate):
        a, b = ref_eval(node.then, seq, causal), ref_eval(node.other, seq, causal)
        return [list(a[i] if ref_pred(seq, node.pred, i) else b[i]) for i in range(n)]
    if isinstance(node, Sharpen):
        sub = ref_eval(node.arg, seq, causal)
        texp = [next((t for t, ids in node.by if seq["ids"][i] in ids), node.t) for i in range(n)]
        return [ref_rownorm([v ** texp[i] if v > 0 else 0.0 for v in row]) for i, row in enumerate(sub)]
    if isinstance(node, Mul):
        subs = [ref_eval(a, seq, causal) for a in node.args]
        return [[math.prod(s[i][j] for s in subs) for j in range(n)] for i in range(n)]
    raise AssertionError(node)


def ref_normalize(scores: list[list[float]], causal: bool) -> list[list[float]]:
    n = len(scores)
    out = []
    for i in range(n):
        row = [max(scores[i][j], 0.0) if ref_visible(i, j, n, causal) else 0.0 for j in range(n)]
        s = sum(row)
        out.append([v / s for v in row] if s > 0 else [1.0 if j == 0 else 0.0 for j in range(n)])
    return out


def ref_batch(node, batch: dict, causal: bool, normalize: bool) -> np.ndarray:
    ids, lengths = batch["ids"], batch["lengths"]
    nb, width = ids.shape
    out = np.zeros((nb, width, width))
    for b in range(nb):
        length = int(lengths[b])
        seq = {"ids": [int(v) for v in ids[b, :length]]}
        for name in FEATURE_NAMES:
            seq[name] = [int(v) for v in batch["features"][name][b, :length]]
        m = ref_eval(node, seq, causal)
        if normalize:
            m = ref_normalize(m, causal)
        if length:
            out[b, :length, :length] = np.array(m)
    return out


# ------------------------------------------------------------------------------------------
# strategies
# ------------------------------------------------------------------------------------------

SMALL = st.integers(-1, 5)
# float32 scores: weights are 0 or well inside float32's normal range (the reference computes in float64)
WEIGHTS = st.one_of(st.just(0.0), st.floats(1e-3, 4.0))


@st.composite
def batches(draw, max_b: int = 3, max_n: int = 9) -> dict:
    """A padded batch; shapes, lengths and the vocabulary size shrink, array contents come from a seed."""
    nb = draw(st.integers(1, max_b))
    width = draw(st.integers(1, max_n))
    lengths = np.array(draw(st.lists(st.integers(0, width), min_size=nb, max_size=nb)), dtype=np.int64)
    vocab = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arr = lambda lo, hi: rng.integers(lo, hi + 1, size=(nb, width), dtype=np.int64)  # noqa: E731
    feats = {
        "word": arr(0, 4),
        "sent": arr(0, 2),
        "punct": arr(0, 1),
        "cap": arr(0, 1),
        "newline": arr(0, 1),
        "sent_end": arr(0, 1),
        "word_start": arr(0, 1),
        "pos": arr(-1, 4),
        "dep_head": arr(-1, width),
        "dep": arr(-1, 4),
        "lemma": arr(-1, 3),
        "quote": arr(0, 1),
    }
    return {"ids": arr(0, vocab - 1), "lengths": lengths, "features": feats}


preds = st.one_of(
    st.sampled_from(dsl.FLAGS).map(lambda f: Pred("flag", f)),
    st.sampled_from(TAGS[:5]).map(lambda t: Pred("pos", t)),
    st.sampled_from(DEPS[:5]).map(lambda t: Pred("dep", t)),
    st.lists(st.integers(0, 5), min_size=1, max_size=3).map(lambda v: Pred("ids", tuple(sorted(set(v))))),
)


def _pair_values(feature: str):
    if feature == "pos":
        return st.one_of(SMALL, st.sampled_from(TAGS[:5]))
    if feature in ("position", "dep_head"):
        return st.integers(-1, 9)
    return SMALL


@st.composite
def match_prims(draw) -> Prim:
    q = draw(st.sampled_from(dsl.MATCH_FEATURES))
    k = draw(st.sampled_from(dsl.MATCH_FEATURES))
    pairs = draw(st.lists(st.tuples(_pair_values(q), _pair_values(k)), min_size=1, max_size=6))
    select = draw(st.sampled_from(dsl.SELECTS))
    return dsl.make_prim("match", [], {"q": q, "k": k, "pairs": [list(x) for x in pairs], "select": select})


@st.composite
def prims(draw, name: str | None = None) -> Prim:
    if name is None:
        name = draw(st.sampled_from(sorted(dsl.PRIMITIVES)))
    if name == "match":
        return draw(match_prims())
    if name in ("prev", "next"):
        return dsl.make_prim(name, [draw(st.integers(1, 10))], {})
    if name == "ngram_induction":
        return dsl.make_prim(name, [draw(st.integers(2, 3))], {})
    if name == "window":
        a, b = sorted(draw(st.tuples(st.integers(-4, 5), st.integers(-4, 5))))
        return dsl.make_prim(name, [a, b], {})
    if name == "decay":
        return dsl.make_prim(name, [draw(st.floats(0.5, 1.0))], {})
    if name == "key_in_set":
        return dsl.make_prim(name, [draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))], {})
    if name == "recent":
        return Prim("recent", (("pred", draw(preds)),))
    if name == "profile":
        w = draw(st.lists(WEIGHTS, min_size=1, max_size=6))
        bos = draw(st.one_of(st.none(), WEIGHTS))
        return dsl.make_prim(name, [], {"w": w, "tail": draw(WEIGHTS), "bos": bos})
    if name == "key_weight":
        table = draw(st.dictionaries(st.integers(0, 5), WEIGHTS, min_size=1, max_size=4))
        return dsl.make_prim(name, [], {"w": [[k, v] for k, v in table.items()], "default": draw(WEIGHTS)})
    if name == "class_weight":
        def classes(label: dict) -> list:
            return [sorted(t for t, c in label.items() if c == k) for k in sorted(set(label.values()))]
        q = classes(draw(st.dictionaries(st.integers(0, 5), st.integers(0, 2), min_size=1, max_size=5)))
        k = classes(draw(st.dictionaries(st.integers(0, 5), st.integers(0, 2), min_size=1, max_size=5)))
        w = [[draw(WEIGHTS) for _ in k] for _ in q]
        return dsl.make_prim(name, [], {"q": q, "k": k, "w": w, "default": draw(WEIGHTS)})
    return dsl.make_prim(name, [], {})


# sharpen(A, t, by=[[t1, ids1], ..]): disjoint query-token classes with their own exponents
@st.composite
def sharpen_classes(draw) -> list:
    """Disjoint query-token classes [[t, [ids..]], ..] for sharpen(A, t, by=...) (possibly none)."""
    cls = draw(st.dictionaries(st.integers(0, 5), st.integers(0, 2), max_size=5))  # token -> class
    exps = draw(st.lists(st.floats(0.25, 3.0), min_size=3, max_size=3))
    return [[exps[c], sorted(t for t, k in cls.items() if k == c)] for c in sorted(set(cls.values()))]


def trees(max_leaves: int = 6):
    weights = st.floats(0.05, 3.0, allow_nan=False)

    def extend(children):
        return st.one_of(
            st.lists(st.tuples(weights, children), min_size=1, max_size=3).map(lambda t: Mix(tuple(t))),
            st.lists(st.tuples(weights, children), min_size=1, max_size=3).map(lambda t: Sum(tuple(t))),
            st.lists(children, min_size=2, max_size=3).map(lambda a: Fallback(tuple(a))),
            st.tuples(preds, children, children).map(lambda t: Gate(*t)),
            st.tuples(children, st.floats(0.25, 3.0)).map(lambda t: Sharpen(*t)),
            st.tuples(children, st.floats(0.25, 3.0), sharpen_classes()).map(lambda t: dsl.make_sharpen(*t)),
            st.lists(children, min_size=2, max_size=2).map(lambda a: Mul(tuple(a))),
        )

    return st.recursive(prims(), extend, max_leaves=max_leaves)


def run(node, batch: dict, causal: bool, normalize: bool) -> np.ndarray:
    fn = dsl.evaluate if normalize else dsl.evaluate_scores
    return fn(node, batch["ids"], batch["lengths"], batch["features"], causal, pos_tags=TAGS)


# ------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(dsl.PRIMITIVES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), causal=st.booleans())
def test_primitive_matches_reference(name: str, data, causal: bool) -> None:
    node = data.draw(prims(name))
    batch = data.draw(batches())
    got = run(node, batch, causal, normalize=False)
    assert got.dtype == np.float32
    assert got.shape == (batch["ids"].shape[0],) + (batch["ids"].shape[1],) * 2
    np.testing.assert_allclose(got, ref_batch(node, batch, causal, normalize=False), rtol=1e-6, atol=1e-7)
    attn = run(node, batch, causal, normalize=True)
    np.testing.assert_allclose(attn, ref_batch(node, batch, causal, normalize=True), rtol=1e-5, atol=1e-6)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=trees(), batch=batches(), causal=st.booleans())
def test_combinators_match_reference(node, batch: dict, causal: bool) -> None:
    got = run(node, batch, causal, normalize=False)
    np.testing.assert_allclose(got, ref_batch(node, batch, causal, normalize=False), rtol=1e-4, atol=1e-6)
    attn = run(node, batch, causal, normalize=True)
    np.testing.assert_allclose(attn, ref_batch(node, batch, causal, normalize=True), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("combinator", ["mix", "sum", "fallback", "gate", "sharpen", "mul"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), causal=st.booleans())
def test_each_combinator_over_primitives(combinator: str, data, causal: bool) -> None:
    a, b = data.draw(prims()), data.draw(prims())
    node = {
        "mix": lambda: Mix(((data.draw(st.floats(0.1, 2.0)), a), (data.draw(st.floats(0.1, 2.0)), b))),
        "sum": lambda: Sum(((data.draw(st.floats(0.1, 2.0)), a), (data.draw(st.floats(0.1, 2.0)), b))),
        "fallback": lambda: Fallback((a, b)),
        "gate": lambda: Gate(data.draw(preds), a, b),
        "sharpen": lambda: dsl.make_sharpen(a, data.draw(st.floats(0.25, 3.0)), data.draw(sharpen_classes())),
        "mul": lambda: Mul((a, b)),
    }[combinator]()
    batch = data.draw(batches())
    np.testing.assert_allclose(run(node, batch, causal, False), ref_batch(node, batch, causal, False),
                               rtol=1e-4, atol=1e-6)


def test_hand_computed_mix() -> None:
    """0.7*prev(1) + 0.3*first(), length 4: row 0 -> BOS; row 1 -> prev is BOS too; then 0.3/0.7 splits."""
    node = dsl.parse("0.7*prev(1) + 0.3*first()")
    got = dsl.evaluate(node, np.array([[9, 8, 7, 6]]), np.array([4]), causal=True)
    want = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0.3, 0.7, 0, 0], [0.3, 0, 0.7, 0]], dtype=np.float32)
    np.testing.assert_allclose(got[0], want, atol=1e-7)


def test_hand_computed_induction_and_fallback() -> None:
    """Tokens A B C A B: query 3 (A) -> key 1 (after earlier A); query 4 (B) -> key 2; others -> BOS."""
    node = dsl.parse("fallback(induction(), first())")
    got = dsl.evaluate(node, np.array([[1, 2, 3, 1, 2]]), np.array([5]), causal=True)[0]
    want = np.zeros((5, 5), dtype=np.float32)
    want[[0, 1, 2], 0] = 1
    want[3, 1] = 1
    want[4, 2] = 1
    np.testing.assert_array_equal(got, want)


def test_hand_computed_ngram_induction() -> None:
    """Tokens A B C A B A B: query 4 (last two A B) -> key 2, after the A B at 0-1; query 6 (A B) -> keys 2 and 5;
    query 5 (B A) and query 3 (C A) have no earlier pair. Dense and sparse agree; summed with ``induction()`` a
    two-token match scores twice a one-token match."""
    ids, lengths = np.array([[1, 2, 3, 1, 2, 1, 2]]), np.array([7])
    raw = dsl.evaluate_scores(dsl.parse("ngram_induction(2)"), ids, lengths, causal=True)[0]
    want = np.zeros((7, 7), dtype=np.float32)
    want[4, 2] = 1
    want[6, [2, 5]] = 1
    np.testing.assert_array_equal(raw, want)
    np.testing.assert_array_equal(K.sparse_ngram_induction(ids, lengths, 2, True).to_dense()[0], want)
    both = dsl.evaluate(dsl.parse("sum(2*first(), induction(), ngram_induction(2))"), ids, lengths, causal=True)[0]
    np.testing.assert_allclose(both[4], [0.5, 0, 0.5, 0, 0, 0, 0])
    np.testing.assert_allclose(both[5], [0.5, 0.25, 0, 0, 0.25, 0, 0])  # A: one-token matches at keys 1 and 4
    np.testing.assert_allclose(both[6], [1 / 3, 0, 1 / 3, 0, 0, 1 / 3, 0], rtol=1e-6)
    abc = np.array([[1, 2, 3, 1, 2, 3]])  # three tokens: only query 5 (A B C) has an earlier A B C, at 0-2
    three = dsl.evaluate_scores(dsl.parse("ngram_induction(3)"), abc, np.array([6]), causal=True)[0]
    assert np.argwhere(three).tolist() == [[5, 3]]
    np.testing.assert_array_equal(K.sparse_ngram_induction(abc, np.array([6]), 3, True).to_dense()[0], three)


def test_match_closest_non_causal_prefers_left_on_ties() -> None:
    """Query 2 matches keys 1 and 3 at distance 1: the left one wins; causal picks j <= i."""
    node = dsl.parse("match(q=token, k=token, pairs=[[5, 7]], select=closest)")
    ids = np.array([[0, 7, 5, 7, 0]])
    nc = dsl.evaluate_scores(node, ids, np.array([5]), causal=False)[0]
    assert nc[2].tolist() == [0, 1, 0, 0, 0]
    assert nc.sum() == 1
    c = dsl.evaluate_scores(node, np.array([[0, 0, 5, 7, 0]]), np.array([5]), causal=True)[0]
    assert c.sum() == 0  # the only match is ahead of the query


def test_value_index() -> None:
    vocab = np.array([-1, 3, 8])
    got = K.value_index(np.array([[3, 4, -1], [8, 0, 9]]), vocab)
    assert got.tolist() == [[1, -1, 0], [2, -1, -1]]
    assert K.value_index(np.array([1, 2]), np.array([], dtype=np.int64)).tolist() == [-1, -1]


def test_kernels_ignore_padding_content() -> None:
    """Changing ids/features beyond each length changes nothing."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, size=(3, 12))
    lengths = np.array([12, 5, 0])
    feats = {name: rng.integers(-1, 4, size=(3, 12)) for name in FEATURE_NAMES}
    node = dsl.parse("0.5*induction() + 0.5*fallback(same_word(), dep_children(), recent(punct), word_start())")
    a = dsl.evaluate(node, ids, lengths, feats, True)
    ids2 = ids.copy()
    ids2[1, 5:] = 99
    feats2 = {k: v.copy() for k, v in feats.items()}
    for v in feats2.values():
        v[1, 5:] = 3
    b = dsl.evaluate(node, ids2, lengths, feats2, True)
    np.testing.assert_array_equal(a, b)
    assert not a[2].any() and not a[1, 5:].any() and not a[1, :, 5:].any()


def test_missing_feature_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="'word'.*batch_feature_arrays"):
        dsl.evaluate(dsl.parse("same_word()"), np.zeros((1, 3), np.int64), np.array([3]), {}, True)


def test_buffer_reuse_never_aliases_results() -> None:
    """Results handed out stay intact while later evaluations recycle intermediate buffers."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 5, size=(4, 10))
    lengths = np.array([10, 7, 3, 10])
    feats = {name: rng.integers(-1, 4, size=(4, 10)) for name in FEATURE_NAMES}
    trees_ = [dsl.parse(t) for t in (
        "0.3*prev(1) + 0.7*fallback(induction(), gate(cap, first(), self()))",
        "mul(uniform(), fallback(same_token(), decay(0.5)))",
        "prev(2)",
    )]
    first = [dsl.evaluate(t, ids, lengths, feats, True) for t in trees_]
    snapshot = [a.copy() for a in first]
    for _ in range(3):
        again = [dsl.evaluate(t, ids, lengths, feats, True) for t in trees_]
        for a, b, s in zip(again, first, snapshot):
            np.testing.assert_array_equal(a, s)
            np.testing.assert_array_equal(b, s)
            assert a is not b and not np.shares_memory(a, b)


def test_out_buffer_receives_the_result() -> None:
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 5, size=(3, 8))
    lengths = np.array([8, 5, 1])
    node = dsl.parse("0.5*fallback(same_token_recent(), first()) + 0.5*sharpen(decay(0.7), 2)")
    want = dsl.evaluate(node, ids, lengths, None, True)
    buf = np.full((3, 8, 8), np.nan, dtype=np.float32)
    got = dsl.evaluate(node, ids, lengths, None, True, out=buf)
    assert got is buf
    np.testing.assert_array_equal(buf, want)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        dsl.evaluate(node, ids, lengths, None, True, out=np.zeros((3, 8, 8)))
