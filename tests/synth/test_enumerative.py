"""The enumerative searcher: recovers known programs, matches the kernels exactly, is deterministic."""
from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.optimize import nnls

from headsurgeon.synth import dsl
from headsurgeon.synth.search.enumerative import (
    EnumerativeConfig, FitSet, GramStats, SearchStats, SplitArrays, enumerative_search, nnls_gram, primitive_library,
    round_weights,
)
from headsurgeon.synth.program import BUDGETS, Program
from headsurgeon.synth.program_store import ProgramStore
from headsurgeon.synth.splits import StoreSplits
from support.story_sequences import kernel_scores, story_sequences

TRUTH = {
    (0, 0): "prev(1)",
    (0, 1): "first()",
    (0, 2): "0.7*prev(1) + 0.3*first()",
    (0, 3): "fallback(same_token_recent(), first())",
    # key weights on frequent tokens ("the" and ".", filled in below)
    (1, 0): "mul(profile(w=[0.2, 1, 0.5, 0.25], tail=0.05, bos=0.6), key_weight(w=[[THE, 4], [DOT, 0.2]], default=1))",
    (1, 1): "gate(punct, first(), 0.5*prev(1) + 0.5*self())",
    # a query-class x key-class interaction: "the" and "a" look back at Lily and the dog, nothing else does
    (1, 2): "mul(profile(w=[1, 0.8, 0.6, 0.5, 0.4, 0.3], tail=0.2, bos=0.5), "
            "class_weight(q=[[THE, A]], k=[[LILY, DOG]], w=[[30]], default=1))",
}


@pytest.fixture(scope="module")
def synthetic():
    seqs = story_sequences()
    ids = {tok.lower(): int(i) for s in seqs for tok, i in zip(s.tokens, s.ids)}
    names = {"THE": "the", "DOT": ".", "A": "a", "LILY": "lily", "DOG": "dog"}
    texts = {}
    for h, t in TRUTH.items():
        for key in sorted(names, key=len, reverse=True):  # longest first: "A" is inside other names
            t = re.sub(rf"\b{key}\b", str(ids[names[key]]), t)
        texts[h] = t
    store = ProgramStore(seqs, {h: Program.parse(t) for h, t in texts.items()})
    docs = sorted({s.doc for s in seqs})
    select_docs = set(docs[::3])
    synth_idx = [i for i, s in enumerate(seqs) if s.doc not in select_docs]
    select_idx = [i for i, s in enumerate(seqs) if s.doc in select_docs]
    stats = SearchStats()
    result = enumerative_search(store, StoreSplits(synth_idx, select_idx),
                                EnumerativeConfig(fit_sequences=None, spacy=False), progress=False, stats=stats)
    return store, synth_idx, select_idx, result, stats


def test_recovers_known_programs(synthetic) -> None:
    store, _, _, result, stats = synthetic
    assert set(result) == set(TRUTH)
    assert stats.primitives > 20 and stats.proposals > 0
    for head, cands in result.items():
        assert cands and all(c.source == "enumerative" for c in cands)  # filed under their head
        best = max(cands, key=lambda c: c.scores["select"]["iou"])
        assert best.scores["select"]["iou"] > 0.97, (head, best.program.text, best.scores)
        assert best.scores["select"]["jsd"] < 0.15, (head, best.program.text, best.scores)


def test_class_tables_capture_a_query_key_interaction(synthetic) -> None:
    """Head (1, 2) needs a query-token x key-token term: only class_weight tables can express it."""
    _, _, _, result, _ = synthetic
    cands = result[(1, 2)]
    with_classes = [c for c in cands if "class_weight(" in c.program.text]
    without = [c for c in cands if "class_weight(" not in c.program.text]
    assert with_classes and without
    best = max(with_classes, key=lambda c: c.scores["select"]["iou"])
    assert best.scores["select"]["iou"] > max(c.scores["select"]["iou"] for c in without) + 0.04
    # the fitted table singles out "the" (query) x "lily" (key), the pair the data shows most often
    table = next(n for n in _walk(best.program.node) if isinstance(n, dsl.Prim) and n.name == "class_weight")
    seqs = story_sequences()
    ids = {tok.lower(): int(i) for s in seqs for tok, i in zip(s.tokens, s.ids)}
    qc = next(c for c, cls in enumerate(table.param("q")) if ids["the"] in cls)
    kc = next(c for c, cls in enumerate(table.param("k")) if ids["lily"] in cls)
    w = np.asarray(table.param("w"))
    assert w[qc, kc] == w.max() and w[qc, kc] > 10


