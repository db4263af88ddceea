"""Synthetic tasks of "Learning Transformer Programs" (Friedman, Wettig & Chen 2023), with the paper's conventions.

Every task maps an input token sequence to one label per position (``PAD`` where a position is not scored).
Conventions follow the paper's code (``vocab_size=8, max_length=8, min_length=1`` for the RASP tasks,
length 16 for Dyck):

=============  ========================  =============  =================================================
task           input                     symbols        labels
=============  ========================  =============  =================================================
reverse        ``<s> x1..xl </s>``       5, l in 1..6   reversed ``x``; BOS/EOS unscored
hist           ``<s> x1..xl``            6, l in 1..7   how often ``xi`` occurs in ``x``
double_hist    ``<s> x1..xl``            6, l in 1..7   how many distinct symbols occur as often as ``xi``
sort           ``<s> x1..xl </s>``       5, l in 1..6   ``sorted(x)``; BOS/EOS unscored
most_freq      ``<s> x1..xl``            6, l in 1..7   distinct symbols by count (desc), ties by first
                                                        occurrence, then ``<s>`` for the remaining positions
dyck1 / dyck2  ``<s> c1..c15``           1 / 2 pairs    ``P`` valid prefix, not balanced; ``T`` balanced;
                                                        ``F`` from the first unmatched close bracket on
induction      ``<s> (a 0)(c 2)...``     4 letters,     at each letter: its number if the letter occurred
                                         4 numbers      earlier, else ``<unk>``; numbers unscored
=============  ========================  =============  =================================================

Datasets hold unique inputs (first occurrence kept), drawn i.i.d. until ``size`` unique ones exist or
``oversample * size`` draws were made (the paper's code tries up to 5x). Reverse and sort have only
19,530 distinct inputs, so they come out smaller than 20,000 (about 14k, as in the paper's code). The
split is 10% test, then 10% of the rest validation: 16,200 / 1,800 / 2,000 for 20,000 samples.
"""
from __future__ import annotations

import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from ..core import InputError

PAD = "<pad>"
BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"

TASKS = ("reverse", "hist", "double_hist", "sort", "most_freq", "dyck1", "dyck2", "induction")
"""Every task name ``make_task`` accepts."""

CAUSAL_TASKS = frozenset({"dyck1", "dyck2", "induction"})
"""Tasks trained with a causal (autoregressive) attention mask, as in the paper."""


