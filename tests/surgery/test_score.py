"""hs.score: one call scores a program against a head, equal to the metric written out by hand."""
from __future__ import annotations

import numpy as np
import pytest

import headsurgeon as hs
from headsurgeon.synth.program import Program

TEXTS = ["Once upon a time there was a cat. The cat was happy.", "Lily saw a dog. The dog ran to the park.",
         "Tom had a red ball. He threw it high."]


@pytest.fixture(scope="module")
def model_and_store():
    model = hs.load_model("tiny-stories")
    seqs = hs.make_sequences(model, TEXTS, max_len=32)
    return model, seqs, hs.capture(model, seqs, progress=False)


def by_hand(store, program: Program, head) -> float:
    """Mean over sequences of Σ min(p, q) / Σ max(p, q) on the causal grid."""
    real, lengths = store.batch(list(range(len(store.sequences))), [head])
    ious = []
    for b, seq in enumerate(store.sequences):
        n = int(lengths[b])
        p = real[0, b, :n, :n].astype(np.float64)
        q = program.evaluate([seq])[0, :n, :n].astype(np.float64)
        ious.append(np.minimum(p, q).sum() / np.maximum(p, q).sum())
    return float(np.mean(ious))


@pytest.mark.parametrize("text", ["prev(1)", "first()", "0.5*prev(1) + 0.5*first()"])
def test_score_equals_the_formula(model_and_store, text):
    model, seqs, store = model_and_store
    program = Program.parse(text)
    from_store = hs.score(program, store, "L1H2")
    from_model = hs.score(text, model, (1, 2), sequences=seqs)
    assert from_store["n"] == from_model["n"] == len(seqs)
    assert from_store["iou"] == pytest.approx(by_hand(store, program, (1, 2)), abs=1e-6)
    assert from_model == pytest.approx(from_store)
    assert 0 <= from_store["jsd"] <= 1 and 0 <= from_store["topq"] <= 1


def test_score_errors_name_the_fix(model_and_store):
    model, seqs, store = model_and_store
    with pytest.raises(ValueError, match="needs sequences="):
        hs.score("prev(1)", model, "L0H0")
    with pytest.raises(IndexError, match="layer 9 does not exist"):
        hs.score("prev(1)", model, "L9H0", sequences=seqs)


def test_python_source_is_not_parsed_as_dsl(model_and_store):
    model, seqs, store = model_and_store
    source = "import numpy as np\ndef program(seq):\n    s = np.zeros((seq.n, seq.n))\n    s[:, 0] = 1.0\n    return s\n"
    for text in (source, source.split("\n", 1)[1]):  # with and without the import line
        with pytest.raises(ValueError, match=r"Python source.*hs\.Program\.python\(source\)"):
            hs.score(text, store, "L0H0")
