"""Vocabulary: a model tokenizer's id ↔ token-string table, so programs can be written and read in tokens.

Programs store token ids (kernels read ids, and a program evaluates without a tokenizer); a
Vocabulary renders those ids as the strings a person reads and parses strings back to ids. Its
fingerprint (sha256 of the token table) is recorded beside programs, so a program is never rendered
or parsed with a tokenizer it was not written for.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Sequence
from ..core import HeadsurgeonError

__all__ = ["Vocabulary", "VocabularyError"]


class VocabularyError(HeadsurgeonError, ValueError):
    """A token string the tokenizer does not have, or a program bound to another tokenizer."""


class Vocabulary:
    """Token strings by id (``tokens[i]`` is id i's string, as the tokenizer spells it)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self.tokens: tuple[str, ...] = tuple(str(t) for t in tokens)
        self._ids: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            self._ids.setdefault(t, i)
        self.fingerprint = hashlib.sha256(json.dumps(self.tokens).encode()).hexdigest()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "Vocabulary":
        """The vocabulary of a Hugging Face (or sentencepiece-backed) tokenizer, id by id."""
        size = len(tokenizer)
        return cls(tokenizer.convert_ids_to_tokens(list(range(size))))

    def __len__(self) -> int:
        return len(self.tokens)

    def token(self, token_id: int) -> str:
        """The string of ``token_id`` (``<id N>`` for ids outside the table)."""
        return self.tokens[token_id] if 0 <= int(token_id) < len(self.tokens) else f"<id {int(token_id)}>"

    def id(self, token: str) -> int:
        """The id of ``token``; a VocabularyError names a token the tokenizer does not have."""
        try:
            return self._ids[token]
        except KeyError:
            raise VocabularyError(f"the tokenizer has no token {token!r}; write tokens as the tokenizer spells "
                                  "them (e.g. with its word-start marker)") from None

    def ids(self, tokens: Iterable[str]) -> tuple[int, ...]:
        """The ids of ``tokens``, in order."""
        return tuple(self.id(t) for t in tokens)

    def check(self, fingerprint: str | None) -> None:
        """Refuse a program recorded for another tokenizer (``fingerprint`` None means unknown: accepted)."""
        if fingerprint and fingerprint != self.fingerprint:
            raise VocabularyError(f"these programs were written for another tokenizer (fingerprint "
                                  f"{fingerprint[:12]}, this one {self.fingerprint[:12]}); load the model they "
                                  "were made for")

    def __repr__(self) -> str:
        return f"Vocabulary({len(self.tokens)} tokens, fingerprint={self.fingerprint[:12]})"
