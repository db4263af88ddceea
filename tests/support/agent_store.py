"""A store whose heads run known programs over word-tokenized story sentences, and the LLM agent's test settings:
what the agent tests (tests/synth/test_agent.py, tests/synth/test_hostile_agent.py) and the kill-and-resume
subprocess share, so the right answer per head is known independently of the agent."""
from __future__ import annotations

import re

import numpy as np

from headsurgeon.synth.program import Program
from headsurgeon.synth.search.llm import AgentConfig
from headsurgeon.synth.sequence import Sequence

TEXTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, Tom saw a big red ball. He wanted to play with it, so he ran to his mom.",
    "The cat sat on the mat. It was warm and happy, and the sun was shining.",
    "Sam had a toy car. He liked to race it fast around the room with his dog.",
    "Mia found a shiny stone by the river. She put it in her pocket and smiled.",
    "The bird sang a song in the tree. The boy listened and clapped his hands.",
    "Ben and Sue went to the shop. They bought milk, bread and a big cake for mom.",
    "A small frog jumped into the pond. The water was cold, but the frog was brave.",
    "Lucy drew a picture of a house. Her dad put it on the wall in the kitchen.",
    "The dog barked at the mailman. Then it wagged its tail and went back to sleep.",
]
TRUE = {(0, 0): "prev(1)", (0, 1): "first()", (0, 2): "0.5*prev(1) + 0.5*first()"}
HEADS = sorted(TRUE)
SYNTH = list(range(0, 6))
SELECT = list(range(6, 10))
RESUME_CONFIG = dict(rounds=1, candidates_per_round=1, concurrency=1)  # the kill-and-resume run's settings


def make_sequences() -> list[Sequence]:
    """Word-level tokenization with a BOS token; ids from a vocabulary over all texts (BOS = 0)."""
    words = sorted({m.group() for t in TEXTS for m in re.finditer(r"\w+|[^\w\s]", t)})
    vocab = {w: i + 1 for i, w in enumerate(words)}
    seqs = []
    for d, text in enumerate(TEXTS):
        ms = list(re.finditer(r"\w+|[^\w\s]", text))
        tokens = ["<s>"] + [m.group() for m in ms]
        ids = [0] + [vocab[m.group()] for m in ms]
        offsets = [(0, 0)] + [(m.start(), m.end()) for m in ms]
        seqs.append(Sequence(ids=np.array(ids), tokens=tokens, text=text, offsets=np.array(offsets), doc=d,
                             has_bos=True))
    return seqs


def build_store():
    """A dense AttentionStore whose heads are the TRUE programs' patterns."""
    from headsurgeon.surgery.patterns.store import AttentionStore

    seqs = make_sequences()
    store = AttentionStore(seqs, n_layers=1, n_heads=3, causal=True, model_name="synthetic")
    progs = [Program.parse(TRUE[h]) for h in HEADS]
    for i, s in enumerate(seqs):
        pats = np.stack([p.evaluate([s], causal=True)[0] for p in progs])  # [H, n, n]
        store.put(i, pats[None])
    return store


def config(base_url: str, **kw) -> AgentConfig:
    base = dict(base_url=base_url, model="scripted-model", api_key="test-key", concurrency=1, request_timeout=5.0,
                max_retries=3, backoff_base=0.01, backoff_max=0.05, jitter=0.5, rounds=1, candidates_per_round=1,
                examples=2, progress=False, program_timeout=0.5)
    base.update(kw)
    return AgentConfig(**base)
