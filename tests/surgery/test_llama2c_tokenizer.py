"""The llama2.c tokenizer.bin path encodes like the sentencepiece model the model was trained with.

On runs of spaces that differs from llama2.c's run.c, whose encoder keeps every space: sentencepiece (and so
this library, with either file) collapses them, as the training data's tokenizer did. The difference is
documented here against a transcription of run.c's encoder.
"""
from __future__ import annotations

import pytest

from conftest import STORIES, need
from headsurgeon.surgery.models.llama2c import load_llama2c_tokenizer, read_pieces


def run_c_encode(text: str, pieces: list[str], scores: list[float]) -> list[int]:
    """run.c's ``encode``: a dummy-prefix space, one piece per UTF-8 character (bytes + 3 as fallback),
    then repeatedly merge the adjacent pair whose concatenation is the highest-scoring piece."""
    lookup = {p.replace("\u2581", " "): i for i, p in enumerate(pieces) if i >= 3}
    tokens = [lookup[" "]] if text else []
    for ch in text:
        if ch in lookup:
            tokens.append(lookup[ch])
        else:
            tokens.extend(b + 3 for b in ch.encode("utf-8"))
    text_of = {i: p for p, i in lookup.items()}
    while True:
        best, best_i = None, -1
        for i in range(len(tokens) - 1):
            merged = text_of.get(tokens[i], "") + text_of.get(tokens[i + 1], "")
            j = lookup.get(merged)
            if j is not None and (best is None or scores[j] > scores[best]):
                best, best_i = j, i
        if best is None:
            return tokens
        tokens[best_i: best_i + 2] = [best]


@pytest.mark.parametrize("text", ["Once upon a time, there was a cat.", "Lily said: \"hi\" and left."])
def test_bin_and_model_agree_with_run_c_on_ordinary_text(text):
    need(STORIES / "tok512.bin")
    bin_tok = load_llama2c_tokenizer(STORIES / "tok512.bin")
    spm_tok = load_llama2c_tokenizer(STORIES / "tok512.model")
    ids = bin_tok(text, add_special_tokens=False)["input_ids"]
    assert ids == spm_tok(text, add_special_tokens=False)["input_ids"]
    assert ids == run_c_encode(text, *read_pieces(STORIES / "tok512.bin"))


def test_double_spaces_collapse_as_in_sentencepiece_not_as_in_run_c():
    need(STORIES / "tok512.bin")
    bin_tok = load_llama2c_tokenizer(STORIES / "tok512.bin")
    spm_tok = load_llama2c_tokenizer(STORIES / "tok512.model")
    ours = bin_tok("a  b", add_special_tokens=False)["input_ids"]
    assert ours == spm_tok("a  b", add_special_tokens=False)["input_ids"] == bin_tok("a b", add_special_tokens=False)["input_ids"]
    run_c = run_c_encode("a  b", *read_pieces(STORIES / "tok512.bin"))
    assert len(run_c) == len(ours) + 1  # run.c keeps the second space as its own piece
