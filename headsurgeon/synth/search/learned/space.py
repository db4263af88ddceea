"""Match features as padded arrays, and their value vocabularies as concatenated one-hot slots (fitted on synth)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...features import POS_TAGS, batch_feature_arrays
from ...sequence import Sequence as TokenSequence, pad_ids
from .config import ARRAY_FEATURES


def feature_arrays(sequences: list[TokenSequence], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Padded int64 [B, N] arrays of the named match features (``token`` and ``position`` included)."""
    ids, lengths = pad_ids(sequences)
    out: dict[str, np.ndarray] = {}
    wanted = [n for n in names if n in ARRAY_FEATURES]
    if wanted:
        out.update(batch_feature_arrays(sequences, wanted))
    if "token" in names:
        out["token"] = ids
    if "position" in names:
        out["position"] = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape).copy()
    return out


@dataclass
class FeatureSpace:
    """Value vocabularies of the candidate features (fitted on ``synth``) and the concatenated one-hot slots.

    Feature ``f`` owns slots ``offset[f] .. offset[f] + len(vocab[f])``; the last one is its "other"
    bucket (values outside the vocabulary, and padding), which never matches anything.
    """

    names: tuple[str, ...]
    vocabs: tuple[np.ndarray, ...]  # sorted raw values per feature

    @classmethod
    def fit(cls, arrays: dict[str, np.ndarray], lengths: np.ndarray, names: Sequence[str], top_tokens: int,
            max_values: int) -> "FeatureSpace":
        """Keep, per feature, its most frequent values over the visible positions (ties: smaller value)."""
        inside = np.arange(next(iter(arrays.values())).shape[1])[None, :] < np.asarray(lengths)[:, None]
        vocabs = []
        for name in names:
            vals, counts = np.unique(arrays[name][inside], return_counts=True)
            cap = top_tokens if name == "token" else max_values
            order = np.lexsort((vals, -counts))[:cap]
            vocabs.append(np.sort(vals[order]).astype(np.int64))
        return cls(tuple(names), tuple(vocabs))

    @property
    def sizes(self) -> list[int]:
        """Slots per feature (vocabulary + the "other" bucket)."""
        return [len(v) + 1 for v in self.vocabs]

    @property
    def offsets(self) -> list[int]:
        """First slot of each feature."""
        return [int(x) for x in np.cumsum([0] + self.sizes[:-1])]

    @property
    def dim(self) -> int:
        """Slots in all."""
        return int(sum(self.sizes))

    def slot_feature(self) -> np.ndarray:
        """Feature index of every slot, int64 [dim]."""
        return np.repeat(np.arange(len(self.names)), self.sizes)

    def other_mask(self) -> np.ndarray:
        """bool [dim]: the "other" slots (forced to never match)."""
        mask = np.zeros(self.dim, dtype=bool)
        for off, size in zip(self.offsets, self.sizes):
            mask[off + size - 1] = True
        return mask

    def local_index(self, f: int, values: np.ndarray) -> np.ndarray:
        """Index of each raw value in feature ``f``'s vocabulary; the "other" index for unknown values."""
        vocab = self.vocabs[f]
        values = np.asarray(values, dtype=np.int64)
        if vocab.size == 0:
            return np.zeros(values.shape, dtype=np.int64)
        pos = np.minimum(np.searchsorted(vocab, values), vocab.size - 1)
        return np.where(vocab[pos] == values, pos, vocab.size).astype(np.int64)

    def encode(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Global slot index of every feature at every position: int64 [F, B, N]."""
        return np.stack([self.local_index(f, arrays[name]) + off
                         for f, (name, off) in enumerate(zip(self.names, self.offsets))])

    def dsl_value(self, f: int, local: int) -> Any:
        """The DSL spelling of value ``local`` of feature ``f`` (POS ids become tag names)."""
        raw = int(self.vocabs[f][local])
        if self.names[f] == "pos" and 0 <= raw < len(POS_TAGS):
            return POS_TAGS[raw]
        return raw

    def describe(self, f: int, local: int, tokens: dict[int, str] | None = None) -> str:
        """A short human label of a value (token text for token ids when known)."""
        raw = int(self.vocabs[f][local])
        name = self.names[f]
        if name == "token" and tokens and raw in tokens:
            return repr(tokens[raw])
        if name == "pos":
            return str(self.dsl_value(f, local))
        if name in ("punct", "cap", "newline", "sent_end", "word_start"):
            return {-1: "BOS", 0: "no", 1: "yes"}.get(raw, str(raw))
        return str(raw)
