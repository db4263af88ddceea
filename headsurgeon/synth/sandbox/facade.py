"""The tokenizer facade: what an EAPS-style program ``prog(sentence, tokenizer)`` gets as its ``tokenizer``.

It is a small pure-Python object built in the job process from the window's own view (ids, token strings,
offsets), with no access to the real tokenizer or its vocabulary. It reproduces the window exactly:

* ``tokenizer(sentence)["input_ids"]`` (``add_special_tokens=True``, the default) are exactly the window's
  ids, BOS included when the window has one, so a matrix sized ``len(input_ids)`` is aligned to the window;
  ``tokenize(sentence)`` and ``add_special_tokens=False`` give the window's tokens without its special
  tokens (BOS, or a (0, 0) separator between documents; headsurgeon/synth/features/words.py's convention);
* a span of the sentence that starts and ends on token boundaries (a word, say) encodes to the window's
  tokens there (plus BOS when asked for special tokens); any other text is a ValueError, since the facade
  knows no other tokens;
* ``return_tensors`` ("pt", "np", "tf") gives int64 numpy arrays with a batch axis (there is no torch in the
  sandbox; indexing, ``len`` and ``.tolist()`` work the same); a list of texts gives one row per text;
* ``bos_token``/``cls_token`` (and their ids) are the window's first token when it is special, ``eos_token``
  /``sep_token`` its last when that is special, otherwise None; ``pad_token``/``unk_token`` are None;
* ``tokenizer.features`` is the same feature namespace as ``seq.features`` (spaCy views and all).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

TENSOR_KINDS = ("pt", "np", "tf", "jax", "mlx")


class Encoding(dict):
    """A ``BatchEncoding``-like dict: ``enc["input_ids"]`` or ``enc.input_ids``, and ``enc.word_ids()``."""

    def __getattr__(self, name: str) -> Any:
        if name in self:
            return self[name]
        raise AttributeError(f"this encoding has no field {name!r}; it has {', '.join(sorted(self))}")

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Per token, the index of its word in the window (None for special tokens)."""
        words = dict.get(self, "_words")
        if words is None:
            raise ValueError("word_ids() needs the window's word views; mention `word_ids` in the program")
        return list(words[batch_index] if words and isinstance(words[0], list) else words)


