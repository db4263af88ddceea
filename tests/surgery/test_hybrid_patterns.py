"""A hybrid's patterns are observable on every backend: hs.capture(hybrid) and hook_pattern show what it uses,
also where the backend ignores pattern edits and the hybrid recomputes z (BERT)."""
from __future__ import annotations

import numpy as np
import pytest

import headsurgeon as hs
from headsurgeon.synth.program import Program


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_capture_of_a_hybrid_shows_the_program_pattern(random_models, documents, kind):
    handle = random_models[kind]
    seqs = hs.make_sequences(handle, documents[:4], max_len=16)
    program = Program.parse("prev(1)") if handle.causal else Program.parse("first()")
    base = hs.capture(handle, seqs, progress=False)
    with hs.replace_heads(handle, {(1, 2): program}) as hybrid:
        assert hybrid.mode == ("pattern" if kind == "gpt2" else "z")
        seen = hs.capture(hybrid, seqs, progress=False)
    want = program.evaluate(seqs, causal=handle.causal)
    got, _ = seen.batch(list(range(len(seqs))), [(1, 2)])
    for b, s in enumerate(seqs):
        np.testing.assert_allclose(got[0, b, : s.n, : s.n], want[b, : s.n, : s.n], atol=2e-3)  # float16 store
    other, _ = seen.batch(list(range(len(seqs))), [(0, 1)])
    untouched, _ = base.batch(list(range(len(seqs))), [(0, 1)])
    np.testing.assert_array_equal(other, untouched)  # other heads keep their neural patterns
    after = hs.capture(handle, seqs, progress=False)  # the base again, once the hybrid is gone
    np.testing.assert_array_equal(after.batch([0], [(1, 2)])[0], base.batch([0], [(1, 2)])[0])
