"""What rendering and parsing programs need of a vocabulary: a token's string by id and back, and the table's
fingerprint that program files record (headsurgeon/synth/vocab.py ``Vocabulary`` is the one built from a tokenizer)."""
from __future__ import annotations

from typing import Protocol

__all__ = ["TokenVocabulary"]


class TokenVocabulary(Protocol):
    """Token ids ↔ token strings as the tokenizer spells them; programs keep ids and people read strings."""

    fingerprint: str

    def token(self, token_id: int) -> str:
        """The string of ``token_id``."""

    def id(self, token: str) -> int:
        """The id of ``token``; a ValueError (or KeyError) when the tokenizer has no such token."""
