"""Corpus → documents → Sequences with the model's BOS convention, and document-level splits."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.surgery.corpus import (CorpusError, load_corpus, make_sequences, predicted_tokens, read_documents,
                                        split_sequences)
from headsurgeon.synth.sequence import Sequence


def test_documents_from_file_and_lists(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("First story.\nSame story.\n\n\n  \nSecond one.\n \t\nThird.")
    assert read_documents(f) == ["First story.\nSame story.", "Second one.", "Third."]
    assert read_documents(str(f)) == read_documents(f)
    assert read_documents(["a b", "", "  c "]) == ["a b", "c"]
    assert read_documents("one<|endoftext|>two<|endoftext|>", separator="<|endoftext|>") == ["one", "two"]


def test_empty_corpora_are_refused_clearly(tmp_path):
    (tmp_path / "e.txt").write_text("\n\n  \n")
    with pytest.raises(CorpusError, match="holds no text"):
        read_documents(tmp_path / "e.txt")
    with pytest.raises(CorpusError, match="every document is empty"):
        read_documents(["", "  "])
    with pytest.raises(CorpusError, match="corpus file not found"):
        read_documents(str(tmp_path / "missing.txt"))


def test_sequences_follow_the_tokenizer_and_bos(stories, documents):
    seqs = make_sequences(stories, documents[:30], max_len=64)
    for s in seqs:
        assert s.has_bos and s.ids[0] == stories.bos_id and s.tokens[0] == "<s>" and 2 <= s.n <= 64
        assert s.tokens == stories.tokenizer.convert_ids_to_tokens(s.ids.tolist())
        # every non-special token's offsets cover exactly its text (sentencepiece ▁ = a space)
        for tok, (a, b) in zip(s.tokens[1:], s.offsets[1:]):
            piece = s.text[a:b]
            if tok.startswith("<0x") or tok == "\u2581":  # byte pieces and a bare space carry no chars of their own
                continue
            assert piece.replace(" ", "\u2581").lstrip("\u2581") == tok.lstrip("\u2581"), (tok, piece)
    # windows of one long document are consecutive and re-tokenize to the same ids
    doc = max(documents[:30], key=len)
    ids = stories.tokenizer(doc, add_special_tokens=False)["input_ids"]
    windows = make_sequences(stories, [doc], max_len=16, min_len=1)
    assert sum(w.n - 1 for w in windows) == len(ids)
    assert np.concatenate([w.ids[1:] for w in windows]).tolist() == ids


def test_gpt2_tokens_and_offsets(random_models):
    h = random_models["gpt2"]
    s = make_sequences(h, ["Hello world, it's a test."], max_len=32)[0]
    assert s.tokens[0] == "<|endoftext|>" and s.tokens[1:3] == ["Hello", "Ġworld"]
    assert [s.text[a:b] for a, b in s.offsets[1:4]] == ["Hello", " world", ","]


def test_too_long_windows_and_short_documents(stories):
    with pytest.raises(CorpusError, match="exceeds the model's context"):
        make_sequences(stories, ["Once upon a time."], max_len=4096)
    with pytest.raises(CorpusError, match="no token windows"):
        make_sequences(stories, ["Hi"], max_len=64, min_len=10)


def test_document_level_splits_are_deterministic_and_disjoint(stories, documents):
    seqs = make_sequences(stories, documents[:60], max_len=48)
    a, b = split_sequences(seqs, seed=3), split_sequences(seqs, seed=3)
    assert [s.key for s in a.test] == [s.key for s in b.test]
    docs = {name: {s.doc for s in a[name]} for name in ("synth", "select", "test")}
    assert not (docs["synth"] & docs["select"]) and not (docs["synth"] & docs["test"]) and not (docs["select"] & docs["test"])
    assert sum(a.sizes().values()) == len(seqs)
    c = split_sequences(seqs, seed=4)
    assert {s.doc for s in c.test} != docs["test"]
    with pytest.raises(ValueError, match="summing to 1"):
        split_sequences(seqs, fractions=(0.5, 0.2, 0.2))


def _windows(n: int, doc: int) -> Sequence:
    return Sequence(ids=np.arange(n) % 7, tokens=["t"] * n, text="t" * n, offsets=np.zeros((n, 2), int), doc=doc)


def test_split_fractions_count_predicted_tokens_not_windows_or_documents():
    # 40 short documents (one 9-token window each) and 10 long ones (six 64-token windows each): by documents the
    # test split would hold ~10 documents whatever their length; by tokens it holds ~20% of the predicted tokens
    seqs = [_windows(9, d) for d in range(40)] + [_windows(64, d) for d in range(40, 50) for _ in range(6)]
    rng = np.random.default_rng(1)
    seqs = [seqs[i] for i in rng.permutation(len(seqs))]
    total = predicted_tokens(seqs)
    for seed in range(6):
        splits = split_sequences(seqs, (0.6, 0.2, 0.2), seed=seed)
        tokens = splits.tokens()
        assert sum(tokens.values()) == total and sum(splits.sizes().values()) == len(seqs)
        for name, share in zip(("synth", "select", "test"), (0.6, 0.2, 0.2)):
            # off by at most half of the longest document (6 x 63 tokens) at each of the split's two boundaries
            assert abs(tokens[name] / total - share) <= 378 / total + 1e-9, (seed, tokens)
        docs = {name: {s.doc for s in splits[name]} for name in ("synth", "select", "test")}
        assert not (docs["synth"] & docs["select"] or docs["synth"] & docs["test"] or docs["select"] & docs["test"])
        again = split_sequences(list(reversed(seqs)), (0.6, 0.2, 0.2), seed=seed)
        assert {s.doc for s in again.test} == docs["test"]  # the input's order does not move a document


def test_a_split_too_small_for_an_interval_is_refused_with_the_fix(stories, documents):
    seqs = make_sequences(stories, documents[:3], max_len=512)
    splits = split_sequences(seqs, seed=0)
    assert len(splits.test) == 1
    with pytest.raises(CorpusError, match=r"test split holds 1 window\(s\) \(\d+ predicted tokens.*more text.*"
                                          r"--max-sequences.*--max-len"):
        splits.require("test")
    bigger = split_sequences(make_sequences(stories, documents[:40], max_len=64), seed=0)
    bigger.require("synth", "select", "test")


def test_load_corpus_end_to_end(stories, corpus_path):
    splits = load_corpus(stories, corpus_path, max_len=64, max_sequences=40)
    assert sum(splits.sizes().values()) == 40 and all(splits.sizes().values())


def one_token_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")


def test_a_one_token_tokenizer_or_ids_beyond_the_model_are_refused_clearly(stories):
    import dataclasses

    docs = ["Once upon a time there was a little cat who liked to run and play in the sun."]
    with pytest.raises(CorpusError, match=r"1 token\(s\) in its vocabulary.*tokenizer="):
        make_sequences(dataclasses.replace(stories, tokenizer=one_token_tokenizer()), docs, max_len=16)
    with pytest.raises(CorpusError, match=r"1 token\(s\)"):
        make_sequences(one_token_tokenizer(), docs, max_len=16)
    small = dataclasses.replace(stories, vocab_size=100)  # the tokenizer's ids go up to 511
    with pytest.raises(CorpusError, match=r"only 100 embeddings.*own tokenizer"):
        make_sequences(small, docs, max_len=16)
