"""Token ids seen inside a forward pass → the Sequence objects programs read (text, tokens, offsets)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...synth.sequence import Sequence


def _key(ids: np.ndarray) -> str:
    return Sequence(ids=ids, tokens=[""] * len(ids), text="", offsets=np.zeros((len(ids), 2))).key


class SequenceRegistry:
    """Known Sequences by content key, and reconstruction from ids for unseen ones (cached)."""

    def __init__(self, tokenizer: Any, bos_id: int | None, max_items: int = 100_000) -> None:
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.known: dict[str, Sequence] = {}
        self.max_items = max_items

    def register(self, sequences: list[Sequence]) -> None:
        for s in sequences:
            if len(self.known) >= self.max_items:
                self.known.pop(next(iter(self.known)))
            self.known[s.key] = s

    def get(self, ids: np.ndarray, need_text: bool = True) -> Sequence:
        """The Sequence behind ``ids``; with ``need_text=False`` an ids-only Sequence suffices (no decoding)."""
        ids = np.asarray(ids, dtype=np.int64)
        key = _key(ids)
        seq = self.known.get(key)
        if seq is None:
            if not need_text:
                return Sequence(ids=ids, tokens=[""] * len(ids), text="", offsets=np.zeros((len(ids), 2)),
                                has_bos=self.bos_id is not None and len(ids) > 0 and int(ids[0]) == self.bos_id)
            seq = self.rebuild(ids)
            self.register([seq])
        return seq

    def rebuild(self, ids: np.ndarray) -> Sequence:
        """Decode ids to text and recover per-token character offsets by re-tokenizing (or by decoding prefixes)."""
        tok = self.tokenizer
        has_bos = self.bos_id is not None and len(ids) > 0 and int(ids[0]) == self.bos_id
        body = ids[1:] if has_bos else ids
        tokens = tok.convert_ids_to_tokens(ids.tolist())
        text = tok.decode(body.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        offsets: list[tuple[int, int]] | None = None
        try:
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            if list(enc["input_ids"]) == body.tolist():
                offsets = [tuple(o) for o in enc["offset_mapping"]]
        except (NotImplementedError, TypeError, ValueError):
            offsets = None
        if offsets is None:  # tokenization does not round-trip: offsets from growing decoded prefixes
            prefixes = tok.batch_decode([body[:i].tolist() for i in range(1, len(body) + 1)],
                                        skip_special_tokens=False, clean_up_tokenization_spaces=False)
            offsets, prev = [], 0
            for prefix in prefixes:
                cur = len(prefix)
                offsets.append((min(prev, cur), cur))
                prev = cur
        if has_bos:
            offsets = [(0, 0)] + offsets
        return Sequence(ids=ids, tokens=list(tokens), text=text, offsets=np.array(offsets).reshape(-1, 2),
                        has_bos=has_bos)
