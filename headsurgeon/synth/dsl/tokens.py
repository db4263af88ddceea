"""Token strings in the text form: read through a Vocabulary into ids, and ids printed back as strings.

Trees always hold token ids (kernels read ids; evaluation needs no tokenizer). Text written for people may
name tokens by their strings wherever ids go: ``key_in_set(tokens=["▁the", "▁a"])``, ``recent(tok("."))``,
``gate(tok("Lily"), A, B)``, ``key_weight(w=[["▁the", 2]])``, ``class_weight(q=[["▁a", "▁the"]], ..)``,
``sharpen(A, 2, by=[[3, ["."]]])`` and ``match(q=token, k=token, pairs=[["▁the", "▁cat"]])``. ``resolve``
turns those strings into ids (headsurgeon/synth/vocab.py's ``Vocabulary``); ``fmt_token`` prints an id as its string.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .bounds import MAX_LITERAL_CHARS, _err
from .quote import _show
from ...core.vocabulary import TokenVocabulary

__all__ = ["Tok", "Quoted", "plain", "NEEDS_VOCAB", "token_id", "token_ids", "resolve", "fmt_token", "token_string"]

NEEDS_VOCAB = ("names tokens by string: pass the model's vocabulary "
               "(Program.parse(text, vocab=Vocabulary.from_tokenizer(tok)))")


@dataclass(frozen=True)
class Tok:
    """``tok("a", ..)`` as read from text: a token predicate (or token set) not yet bound to ids."""

    items: tuple[Any, ...]


class Quoted(str):
    """A quoted string literal as read from text (only quoted strings name tokens; bare names never do)."""


def plain(value: Any) -> Any:
    """``value`` with every ``Quoted`` string made a plain ``str`` (lists become lists)."""
    if isinstance(value, Quoted):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def token_id(value: Any, vocab: TokenVocabulary | None, what: str) -> Any:
    """The id of a quoted token string (other values pass through for their own checks)."""
    if not isinstance(value, Quoted):
        return value
    if vocab is None:
        raise _err(f"{what} {NEEDS_VOCAB}; got {_show(value)}")
    try:
        return vocab.id(value)
    except (KeyError, ValueError) as e:
        raise _err(f"{what}: {e}") from None


def token_ids(value: Any, vocab: TokenVocabulary | None, what: str) -> Any:
    """A list of ids from a list of token strings / ids, a ``Tok`` or one string."""
    if isinstance(value, Tok):
        value = list(value.items)
    if isinstance(value, Quoted):
        value = [value]
    if isinstance(value, (list, tuple)):
        return [token_id(v, vocab, what) for v in value]
    return value


def _pairs(value: Any, firsts: bool, seconds: bool, vocab: TokenVocabulary | None, what: str) -> Any:
    """Pairs [a, b] with the token side(s) resolved."""
    if not isinstance(value, (list, tuple)) or not (firsts or seconds):
        return value
    out = []
    for item in value:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            a, b = item
            item = [token_id(a, vocab, what) if firsts else a, token_id(b, vocab, what) if seconds else b]
        out.append(item)
    return out


def resolve(kind: str, value: Any, vocab: TokenVocabulary | None, what: str, others: Mapping[str, Any]) -> Any:
    """A parameter value of ``kind`` with token strings replaced by ids (``others``: the call's other arguments)."""
    if isinstance(value, Tok) and kind != "ids":
        raise _err(f"{what}: tok(..) names a token predicate; write it where a predicate or a token set goes, "
                   'e.g. recent(tok(".")) or key_in_set(tokens=["▁the"])')
    if kind == "ids":
        return token_ids(value, vocab, what)
    if kind == "idweights":
        return _pairs(value, True, False, vocab, what)
    if kind == "idclasses" and isinstance(value, (list, tuple)):
        return [token_ids(c, vocab, what) if isinstance(c, (list, tuple)) else c for c in value]
    if kind == "pairs":
        return _pairs(value, others.get("q") == "token", others.get("k") == "token", vocab, what)
    return value


def token_string(vocab: TokenVocabulary, token_id: int) -> str | None:
    """The string of ``token_id`` when it reads back to the same id (None: print the id)."""
    try:
        s = vocab.token(int(token_id))
        if vocab.id(s) != int(token_id):
            return None
    except (KeyError, ValueError, IndexError):
        return None
    return s


def fmt_token(token_id: int, vocab: TokenVocabulary | None) -> str:
    """An id as a quoted token string (``"▁the"``), or the id itself without a vocab or when no string reads back."""
    if vocab is None:
        return str(token_id)
    s = token_string(vocab, token_id)
    if s is None:
        return str(token_id)
    quoted = json.dumps(s, ensure_ascii=False)
    return quoted if len(quoted) <= MAX_LITERAL_CHARS else str(token_id)
