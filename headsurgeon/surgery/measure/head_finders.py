"""Head finders: how strongly each head does what papers name heads for (induction, previous token, first token,
self, duplicate token), as a layer x head table, the way TransformerLens's head detector scores them.

Each kind is a detection pattern built from the token ids alone: for query i the set of keys a head of that kind
attends to (induction: every key j whose preceding token equals token i; duplicate: every earlier key holding
token i). A head's score is the attention mass it puts on that set, averaged over the queries whose set is not
empty: 1 means it does exactly that, 0 never. The default probe is repeated random tokens (BOS + block + block),
on which induction and duplicate heads show and the text's own statistics do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence as Seq

import numpy as np

from ...core import Head, InputError, check_choice
from ...synth.sequence import Sequence
from ..patterns.capture import forward_patterns
from ..configs import HEAD_KINDS, HeadKind
from ..models.loading import ModelHandle, load_model
from ..swap.hybrid import HybridModel

__all__ = ["HEAD_KINDS", "HeadKind", "HeadScores", "head_scores", "probe_sequences", "detection_pattern"]



def probe_sequences(handle: ModelHandle, length: int = 24, count: int = 8, seed: int = 0) -> list[Sequence]:
    """``count`` sequences of a random block of ``length`` ordinary tokens said twice (after BOS when the model
    uses one): the repeated-random-tokens probe of induction heads."""
    if not (isinstance(length, int) and length >= 2 and isinstance(count, int) and count >= 1):
        raise InputError(f"the probe needs length >= 2 and count >= 1 (whole numbers); got {length!r}, {count!r}")
    tok = handle.tokenizer
    special = set(getattr(tok, "all_special_ids", None) or [])
    vocab = int(getattr(tok, "vocab_size", None) or len(tok))
    ordinary = np.array([i for i in range(vocab) if i not in special], dtype=np.int64)
    if len(ordinary) < length:
        raise InputError(f"{handle.name} has {len(ordinary)} ordinary tokens; the probe needs {length} distinct ones")
    if 2 * length + 1 > handle.n_ctx:
        raise InputError(f"a probe of 2 x {length} tokens exceeds the context of {handle.n_ctx}; lower length")
    rng = np.random.default_rng(seed)
    bos = [handle.bos_id] if handle.prepend_bos and handle.bos_id is not None else []
    out = []
    for d in range(count):
        block = rng.choice(ordinary, size=length, replace=False)
        ids = np.concatenate([bos, block, block]).astype(np.int64)
        names = tok.convert_ids_to_tokens(ids.tolist()) if hasattr(tok, "convert_ids_to_tokens") else [str(i) for i in ids]
        out.append(Sequence(ids, list(names), "", np.zeros((len(ids), 2), dtype=np.int64), doc=d, has_bos=bool(bos)))
    return out


def detection_pattern(ids: np.ndarray, kind: HeadKind) -> np.ndarray:
    """[n, n] 0/1: for each query (row) the keys a head of ``kind`` attends to; rows left empty are not scored (the
    first query, which has nothing before it, and queries with no such key)."""
    check_choice(kind, HEAD_KINDS, "kind")
    ids = np.asarray(ids)
    n = len(ids)
    i, j = np.indices((n, n))
    if kind == "previous":
        pattern = j == i - 1
    elif kind == "first":
        pattern = j == 0
    elif kind == "self":
        pattern = j == i
    elif kind == "duplicate":
        pattern = (j < i) & (ids[j] == ids[i])
    else:  # induction: the key right after an earlier occurrence of the query's token
        before = np.concatenate([[-1], ids[:-1]])
        pattern = (j >= 1) & (j < i) & (before[j] == ids[i])
    return (pattern & (i >= 1)).astype(np.float32)


@dataclass(frozen=True)
class HeadScores:
    """One finder's scores: ``scores[layer, head]`` in [0, 1] on ``n_queries`` scored query positions."""

    kind: HeadKind
    scores: np.ndarray
    model: str
    n_queries: int

    def top(self, k: int = 5) -> list[tuple[Head, float]]:
        """The ``k`` highest-scoring heads, best first."""
        order = np.argsort(-self.scores, axis=None, kind="stable")[:k]
        return [(Head(*map(int, np.unravel_index(o, self.scores.shape))), float(self.scores.flat[o])) for o in order]

    def found(self, threshold: float = 0.4) -> list[Head]:
        """Heads scoring at least ``threshold``, best first."""
        return [h for h, s in self.top(self.scores.size) if s >= threshold]

    def table(self) -> str:
        """The layer x head grid as text, two decimals per head."""
        heads = self.scores.shape[1]
        lines = [f"{self.kind} scores of {self.model} ({self.n_queries} queries)", "     " + "".join(f"{f'H{h}':>6}" for h in range(heads))]
        lines += [f"L{layer:<4}" + "".join(f"{v:6.2f}" for v in row) for layer, row in enumerate(self.scores)]
        return "\n".join(lines)

    def plot(self, path: str | Path | None = None) -> Any:
        """A layer x head heatmap (matplotlib Figure), saved to ``path`` when given."""
        from .plots import head_heatmap

        return head_heatmap(self.scores, f"{self.kind} score", path)

    def __repr__(self) -> str:
        best = ", ".join(f"{h} {s:.2f}" for h, s in self.top(3))
        return f"HeadScores({self.kind} on {self.model}: {self.scores.shape[0]} x {self.scores.shape[1]}; best {best})"


def head_scores(model: Any, kind: HeadKind = "induction", sequences: Seq[Sequence] | None = None,
                length: int = 24, count: int = 8, seed: int = 0) -> HeadScores:
    """How strongly every head of ``model`` (a ModelHandle, a HybridModel, or anything ``load_model`` takes) does
    ``kind``, on ``sequences`` (default: ``probe_sequences(model, length, count, seed)``)."""
    check_choice(kind, HEAD_KINDS, "kind")
    hybrid = model if isinstance(model, HybridModel) else None  # its programs' patterns are what it attends with
    handle = hybrid.handle if hybrid is not None else model if isinstance(model, ModelHandle) else load_model(model)
    seqs = list(sequences) if sequences is not None else probe_sequences(handle, length, count, seed)
    if not seqs:
        raise InputError("head_scores needs at least one sequence")
    mass = np.zeros((handle.n_layers, handle.n_heads))
    queries = 0
    for start in range(0, len(seqs), 8):
        batch = seqs[start:start + 8]
        for seq, patterns in zip(batch, forward_patterns(handle, batch, call=hybrid)):
            target = detection_pattern(seq.ids, kind)
            rows = target.sum(1) > 0
            if rows.any():
                mass += np.einsum("lhqk,qk->lh", patterns[:, :, rows], target[rows])
                queries += int(rows.sum())
    if not queries:
        raise InputError(f"no query of these sequences has a {kind} target (e.g. no repeated token for induction); "
                         "use the default probe")
    return HeadScores(kind, (mass / queries).astype(np.float32), handle.name, queries)
