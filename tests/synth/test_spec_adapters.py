"""The searchers take the DSL's semantics from the spec: every combinator and fitted primitive declares a cells
adapter, the enumerative fit set evaluates through them like the reference evaluator, and a combinator without one is
refused by name; the learned searcher's positional rows come from the primitives' ``position`` scores the same way."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from support.dsl_trees import grow_trees, random_primitive, random_sequences

from headsurgeon.core import InputError
from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Pred
from headsurgeon.synth.dsl.spec import (CellsAdapter, CombinatorSpec, PrimitiveSpec, combinator_for,
                                        register_combinator, register_primitive, unregister_combinator,
                                        unregister_primitive)
from headsurgeon.synth.program import Program
from headsurgeon.synth.search.enumerative import FitSet, SplitArrays
from headsurgeon.synth.search.learned.rows import positional_rows, positional_specs
from headsurgeon.synth.program_store import ProgramStore

# primitives the enumerative searcher fits and so evaluates outside its library (headsurgeon/synth/search/enumerative/small.py,
# tables.py); every other primitive's cells come from the library, which the reference kernels compute
FITTED = ("profile", "key_weight", "class_weight", "key_in_set")
NO_SPACY = ("token", "position", "word", "sent", "punct", "cap", "newline", "sent_end", "word_start")
PREDS = [Pred("flag", f) for f in ("punct", "cap", "word_start")]


def test_every_combinator_and_fitted_primitive_declares_cells() -> None:
    for name, spec in dsl.COMBINATOR_SPECS.items():
        assert isinstance(spec.cells, CellsAdapter), f"{name} has no cells adapter"
        assert callable(spec.cells.values) and callable(spec.cells.raw), name
    for name in FITTED:
        assert callable(dsl.PRIMITIVE_SPECS[name].cells), name


def _fit_set(rng: np.random.Generator, causal: bool) -> tuple[FitSet, SplitArrays, dict[str, list[dsl.Node]]]:
    """A fit set over random sequences, its split and random instances of every usable primitive; the library
    holds all but the fitted ones."""
    seqs = random_sequences(rng, 10)
    usable = [n for n, s in dsl.PRIMITIVE_SPECS.items() if set(s.features) <= set(NO_SPACY)]
    prims = {name: [random_primitive(name, rng, NO_SPACY[2:]) for _ in range(3)] for name in usable}
    needed = set().union(*(dsl.features_needed(p) for ps in prims.values() for p in ps), {f.value for f in PREDS})
    split = SplitArrays(ProgramStore(seqs, {(0, 0): "prev(1)"}, causal=causal), list(range(len(seqs))), needed)
    library = [Program.from_node(p) for name in usable if name not in FITTED for p in prims[name]]
    library = list({p.hash: p for p in library}.values())
    return FitSet(split, library, [(0, 0)], PREDS, causal, progress=False), split, prims


def _cells(fs: FitSet, split: SplitArrays, dense: np.ndarray, causal: bool) -> np.ndarray:
    """A [B, N, N] array's visible cells in the fit set's (sequence, query, key) order."""
    cells = []
    for b in fs.order:
        n = int(split.lengths[b])
        vis = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
        cells.append(dense[b, :n, :n][vis])
    return np.concatenate(cells)


@pytest.mark.parametrize("causal", [True, False])
def test_fit_set_evaluates_every_primitive_and_combinator_like_the_reference(causal: bool) -> None:
    """Patterns and raw scores on the fit set's cells equal the kernels: bit for bit for 0/1 primitives, to
    float32 round-off otherwise, because the fit set normalizes a row by multiplying with the float32 reciprocal
    of its float32 sum, the kernels divide by a float64 sum (headsurgeon/kernels/normalize.py), and its sharpen takes float32
    exponents (the searcher's scores have always been computed this way)."""
    rng = np.random.default_rng(7 + causal)
    fs, split, prims = _fit_set(rng, causal)
    pool = [p for ps in prims.values() for p in ps]
    cases = [(name, p) for name, ps in prims.items() for p in ps]
    cases += grow_trees(rng, pool, PREDS, depth=2, per=4)
    memo: dict = {}
    exact = set()
    for name, node in cases:
        text = f"{name}: {dsl.to_text(node)}"
        got = fs.pattern(node, memo)
        want = _cells(fs, split, dsl.evaluate(node, split.ids, split.lengths, split.features, causal), causal)
        raw = _cells(fs, split, dsl.evaluate_scores(node, split.ids, split.lengths, split.features, causal), causal)
        if isinstance(node, dsl.Prim) and set(np.unique(raw)) <= {0.0, 1.0}:
            np.testing.assert_array_equal(got, want, err_msg=text)
            exact.add(name)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=text)
        if not isinstance(node, (dsl.Sum, dsl.Sharpen)):  # those two hand ``sum`` their normalized rows
            np.testing.assert_allclose(fs.raw(node, memo), raw, rtol=1e-5, atol=1e-6, err_msg=text)
    assert {name for name, _ in cases} == set(prims) | set(dsl.COMBINATORS)
    assert {"first", "prev", "key_in_set", "same_token"} <= exact


