"""How far each split's share of the predicted tokens lands from its fraction: the split by predicted tokens
(headsurgeon/surgery/corpus.py ``split_sequences``) beside the previous rule, which rounded the fractions of the document count.

    python benchmarks/split_tokens.py [--corpus FILE ...] [--max-len 64 128] [--max-sequences 300] [--seeds 10]

Prints, per corpus (and the same text as documents of very different lengths, ``mixed``) and window length, the mean and worst |token share − fraction| over the seeds for each rule, and
the fewest test windows a seed gave (a split under 2 test windows is now refused: headsurgeon/surgery/corpus.py
``Splits.require``). Figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
STORIES = SHARED / "models" / "stories260K"
CORPORA = [SHARED / "corpora" / "tinystories-valid.txt"]
FRACTIONS = (0.6, 0.2, 0.2)


def by_documents(sequences: list, fractions: tuple[float, float, float], seed: int) -> dict[str, list]:
    """The previous rule (headsurgeon before this change), kept here only as the baseline: the fractions of the
    document count, rounded, in the same seeded document order."""
    docs = sorted({s.doc for s in sequences})
    order = np.random.default_rng(seed).permutation(len(docs))
    n = len(docs)
    n_synth, n_select = int(round(fractions[0] * n)), int(round(fractions[1] * n))
    if n >= 3:
        n_synth = min(max(n_synth, 1), n - 2)
        n_select = min(max(n_select, 1), n - n_synth - 1)
    which = {docs[i]: "synth" if r < n_synth else "select" if r < n_synth + n_select else "test"
             for r, i in enumerate(order)}
    parts: dict[str, list] = {"synth": [], "select": [], "test": []}
    for s in sequences:
        parts[which[s.doc]].append(s)
    return parts


def mixed(docs: list[str], seed: int = 0) -> list[str]:
    """The same text as documents of very different lengths: runs of 1 to 12 consecutive paragraphs joined (seeded),
    as a corpus of notes and chapters would be."""
    rng = np.random.default_rng(seed)
    out, i = [], 0
    while i < len(docs):
        k = int(rng.choice([1, 1, 1, 2, 12]))
        out.append("\n".join(docs[i: i + k]))
        i += k
    return out


def errors(parts: dict[str, list]) -> tuple[list[float], int]:
    """Each split's |token share − fraction| and the number of test windows."""
    from headsurgeon.surgery.corpus import predicted_tokens

    tokens = {k: predicted_tokens(v) for k, v in parts.items()}
    total = sum(tokens.values())
    return [abs(tokens[k] / total - f) for k, f in zip(("synth", "select", "test"), FRACTIONS)], len(parts["test"])


def main() -> None:
    from headsurgeon.surgery.corpus import make_sequences, read_documents, split_sequences
    from headsurgeon.surgery.models.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", nargs="+", type=Path, default=[c for c in CORPORA if c.exists()])
    ap.add_argument("--max-len", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--max-sequences", nargs="+", type=int, default=[40, 300])
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    handle = load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model")
    print(f"fractions {FRACTIONS}; |token share - fraction| over {args.seeds} seeds: mean / worst (synth, select, "
          "test); fewest test windows")
    print(f"{'corpus':<30} {'len':>4} {'windows':>7} {'docs':>5}  {'by documents (before)':<34} "
          f"{'by predicted tokens (now)':<34}")
    corpora = [(c.name, read_documents(c)) for c in args.corpus]
    corpora += [(f"{name} (mixed)", mixed(docs)) for name, docs in corpora]
    for name, docs in corpora:
        for max_len in args.max_len:
            for cap in args.max_sequences:
                seqs = make_sequences(handle, docs, max_len=max_len, max_sequences=cap)
                cells = []
                for rule in (lambda s: by_documents(seqs, FRACTIONS, s),
                             lambda s: split_sequences(seqs, FRACTIONS, s).__dict__):
                    got = [errors(rule(seed)) for seed in range(args.seeds)]
                    errs = np.array([e for e, _ in got])
                    fewest = min(n for _, n in got)
                    cells.append(f"{errs.mean():.3f} / {errs.max():.3f}; test >= {fewest:>3} windows")
                print(f"{name:<30} {max_len:>4} {len(seqs):>7} {len({s.doc for s in seqs}):>5}  "
                      f"{cells[0]:<34} {cells[1]:<34}")


if __name__ == "__main__":
    main()
