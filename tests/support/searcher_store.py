"""A store of known programs over word-level sequences and its splits, for the searcher tests
(tests/synth/test_searchers.py, tests/synth/test_backends.py), and the variables that point at an LLM endpoint."""
from __future__ import annotations

import numpy as np

from headsurgeon.synth.sequence import Sequence

TRUTH = {(0, 0): "prev(1)", (0, 1): "0.7*prev(1) + 0.3*first()", (1, 0): "self()"}
WORDS = "once upon a time there was a little girl named lily she loved to play outside in the park".split()


def tiny_sequences(n: int = 12, length: int = 10) -> list[Sequence]:
    """Word-level sequences with BOS, one document each."""
    rng = np.random.default_rng(0)
    out = []
    for doc in range(n):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), length - 1)]
        text = " ".join(words)
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        offsets = [(0, 0)] + [(int(s), int(s) + len(w)) for s, w in zip(starts, words)]
        ids = [0] + [1 + WORDS.index(w) for w in words]
        out.append(Sequence(ids=np.array(ids), tokens=["<s>"] + words, text=text, offsets=np.array(offsets),
                            doc=doc, has_bos=True))
    return out


SYNTH, SELECT, TEST = list(range(6)), list(range(6, 9)), list(range(9, 12))
#: the variables that point the LLM agent at an endpoint: a test without one deletes them all
LLM_ENV = ("HEADSURGEON_LLM_BASE_URL", "OPENAI_BASE_URL", "HEADSURGEON_LLM_MODEL", "HEADSURGEON_LLM_API_KEY",
           "OPENAI_API_KEY")