@dataclass
class TaskSplit:
    """One split as padded id arrays: ``x`` token ids, ``y`` label ids, both ``[n, max_len]`` int64; 0 is PAD."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass
class TaskData:
    """A generated task: vocabularies, the three splits and the raw token/label lists they were built from."""

    name: str
    vocab: list[str]
    labels: list[str]
    max_len: int
    causal: bool
    train: TaskSplit
    val: TaskSplit
    test: TaskSplit
    raw: dict[str, list[tuple[list[str], list[str]]]] = field(default_factory=dict, repr=False)

    @property
    def label_index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.labels)}

    def decode(self, ids: np.ndarray) -> list[str]:
        """Token strings of one padded id row, PAD dropped."""
        return [self.vocab[i] for i in np.asarray(ids).tolist() if i != 0]


# ----------------------------------------------------------------------------------------------- samplers
Sampler = Callable[[np.random.Generator], tuple[list[str], list[str]]]


def _symbols(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def _reverse(rng: np.random.Generator, n_sym: int = 5, min_len: int = 1, max_len: int = 8):
    sent = [str(s) for s in rng.integers(0, n_sym, size=int(rng.integers(min_len, max_len - 1)))]
    return [BOS, *sent, EOS], [PAD, *sent[::-1], PAD]


def _sort(rng: np.random.Generator, n_sym: int = 5, min_len: int = 1, max_len: int = 8):
    sent = [str(s) for s in rng.integers(0, n_sym, size=int(rng.integers(min_len, max_len - 1)))]
    return [BOS, *sent, EOS], [PAD, *sorted(sent), PAD]


def _draw(rng: np.random.Generator, n_sym: int, min_len: int, max_len: int) -> list[str]:
    return [str(s) for s in rng.integers(0, n_sym, size=int(rng.integers(min_len, max_len)))]


def _hist(rng: np.random.Generator, n_sym: int = 6, min_len: int = 1, max_len: int = 8):
    sent = _draw(rng, n_sym, min_len, max_len)
    counts = Counter(sent)
    return [BOS, *sent], [PAD, *(str(counts[c]) for c in sent)]


def _double_hist(rng: np.random.Generator, n_sym: int = 6, min_len: int = 1, max_len: int = 8):
    sent = _draw(rng, n_sym, min_len, max_len)
    counts = Counter(sent)
    same = Counter(counts.values())
    return [BOS, *sent], [PAD, *(str(same[counts[c]]) for c in sent)]


def _most_freq(rng: np.random.Generator, n_sym: int = 6, min_len: int = 1, max_len: int = 8):
    sent = _draw(rng, n_sym, min_len, max_len)
    counts = Counter(sent)
    first: dict[str, int] = {}
    for i, c in enumerate(sent):
        first.setdefault(c, i)
    order = sorted(counts, key=lambda c: (-counts[c], first[c]))
    tags = [PAD, *order]
    tags += [BOS] * (len(sent) + 1 - len(tags))
    return [BOS, *sent], tags


DYCK_PAIRS = (("(", ")"), ("{", "}"))


def dyck_labels(sent: list[str]) -> list[str]:
    """P/T/F label per bracket: T when the prefix is balanced, P when it is a valid unbalanced prefix, F from
    the first close bracket that does not match on."""
    opening = {o: c for o, c in DYCK_PAIRS}
    stack: list[str] = []
    tags: list[str] = []
    for i, c in enumerate(sent):
        if c in opening:
            stack.append(c)
            tags.append("P")
            continue
        if not stack or opening[stack[-1]] != c:
            return tags + ["F"] * (len(sent) - i)
        stack.pop()
        tags.append("T" if not stack else "P")
    return tags


def _balanced(rng: np.random.Generator, pairs, min_depth: int, max_depth: int) -> list[str]:
    out: list[str] = []
    for _ in range(int(rng.integers(min_depth, max_depth + 1))):
        o, c = pairs[int(rng.integers(0, len(pairs)))]
        out = out + [o, c] if rng.integers(0, 2) == 0 else [o, *out, c]
    return out


def _dyck(rng: np.random.Generator, n_pairs: int, min_len: int = 1, max_len: int = 16):
    pairs = DYCK_PAIRS[:n_pairs]
    alphabet = [c for p in pairs for c in p]
    n = max_len - 1
    if rng.integers(0, 2):
        sent = _balanced(rng, pairs, min_len // 2, max_len // 2)
        if len(sent) < n:
            sent = sent + [alphabet[i] for i in rng.integers(0, len(alphabet), size=n - len(sent))]
        sent = sent[:n]
    else:
        sent = [alphabet[i] for i in rng.integers(0, len(alphabet), size=n)]
    return [BOS, *sent], [PAD, *dyck_labels(sent)]


def _induction(rng: np.random.Generator, vocab_size: int = 10, min_len: int = 9, max_len: int = 9):
    size = (vocab_size - 2) // 2
    letters = list(string.ascii_lowercase[:size])
    numbers = _symbols(size)
    n_pairs = int(rng.integers(min_len // 2, max_len // 2 + 1))
    letter_to_number = rng.integers(0, size, size=size)
    sent, tags = [BOS], [PAD]
    for c in rng.integers(0, size, size=n_pairs):
        seen = letters[c] in sent
        sent += [letters[c], numbers[letter_to_number[c]]]
        tags += [numbers[letter_to_number[c]] if seen else UNK, PAD]
    if rng.integers(0, 2):
        sent = [BOS, numbers[int(rng.integers(0, size))], *sent[1:]]
        tags = [PAD, *tags]
    else:
        c = int(rng.integers(0, size))
        tags.append(numbers[letter_to_number[c]] if letters[c] in sent else UNK)
        sent.append(letters[c])
    return sent, tags


def _vocab(name: str) -> tuple[list[str], list[str]]:
    """(token vocabulary, label vocabulary); index 0 is PAD in both."""
    if name in ("reverse", "sort"):
        syms = _symbols(5)
        return [PAD, BOS, EOS, *syms], [PAD, *syms]
    if name in ("hist", "double_hist"):
        return [PAD, BOS, *_symbols(6)], [PAD, *(str(i) for i in range(1, 8))]
    if name == "most_freq":
        syms = _symbols(6)
        return [PAD, BOS, *syms], [PAD, BOS, *syms]
    if name in ("dyck1", "dyck2"):
        pairs = DYCK_PAIRS[: 1 if name == "dyck1" else 2]
        return [PAD, BOS, *(c for p in pairs for c in p)], [PAD, "F", "P", "T"]
    if name == "induction":
        return [PAD, BOS, *"abcd", *_symbols(4)], [PAD, UNK, *_symbols(4)]
    raise InputError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")


def sampler(name: str) -> tuple[Sampler, int]:
    """The per-sample generator of a task and its maximum sequence length (BOS/EOS included)."""
    table: dict[str, tuple[Sampler, int]] = {
        "reverse": (_reverse, 8),
        "hist": (_hist, 8),
        "double_hist": (_double_hist, 8),
        "sort": (_sort, 8),
        "most_freq": (_most_freq, 8),
        "dyck1": (lambda r: _dyck(r, 1), 16),
        "dyck2": (lambda r: _dyck(r, 2), 16),
        "induction": (_induction, 10),
    }
    if name not in table:
        raise InputError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return table[name]


def _encode(samples: list[tuple[list[str], list[str]]], vocab: list[str], labels: list[str], width: int) -> TaskSplit:
    t_idx = {t: i for i, t in enumerate(vocab)}
    l_idx = {t: i for i, t in enumerate(labels)}
    x = np.zeros((len(samples), width), dtype=np.int64)
    y = np.zeros((len(samples), width), dtype=np.int64)
    for r, (s, t) in enumerate(samples):
        x[r, : len(s)] = [t_idx[c] for c in s]
        y[r, : len(t)] = [l_idx[c] for c in t]
    return TaskSplit(x, y)


def split_sizes(n: int, test_frac: float = 0.1, val_frac: float = 0.1) -> tuple[int, int, int]:
    """(train, val, test) sizes: ``test_frac`` of all for test, ``val_frac`` of the rest for validation."""
    n_test = int(round(n * test_frac))
    n_val = int(round((n - n_test) * val_frac))
    return n - n_test - n_val, n_val, n_test


def make_task(name: str, size: int = 20_000, seed: int = 0, oversample: int = 5) -> TaskData:
    """Generate ``size`` unique samples of a task (fewer where the task has fewer distinct inputs), split
    16.2k/1.8k/2k for 20,000; the same ``(name, size, seed)`` always gives the same data."""
    sample, width = sampler(name)
    vocab, labels = _vocab(name)
    if size < 10:
        raise InputError(f"size={size} is too small to split into train/val/test; use at least 10")
    rng = np.random.default_rng(seed)
    seen: set[tuple[str, ...]] = set()
    samples: list[tuple[list[str], list[str]]] = []
    for _ in range(oversample * size):
        s, t = sample(rng)
        key = tuple(s)
        if key in seen:
            continue
        seen.add(key)
        samples.append((s, t))
        if len(samples) == size:
            break
    order = np.random.default_rng([seed, 1]).permutation(len(samples))
    samples = [samples[i] for i in order]
    n_train, n_val, n_test = split_sizes(len(samples))
    parts = {
        "test": samples[:n_test],
        "val": samples[n_test : n_test + n_val],
        "train": samples[n_test + n_val :],
    }
    return TaskData(
        name=name,
        vocab=vocab,
        labels=labels,
        max_len=width,
        causal=name in CAUSAL_TASKS,
        train=_encode(parts["train"], vocab, labels, width),
        val=_encode(parts["val"], vocab, labels, width),
        test=_encode(parts["test"], vocab, labels, width),
        raw=parts,
    )
