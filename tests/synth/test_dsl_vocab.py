"""A readable DSL: token strings through a Vocabulary, the raw ``sum`` combinator, linguistic classes
(same_lemma, dep=, quote), ``round_numbers`` and English glosses."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import STORIES
from headsurgeon.kernels import primitives as K
from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Pred, Prim, Sum
from headsurgeon.synth.errors import ProgramValidationError
from headsurgeon.synth.program import Program
from headsurgeon.synth.sequence import Sequence
from headsurgeon.synth.vocab import Vocabulary

VOCAB = Vocabulary(["<s>", "▁the", "▁a", "▁Lily", ".", '"', "▁said", "x\\y", "▁cat"])
NEEDS_VOCAB = "names tokens by string: pass the model's vocabulary"

# (text with token strings, the same program with ids)
SPELLINGS = [
    ('key_in_set(tokens=["▁the", "▁a"])', "key_in_set(ids=[1, 2])"),
    ('key_in_set(ids=["▁a", 1])', "key_in_set(ids=[1, 2])"),
    ('recent(tok("."))', "recent(ids=[4])"),
    ('recent(tokens=[".", "\\""])', "recent(ids=[4, 5])"),
    ('gate(tok("▁Lily"), first(), prev(1))', "gate(ids=[3], first(), prev(1))"),
    ('gate(tokens=["▁the", "▁a"], first(), prev(1))', "gate(ids=[1, 2], first(), prev(1))"),
    ('gate(tok("▁the", "▁a"), self(), prev(2))', "gate(ids=[1, 2], self(), prev(2))"),
    ('key_weight(w=[["▁the", 2.5], [".", 0.5]], default=1)', "key_weight(w=[[1, 2.5], [4, 0.5]])"),
    ('class_weight(q=[["▁the", "▁a"], ["."]], k=[["\\""]], w=[[1], [2]])',
     "class_weight(q=[[1, 2], [4]], k=[[5]], w=[[1], [2]])"),
    ('sharpen(uniform(), 2, by=[[3, ["."]], [0.5, ["▁the", "▁a"]]])',
     "sharpen(uniform(), 2, by=[[3, [4]], [0.5, [1, 2]]])"),
    ('match(q=token, k=token, pairs=[["▁said", "\\""]], select=all)',
     "match(q=token, k=token, pairs=[[6, 5]], select=all)"),
    ('match(q=pos, k=token, pairs=[[NOUN, "▁Lily"]])', "match(q=pos, k=token, pairs=[[NOUN, 3]])"),
    ('sum(2*recent(tok(".")), key_in_set(tokens=["x\\\\y"]))', "sum(2*recent(ids=[4]), key_in_set(ids=[7]))"),
]


# --------------------------------------------------------------------------------------------
# token strings
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, ids_text", SPELLINGS)
def test_token_strings_parse_to_the_id_tree_and_render_back(text: str, ids_text: str) -> None:
    node = dsl.parse(text, vocab=VOCAB)
    assert node == dsl.parse(ids_text)
    shown = dsl.to_text(node, VOCAB)
    assert dsl.parse(shown, vocab=VOCAB) == node
    assert dsl.to_text(node) == dsl.to_text(dsl.parse(ids_text))  # without a vocab: the canonical id form
    prog = Program.parse(text, vocab=VOCAB)
    assert prog == Program.parse(ids_text) and prog.hash == Program.parse(ids_text).hash
    assert prog.render(VOCAB) == shown and prog.chars(VOCAB) == len(shown)
    assert prog.render() == prog.text


def test_rendering_names_every_token_by_its_string() -> None:
    node = dsl.parse("fallback(gate(ids=[3], recent(ids=[4]), key_in_set(ids=[1, 2])), "
                     "mul(key_weight(w=[[6, 2]]), class_weight(q=[[1]], k=[[5, 8]], w=[[3]])))")
    shown = dsl.to_text(node, VOCAB)
    assert shown == ('fallback(gate(tok("▁Lily"), recent(tok(".")), key_in_set(tokens=["▁the", "▁a"])), '
                     'mul(key_weight(w=[["▁said", 2]], default=1), '
                     'class_weight(q=[["▁the"]], k=[["\\"", "▁cat"]], w=[[3]], default=1)))')
    assert dsl.parse(shown, vocab=VOCAB) == node


def test_ids_without_a_string_stay_numbers() -> None:
    node = dsl.parse("key_in_set(ids=[1, 999])")  # 999 is outside the vocabulary
    assert dsl.to_text(node, VOCAB) == 'key_in_set(tokens=["▁the", 999])'
    assert dsl.parse(dsl.to_text(node, VOCAB), vocab=VOCAB) == node


@pytest.mark.parametrize("text", [text for text, _ in SPELLINGS if '"' in text])
def test_token_strings_without_a_vocabulary_are_a_clear_error(text: str) -> None:
    with pytest.raises(ProgramValidationError, match=NEEDS_VOCAB) as err:
        dsl.parse(text)
    assert "Program.parse(text, vocab=Vocabulary.from_tokenizer(tok))" in str(err.value)
    with pytest.raises(ProgramValidationError, match=NEEDS_VOCAB):
        Program.parse(text)


def test_token_mistakes_are_clear() -> None:
    with pytest.raises(ProgramValidationError, match="no token 'Bob'"):
        dsl.parse('recent(tok("Bob"))', vocab=VOCAB)
    with pytest.raises(ProgramValidationError, match="not an expression"):
        dsl.parse('tok("▁the")', vocab=VOCAB)
    with pytest.raises(ProgramValidationError, match="token predicate"):
        dsl.parse('prev(tok("▁the"))', vocab=VOCAB)
    with pytest.raises(ProgramValidationError, match="not both"):
        dsl.parse('key_in_set(ids=[1], tokens=["▁a"])', vocab=VOCAB)
    with pytest.raises(ProgramValidationError, match="must be an integer"):
        dsl.parse("key_in_set(ids=[the])", vocab=VOCAB)  # bare names are never tokens: quote them
    with pytest.raises(ProgramValidationError, match="bad escape"):
        dsl.parse('recent(tok("\\q"))', vocab=VOCAB)


def test_gloss_names_tokens() -> None:
    assert Program.parse('recent(tok("▁Lily"))', vocab=VOCAB).gloss(VOCAB) == "attends to the most recent 'Lily'"
    assert Program.parse("recent(ids=[3])").gloss() == "attends to the most recent token with id 3"
    assert dsl.gloss(dsl.parse("key_in_set(ids=[1, 2])"), VOCAB) == "attends to every 'the' or 'a'"
    assert dsl.gloss(dsl.parse("gate(ids=[4], first(), prev(1))"), VOCAB) == (
        "when the query is '.', attends to the first token; otherwise to the previous token")


@pytest.fixture(scope="module")
def stories_vocab() -> Vocabulary:
    if not (STORIES / "tok512.model").exists():
        pytest.skip(f"needs {STORIES / 'tok512.model'}")
    from headsurgeon.surgery.models.loading import load_model

    handle = load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model")
    return Vocabulary.from_tokenizer(handle.tokenizer)


def test_the_stories260k_tokenizer_round_trips_every_token(stories_vocab: Vocabulary) -> None:
    v = stories_vocab
    node = dsl.make_prim("key_in_set", [], {"ids": list(range(len(v)))})
    shown = dsl.to_text(node, v)
    assert dsl.parse(shown, vocab=v) == node
    assert '"▁Lily"' in shown and '"<s>"' in shown
    text = 'sum(2*gate(tok("▁Lily"), recent(tok(".")), prev(1)), key_weight(w=[["▁the", 2], ["\\"", 0.5]]))'
    prog = Program.parse(text, vocab=v)
    assert Program.parse(prog.render(v), vocab=v) == prog
    assert "▁Lily" in prog.render(v) and str(v.id("▁Lily")) in prog.text
    with pytest.raises(ProgramValidationError, match=NEEDS_VOCAB):
        Program.parse(text)
    assert Program.parse('recent(tok("▁Lily"))', vocab=v).gloss(v) == "attends to the most recent 'Lily'"


# --------------------------------------------------------------------------------------------
# sum: add raw weights, then normalize each row
# --------------------------------------------------------------------------------------------

def eaps_sum(n: int, ids: list[int]) -> np.ndarray:
    """EAPS's idiom in numpy: out = 2*prev + first + 0.5*decay(0.5) + key weights; rows normalized at the end."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    causal = j <= i
    prev = (j == i - 1).astype(float)
    first = np.where(causal, (j == 0).astype(float), 0.0)
    decay = np.where(causal, 0.5 ** np.abs(i - j), 0.0)
    kw = np.where(causal, np.array([3.0 if t == 7 else 1.0 for t in ids])[None, :], 0.0)
    out = 2 * prev + first + 0.5 * decay + 1.5 * kw
    return out / out.sum(axis=1, keepdims=True)