class TokenizerFacade:
    """A tokenizer that knows only one window: its text, ids, token strings and offsets (module docstring)."""

    __slots__ = ("_text", "_ids", "_tokens", "_offsets", "_special", "_words", "_id_token", "_token_id",
                 "features", "bos_token", "bos_token_id", "cls_token", "cls_token_id", "eos_token", "eos_token_id",
                 "sep_token", "sep_token_id", "pad_token", "pad_token_id", "unk_token", "unk_token_id",
                 "all_special_tokens", "all_special_ids")

    def __init__(self, text: str, ids: Iterable[int], tokens: Iterable[str], offsets: Any, has_bos: bool,
                 features: Any = None, words: Iterable[int] | None = None) -> None:
        self._text = str(text)
        self._ids = [int(i) for i in ids]
        self._tokens = [str(t) for t in tokens]
        self._offsets = [(int(a), int(b)) for a, b in np.asarray(offsets, dtype=np.int64).reshape(-1, 2).tolist()]
        n = len(self._ids)
        special, seen = [False] * n, False
        for i, (a, b) in enumerate(self._offsets):
            if (i == 0 and has_bos) or (a == 0 and b == 0 and seen):
                special[i] = True
            elif b > 0:
                seen = True
        self._special = special
        self._words = None if words is None else [None if special[i] or w < 0 else int(w) for i, w in enumerate(words)]
        self._id_token: dict[int, str] = {}
        self._token_id: dict[str, int] = {}
        for i, t in zip(self._ids, self._tokens):
            self._id_token.setdefault(i, t)
            self._token_id.setdefault(t, i)
        self.features = features
        first = 0 if n and special[0] else None
        last = n - 1 if n > 1 and special[n - 1] else None
        self.bos_token = self.cls_token = None if first is None else self._tokens[first]
        self.bos_token_id = self.cls_token_id = None if first is None else self._ids[first]
        self.eos_token = self.sep_token = None if last is None else self._tokens[last]
        self.eos_token_id = self.sep_token_id = None if last is None else self._ids[last]
        self.pad_token = self.pad_token_id = self.unk_token = self.unk_token_id = None
        specials = sorted({(self._tokens[i], self._ids[i]) for i in range(n) if special[i]})
        self.all_special_tokens = [t for t, _ in specials]
        self.all_special_ids = [i for _, i in specials]

    # ---- encoding ---------------------------------------------------------------------------------
    def _positions(self, text: str, add_special_tokens: bool) -> list[int]:
        """Window positions of ``text``'s tokens: the whole window, or a span on token boundaries."""
        return self._located(text, add_special_tokens)[0]

    def _located(self, text: str, add_special_tokens: bool) -> tuple[list[int], int]:
        """(window positions of ``text``'s tokens, where ``text`` starts in the window's text)."""
        if not isinstance(text, str):
            raise TypeError(f"the tokenizer takes a str (or a list of str), got {type(text).__name__}")
        n = len(self._ids)
        if text == self._text:
            return [i for i in range(n) if add_special_tokens or not self._special[i]], 0
        found, base = self._span(text)
        if found is None:
            raise ValueError(
                f"the tokenizer facade knows only this window's tokens: {text[:60]!r} is neither the window's "
                "text (the `sentence` argument) nor a span of it that starts and ends on token boundaries")
        return ([0] if add_special_tokens and n and self._special[0] else []) + found, base

    def _span(self, text: str) -> tuple[list[int] | None, int]:
        """Tokens covering an occurrence of ``text`` (up to whitespace at its ends) exactly, and where it starts."""
        core = text.strip()
        lead = len(text) - len(text.lstrip())
        if not core:
            return ([] if text == "" else None), 0
        start = self._text.find(core)
        while start >= 0:
            end = start + len(core)
            got = [i for i, (a, b) in enumerate(self._offsets)
                   if not self._special[i] and b > a and a < end and b > start]
            if got:
                lo, hi = self._offsets[got[0]][0], self._offsets[got[-1]][1]
                if not self._text[lo:start].strip() and not self._text[end:hi].strip():
                    return got, start - lead
            start = self._text.find(core, start + 1)
        return None, 0

    def _encode(self, text: str, add_special_tokens: bool) -> dict[str, list]:
        pos, base = self._located(text, add_special_tokens)
        offsets = [(0, 0) if self._special[i] else (max(self._offsets[i][0] - base, 0), max(self._offsets[i][1] - base, 0))
                   for i in pos]
        out: dict[str, list] = {"input_ids": [self._ids[i] for i in pos], "attention_mask": [1] * len(pos), "offset_mapping": offsets}
        if self._words is not None:
            out["_words"] = [self._words[i] for i in pos]
        return out

    def __call__(self, text: str | list[str], add_special_tokens: bool = True, return_tensors: str | None = None,
                 **_ignored: Any) -> Encoding:
        """``input_ids``, ``attention_mask`` and ``offset_mapping`` of ``text`` (padding/truncation are ignored)."""
        if isinstance(text, (list, tuple)):
            rows = [self._encode(t, add_special_tokens) for t in text]
            batched = True
        else:
            rows = [self._encode(text, add_special_tokens)]
            batched = return_tensors is not None
        keys = [k for k in rows[0] if k != "_words"] if rows else ["input_ids", "attention_mask", "offset_mapping"]
        enc = Encoding()
        for k in keys:
            values = [r[k] for r in rows]
            if return_tensors is not None:
                if return_tensors not in TENSOR_KINDS:
                    raise ValueError(f"return_tensors must be one of {TENSOR_KINDS}, got {return_tensors!r}")
                if len({len(v) for v in values}) > 1:
                    raise ValueError("texts of different lengths cannot be one tensor (the facade does not pad)")
                enc[k] = np.asarray(values, dtype=np.int64)
            else:
                enc[k] = values if batched else values[0]
        if rows and "_words" in rows[0]:
            dict.__setitem__(enc, "_words", [r["_words"] for r in rows] if batched else rows[0]["_words"])
        return enc

    def encode(self, text: str, add_special_tokens: bool = True, **_ignored: Any) -> list[int]:
        """The ids of ``text`` (the window's ids for the window's text)."""
        return [self._ids[i] for i in self._positions(text, add_special_tokens)]

    def tokenize(self, text: str, **_ignored: Any) -> list[str]:
        """The token strings of ``text`` without special tokens (the window's own strings)."""
        return [self._tokens[i] for i in self._positions(text, False)]

    # ---- ids and tokens ---------------------------------------------------------------------------
    def convert_ids_to_tokens(self, ids: Any, skip_special_tokens: bool = False) -> Any:
        """Token string(s) of id(s) seen in this window; an id the window lacks is a ValueError."""
        if isinstance(ids, (int, np.integer)):
            return self._token_of(int(ids))
        specials = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._token_of(int(i)) for i in np.asarray(ids).reshape(-1).tolist() if int(i) not in specials]

    def _token_of(self, i: int) -> str:
        if i not in self._id_token:
            raise ValueError(f"token id {i} does not occur in this window; the facade knows only the window's tokens")
        return self._id_token[i]

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        """Id(s) of token string(s) seen in this window; others map to ``unk_token_id`` (None)."""
        if isinstance(tokens, str):
            return self._token_id.get(tokens, self.unk_token_id)
        return [self._token_id.get(str(t), self.unk_token_id) for t in tokens]

    def decode(self, ids: Any, skip_special_tokens: bool = False, **_ignored: Any) -> str:
        """The window's text under a run of its ids; otherwise each id's first text in the window, joined."""
        seq = [int(i) for i in np.asarray(ids).reshape(-1).tolist()]
        run = self._run_text(seq, skip_special_tokens)
        if run is not None:
            return run
        specials = set(self.all_special_ids)
        parts: list[str] = []
        for i in seq:
            if i in specials:
                if not skip_special_tokens:
                    parts.append(self._token_of(i))
                continue
            k = self._ids.index(i) if i in self._id_token else -1
            if k < 0:
                raise ValueError(f"token id {i} does not occur in this window; the facade knows only its tokens")
            a, b = self._offsets[k]
            parts.append(self._text[a:b])
        return "".join(parts)

    def _run_text(self, seq: list[int], skip_special: bool) -> str | None:
        """The exact text under ``seq`` when it is a contiguous run of the window's ids."""
        m = len(seq)
        for s in range(len(self._ids) - m + 1):
            if self._ids[s:s + m] == seq:
                real = [i for i in range(s, s + m) if not self._special[i]]
                body = self._text[self._offsets[real[0]][0]:self._offsets[real[-1]][1]] if real else ""
                lead = [] if skip_special else [self._tokens[i] for i in range(s, s + m) if self._special[i]]
                return " ".join(lead + ([body] if body else []))
        return None

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False, **_ignored: Any) -> list[str]:
        """``decode`` of each row."""
        return [self.decode(row, skip_special_tokens) for row in sequences]

    def __repr__(self) -> str:
        return f"TokenizerFacade(window of {len(self._ids)} tokens)"