def test_scores_equal_the_kernels_and_score_many(synthetic) -> None:
    """The searcher scores programs on compact cells; the DSL kernels must give the same numbers."""
    store, synth_idx, select_idx, result, _ = synthetic
    kinds = set()
    for head, cands in result.items():
        for k, c in enumerate(cands):
            kinds.add(type(c.program.node).__name__)
            splits = (("select", select_idx),) + ((("synth", synth_idx),) if k < 2 else ())
            for split, idx in splits:
                iou, jsd = kernel_scores(store, head, c.program, idx)
                assert c.scores[split]["iou"] == pytest.approx(iou, abs=2e-4), (head, split, c.program.text)
                assert c.scores[split]["jsd"] == pytest.approx(jsd, abs=2e-4), (head, split, c.program.text)
    assert {"Prim", "Mix"} <= kinds


def test_ranked_by_jsd_and_programs_are_readable(synthetic) -> None:
    _, _, _, result, _ = synthetic
    for cands in result.values():
        jsds = [c.scores["synth"]["jsd"] for c in cands]
        assert jsds == sorted(jsds)
        for c in cands:
            assert Program.parse(c.program.text) == c.program  # text round-trips
            for node in _walk(c.program.node):
                if isinstance(node, dsl.Mix):
                    ws = [w for w, _ in node.terms]
                    assert all(round(w, 2) == w for w in ws) and sum(ws) == pytest.approx(1.0, abs=1e-9)


def _walk(node):
    yield node
    for child in dsl.children(node):
        yield from _walk(child)


def test_compact_evaluator_matches_kernels_on_every_combinator() -> None:
    seqs = story_sequences()[:8]
    store = ProgramStore(seqs, {(0, 0): Program.parse("prev(1)")})
    lib = [Program.parse(t) for t in ("prev(1)", "first()", "self()", "same_token_recent()", "decay(0.5)",
                                      "recent(punct)", "key_in_set(ids=[1, 3])", "uniform()")]
    preds = [dsl.Pred("flag", "punct"), dsl.Pred("flag", "cap")]
    split = SplitArrays(store, list(range(len(seqs))), {"punct", "cap"})
    fs = FitSet(split, lib, [(0, 0)], preds, True, progress=False)
    texts = [
        "0.6*prev(1) + 0.4*same_token_recent()",
        "gate(punct, first(), 0.5*decay(0.5) + 0.5*self())",
        "gate(ids=[1, 2], prev(1), uniform())",
        "fallback(same_token_recent(), recent(punct), first())",
        "sharpen(0.3*decay(0.5) + 0.7*uniform(), 2.5)",
        "mul(decay(0.5), key_in_set(ids=[1, 3]))",
        "mul(profile(w=[0.5, 1, 0.25], tail=0.1, bos=2), key_weight(w=[[1, 3], [4, 0]], default=0.5))",
        "gate(cap, sharpen(profile(w=[1, 0.5]), 0.7), same_token_recent())",
        "sharpen(0.5*decay(0.5) + 0.5*uniform(), 1.5, by=[[3, [1, 2]], [0.5, [5]]])",
        "mul(profile(w=[1, 0.5], tail=0.2), class_weight(q=[[1, 2], [4]], k=[[1], [3, 5]], w=[[4, 0.5], [0, 2]], "
        "default=0.3))",
    ]
    lengths = np.array([s.n for s in seqs])
    for text in texts:
        prog = Program.parse(text)
        compact = fs.pattern(prog.node, {})
        dense = prog.evaluate(seqs, causal=True)[fs.order]  # the fit set holds sequences in chunk order
        n = dense.shape[1]
        ar = np.arange(n)
        inside = ar[None, :] < lengths[fs.order][:, None]
        vis = inside[:, :, None] & inside[:, None, :] & (ar[None, None, :] <= ar[None, :, None])
        np.testing.assert_allclose(compact, dense[vis], rtol=1e-5, atol=1e-6, err_msg=text)