def test_sum_matches_the_numpy_idiom() -> None:
    ids = [0, 5, 7, 5, 7, 7, 2, 9]
    node = dsl.parse("sum(2*prev(1), first(), 0.5*decay(0.5), 1.5*key_weight(w=[[7, 3]]))")
    got = dsl.evaluate(node, np.array([ids]), np.array([len(ids)]), causal=True)[0]
    np.testing.assert_allclose(got, eaps_sum(len(ids), ids), rtol=1e-5, atol=1e-7)
    # mix normalizes each component first: different rows, which is why sum exists
    mix = dsl.parse("2*prev(1) + 1*first() + 0.5*decay(0.5) + 1.5*key_weight(w=[[7, 3]])")
    other = dsl.evaluate(mix, np.array([ids]), np.array([len(ids)]), causal=True)[0]
    assert not np.allclose(other, got, atol=1e-3)


def test_sum_text_json_size_and_gloss() -> None:
    node = dsl.parse("sum(2*prev(1), first())")
    assert node == Sum(((2.0, Prim("prev", (("k", 1),))), (1.0, Prim("first"))))
    assert dsl.to_text(node) == "sum(2*prev(1), first())"
    assert dsl.to_json(node) == {"sum": [[2.0, {"prev": 1}], [1.0, {"first": {}}]]}
    assert dsl.from_json(json.loads(dsl.canonical_json(node))) == node
    assert dsl.parse("sum(prev(1)*2, 1*first())") == node
    nested = dsl.parse("sum(0.5*(0.3*prev(1) + 0.7*first()), sum(self(), uniform()))")
    assert dsl.parse(dsl.to_text(nested)) == nested
    assert dsl.size(node) == 6 and dsl.cost(node) == 1 + 1 + 2
    assert dsl.gloss(node) == ("attends to the previous token (weight 2) and to the first token (weight 1), "
                               "adding up raw scores")
    for bad, message in [("sum(prev(1) + first())", "commas"), ("sum()", "at least one"),
                         ("sum(0*prev(1))", "must be > 0"), ("sum(prev(1), 3)", "weight")]:
        with pytest.raises(ProgramValidationError, match=message):
            dsl.parse(bad)
    with pytest.raises(ProgramValidationError, match="MAX_DEPTH|deeper"):
        dsl.parse("sum(" * 80 + "self()" + ")" * 80)


