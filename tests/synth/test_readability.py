"""Program size, rendered length, readability and glosses: the quantities explanations are measured by."""
from __future__ import annotations

import pytest

from headsurgeon.synth.program import READABLE_CHARS, Program
from headsurgeon.synth.vocab import Vocabulary, VocabularyError


@pytest.mark.parametrize("text, size", [
    ("prev(1)", 2),                        # the primitive and its offset
    ("first()", 1),
    ("0.7*prev(1) + 0.3*first()", 6),      # mix, two weights, prev, 1, first
    ("key_in_set(ids=[3, 5, 7])", 4),      # every id counts
    ("gate(punct, first(), prev(1))", 6),  # gate, predicate and its flag, first, prev, 1
])
def test_size_counts_nodes_and_literals(text, size):
    assert Program.parse(text).size == size


def test_chars_and_readability():
    small = Program.parse("0.7*prev(1) + 0.3*first()")
    assert small.chars() == len("0.7*prev(1) + 0.3*first()") and small.readable()
    big = Program.parse("key_in_set(ids=[" + ", ".join(str(i) for i in range(100)) + "])")
    assert big.chars() > READABLE_CHARS and not big.readable() and big.size == 101


def test_gloss_is_english_and_deterministic():
    p = Program.parse("0.7*prev(1) + 0.3*first()")
    assert p.gloss() == Program.parse("0.7*prev(1) + 0.3*first()").gloss()
    assert "first token" in p.gloss() and "70%" in p.gloss()


def test_python_programs_have_a_size():
    p = Program.python("def f(seq):\n    return np.zeros((seq.n, seq.n))\n")
    assert p.size > 5 and p.chars() == len(p.text)


def test_vocabulary_round_trip_and_fingerprint():
    v = Vocabulary(["<s>", "▁the", "▁a", "Lily"])
    assert v.ids(["▁the", "Lily"]) == (1, 3) and v.token(2) == "▁a" and v.token(99) == "<id 99>"
    with pytest.raises(VocabularyError, match="no token 'Bob'"):
        v.id("Bob")
    v.check(v.fingerprint)
    v.check(None)
    with pytest.raises(VocabularyError, match="another tokenizer"):
        v.check(Vocabulary(["x"]).fingerprint)