def test_deterministic_for_a_seed() -> None:
    seqs = story_sequences()
    store = ProgramStore(seqs, {(0, 0): Program.parse("0.6*prev(2) + 0.4*first()"),
                                (0, 1): Program.parse("gate(cap, self(), prev(1))")})
    splits = StoreSplits([i for i, s in enumerate(seqs) if s.doc % 2 == 0],
                         [i for i, s in enumerate(seqs) if s.doc % 2 == 1])
    config = EnumerativeConfig(seed=3, fit_sequences=8, spacy=False, top_k=4)
    a = enumerative_search(store, splits, config, progress=False)
    b = enumerative_search(store, splits, config, progress=False)
    assert {h: [(c.program.text, c.scores) for c in v] for h, v in a.items()} == \
        {h: [(c.program.text, c.scores) for c in v] for h, v in b.items()}


def test_tensor_cache_gives_the_same_result_and_is_reused() -> None:
    from headsurgeon.kernels.cache import TensorCache

    seqs = story_sequences()
    store = ProgramStore(seqs, {(0, 0): Program.parse("0.5*prev(1) + 0.5*same_token_recent()")})
    splits = StoreSplits([i for i, s in enumerate(seqs) if s.doc % 2 == 0],
                         [i for i, s in enumerate(seqs) if s.doc % 2 == 1])
    kw = dict(config=EnumerativeConfig(fit_sequences=6, spacy=False, top_k=3, tables=False), progress=False)
    plain = enumerative_search(store, splits, **kw)
    cache = TensorCache()
    first = enumerative_search(store, splits, cache=cache, **kw)
    misses = cache.stats.misses
    second = enumerative_search(store, splits, cache=cache, **kw)
    assert cache.stats.misses == misses and cache.stats.hits > 0  # the second run only reads
    as_list = lambda r: [(c.program.text, c.scores) for c in r[(0, 0)]]  # noqa: E731
    assert as_list(plain) == as_list(first) == as_list(second)


def test_default_split_is_by_document_and_bad_arguments_fail() -> None:
    seqs = story_sequences()
    store = ProgramStore(seqs, {(0, 0): Program.parse("prev(1)")})
    plain = EnumerativeConfig(spacy=False)
    res = enumerative_search(store, None, EnumerativeConfig(spacy=False, tables=False, gates=0, top_k=2),
                             progress=False)
    assert res[(0, 0)][0].scores["select"]["iou"] > 0.97
    with pytest.raises(ValueError, match="share"):
        enumerative_search(store, StoreSplits([0, 1, 2], [2, 3]), plain, progress=False)
    with pytest.raises(ValueError, match="no heads"):
        enumerative_search(store, None, plain, heads=[], progress=False)
    with pytest.raises(ValueError, match="single DSL primitives"):
        enumerative_search(store, None, EnumerativeConfig(library=(Program.parse("0.5*prev(1) + 0.5*first()"),),
                                                          spacy=False), progress=False)
    with pytest.raises(ValueError, match="beam"):
        EnumerativeConfig(beam=0)
    with pytest.raises(ValueError, match="unknown enumerative setting.*bem"):
        EnumerativeConfig.of({"bem": 2})