def test_sum_saturates_instead_of_overflowing() -> None:
    node = dsl.parse("sum(1e30*profile(w=[1e30]), 1e30*profile(w=[1e30]), first())")
    got = dsl.evaluate(node, np.zeros((1, 4), np.int64), np.array([4]), causal=True)
    assert np.isfinite(got).all() and np.allclose(got.sum(-1), 1)


# --------------------------------------------------------------------------------------------
# classes named by features: same_lemma, dep=, quote
# --------------------------------------------------------------------------------------------

def test_same_lemma_kernel() -> None:
    lemma = np.array([[-1, 4, 7, 4, -1, 4, 7]], dtype=np.int64)
    got = K.score_same_value(lemma, np.array([7]), True)[0]
    want = np.zeros((7, 7), np.float32)
    want[3, 1] = want[5, 1] = want[5, 3] = want[6, 2] = 1  # earlier tokens with the query's lemma
    np.testing.assert_array_equal(got, want)
    both = K.score_same_value(lemma, np.array([7]), False)[0]
    np.testing.assert_array_equal(both, want + want.T)  # non-causal: every other token; -1 matches nothing
    assert K.score_same_value(lemma, np.array([3]), True)[0, 3:].sum() == 0


def test_dep_predicate_and_quote_flag_on_arrays() -> None:
    labels = dsl.dep_labels()
    nsubj = labels.index("nsubj")
    feats = {"dep": np.array([[-1, nsubj, 0, nsubj, 3]]), "quote": np.array([[0, 0, 1, 1, 0]]),
             "lemma": np.array([[-1, 2, 5, 2, 5]])}
    ids, lengths = np.zeros((1, 5), np.int64), np.array([5])
    recent = dsl.evaluate_scores(dsl.parse("recent(dep=nsubj)"), ids, lengths, feats)[0]
    assert [int(np.argmax(r)) if r.any() else -1 for r in recent] == [-1, 1, 1, 3, 3]
    gate = dsl.evaluate_scores(dsl.parse("gate(quote, first(), self())"), ids, lengths, feats)[0]
    assert gate[2, 0] == gate[3, 0] == 1 and gate[4, 4] == 1 and gate[1, 1] == 1
    lemma = dsl.evaluate_scores(dsl.parse("same_lemma()"), ids, lengths, feats)[0]
    assert lemma[3, 1] == 1 and lemma[4, 2] == 1 and lemma.sum() == 2
    keyed = dsl.evaluate_scores(dsl.parse("match(q=dep, k=dep, pairs=[[nsubj, ROOT]], select=all)"),
                                ids, lengths, feats)[0]
    assert keyed[3, 2] == 1 and keyed.sum() == 1  # query 1 (nsubj) cannot see the ROOT ahead of it
    assert dsl.parse("recent(dep=NSUBJ)") == Prim("recent", (("pred", Pred("dep", "nsubj")),))
    assert dsl.features_needed(dsl.parse("gate(dep=nsubj, same_lemma(), recent(quote))")) == {"dep", "lemma",
                                                                                            "quote"}
    assert dsl.to_json(dsl.parse("recent(dep=nsubj)")) == {"recent": {"dep": "nsubj"}}
    assert dsl.from_json({"recent": {"dep": "nsubj"}}) == dsl.parse("recent(dep=nsubj)")
    with pytest.raises(ProgramValidationError, match="dependency label"):
        dsl.parse("recent(dep=bogus)")


