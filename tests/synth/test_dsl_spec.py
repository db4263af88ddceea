"""The DSL spec: every entry is complete, every derived artefact follows it, the specialized evaluators agree
with the reference evaluator on every primitive and combinator, and a new primitive needs only the spec."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from headsurgeon.kernels import primitives as kernels
from headsurgeon.synth import dsl
from headsurgeon.synth.search.llm import prompts
from headsurgeon.synth.dsl import Param, PrimitiveSpec, Pred, Prim
from headsurgeon.synth.errors import ProgramValidationError
from headsurgeon.synth.program import Program
from headsurgeon.synth.sequence import pad_ids
from support.dsl_trees import random_combinator, random_primitive, random_sequences


# --------------------------------------------------------------------------------------------
# every spec entry is complete
# --------------------------------------------------------------------------------------------

def test_every_spec_entry_has_kernel_bounds_doc_and_gloss() -> None:
    assert dsl.PRIMITIVE_SPECS and set(dsl.COMBINATORS) == {"mix", "sum", "fallback", "gate", "sharpen", "mul"}
    for name, spec in dsl.PRIMITIVE_SPECS.items():
        assert spec.name == name and callable(spec.kernel), name
        assert spec.doc and "\n" not in spec.doc, f"{name}: the doc is one line"
        assert spec.gloss and "\n" not in spec.gloss, f"{name}: the gloss is one line"
        assert dsl.docs.template_fields(spec.gloss) <= {p.name for p in spec.params}, name
        assert spec.cost >= 1
        for p in spec.params:
            assert p.kind in dsl.KINDS and dsl.KINDS[p.kind].bound, f"{name}({p.name}) has no bound"
    for name, spec in dsl.COMBINATOR_SPECS.items():
        assert callable(spec.kernel) and spec.bound and spec.doc and spec.gloss and spec.cost >= 1, name


def test_module_docs_embed_the_tables_generated_from_the_spec() -> None:
    tables = dsl.render_tables()
    assert tables in dsl.__doc__
    for spec in dsl.PRIMITIVE_SPECS.values():
        assert f"``{spec.signature}``".replace("|", "\\|") in tables and spec.doc.replace("|", "\\|") in tables
    for spec in dsl.COMBINATOR_SPECS.values():
        assert spec.bound in tables


def test_prompt_reference_is_built_from_the_spec() -> None:
    ref = prompts.dsl_reference()
    assert ref.startswith(dsl.reference_text())
    for spec in dsl.PRIMITIVE_SPECS.values():
        assert f"  {spec.signature}: {spec.doc}" in ref
    for spec in dsl.COMBINATOR_SPECS.values():
        assert f"  {spec.syntax}: {spec.doc}" in ref


def test_public_seams_replace_the_private_ones() -> None:
    assert not any(hasattr(dsl, old) for old in ("_make_prim", "_make_sharpen", "_children"))
    assert not hasattr(dsl, "clear_scratch")
    tree = dsl.parse("gate(punct, 0.5*prev(1) + 0.5*first(), sharpen(uniform(), 2))")
    assert [type(c).__name__ for c in dsl.children(tree)] == ["Mix", "Sharpen"]


def test_gloss_fills_the_templates() -> None:
    assert dsl.gloss(dsl.parse("prev(2)")) == "attends to the token 2 positions back"
    assert dsl.gloss(dsl.parse("prev(1)")) == "attends to the previous token"
    assert dsl.gloss(dsl.parse("0.75*prev(1) + 0.25*first()")) == (
        "attends to the previous token (75%) and to the first token (25%)")
    assert dsl.gloss(dsl.parse("gate(punct, first(), recent(pos=NOUN))")) == (
        "when the query is a punctuation mark, attends to the first token; otherwise to the most recent noun")
    assert dsl.gloss(dsl.parse("fallback(induction(), first())")) == (
        "attends to the token that followed an earlier occurrence of its own token (induction), otherwise to the first token")
    long = dsl.gloss(dsl.parse(f"key_in_set(ids={list(range(40))})"))
    assert "(40 in all)" in long and len(long) < 100
    rng = np.random.default_rng(3)
    pool = [random_primitive(name, rng) for name in dsl.PRIMITIVES]
    for node in pool + [random_combinator(c, rng, pool, [Pred("flag", "cap")]) for c in dsl.COMBINATORS]:
        text = dsl.gloss(node)
        assert text and "{" not in text and "}" not in text, text


# --------------------------------------------------------------------------------------------
# the specialized evaluators agree with the reference evaluator
# --------------------------------------------------------------------------------------------

# (the enumerative fit set's cells against the reference: tests/synth/test_spec_adapters.py)


@pytest.mark.parametrize("causal", [True, False])
def test_torch_evaluator_matches_the_reference_where_it_covers_the_dsl(causal: bool) -> None:
    """The learned searcher's torch model covers first/self/prev/next/uniform/decay, match (inside
    ``fallback(match, first())``), mix and gate on a flag."""
    from headsurgeon.synth.search import learned

    rng = np.random.default_rng(11 + causal)
    seqs = random_sequences(rng, 10)
    names = ("token", "punct", "cap", "word_start", "position")
    arrays = learned.feature_arrays(seqs, names)
    _, lengths = pad_ids(seqs)
    space = learned.FeatureSpace.fit(arrays, lengths, names, top_tokens=6, max_values=6)
    specs = learned.positional_specs(learned.LearnedConfig(offsets=3), causal)

    def check(head, what: str) -> None:
        prog = Program.parse(head.program.text)
        np.testing.assert_allclose(prog.evaluate(seqs, causal=causal), head.torch_patterns(seqs).numpy(),
                                   atol=2e-6, err_msg=f"{what}: {head.program.text}")

    def match_term(select: str):
        q, k = (int(x) for x in rng.integers(0, len(names), 2))
        table = rng.random((space.sizes[q], space.sizes[k])) < 0.3
        table[-1, :] = table[:, -1] = False
        table[0, 0] = True  # at least one pair
        return learned.MatchTerm(q, k, table, select)

    covered = set()
    for text in specs:  # each positional primitive alone
        check(learned.LearnedHead(space, causal, [], [(1.0, text)]), text)
        covered.add(dsl.parse(text).name)
    for select in dsl.SELECTS:  # match alone (decompiled as fallback(match, first()))
        check(learned.LearnedHead(space, causal, [(1.0, match_term(select))], []), f"match {select}")
    covered |= {"match", "fallback"}
    for trial in range(4):  # mixes, and query gates on a flag
        matches = [(float(rng.uniform(0.1, 1)), match_term(str(rng.choice(dsl.SELECTS)))) for _ in range(2)]
        positional = [(float(rng.uniform(0.05, 1)), str(s)) for s in rng.choice(specs, 2, replace=False)]
        head = learned.LearnedHead(space, causal, matches, positional)
        if trial % 2:
            head.gate = str(rng.choice(["punct", "cap", "word_start"]))
            head.other_matches = matches[1:]
            head.other_positional = [(1.0, str(rng.choice(specs)))]
        check(head, "mixture" + (" gated" if head.gate else ""))
    covered |= {"mix", "gate"}
    assert {"first", "self", "prev", "uniform", "decay"} | ({"next"} if not causal else set()) <= covered


# --------------------------------------------------------------------------------------------
# worked example: a new primitive through the spec alone
# --------------------------------------------------------------------------------------------

def _every_nth(node: Prim, ctx: dsl.Context) -> np.ndarray:
    """Kernel of the toy primitive: keys j <= i whose distance i - j is a multiple of k (numpy, not numba)."""
    out = kernels.out_buffer(ctx.buf(), (ctx.ids.shape[0], ctx.n, ctx.n))
    i, j = np.arange(ctx.n)[:, None], np.arange(ctx.n)[None, :]
    inside = np.arange(ctx.n)[None, :] < ctx.lengths[:, None]
    visible = inside[:, :, None] & inside[:, None, :] & (j <= i)[None]
    out[...] = visible & ((i - j) % node.param("k") == 0)[None]
    return out


EVERY_NTH = PrimitiveSpec(
    "every_nth", (Param("k", "offset", 2),), _every_nth,
    doc="keys at a distance behind the query that is a multiple of k (the query included)",
    gloss="attends to every {k}-th token back", json_scalar=True)


def test_a_new_primitive_needs_only_a_spec_entry_and_a_kernel() -> None:
    dsl.register_primitive(EVERY_NTH)
    try:
        node = dsl.parse("0.5*every_nth(3) + 0.5*first()")
        assert dsl.to_text(node) == "0.5*every_nth(3) + 0.5*first()"
        assert dsl.to_json(node) == {"mix": [[0.5, {"every_nth": 3}], [0.5, {"first": {}}]]}
        assert dsl.from_json(json.loads(dsl.canonical_json(node))) == node
        assert dsl.parse("every_nth()") == Prim("every_nth", (("k", 2),))  # the declared default
        with pytest.raises(ProgramValidationError, match="MAX_OFFSET"):
            dsl.parse("every_nth(5000)")  # the bound of the parameter's kind
        with pytest.raises(ProgramValidationError, match="offset >= 1"):
            dsl.parse("every_nth(0)")
        ids = np.zeros((1, 7), np.int64)
        pat = dsl.evaluate(dsl.parse("every_nth(2)"), ids, np.array([7]), causal=True)
        assert np.allclose(pat[0, 6], [0.25, 0, 0.25, 0, 0.25, 0, 0.25])
        assert np.allclose(pat[0, 1], [0, 1, 0, 0, 0, 0, 0])
        assert dsl.gloss(node) == "attends to every 3-th token back (50%) and to the first token (50%)"
        assert dsl.cost(node) == 1 + 1 + 2 and dsl.features_needed(node) == frozenset()
        assert "``every_nth(k)``" in dsl.render_tables()
        assert "every_nth(k): keys at a distance" in prompts.dsl_reference()
        prog = Program.parse("every_nth(2)")
        assert Program.from_json(prog.to_json()) == prog
    finally:
        dsl.unregister_primitive("every_nth")
    with pytest.raises(ProgramValidationError, match="unknown primitive"):
        dsl.parse("every_nth(2)")


def test_registering_a_clash_or_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="already declared"):
        dsl.register_primitive(PrimitiveSpec("prev", (), _every_nth, "x", "x"))
    with pytest.raises(ValueError, match="unknown kind"):
        dsl.register_primitive(PrimitiveSpec("toy", (Param("x", "bogus"),), _every_nth, "x", "x"))
    assert "toy" not in dsl.PRIMITIVES and re.search(r"\bprev\b", dsl.render_tables())
