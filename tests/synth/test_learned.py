"""Learned searcher: Gumbel-annealed categorical predicates recover known programs, decompile exactly, and
beat the uniform baseline on real stories260K heads."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.patterns.store import AttentionStore
from headsurgeon.synth.search.learned import (
    FeatureSpace, LearnedConfig, LearnedHead, MatchTerm, feature_arrays, key_order, learned_search, positional_specs,
    select_rows, visible,
)
from headsurgeon.synth.metrics import score_many
from headsurgeon.synth.program import Program
from headsurgeon.synth.sequence import pad_ids

FAST = LearnedConfig(steps=100, refit_steps=40)


@pytest.fixture(scope="module")
def seqs(stories, documents):
    """Real TinyStories windows (64 tokens) tokenized with the stories260K sentencepiece tokenizer."""
    return make_sequences(stories, documents[:60], max_len=64)


def _splits(seqs, n_synth_docs=40):
    docs = sorted({s.doc for s in seqs})
    synth_docs = set(docs[:n_synth_docs])
    synth = [i for i, s in enumerate(seqs) if s.doc in synth_docs]
    select = [i for i, s in enumerate(seqs) if s.doc not in synth_docs]
    return synth, select


def _frequent_tokens(seqs, k):
    counts = Counter(int(t) for s in seqs for t in s.ids[1:])  # skip BOS
    return [t for t, _ in counts.most_common(k)]


@pytest.fixture(scope="module")
def truth(seqs):
    """Known categorical programs over frequent real tokens."""
    t = _frequent_tokens(seqs, 4)
    return {
        (0, 0): f"fallback(match(q=token, k=token, pairs=[[{t[0]}, {t[1]}], [{t[2]}, {t[3]}]], select=closest), "
                "first())",
        (0, 1): "0.5*fallback(match(q=cap, k=punct, pairs=[[0, 1], [1, 1]], select=closest), first()) + 0.5*prev(1)",
    }


@pytest.fixture(scope="module")
def synthetic_store(seqs, truth):
    store = AttentionStore(seqs, 1, 2)
    progs = [Program.parse(truth[(0, h)]) for h in range(2)]
    for i, s in enumerate(seqs):
        store.put(i, np.stack([p.evaluate([s])[0] for p in progs])[None])
    return store


@pytest.fixture(scope="module")
def learned(synthetic_store, seqs):
    synth, select = _splits(seqs)
    return learned_search(synthetic_store, synth_idx=synth, select_idx=select, seed=0, progress=False,
                            config=FAST, return_models=True)


def _uniform_iou(store, head, idx):
    real, lengths = store.batch(idx, [head])
    cand = Program.parse("uniform()").evaluate([store.sequences[i] for i in idx])[None]
    return float(score_many(real, cand, lengths, store.causal, ("iou",))["iou"][0, 0])


def test_recovers_known_categorical_programs(learned, synthetic_store, seqs):
    _, select = _splits(seqs)
    for head in [(0, 0), (0, 1)]:
        cands, fits = learned[head]
        assert all(c.source == "learned" for c in cands)  # filed under their head
        assert all(set(c.scores) == {"synth", "select"} and set(c.scores["select"]) == {"iou", "jsd"} for c in cands)
        best = max(cands, key=lambda c: c.scores["select"]["iou"])
        assert best.scores["select"]["iou"] > 0.97, (head, best.program.text, best.scores)
        assert best.scores["select"]["iou"] > _uniform_iou(synthetic_store, head, select) + 0.3
        assert "learned predicate" in cands[0].hypothesis
    # the pure match head: its closest-match term reads token x token and holds exactly the true pairs
    model = learned[(0, 0)][1][0]
    main = next(term for _, term in model.matches if term.select == "closest")
    assert (model.space.names[main.q], model.space.names[main.k]) == ("token", "token")
    t = _frequent_tokens(seqs, 4)
    pairs = {(int(model.space.vocabs[main.q][a]), int(model.space.vocabs[main.k][b]))
             for a, b in zip(*np.nonzero(main.table))}
    assert pairs == {(t[0], t[1]), (t[2], t[3])}


def test_scores_are_the_kernel_metrics(learned, synthetic_store, seqs):
    """A candidate's select IoU/JSD equal score_many on the kernel-evaluated program."""
    _, select = _splits(seqs)
    cand = learned[(0, 1)][0][0]
    real, lengths = synthetic_store.batch(select, [(0, 1)])
    pat = cand.program.evaluate([seqs[i] for i in select])[None]
    got = score_many(real, pat, lengths, True, ("iou", "jsd"))
    assert cand.scores["select"]["iou"] == pytest.approx(float(got["iou"][0, 0]), abs=1e-6)
    assert cand.scores["select"]["jsd"] == pytest.approx(float(got["jsd"][0, 0]), abs=1e-6)