def _sequence(words: list[str], ids: list[int]) -> Sequence:
    text, offsets = "", [(0, 0)]
    for w in words:
        if text and w not in ',.!"' and not text.endswith('"'):
            text += " "
        offsets.append((len(text), len(text) + len(w)))
        text += w
    return Sequence(ids=np.array([0] + ids), tokens=["<s>"] + words, text=text, offsets=np.array(offsets),
                    doc=0, has_bos=True)


def test_features_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Program.evaluate fetches the feature arrays by name (headsurgeon/synth/features/arrays.py; the spaCy ones, dep and
    lemma, are faked here so the test needs no parser)."""
    from headsurgeon.synth import features

    seq = _sequence(["Lily", "said", '"', "run", '"', "and", "she", "ran", "."], list(range(1, 10)))
    quote = Program.parse("recent(quote)").evaluate([seq])[0]
    assert [int(np.argmax(r)) for r in quote] == [0, 0, 0, 3, 4, 5, 5, 5, 5, 5]  # rows without a quote: BOS
    real = features.batch_feature_arrays

    def fake(sequences, names):
        names = list(names)
        out = real(sequences, [k for k in names if k not in ("dep", "lemma")])
        n = max(s.n for s in sequences)
        if "lemma" in names:
            out["lemma"] = np.array([[-1, 0, 1, -1, 2, -1, 3, 4, 2, -1]])[:, :n]
        if "dep" in names:
            out["dep"] = np.array([[-1] + [dsl.dep_labels().index("nsubj")] + [0] * 8])[:, :n]
        return out

    monkeypatch.setattr(features, "batch_feature_arrays", fake)
    lemma = Program.parse("fallback(same_lemma(), self())").evaluate([seq])[0]
    assert lemma[8, 4] == 1 and lemma[5, 5] == 1  # "ran" -> "run"
    dep = Program.parse("gate(dep=nsubj, first(), recent(dep=nsubj))").evaluate([seq])[0]
    assert dep[1, 0] == 1 and dep[7, 1] == 1


# --------------------------------------------------------------------------------------------
# numbers rounded to what matters
# --------------------------------------------------------------------------------------------

def test_round_numbers() -> None:
    node = dsl.parse("0.7123*prev(1) + 0.2877*sharpen(mul(profile(w=[1.234, 0.0, 0.05678], tail=0.0123, "
                     "bos=2.345), key_weight(w=[[12345, 3.14159]], default=0.987)), 1.987, by=[[2.71828, [7]]])")
    r = dsl.round_numbers(node, 2)
    assert dsl.to_text(r) == ("0.71*prev(1) + 0.29*sharpen(mul(profile(w=[1.2, 0, 0.057], tail=0.012, bos=2.3), "
                              "key_weight(w=[[12345, 3.1]], default=0.99)), 2, by=[[2.7, [7]]])")
    assert dsl.round_numbers(node, 3) == dsl.parse(
        "0.712*prev(1) + 0.288*sharpen(mul(profile(w=[1.23, 0, 0.0568], tail=0.0123, bos=2.35), "
        "key_weight(w=[[12345, 3.14]], default=0.987)), 1.99, by=[[2.72, [7]]])")
    assert dsl.round_numbers(dsl.parse("decay(0.9996)"), 2) == dsl.parse("decay(1)")  # stays within (0, 1]
    assert dsl.round_numbers(dsl.parse("sum(1.0049*prev(123), 0.00012345*window(-3, 4))"), 2) == dsl.parse(
        "sum(prev(123), 0.00012*window(-3, 4))")
    cw = dsl.parse("gate(ids=[3], class_weight(q=[[1]], k=[[2], [3]], w=[[0.33333, 1.5555]]), decay(0.123456))")
    assert dsl.to_text(dsl.round_numbers(cw, 2)) == (
        "gate(ids=[3], class_weight(q=[[1]], k=[[2], [3]], w=[[0.33, 1.6]], default=1), decay(0.12))")
    assert dsl.round_numbers(dsl.parse("prev(3)"), 1) == dsl.parse("prev(3)")
    big = Prim("profile", (("w", (1e30 * 0.99999,)), ("tail", 0.0), ("bos", None)))
    assert dsl.round_numbers(big, 1).param("w") == (1e30,)  # never past MAX_WEIGHT
    with pytest.raises(ProgramValidationError, match="digits"):
        dsl.round_numbers(node, 0)


def test_floats_print_without_noise() -> None:
    assert dsl.to_text(dsl.parse("0.7*prev(1) + 0.3*first()")) == "0.7*prev(1) + 0.3*first()"
    noisy = dsl.make_mix([(0.1 + 0.2, Prim("first")), (float(np.float32(0.7)), Prim("self"))])
    assert dsl.to_text(dsl.round_numbers(noisy, 2)) == "0.3*first() + 0.7*self()"


# --------------------------------------------------------------------------------------------
# glosses
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, sentence", [
    ("prev(1)", "attends to the previous token"),
    ("prev(2)", "attends to the token 2 positions back"),
    ("next(1)", "attends to the next token"),
    ("0.7*prev(1) + 0.3*first()", "attends to the previous token (70%) and to the first token (30%)"),
    ("fallback(same_token_recent(), first())",
     "attends to the most recent earlier occurrence of its own token, otherwise to the first token"),
    ("gate(cap, recent(punct), prev(1))",
     "when the query is a capitalized token, attends to the most recent punctuation mark; otherwise to the "
     "previous token"),
    ("recent(quote)", "attends to the most recent token inside quotes"),
    ("recent(dep=nsubj)", "attends to the most recent nsubj dependent"),
    ("gate(pos=ADJ, same_lemma(), dep_head())",
     "when the query is an adjective, attends to other tokens with its own lemma; otherwise to its dependency head"),
    ("sum(prev(1), first())", "attends to the previous token and to the first token, adding up raw scores"),
])
def test_gloss_sentences(text: str, sentence: str) -> None:
    assert dsl.gloss(dsl.parse(text)) == sentence
    assert Program.parse(text).gloss() == sentence
