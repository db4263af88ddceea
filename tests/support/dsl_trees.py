"""Random word-level sequences and random instances of every DSL primitive and combinator, for the tests that
compare evaluators (tests/synth/test_dsl_spec.py, tests/synth/test_spec_adapters.py, tests/synth/test_sparse_scoring.py,
tests/kernels/test_sparse_dsl.py)."""
from __future__ import annotations

import numpy as np

from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Pred, Prim
from headsurgeon.synth.sequence import Sequence

WORDS = ["the", "cat", "Sat", "on", "a", "mat", ",", ".", "Dog", "ran", "the", "a", "!", "and"]


def random_sequences(rng: np.random.Generator, count: int, min_len: int = 2, max_len: int = 14) -> list[Sequence]:
    """Word-level sequences with BOS (id 0); token ids follow the lower-cased word, so tokens repeat."""
    vocab = {"<s>": 0}
    out = []
    for doc in range(count):
        words = [str(w) for w in rng.choice(WORDS, int(rng.integers(min_len - 1, max_len)))]
        text, offsets = "", [(0, 0)]
        for w in words:
            if text and w not in ",.!":
                text += " "
            offsets.append((len(text), len(text) + len(w)))
            text += w
        ids = [0] + [vocab.setdefault(w.lower(), len(vocab)) for w in words]
        out.append(Sequence(ids=np.array(ids), tokens=["<s>"] + words, text=text, offsets=np.array(offsets),
                            doc=doc, has_bos=True))
    return out


# --------------------------------------------------------------------------------------------
# random instances of every primitive and combinator
# --------------------------------------------------------------------------------------------

def random_ids(rng: np.random.Generator, k: int = 3) -> list[int]:
    return sorted({int(x) for x in rng.integers(0, 8, k)})


def random_classes(rng: np.random.Generator, count: int) -> list[list[int]]:
    ids = rng.permutation(8)[: 2 * count]
    return [sorted(int(x) for x in ids[2 * c: 2 * c + 2]) for c in range(count)]


def random_primitive(name: str, rng: np.random.Generator, features: tuple[str, ...] = ()) -> Prim:
    """A valid random instance of primitive ``name`` (match reads only ``features`` besides token/position)."""
    spans = {"prev": lambda: [int(rng.integers(1, 4))], "next": lambda: [int(rng.integers(1, 4))],
             "window": lambda: sorted(int(x) for x in rng.integers(-2, 4, 2)),
             "decay": lambda: [float(rng.choice([0.3, 0.5, 0.9]))],
             "ngram_induction": lambda: [int(rng.integers(2, 4))]}
    if name in spans:
        return dsl.make_prim(name, spans[name](), {})
    if name == "key_in_set":
        return dsl.make_prim(name, [], {"ids": random_ids(rng)})
    if name == "recent":
        return dsl.make_prim(name, [], {"pred": Pred("flag", str(rng.choice(["punct", "cap", "word_start"])))})
    if name == "profile":
        bos = None if rng.random() < 0.5 else float(rng.uniform(0, 2))
        return dsl.make_prim(name, [], {"w": [float(x) for x in rng.uniform(0, 1, int(rng.integers(1, 5)))],
                                        "tail": float(rng.uniform(0, 0.3)), "bos": bos})
    if name == "key_weight":
        return dsl.make_prim(name, [], {"w": [[i, float(rng.uniform(0, 3))] for i in random_ids(rng)],
                                        "default": float(rng.uniform(0, 1))})
    if name == "class_weight":
        nq, nk = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        return dsl.make_prim(name, [], {"q": random_classes(rng, nq), "k": random_classes(rng, nk),
                                        "w": rng.uniform(0, 3, (nq, nk)).tolist(), "default": float(rng.random())})
    if name == "match":
        choices = ["token", "position"] + list(features)
        q, k = (str(x) for x in rng.choice(choices, 2))
        value = {"token": lambda: int(rng.integers(0, 8)), "position": lambda: int(rng.integers(0, 10))}
        pairs = [[value.get(q, lambda: int(rng.integers(-1, 2)))(), value.get(k, lambda: int(rng.integers(-1, 2)))()]
                 for _ in range(3)]
        return dsl.make_prim(name, [], {"q": q, "k": k, "pairs": pairs, "select": str(rng.choice(dsl.SELECTS))})
    assert not dsl.PRIMITIVES[name], f"add a random instance of {name} to random_primitive"
    return Prim(name)


def random_combinator(name: str, rng: np.random.Generator, pool: list[dsl.Node], preds: list[Pred]) -> dsl.Node:
    """A random ``name`` node over children from ``pool``."""
    pick = lambda: pool[int(rng.integers(len(pool)))]  # noqa: E731
    if name == "mix":
        return dsl.make_mix([(float(rng.uniform(0.1, 1)), pick()) for _ in range(int(rng.integers(1, 4)))])
    if name == "sum":
        return dsl.make_sum([(float(rng.uniform(0.1, 3)), pick()) for _ in range(int(rng.integers(1, 4)))])
    if name == "fallback":
        return dsl.Fallback(tuple(pick() for _ in range(int(rng.integers(2, 4)))))
    if name == "mul":
        return dsl.Mul(tuple(pick() for _ in range(int(rng.integers(2, 4)))))
    if name == "gate":
        pred = preds[int(rng.integers(len(preds)))] if rng.random() < 0.7 else Pred("ids", tuple(random_ids(rng)))
        return dsl.Gate(pred, pick(), pick())
    if name == "sharpen":
        by = [[float(rng.uniform(0.5, 3)), ids] for ids in random_classes(rng, int(rng.integers(0, 3)))]
        return dsl.make_sharpen(pick(), float(rng.uniform(0.5, 3)), by)
    raise AssertionError(f"add a random instance of combinator {name}")


def grow_trees(rng: np.random.Generator, pool: list[dsl.Node], preds: list[Pred], depth: int,
               per: int) -> list[tuple[str, dsl.Node]]:
    """``per`` random nodes of every combinator, ``depth`` times, each level's nodes joining ``pool``."""
    grown = []
    for _ in range(depth):
        for name in dsl.COMBINATORS:
            for _ in range(per):
                node = random_combinator(name, rng, pool, preds)
                grown.append((name, node))
                pool.append(node)
    return grown
