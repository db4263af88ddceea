"""Real story text cut into word-level sequences, and a program's scores on a store through the kernels and
score_many (a path independent of the searcher's), for tests/synth/test_enumerative.py and
tests/kernels/test_cell_kernels.py."""
from __future__ import annotations

import re

import numpy as np

from headsurgeon.synth.metrics import score_many
from headsurgeon.synth.program import Program
from headsurgeon.synth.program_store import ProgramStore
from headsurgeon.synth.sequence import Sequence

STORY = """Once upon a time, there was a little girl named Lily. She loved to play outside in the park.
One day, she saw a big red ball. The ball was under a tree. Lily ran to the ball and picked it up.
"Can I play with you?" asked a small dog. Lily smiled and said, "Yes, you can play with me!"
The dog and Lily played all day. They threw the ball and ran in the sun. The sun was warm and bright.
When it was time to go home, Lily hugged the dog. "Thank you for playing with me," she said.
The next day, Lily went back to the park. The dog was there again! Lily was very happy.
Tom had a blue car. He liked to drive the car around the room. The car was fast and shiny.
His mom said, "Tom, please be careful with your car." Tom nodded and played more slowly.
Then the car hit a chair. Tom was sad, but his mom helped him fix it. They laughed together.
A bird sat on the roof. The bird sang a song every morning. Ben liked the song very much.
"""

TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def story_sequences(max_len: int = 24, text: str = STORY) -> list[Sequence]:
    """Real-text sequences (or ``text``'s) with a word-level tokenizer: BOS (id 0) + up to max_len-1 tokens, one doc
    per line."""
    vocab: dict[str, int] = {"<s>": 0}
    out = []
    for doc, line in enumerate(text.strip().splitlines()):
        matches = list(TOKEN_RE.finditer(line))
        for start in range(0, len(matches), max_len - 1):
            chunk = matches[start: start + max_len - 1]
            if len(chunk) < 4:
                continue
            lo, hi = chunk[0].start(), chunk[-1].end()
            tokens = ["<s>"] + [m.group() for m in chunk]
            ids = [0] + [vocab.setdefault(m.group().lower(), len(vocab)) for m in chunk]
            offsets = [(0, 0)] + [(m.start() - lo, m.end() - lo) for m in chunk]
            out.append(Sequence(ids=np.array(ids), tokens=tokens, text=line[lo:hi], offsets=np.array(offsets),
                                doc=doc, has_bos=True))
    return out



def kernel_scores(store: ProgramStore, head, program: Program, idx: list[int]) -> tuple[float, float]:
    """IoU and JSD of a program on store sequences, through the kernels and score_many (independent path)."""
    seqs = [store.sequences[i] for i in idx]
    real, lengths = store.batch(idx, [head])
    cand = program.evaluate(seqs, causal=store.causal)[None]
    sc = score_many(real, cand, lengths, store.causal, ("iou", "jsd"))
    return float(sc["iou"][0, 0]), float(sc["jsd"][0, 0])
