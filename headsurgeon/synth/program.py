"""``Program``: the one type every part of headsurgeon uses for "what replaces a head".

A Program is a kind, a payload and the backend registered for that kind (``headsurgeon.synth.backends``):

* ``"dsl"``: an expression over kernel primitives (``headsurgeon.synth.dsl``); safe by construction,
  evaluated in-process by numba kernels;
* ``"python"``: source defining one function over the Sequence API; validated by the sandbox's AST
  allowlist when built and executed only in the sandbox pool.

Every kind-specific question (serialization, trust, evaluation) goes to the backend, so ``Program`` has
no branch per kind. Either way ``evaluate`` returns normalized attention float32 ``[B, N, N]`` (padded,
zero beyond each length). Programs compare and hash by their canonical form (``.hash`` = sha256 hex of
it), which is what caches and checkpoints key on.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from . import dsl
from .backends import (DEFAULT_TIMEOUT, ProgramBackend, backend_for_document, get_backend, json_document)
from .backends.python import PythonBackend
from .sequence import Sequence
from ..core.vocabulary import TokenVocabulary

#: a program is readable when its rendered text (tokens as strings) fits in this many characters
READABLE_CHARS = 200
#: the size budgets (characters) selection keeps a best program for, per head; None is unbounded
BUDGETS: tuple[int | None, ...] = (60, READABLE_CHARS, None)

__all__ = ["Program", "DEFAULT_TIMEOUT"]


class Program:
    """A head-replacing program (DSL or sandboxed Python); immutable, hashable by canonical form."""

    __slots__ = ("kind", "_text", "_payload", "_canonical", "_hash", "_backend")

    def __init__(self, backend: ProgramBackend, payload: Any) -> None:
        """Internal: use ``Program.parse``, ``from_dsl_json``, ``from_json``, ``python``, ``from_node`` or ``of``."""
        if dsl.is_node(payload):
            dsl.validate(payload)  # a tree built by hand is checked here; parsed and read trees are known valid
        self._backend = backend
        self._payload = payload
        self.kind = backend.kind
        # the text, the canonical form and its sha256 are computed on first use and kept: the searchers wrap many
        # large table programs only to render them (headsurgeon/synth/search/enumerative/search.py), and a journal
        # read back holds hundreds whose text nobody prints (headsurgeon/scaleout/journal.py)
        self._text: str | None = None
        self._canonical: str | None = None
        self._hash: str | None = None

    # ---------------------------------------------------------------- constructors

    @classmethod
    def of(cls, kind: str, payload: Any) -> "Program":
        """A program of a registered kind from its backend's payload (a DSL tree, a canonical Python source, ...)."""
        return cls(get_backend(kind), payload)

    @classmethod
    def from_node(cls, node: dsl.Node) -> "Program":
        """Wrap an already-built (valid) DSL tree."""
        return cls(get_backend("dsl"), node)

    @classmethod
    def parse(cls, text: str, vocab: TokenVocabulary | None = None) -> "Program":
        """A DSL program from its text form, e.g. ``Program.parse("0.7*prev(1) + 0.3*first()")``; with a
        ``Vocabulary``, token strings (``recent(tok("Lily"))``) are read as their ids."""
        return cls.from_node(dsl.parse(text, vocab=vocab))

    @classmethod
    def python(cls, source: str) -> "Program":
        """A Python program, validated by the sandbox's AST allowlist (raises ProgramValidationError)."""
        backend = get_backend("python")
        assert isinstance(backend, PythonBackend)
        return cls(backend, backend.from_source(source))

    @classmethod
    def from_json(cls, obj: Any, *, kind: str | None = None) -> "Program":
        """From ``to_json()`` output, the record form (DSL JSON, ``{"dsl": text}`` or ``{"python": src}``).

        ``kind="dsl"`` or ``kind="python"`` pins what the document must hold (a mismatch is a
        ProgramValidationError); ``kind=None`` accepts any registered kind, for programs.json and agent
        journals. A Python program is only AST-validated here, never executed.
        """
        if kind is None:
            obj = json_document(obj)
            backend = backend_for_document(obj)
        else:
            backend = get_backend(kind)
        return cls(backend, backend.from_json(obj))

    @classmethod
    def from_dsl_json(cls, obj: Any) -> "Program":
        """A DSL program from DSL JSON (tree or ``{"dsl": text}``); never returns Python, whatever the input holds."""
        return cls.from_json(obj, kind="dsl")

    @classmethod
    def from_file(cls, data: bytes | str, kind: str) -> "Program":
        """A program of ``kind`` from the contents of its program file (``to_file()``); nothing is executed."""
        backend = get_backend(kind)
        return cls(backend, backend.from_file(data))

    # ---------------------------------------------------------------- properties

    @property
    def backend(self) -> ProgramBackend:
        """The backend of this program's kind (file suffix, trust, serialization, evaluation)."""
        return self._backend

    @property
    def suffix(self) -> str:
        """The file suffix of its program file in a checkpoint (".json" for DSL, ".py" for Python)."""
        return self._backend.suffix

    @property
    def needs_trust(self) -> bool:
        """Whether loading this program from someone else needs their trust (Python: yes, DSL: no)."""
        return self._backend.needs_trust

    @property
    def sandboxed(self) -> bool:
        """Whether it runs in sandbox workers (Python) rather than this process's kernels (DSL)."""
        return self._backend.sandboxed

    @property
    def has_tree(self) -> bool:
        """Whether a DSL tree stands behind it (``node``, ``evaluate_arrays``, rounding)."""
        return self._backend.has_tree

    @property
    def sparse_rows(self) -> bool:
        """Whether it is evaluated as compressed rows (``SparseRows``; DSL trees without a dense primitive)."""
        return self._backend.sparse_rows(self._payload)

    @property
    def needs_text(self) -> bool:
        """Whether evaluation needs the decoded text (Python, feature-reading DSL) rather than only the ids."""
        return self._backend.needs_text(self._payload)

    @property
    def node(self) -> dsl.Node:
        """The DSL tree (DSL programs only)."""
        return self._backend.node(self._payload)

    @property
    def features_needed(self) -> frozenset[str]:
        """Feature array names the program reads (DSL); Python programs read views themselves: empty."""
        return self._backend.features_needed(self._payload)

    @property
    def text(self) -> str:
        """The text form (DSL text, or the Python source), computed once, on first use."""
        if self._text is None:
            self._text = self._backend.text(self._payload)
        return self._text

    @property
    def canonical(self) -> str:
        """The canonical form the hash is computed from (computed once, on first use)."""
        if self._canonical is None:
            self._canonical = self._backend.canonical(self._payload)
        return self._canonical

    @property
    def hash(self) -> str:
        """sha256 hex of the canonical form: what caches and checkpoints key on (computed once, on first use)."""
        if self._hash is None:
            self._hash = hashlib.sha256(self.canonical.encode("utf-8")).hexdigest()
        return self._hash

    @property
    def size(self) -> int:
        """Description length of the canonical form: syntax nodes plus scalar literals (docs/architecture.md)."""
        return self._backend.size(self._payload)

    def render(self, vocab: TokenVocabulary | None = None) -> str:
        """The text a person reads; with a ``Vocabulary`` token ids are shown as token strings."""
        return self._backend.render(self._payload, vocab)

    def chars(self, vocab: TokenVocabulary | None = None) -> int:
        """Characters of :meth:`render`: what "fits in 200 characters" measures."""
        return len(self.render(vocab))

    def readable(self, vocab: TokenVocabulary | None = None) -> bool:
        """Whether the rendered program fits in ``READABLE_CHARS`` characters."""
        return self.chars(vocab) <= READABLE_CHARS

    def gloss(self, vocab: TokenVocabulary | None = None) -> str:
        """A deterministic English sentence saying what the program attends to."""
        return self._backend.gloss(self._payload, vocab)

    def to_json(self) -> Any:
        """JSON-serializable form: the DSL JSON, or ``{"python": source}``."""
        return self._backend.to_json(self._payload)

    def to_file(self) -> bytes:
        """The bytes of its program file in a checkpoint (read back by ``Program.from_file``)."""
        return self._backend.to_file(self._payload)

    # ---------------------------------------------------------------- evaluation

    def evaluate_scores(self, sequences: list[Sequence], causal: bool = True,
                        features: Mapping[str, np.ndarray] | None = None,
                        timeout: float = DEFAULT_TIMEOUT, pos_tags: Iterable[str] | None = None,
                        out: np.ndarray | None = None) -> np.ndarray:
        """Raw scores [B,N,N] before normalization, padded with zeros (float32 for DSL, float64 for Python).

        ``out``: a float32 [B,N,N] buffer to write into instead of allocating.
        """
        return self._backend.evaluate_scores(self._payload, list(sequences), causal, features, timeout, pos_tags,
                                             out)

    def evaluate(self, sequences: list[Sequence], causal: bool = True,
                 features: Mapping[str, np.ndarray] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, pos_tags: Iterable[str] | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Normalized attention float32 [B,N,N] for a batch of sequences (zeros beyond each length).

        ``features`` may supply precomputed ``batch_feature_arrays`` output (padded like the ids);
        missing names are fetched lazily. Python programs run in the sandbox pool with ``timeout``
        seconds per sequence; the first failure is raised as ``ProgramExecutionError``. ``out``: an
        optional C-contiguous float32 [B,N,N] buffer that receives the result (saves the allocation
        when evaluating many programs block by block).
        """
        return self._backend.evaluate(self._payload, list(sequences), causal, features, timeout, pos_tags, out)

    def labels(self, sequences: list[Sequence], timeout: float = DEFAULT_TIMEOUT) -> list[str] | None:
        """The label it returns with each sequence's matrix (EAPS programs, run in the sandbox); None: none."""
        return self._backend.labels(self._payload, list(sequences), timeout)

    def evaluate_arrays(self, ids: np.ndarray, lengths: np.ndarray,
                        features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
                        pos_tags: Iterable[str] | None = None, normalize: bool = True,
                        out: np.ndarray | None = None) -> np.ndarray:
        """DSL only: evaluate on padded arrays directly (ids [B,N], lengths [B], feature arrays [B,N])."""
        return self._backend.evaluate_arrays(self._payload, ids, lengths, features, causal, pos_tags, normalize, out)

    # ---------------------------------------------------------------- identity

    def __eq__(self, other: object) -> bool:
        return other is self or isinstance(other, Program) and other.canonical == self.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __repr__(self) -> str:
        return f"Program({self._backend.describe(self.text, self.hash)})"

    def __str__(self) -> str:
        return self.text
