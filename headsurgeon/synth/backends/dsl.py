"""The DSL program backend: expressions over kernel primitives, evaluated in-process by numba kernels.

DSL programs are data with every parameter bounded at parse time, so they load without trust
(SECURITY.md). Their payload is the parsed tree (``headsurgeon.synth.dsl.Node``); their file is the
DSL JSON, written like the rest of a checkpoint's JSON (indent 1, insertion order, final newline).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from headsurgeon.core.fileio import json_bytes
from headsurgeon.kernels.normalize import normalize_scores

from .. import dsl, features as feature_views
from ..errors import ProgramValidationError
from ..sequence import Sequence, pad_ids
from .base import ProgramBackend, json_document
from ...core.vocabulary import TokenVocabulary

__all__ = ["DSLBackend"]


def _features(need: frozenset[str], sequences: list[Sequence],
              features: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``features`` completed with the arrays the program needs but the caller did not pass."""
    have = dict(features or {})
    missing = sorted(need - set(have))
    if missing:
        have.update(feature_views.batch_feature_arrays(sequences, missing))
    return have


class DSLBackend(ProgramBackend):
    """DSL programs: payload = ``dsl.Node``; JSON = the DSL JSON tree; file suffix ``.json``; no trust needed."""

    kind = "dsl"
    label = "DSL"
    suffix = ".json"
    needs_trust = False
    sandboxed = False
    has_tree = True
    readable_text = True

    def from_json(self, obj: Any) -> dsl.Node:
        """A tree from DSL JSON (tree or ``{"dsl": text}``); a document holding Python is refused."""
        obj = json_document(obj)
        if isinstance(obj, dict) and "python" in obj:
            raise ProgramValidationError(
                'a DSL program document holds {"python": ...}: DSL JSON can never carry Python source; '
                "load Python programs with Program.python (or as a trusted Python program file)"
            )
        if isinstance(obj, dict) and len(obj) == 1 and "dsl" in obj:
            value = obj["dsl"]
            return dsl.parse(value) if isinstance(value, str) else dsl.from_json(value)
        return dsl.from_json(obj)

    def claims(self, obj: Any) -> bool:
        """The default kind: any record no other backend claims is read as DSL JSON."""
        return True

    def to_json(self, payload: dsl.Node) -> Any:
        """The DSL JSON tree."""
        return dsl.to_json(payload)

    def text(self, payload: dsl.Node) -> str:
        """The DSL text form, e.g. ``0.7*prev(1) + 0.3*first()``."""
        return dsl.to_text(payload)

    def canonical(self, payload: dsl.Node) -> str:
        """``dsl:`` + the canonical JSON."""
        return "dsl:" + dsl.canonical_json(payload)

    def size(self, payload: dsl.Node) -> int:
        """Nodes plus scalar literals of the tree (headsurgeon/synth/dsl/size.py)."""
        return dsl.size(payload)

    def render(self, payload: dsl.Node, vocab: TokenVocabulary | None = None) -> str:
        """The text form; with a ``Vocabulary`` every token id is shown as its token string."""
        return dsl.to_text(payload, vocab)

    def gloss(self, payload: dsl.Node, vocab: TokenVocabulary | None = None) -> str:
        """The spec's English templates filled in for this tree (tokens named by string with a ``Vocabulary``)."""
        return dsl.gloss(payload, vocab)

    def to_file(self, payload: dsl.Node) -> bytes:
        """The DSL JSON, indent 1, keys in tree order, final newline."""
        return json_bytes(self.to_json(payload), indent=1, sort_keys=False) + b"\n"

    def from_file(self, data: bytes | str) -> dsl.Node:
        """A tree from a ``.json`` program file (DSL JSON only)."""
        return self.from_json(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)

    def features_needed(self, payload: dsl.Node) -> frozenset[str]:
        """The feature arrays the tree's primitives read."""
        return dsl.features_needed(payload)

    def sparse_rows(self, payload: dsl.Node) -> bool:
        """When no primitive in the tree is dense (``dsl.is_sparse``)."""
        return dsl.is_sparse(payload)

    def needs_text(self, payload: dsl.Node) -> bool:
        """Only trees that read linguistic features need the decoded text."""
        return bool(self.features_needed(payload))

    def evaluate_scores(self, payload: dsl.Node, sequences: list[Sequence], causal: bool,
                        features: Mapping[str, np.ndarray] | None, timeout: float, pos_tags: Iterable[str] | None,
                        out: np.ndarray | None) -> np.ndarray:
        """float32 raw scores from the numba kernels (``out``: a float32 [B,N,N] buffer to fill)."""
        ids, lengths = pad_ids(sequences)
        feats = _features(self.features_needed(payload), sequences, features)
        return dsl.evaluate_scores(payload, ids, lengths, feats, causal, pos_tags, out)

    def evaluate(self, payload: dsl.Node, sequences: list[Sequence], causal: bool,
                 features: Mapping[str, np.ndarray] | None, timeout: float, pos_tags: Iterable[str] | None,
                 out: np.ndarray | None) -> np.ndarray:
        """Scores normalized in place (the buffer is ours and zero outside the visible grid)."""
        lengths = np.array([s.n for s in sequences], dtype=np.int64)
        scores = self.evaluate_scores(payload, sequences, causal, features, timeout, pos_tags, out)
        return normalize_scores(scores, lengths, causal, out=scores, masked=True)

    def evaluate_arrays(self, payload: dsl.Node, ids: np.ndarray, lengths: np.ndarray,
                        features: Mapping[str, np.ndarray] | None, causal: bool, pos_tags: Iterable[str] | None, normalize: bool,
                        out: np.ndarray | None) -> np.ndarray:
        """Evaluate on padded ids [B,N], lengths [B] and feature arrays [B,N]."""
        if normalize:
            return dsl.evaluate(payload, ids, lengths, features, causal, pos_tags, out)
        return dsl.evaluate_scores(payload, ids, lengths, features, causal, pos_tags, out)

    def node(self, payload: dsl.Node) -> dsl.Node:
        """The tree itself."""
        return payload

    def describe(self, text: str, program_hash: str) -> str:
        """``dsl: <text>``, a long program (a fitted table of thousands of characters) cut to its first 80 with its
        length and hash, so reprs of dicts of programs (``hybrid.replaced``) stay readable."""
        if len(text) <= 80:
            return f"dsl: {text}"
        return f"dsl: {text[:80]}... ({len(text)} characters), hash={program_hash[:12]}"
