"""Write the local lm-eval tasks' JSONL from TinyStories validation text (run once; the output is committed).

python tests/lm_eval_tasks/make_tasks.py [../shared/data/corpora/tinystories-valid.txt]
"""
from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parents[2] / "shared" / "data" / "corpora" / "tinystories-valid.txt"
WORD = re.compile(r"[A-Za-z]{3,}")


def stories(path: Path) -> list[str]:
    """Paragraphs of the corpus (blank-line separated), whitespace collapsed."""
    return [" ".join(p.split()) for p in path.read_text(encoding="utf-8").split("\n\n") if len(p.split()) >= 40]


def cloze(texts: list[str], n: int, rng: random.Random) -> list[dict]:
    """Pick the true next word among four: the context ends before a word, the distractors are other words of the
    same passage (so unigram statistics alone do not pick the answer; the context does)."""
    out = []
    for text in rng.sample(texts, len(texts)):
        words = text.split()
        spots = [i for i in range(15, min(len(words), 80)) if WORD.fullmatch(words[i])]
        if not spots:
            continue
        i = rng.choice(spots)
        answer = words[i]
        pool = sorted({w for w in words if WORD.fullmatch(w) and w.lower() != answer.lower()})
        if len(pool) < 3:
            continue
        distractors = rng.sample(pool, 3)
        choices = distractors + [answer]
        rng.shuffle(choices)
        out.append({"context": " ".join(words[:i]), "choices": choices, "label": choices.index(answer)})
        if len(out) == n:
            break
    return out


def main(path: Path = DEFAULT) -> None:
    rng = random.Random(0)
    texts = stories(path)
    rows = {
        "cloze.jsonl": cloze(texts, 100, rng),
        # some texts exceed the embedded model's 256-token window, so rolling windows are exercised
        "rolling.jsonl": [{"text": t} for t in rng.sample(texts, 12)] + [{"text": " ".join(rng.sample(texts, 4))}],
        "generate.jsonl": [{"prompt": " ".join(t.split()[:12]), "answer": " ".join(t.split()[12:15])}
                           for t in rng.sample(texts, 10)],
    }
    for name, items in rows.items():
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in items), encoding="utf-8")
        print(f"{name}: {len(items)} examples")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