def test_the_former_keyword_form_warns_and_finds_the_same() -> None:
    """enumerative_search(store, heads, synth_idx, select_idx, ..., top_k=...) still runs for one release, with a
    DeprecationWarning naming the new call, and finds what the new form finds."""
    seqs = story_sequences()
    store = ProgramStore(seqs, {(0, 0): Program.parse("0.6*prev(2) + 0.4*first()"),
                                (0, 1): Program.parse("prev(1)")})
    synth = [i for i, s in enumerate(seqs) if s.doc % 2 == 0]
    select = [i for i, s in enumerate(seqs) if s.doc % 2 == 1]
    config = EnumerativeConfig(seed=2, fit_sequences=6, spacy=False, top_k=3, tables=False, small=0)
    new = enumerative_search(store, StoreSplits(synth, select), config, heads=[(0, 1)], progress=False)
    as_list = lambda r: [(c.program.text, c.scores) for c in r[(0, 1)]]  # noqa: E731
    with pytest.warns(DeprecationWarning, match=r"enumerative_search\(store, StoreSplits"):
        positional = enumerative_search(store, [(0, 1)], synth, select, 6, 5, 2, False, fit_sequences=6, spacy=False,
                                        top_k=3, tables=False, small=0)
    with pytest.warns(DeprecationWarning):
        keywords = enumerative_search(store, heads=[(0, 1)], synth_idx=synth, select_idx=select, seed=2,
                                      progress=False, fit_sequences=6, spacy=False, top_k=3, tables=False, small=0)
    assert as_list(positional) == as_list(keywords) == as_list(new)
    with pytest.raises(TypeError, match="multiple values for beam"):
        enumerative_search(store, None, None, None, 4, beam=4)


def test_nnls_gram_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    for trial in range(30):
        A = rng.random((40, 6)) * (rng.random((40, 6)) < 0.6)
        if trial % 3 == 0:
            A[:, 5] = A[:, 4]  # duplicate component: the ridge keeps it solvable
        b = rng.random(40) - 0.3
        w = nnls_gram(A.T @ A, A.T @ b)
        ref, _ = nnls(A, b)
        assert (w >= 0).all()
        assert np.linalg.norm(A @ w - b) == pytest.approx(np.linalg.norm(A @ ref - b), rel=1e-5, abs=1e-8)


def test_components_that_are_one_pattern_rank_by_library_order_not_by_rounding() -> None:
    """``self()`` and ``word_start()`` are one pattern where every query starts a word: their one-term fits differ
    only in the last bits of the solve, and the beam must not let those bits pick the program."""
    from headsurgeon.synth.search.enumerative.mixtures import beam_mixtures

    rng = np.random.default_rng(3)
    X = rng.random((4, 200)) * (rng.random((4, 200)) < 0.4)
    X[2] = X[0]  # component 2 is component 0's pattern on these rows
    target = 0.7 * X[0] + 0.3 * X[1]
    R = X @ target
    R[2] *= 1 + 1e-13  # rounding of the kind two solves leave: component 2 now fits a hair better
    stats = GramStats(X @ X.T, R[None], np.array([target @ target]))
    ones = [sup for _, sup, _ in beam_mixtures(stats, 0, np.ones(4, dtype=bool), 4, 1, 4)]
    assert ones[0] == (0,) and (2,) in ones


def test_round_weights() -> None:
    for ws in ([0.333, 0.333, 0.334], [5, 1, 0.01], [1e-9, 1.0], [0.125, 0.125, 0.75]):
        r = round_weights(ws)
        assert sum(r) == pytest.approx(1.0, abs=1e-12)
        assert all(round(x, 2) == x for x in r)
        total = sum(ws)
        assert all(abs(x - w / total) <= 0.01 + 1e-12 for x, w in zip(r, ws))


def test_library_has_the_documented_grid() -> None:
    lib = {p.text for p in primitive_library(story_sequences(), causal=True, spacy=False)}
    for text in ("self()", "first()", "uniform()", "prev(1)", "prev(8)", "decay(0.5)", "same_token_recent()",
                 "induction()", "recent(punct)", "sentence_start()", "word_start()", "same_word()"):
        assert text in lib
    assert any(t.startswith("key_in_set(") for t in lib) and any(t.startswith("window(") for t in lib)
    assert not any("pos=" in t or t.startswith("dep_") for t in lib)  # spacy=False leaves them out


