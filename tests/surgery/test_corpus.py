"""Corpus → documents → Sequences with the model's BOS convention, and document-level splits."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.surgery.corpus import CorpusError, load_corpus, make_sequences, read_documents, split_sequences


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
    assert abs(len(docs["synth"]) - 36) <= 1 and abs(len(docs["test"]) - 12) <= 1
    c = split_sequences(seqs, seed=4)
    assert {s.doc for s in c.test} != docs["test"]
    with pytest.raises(ValueError, match="summing to 1"):
        split_sequences(seqs, fractions=(0.5, 0.2, 0.2))


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