@dataclass(frozen=True)
class Twice:
    """A toy combinator's node: its argument's scores, doubled."""

    arg: object


def test_a_combinator_without_cells_is_refused_by_name() -> None:
    fs, _, _ = _fit_set(np.random.default_rng(1), True)
    register_combinator(CombinatorSpec(
        "twice", Twice, "twice(A)", "one argument", lambda node, ctx: 2 * ctx.eval(node.arg), "A's scores doubled",
        "{arg}", lambda node, gloss: {"arg": gloss(node.arg)}, cost=1))
    try:
        node = Twice(dsl.parse("prev(1)"))
        for evaluate in (fs.values, fs.raw, fs.pattern):
            with pytest.raises(InputError, match=r"combinator 'twice' declares no cells adapter.*cells=CellsAdapter"):
                evaluate(node, {})
    finally:
        unregister_combinator("twice")
    assert combinator_for(node) is None and "twice" not in dsl.COMBINATOR_SPECS


# the learned searcher's positional rows (headsurgeon/synth/search/learned/rows.py) take each primitive's ``position`` scores

def _kernel_rows(node: dsl.Node, lengths: np.ndarray, n: int, causal: bool) -> np.ndarray:
    ids = np.zeros((len(lengths), n), dtype=np.int64)
    return dsl.evaluate(node, ids, lengths.astype(np.int64), {}, causal)


@pytest.mark.parametrize("causal", [True, False])
def test_learned_positional_rows_are_the_declared_position_scores(causal: bool) -> None:
    """Every term the learned searcher mixes has ``position=`` in its declaration, and its torch rows equal the
    kernel's normalized pattern on visible rows (float64 against the kernels' float32)."""
    import torch

    from headsurgeon.synth.search.learned import LearnedConfig

    lengths = np.array([7, 3, 1, 5])
    specs = positional_specs(LearnedConfig(offsets=3, decays=(0.3, 0.9)), causal)
    comps, nonempty = positional_rows(specs, torch.tensor(lengths), 7, causal)
    for t, text in enumerate(specs):
        node = dsl.parse(text)
        assert callable(dsl.PRIMITIVE_SPECS[node.name].position), f"{node.name} declares no position scores"
        want = _kernel_rows(node, lengths, 7, causal)
        rows = (comps[t] * nonempty[t][..., None]).numpy()
        for b, n in enumerate(lengths):  # empty rows fall back to position 0 in the kernels, stay 0 here
            full = nonempty[t][b, :n].numpy().astype(bool)
            np.testing.assert_allclose(rows[b, :n, :n][full], want[b, :n, :n][full], rtol=0, atol=1e-6, err_msg=text)


def test_a_primitive_declared_with_position_scores_joins_the_learned_rows_and_others_are_refused() -> None:
    """A primitive registered at run time with ``position=`` is a learned term with no edit to the searcher; one
    without it (``key_in_set``) is refused by name."""
    import torch

    from headsurgeon.kernels import primitives as kernels

    register_primitive(PrimitiveSpec(
        "last_three", (), lambda node, ctx: kernels.score_window(ctx.lengths, ctx.n, 0, 2, ctx.causal, out=ctx.buf()),
        "keys i-2 to i", "attends to itself and the two tokens before it",
        position=lambda node, i, j: ((i - j >= 0) & (i - j <= 2)).double()))
    try:
        lengths = np.array([6, 4])
        comps, _ = positional_rows(["last_three()"], torch.tensor(lengths), 6, True)
        want = _kernel_rows(dsl.parse("last_three()"), lengths, 6, True)
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(comps[0][b, :n, :n].numpy(), want[b, :n, :n], atol=1e-7)
    finally:
        unregister_primitive("last_three")
    with pytest.raises(InputError, match=r"key_in_set\(ids=\[1\]\) is not a positional primitive.*position="):
        positional_rows(["key_in_set(ids=[1])"], torch.tensor([3]), 3, True)
