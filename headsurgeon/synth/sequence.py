"""The Sequence: one tokenized text exactly as the model sees it, plus lazy linguistic views.

Programs read Sequences; capture produces patterns over them; kernels see them as padded arrays.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ..core import InputError


#: how many times a built Sequence's ``ids`` array was replaced: headsurgeon/synth/tensors.py reuses a prepared batch of
#: sequences only while it is unchanged, without reading every Sequence again
IDS_REPLACED = 0


@dataclass(eq=False)
class Sequence:
    """One window of token ids with the model's own token strings and character offsets.

    ``offsets[i] = (start, end)`` indexes ``text``; special tokens (BOS) get ``(0, 0)``.
    ``doc`` is the index of the source document (splits are made by document).
    """

    ids: np.ndarray
    tokens: list[str]
    text: str
    offsets: np.ndarray
    doc: int = 0
    has_bos: bool = False
    _views: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", np.asarray(self.ids, dtype=np.int64).reshape(-1))
        self.offsets = np.asarray(self.offsets, dtype=np.int64).reshape(-1, 2)
        if len(self.tokens) != len(self.ids) or len(self.offsets) != len(self.ids):
            raise InputError(
                f"Sequence fields disagree: {len(self.ids)} ids, {len(self.tokens)} tokens, "
                f"{len(self.offsets)} offsets; build all three from the same tokenization"
            )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "ids" and "ids" in self.__dict__:  # tokens replaced after construction (IDS_REPLACED)
            global IDS_REPLACED
            IDS_REPLACED += 1
        object.__setattr__(self, name, value)

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])

    def __len__(self) -> int:
        return self.n

    @property
    def key(self) -> str:
        """Content hash of the token ids (what the tensor cache keys on)."""
        return hashlib.sha256(self.ids.astype("<i8").tobytes()).hexdigest()[:32]

    @property
    def features(self):
        """Lazy linguistic views (word/sentence index, punctuation, spaCy tags); computed once."""
        from .features import FeatureView

        view = self._views.get("features")
        if view is None:
            view = FeatureView(self)
            self._views["features"] = view
        return view

    def __repr__(self) -> str:
        head = " ".join(self.tokens[:8])
        return f"Sequence(n={self.n}, doc={self.doc}, tokens=[{head}{' ...' if self.n > 8 else ''}])"


def sequences_key(sequences: list[Sequence]) -> str:
    """Content hash of a list of sequences (order matters)."""
    h = hashlib.sha256()
    for s in sequences:
        h.update(s.key.encode())
    return h.hexdigest()[:32]


def pad_ids(sequences: list[Sequence], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pad token ids to ``[B, N]`` int64 and return them with the lengths ``[B]`` int64."""
    lengths = np.array([s.n for s in sequences], dtype=np.int64)
    width = int(lengths.max()) if len(sequences) else 0
    out = np.full((len(sequences), width), pad, dtype=np.int64)
    for b, s in enumerate(sequences):
        out[b, : s.n] = s.ids
    return out, lengths