# ------------------------------------------------------------------------------------------
# a small real run: stories260K over TinyStories
# ------------------------------------------------------------------------------------------


def test_a_heads_candidates_do_not_depend_on_the_other_heads_searched_with_it() -> None:
    """Explain's tasks hold 64 heads serially and a few on Ray: a head's candidates and the bits of their scores
    are the same searched alone, with two others or with 19 (BLAS rounds products of other sizes differently)."""
    seqs = story_sequences()
    rng = np.random.default_rng(5)
    programs = {}
    for k in range(20):
        w = rng.dirichlet(np.ones(3)).round(3)
        text = f"{w[0]}*prev({1 + k % 3}) + {w[1]}*first() + {w[2]}*decay(0.{5 + k % 4})"
        programs[(k // 8, k % 8)] = Program.parse(text)
    store = ProgramStore(seqs, programs)
    splits = StoreSplits([i for i, s in enumerate(seqs) if s.doc % 2 == 0],
                         [i for i, s in enumerate(seqs) if s.doc % 2 == 1])
    config = EnumerativeConfig(spacy=False, top_k=4, small=0)

    def found(heads):
        result = enumerative_search(store, splits, config, heads=heads, progress=False)
        return {h: [(c.program.text, c.scores) for c in v] for h, v in result.items()}

    every = found(list(programs))
    for head in [(0, 1), (1, 5), (2, 3)]:
        assert found([head])[head] == every[head]
        assert found([(0, 0), head, (2, 0)])[head] == every[head]


def test_a_rows_products_are_the_same_bits_wherever_the_row_sits() -> None:
    """The Gram statistics' head-by-component products: OpenBLAS rounds a row's products by the matrices' shapes and
    the row's place in its tile (at these sizes a zero-padded block of 16 rows gave rows 6-15 other bits than alone)."""
    from headsurgeon.synth.search.enumerative.blas import row_products, single_thread_blas

    rng = np.random.default_rng(0)
    rows, cols = rng.random((40, 5000), dtype=np.float32), rng.random((90, 5000), dtype=np.float32)
    with single_thread_blas():
        every = row_products(rows, cols)
        for k in range(1, 40):
            assert np.array_equal(row_products(rows[k: k + 1], cols)[0], every[k])
            assert np.array_equal(row_products(rows[k - 1: k + 1], cols)[1], every[k])
    assert np.allclose(every, rows.astype(np.float64) @ cols.T.astype(np.float64), rtol=1e-5)


def test_real_heads_of_stories260k_beat_uniform(stories, corpus_path) -> None:
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents

    docs = read_documents(corpus_path)[:24]
    seqs = make_sequences(stories, docs, max_len=48)
    store = capture(stories, seqs, progress=False)
    synth_idx = [i for i, s in enumerate(seqs) if s.doc % 3 != 0]
    select_idx = [i for i, s in enumerate(seqs) if s.doc % 3 == 0]
    heads = [(0, 4), (3, 0)]
    res = enumerative_search(store, StoreSplits(synth_idx, select_idx),
                             EnumerativeConfig(fit_sequences=24, spacy=False, top_k=3), heads=heads, progress=False)
    uniform = Program.parse("uniform()")
    for head in heads:
        cands = res[head]
        assert 1 <= len(cands) <= 3 + 6 * len(BUDGETS)  # top_k, plus the small ones kept per size budget
        for c in cands:
            assert set(c.scores) == {"synth", "select"}
            assert all(set(v) == {"iou", "jsd"} for v in c.scores.values())
            assert all(np.isfinite(x) for v in c.scores.values() for x in v.values())
        best = max(cands, key=lambda c: c.scores["select"]["iou"])
        base_iou, base_jsd = kernel_scores(store, head, uniform, select_idx)
        iou, jsd = kernel_scores(store, head, best.program, select_idx)
        assert iou == pytest.approx(best.scores["select"]["iou"], abs=2e-3)  # float16 store vs float32 kernels
        assert iou > base_iou + 0.05 and jsd < base_jsd


# ------------------------------------------------------------------------------------------
# candidates across sizes (headsurgeon/synth/search/enumerative/small.py)
# ------------------------------------------------------------------------------------------


def test_small_candidates_exist_within_each_budget(synthetic) -> None:
    """Every head gets candidates at every finite budget, each within it, alongside the big fitted tables."""
    from headsurgeon.synth.search.enumerative.small import BANDS, rendered_chars, vocabulary_of

    store, synth_idx, _, result, _ = synthetic
    vocab = vocabulary_of([store.sequences[i] for i in synth_idx])
    assert BANDS == tuple(b for b in BUDGETS if b is not None)
    for head, cands in result.items():
        chars = [rendered_chars(c.program, vocab) for c in cands]
        for budget in BANDS:
            fit = [c for c, n in zip(cands, chars) if n <= budget]
            assert len(fit) >= 2, (head, budget, chars)
            assert all(c.program.chars(vocab) <= budget for c in fit)
    # simple heads are recovered by a small program: the best one under 60 characters is nearly exact
    for head in [(0, 0), (0, 1), (0, 2), (0, 3)]:
        small = [c for c in result[head] if rendered_chars(c.program, vocab) <= 60]
        assert max(c.scores["select"]["iou"] for c in small) > 0.97, head


def test_small_candidates_ranking_is_sane(synthetic) -> None:
    """Within a budget the JSD ranking agrees with the true program: the exact one ranks first on synth."""
    store, synth_idx, _, result, _ = synthetic
    for head in [(0, 0), (0, 2), (1, 1)]:
        cands = result[head]
        truth = store.programs[head]
        best = min(cands, key=lambda c: c.scores["synth"]["jsd"])
        assert best.scores["synth"]["jsd"] < 0.05, (head, best.program.text)
        small = [c for c in cands if len(c.program.text) <= 60]
        assert small and min(c.scores["synth"]["jsd"] for c in small) < 0.05, (head, truth.text)
        # a candidate's JSD rank agrees with its IoU rank at the extremes
        jsd_best = min(small, key=lambda c: c.scores["synth"]["jsd"])
        jsd_worst = max(small, key=lambda c: c.scores["synth"]["jsd"])
        assert jsd_best.scores["synth"]["iou"] >= jsd_worst.scores["synth"]["iou"]


def test_key_sets_and_short_profiles_evaluate_exactly() -> None:
    """key_in_set over a few ids and a fitted short profile: compact cells equal the kernels."""
    from headsurgeon.synth.search.enumerative.small import key_in_set, key_sets, short_profiles
    from headsurgeon.synth.search.enumerative.split import features_for

    seqs = story_sequences()
    ids = {tok.lower(): int(i) for s in seqs for tok, i in zip(s.tokens, s.ids)}
    head = (0, 0)
    store = ProgramStore(seqs, {head: Program.parse(f"0.8*key_in_set(ids=[{ids['.']}, {ids['the']}]) + 0.2*first()")})
    lib = primitive_library(seqs, True, spacy=False)
    split = SplitArrays(store, list(range(len(seqs))), features_for(lib, []))
    fs = FitSet(split, lib, [head], [], True, False)
    sets = key_sets(fs, 0)
    assert sets and set(sets[-1]) >= {ids["."], ids["the"]} and all(len(s) <= 8 for s in sets)
    for node in [key_in_set(sets[0])] + short_profiles(fs, 0):
        prog = Program.from_node(node)
        memo: dict = {}
        q = fs.pattern(node, memo)
        iou, jsd = kernel_scores(store, head, prog, list(range(len(seqs))))
        assert float(fs.iou(q[None], 0)[0]) == pytest.approx(iou, abs=2e-4), prog.text
        assert float(fs.jsd(q[None], 0)[0]) == pytest.approx(jsd, abs=2e-4), prog.text


def test_key_sets_skip_a_token_seen_in_one_window() -> None:
    """A head that favours a word found early in a single window (a second sink) does not get that word as a key
    set; the same head's word found in many windows does."""
    from headsurgeon.synth.search.enumerative.small import key_sets
    from headsurgeon.synth.search.enumerative.split import features_for

    seqs = story_sequences(64)
    ids = {tok.lower(): int(i) for s in seqs for tok, i in zip(s.tokens, s.ids)}
    windows = {w: sum(ids[w] in s.ids[1:].tolist() for s in seqs) for w in ("one", "the")}
    assert windows["one"] == 1 and windows["the"] >= 3, windows
    head = (0, 0)
    real = Program.parse(f"0.4*key_in_set(ids=[{ids['one']}]) + 0.3*key_in_set(ids=[{ids['the']}]) + 0.3*first()")
    store = ProgramStore(seqs, {head: real})
    lib = primitive_library(seqs, True, spacy=False)
    fs = FitSet(split := SplitArrays(store, list(range(len(seqs))), features_for(lib, [])), lib, [head], [], True,
                False)
    assert len(split) == len(seqs)
    named = {t for s in key_sets(fs, 0, min_cells=10) for t in s}
    assert ids["the"] in named and ids["one"] not in named, named
    assert ids["one"] in {t for s in key_sets(fs, 0, min_cells=10, min_windows=1) for t in s}


def test_no_fallback_or_gate_on_a_rule_seen_in_fewer_than_three_windows() -> None:
    """A fallback on a rule that never fires in the fit windows equals its anchor there and acts only on unseen
    text, and a gate on a query token of one window is that window's accident: neither is proposed; a gate on a
    token of many windows is."""
    from headsurgeon.synth.search.enumerative.compose import fallback_rules, propose, sparse_primitives
    from headsurgeon.synth.search.enumerative.small import propose_small
    from headsurgeon.synth.search.enumerative.split import features_for

    seqs = story_sequences(64)
    ids = {tok.lower(): int(i) for s in seqs for tok, i in zip(s.tokens, s.ids)}
    one, the = ids["one"], ids["the"]
    preds = [dsl.Pred("ids", (one,)), dsl.Pred("ids", (the,))]
    head = (0, 0)
    real = Program.parse(f"gate(ids=[{one}], prev(2), gate(ids=[{the}], prev(1), first()))")
    store = ProgramStore(seqs, {head: real})
    lib = primitive_library(seqs, True, spacy=False)
    fs = FitSet(SplitArrays(store, list(range(len(seqs))), features_for(lib, preds)), lib, [head], preds, True, False)
    assert fs.pred_windows.tolist() == [sum(i in s.ids.tolist() for s in seqs) for i in (one, the)]
    assert fs.pred_windows[0] == 1 and fs.pred_windows[1] >= 3
    never = [p for p in sparse_primitives(lib) if fs.prim_windows[p] == 0]
    assert "recent(newline)" in {lib[p].text for p in never}  # no story window has a newline
    tot, groups = fs.stats()
    nodes = [p.node for p in lib]
    cfg = EnumerativeConfig()

    def proposals(sparse: list[int]) -> list[dsl.Node]:
        return (propose(fs, 0, tot, groups, nodes, sparse, cfg.beam, cfg.max_terms, cfg.gates)
                + propose_small(fs, 0, tot, groups, nodes, sparse, cfg.gates + 1))

    def rules(props: list[dsl.Node]) -> set[str]:
        return {dsl.to_text(p.args[0]) for p in props if isinstance(p, dsl.Fallback)}

    unguarded = rules(proposals(sparse_primitives(lib)))
    assert unguarded & {lib[p].text for p in never}  # without the guard such fallbacks are proposed
    props = proposals(fallback_rules(fs, lib))
    assert not rules(props) & {lib[p].text for p in never}
    gated = {p.pred for p in props if isinstance(p, dsl.Gate)}
    assert preds[1] in gated and preds[0] not in gated, gated


def test_raw_sums_and_feature_gates_evaluate_exactly_and_fit_budgets() -> None:
    """Small raw ``sum``s and quote/dep/pos gates: within the budgets, and FitSet equals ``Program.evaluate``."""
    from headsurgeon.synth.search.enumerative.small import BANDS, raw_sums, rendered_chars, vocabulary_of
    from headsurgeon.synth.search.enumerative.split import features_for

    seqs = story_sequences()
    ids = {tok.lower(): int(i) for s in seqs for tok, i in zip(s.tokens, s.ids)}
    head = (0, 0)
    store = ProgramStore(seqs, {head: Program.parse(f"sum(2*prev(1), key_in_set(ids=[{ids['the']}]), first())")})
    lib = primitive_library(seqs, True, spacy=False)
    preds = [dsl.Pred("flag", "quote"), dsl.Pred("flag", "punct")]
    split = SplitArrays(store, list(range(len(seqs))), features_for(lib, preds))
    fs = FitSet(split, lib, [head], preds, True, False)
    vocab = vocabulary_of(seqs)
    terms = [dsl.parse("prev(1)"), dsl.parse("same_word()"), dsl.parse(f"key_in_set(ids=[{ids['the']}])")]
    sums = raw_sums(fs, 0, terms)
    assert any(len(n.terms) == 3 for n in sums) and all(isinstance(n, dsl.Sum) for n in sums)
    extra = ["gate(quote, sum(2*prev(1), first()), same_word())",
             f"gate(punct, first(), sum(key_in_set(ids=[{ids['.']}]), 4*prev(1)))",
             "sum(mul(decay(0.5), same_word()), fallback(same_word(), first()))"]
    nodes = sums + [dsl.parse(t) for t in extra]
    lengths = np.array([s.n for s in seqs])[fs.order]
    for node in nodes:
        prog = Program.from_node(node)
        assert rendered_chars(prog, vocab) == prog.chars(vocab)
        compact = fs.pattern(node, {})
        dense = prog.evaluate(seqs, causal=True)[fs.order]
        n = dense.shape[1]
        ar = np.arange(n)
        inside = ar[None, :] < lengths[:, None]
        vis = inside[:, :, None] & inside[:, None, :] & (ar[None, None, :] <= ar[None, :, None])
        np.testing.assert_allclose(compact, dense[vis], rtol=1e-5, atol=1e-6, err_msg=prog.text)
    assert any(Program.from_node(n).chars(vocab) <= BANDS[0] for n in sums)
    # the true raw sum is among the proposals and fits best
    memo: dict = {}
    jsd = fs.jsd(np.stack([fs.pattern(n, memo) for n in sums]), 0)
    assert float(jsd.min()) < 0.02, dsl.to_text(sums[int(np.argmin(jsd))])


def test_search_proposes_sums_and_feature_gates(synthetic) -> None:
    """The search keeps raw sums among each head's candidates (each within its budget)."""
    from headsurgeon.synth.search.enumerative.small import rendered_chars, vocabulary_of

    store, synth_idx, _, result, _ = synthetic
    vocab = vocabulary_of([store.sequences[i] for i in synth_idx])
    kinds = {type(c.program.node).__name__ for cands in result.values() for c in cands}
    assert "Sum" in kinds, kinds
    for cands in result.values():
        for c in cands:
            assert rendered_chars(c.program, vocab) == c.program.chars(vocab)


def test_rendered_chars_skips_programs_too_big_for_every_budget(monkeypatch) -> None:
    """A program with more nodes and literals than the largest finite budget is not rendered (rendering a fitted
    table costs milliseconds per candidate); its size, returned instead, is a lower bound of its characters."""
    from headsurgeon.synth.search.enumerative.small import BANDS, rendered_chars

    table = Program.parse("mul(profile(w=[" + ", ".join(["0.5"] * 300) + "]), first())")
    small = Program.parse("0.7*prev(1) + 0.3*first()")
    assert len(table.render()) >= table.size > max(BANDS)  # the bound it relies on
    assert rendered_chars(small, None, max(BANDS)) == len(small.render())
    monkeypatch.setattr(Program, "render", lambda self, vocab=None: pytest.fail("rendered a too-big program"))
    assert rendered_chars(table, None, max(BANDS)) > max(BANDS)