def test_decompiled_program_round_trips_and_matches_the_torch_model(learned, seqs):
    _, select = _splits(seqs)
    held_out = [seqs[i] for i in select]
    for head in [(0, 0), (0, 1)]:
        cands, fits = learned[head]
        assert [f.gate is None for f in fits] == [True, False]  # the single mixture, then the query-gated one
        for cand in cands:
            again = Program.parse(cand.program.text)
            assert again == cand.program and again.hash == cand.program.hash
        for model in fits:
            kernels = Program.parse(model.program.text).evaluate(held_out)
            torch_side = model.torch_patterns(held_out).numpy()
            assert kernels.shape == torch_side.shape
            np.testing.assert_allclose(kernels, torch_side, atol=2e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_random_discrete_models_decompile_exactly(seqs, causal):
    """Random predicate tables over several features, both selects and positional terms: DSL == torch."""
    rng = np.random.default_rng(1)
    some = seqs[:12]
    names = ("token", "punct", "cap", "word_start", "newline", "sent_end")
    arrays = feature_arrays(some, names)
    _, lengths = pad_ids(some)
    space = FeatureSpace.fit(arrays, lengths, names, top_tokens=20, max_values=8)
    specs = positional_specs(LearnedConfig(offsets=3), causal)
    for trial in range(4):
        matches = []
        for select in ("closest", "all"):
            q, k = (int(x) for x in rng.integers(0, len(names), 2))
            table = rng.random((space.sizes[q], space.sizes[k])) < 0.3
            table[-1, :] = table[:, -1] = False  # the "other" bucket never matches
            matches.append((float(rng.uniform(0.1, 1)), MatchTerm(q, k, table, select)))
        positional = [(float(rng.uniform(0.05, 1)), s) for s in rng.choice(specs, 3, replace=False)]
        head = LearnedHead(space, causal, matches, positional)
        if trial % 2:  # query-gated: flagged queries take the mixture above, the others another one
            head.gate = str(rng.choice(["punct", "cap", "word_start"]))
            head.other_matches = matches[1:]
            head.other_positional = [(1.0, str(rng.choice(specs)))]
            assert head.program.text.startswith(f"gate({head.gate}, ")
        prog = Program.parse(head.program.text)
        assert prog == head.program
        np.testing.assert_allclose(prog.evaluate(some, causal=causal), head.torch_patterns(some).numpy(), atol=2e-6)


def test_pos_feature_decompiles_to_tag_names(seqs):
    """spaCy POS values become tag names in the DSL and evaluate to the same pattern as the torch model."""
    from headsurgeon.synth.features import FeatureDependencyError

    some = seqs[:8]
    try:
        arrays = feature_arrays(some, ("pos", "punct"))
    except FeatureDependencyError as e:
        pytest.skip(f"spaCy model unavailable: {e}")
    _, lengths = pad_ids(some)
    space = FeatureSpace.fit(arrays, lengths, ("pos", "punct"), top_tokens=8, max_values=20)
    table = np.zeros((space.sizes[0], space.sizes[0]), dtype=bool)
    tags = list(space.vocabs[0])
    noun, verb = tags.index(7), tags.index(15)  # POS_TAGS index of NOUN and VERB
    table[verb, noun] = table[noun, noun] = True
    head = LearnedHead(space, True, [(1.0, MatchTerm(0, 0, table, "closest"))], [(0.5, "prev(1)")])
    text = head.program.text
    assert "[NOUN, NOUN]" in text and "[VERB, NOUN]" in text, text
    np.testing.assert_allclose(Program.parse(text).evaluate(some), head.torch_patterns(some).numpy(), atol=2e-6)


def test_soft_select_is_exact_at_hard_inputs():
    """The Gumbel relaxation of closest/all equals the discrete selection when every m is 0 or 1."""
    g = torch.Generator().manual_seed(0)
    n = 9
    lengths = torch.tensor([9, 6, 1])
    for causal in (True, False):
        vis = visible(lengths, n, causal)
        m = (torch.rand(3, n, n, generator=g) < 0.3) & vis
        order = key_order(n)
        for select in ("closest", "all"):
            hard = select_rows(m.double(), select, order, hard=True) * vis
            soft = select_rows(m.double(), select, order, hard=False) * vis
            torch.testing.assert_close(soft, hard, atol=1e-5, rtol=0)
            # an independent loop: closest = nearest match (ties to the left), none -> position 0
            for b in range(3):
                for i in range(int(lengths[b])):
                    keys = [j for j in range(n) if m[b, i, j]]
                    ref = torch.zeros(n, dtype=torch.float64)
                    if not keys:
                        ref[0] = 1
                    elif select == "closest":
                        ref[min(keys, key=lambda j: (abs(i - j), j))] = 1
                    else:
                        ref[keys] = 1 / len(keys)
                    torch.testing.assert_close(hard[b, i], ref)


def test_deterministic_for_a_seed(synthetic_store, seqs):
    synth, select = _splits(seqs)
    cfg = LearnedConfig(steps=15, refit_steps=5)
    runs = [learned_search(synthetic_store, heads=[(0, 1)], synth_idx=synth, select_idx=select, seed=3,
                             progress=False, config=cfg) for _ in range(2)]
    a, b = (r[(0, 1)] for r in runs)
    assert [c.program.text for c in a] == [c.program.text for c in b]
    assert [c.scores for c in a] == [c.scores for c in b]


def test_non_causal_store(seqs):
    """Encoder-style (bidirectional) heads: closest is the nearest key on either side, ties to the left."""
    truth = Program.parse("fallback(match(q=cap, k=punct, pairs=[[0, 1], [1, 1]], select=closest), first())")
    some = seqs[:40]
    store = AttentionStore(some, 1, 1, causal=False)
    for i, s in enumerate(some):
        store.put(i, truth.evaluate([s], causal=False)[0][None, None])
    found = learned_search(store, synth_idx=list(range(30)), select_idx=list(range(30, 40)), progress=False,
                             config=LearnedConfig(steps=100, refit_steps=30, offsets=2))
    best = max(found[(0, 0)], key=lambda c: c.scores["select"]["iou"])
    assert best.scores["select"]["iou"] > 0.95, best.program.text


def test_rejects_overlapping_splits_and_bad_config(synthetic_store):
    with pytest.raises(ValueError, match="disjoint"):
        learned_search(synthetic_store, synth_idx=[0, 1], select_idx=[1, 2], progress=False)
    with pytest.raises(ValueError, match="features"):
        LearnedConfig(features=("token", "colour"))
    with pytest.raises(ValueError, match="select modes"):
        LearnedConfig(terms=("nearest",))


def test_real_heads_beat_the_uniform_baseline(stories, seqs):
    """Two heads of stories260K, captured on real text: the learned program beats uniform() on select."""
    from headsurgeon.surgery.patterns.capture import capture

    synth, select = _splits(seqs)
    synth, select = synth[:60], select[:30]
    idx = synth + select
    store = capture(stories, [seqs[i] for i in idx], progress=False)
    synth, select = list(range(len(synth))), list(range(len(synth), len(idx)))
    heads = [(0, 0), (1, 3)]
    found = learned_search(store, heads=heads, synth_idx=synth, select_idx=select, progress=False, config=FAST)
    for head in heads:
        best = max(c.scores["select"]["iou"] for c in found[head])
        assert best > _uniform_iou(store, head, select) + 0.05, (head, best)


def test_pruned_programs_span_the_size_budgets(learned, synthetic_store, seqs):
    """Besides the fitted mixtures, every head gets pruned programs of 1-3 terms, scored like the rest."""
    from headsurgeon.synth.program import READABLE_CHARS
    from headsurgeon.synth.search.learned.prune import MAX_PAIRS, pruned_heads

    for head, (cands, fits) in learned.items():
        pruned = [p for m in fits for p in pruned_heads(m)]
        assert pruned, head
        for p in pruned:
            node = p.node()
            terms = node.terms if hasattr(node, "terms") else ((1.0, node),)
            assert 1 <= len(terms) <= 3 and p.gate is None
            assert all(t.n_pairs <= MAX_PAIRS for _, t in p.matches)
        texts = {c.program.text for c in cands}
        assert {p.program.text for p in pruned} <= texts
        small = [c for c in cands if c.program.chars() <= READABLE_CHARS]
        assert small and all({"synth", "select"} <= set(c.scores) for c in small)
