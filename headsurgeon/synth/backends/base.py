"""The program-backend seam: what one kind of program (DSL, sandboxed Python, ...) must provide.

``Program`` holds a backend and a payload (a DSL tree, a Python source, ...) and forwards every
kind-specific question to the backend: how to build, serialize and file it, whether loading it needs
trust, and how to evaluate it. A registry maps kinds to backends so that a new kind plugs in with
``register_backend`` without touching ``Program``, program sets or checkpoints (docs/architecture.md).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from .. import dsl
from ..errors import ProgramValidationError, excerpt
from ..sequence import Sequence
from ...core import InputError
from ...core.vocabulary import TokenVocabulary

__all__ = ["ProgramBackend", "register_backend", "unregister_backend", "get_backend", "backend_kinds", "backend_for_document",
           "json_document", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 10.0

_REGISTRY: dict[str, "ProgramBackend"] = {}


def json_document(obj: Any) -> Any:
    """Parse a JSON string or bytes with the DSL's bounded loader (objects pass through)."""
    if isinstance(obj, bytearray):
        obj = bytes(obj)
    return dsl.json_loads(obj) if isinstance(obj, (str, bytes)) else obj


class ProgramBackend(ABC):
    """One kind of program: its names, its serialized forms and its evaluation; stateless, one instance per kind."""

    kind: ClassVar[str]  # "dsl", "python": the manifest's and programs.json's ``kind`` field
    label: ClassVar[str]  # how messages name the kind: "DSL", "Python"
    suffix: ClassVar[str]  # the file suffix of its program files in checkpoints: ".json", ".py"
    needs_trust: ClassVar[bool]  # True when loading one from someone else must be trusted (SECURITY.md)
    #: True when it runs in sandbox worker processes (headsurgeon/synth/sandbox/): each program is scored alone so a failing
    #: one drops only itself, outside the numba lock. False: this process's kernels evaluate it, cheaply, into a
    #: caller's buffer and from precomputed feature arrays (headsurgeon/synth/tensors.py).
    sandboxed: ClassVar[bool]
    #: True when a DSL tree stands behind it: ``node``, ``evaluate_arrays``, rounding (headsurgeon/synth/select.py).
    has_tree: ClassVar[bool] = False
    #: True when its text is short enough to show inline (checkpoint manifests, model cards); False: its file is
    #: what a reader opens (Python source).
    readable_text: ClassVar[bool] = False

    # ------------------------------------------------------------ building and serializing
    @abstractmethod
    def from_json(self, obj: Any) -> Any:
        """The payload of a JSON document (or its string) of this kind; anything else is a ProgramValidationError."""

    @abstractmethod
    def claims(self, obj: Any) -> bool:
        """Whether an untyped JSON record (programs.json, journals) is of this kind."""

    @abstractmethod
    def to_json(self, payload: Any) -> Any:
        """The JSON-serializable record of a payload (what ``from_json`` reads back)."""

    @abstractmethod
    def text(self, payload: Any) -> str:
        """The human-readable form (DSL text, Python source)."""

    @abstractmethod
    def canonical(self, payload: Any) -> str:
        """The canonical form, prefixed by the kind; programs hash and compare by it."""

    @abstractmethod
    def to_file(self, payload: Any) -> bytes:
        """The bytes of its program file in a checkpoint (``programs/<id><suffix>``)."""

    @abstractmethod
    def from_file(self, data: bytes | str) -> Any:
        """The payload of a program file's contents (never anything but this kind; nothing is executed)."""

    # ------------------------------------------------------------ reading it
    @abstractmethod
    def size(self, payload: Any) -> int:
        """Description length: syntax nodes plus scalar literals (every number, list item and table cell)."""

    def render(self, payload: Any, vocab: TokenVocabulary | None = None) -> str:
        """The text a person reads; with a ``Vocabulary``, token ids appear as token strings."""
        return self.text(payload)

    def gloss(self, payload: Any, vocab: TokenVocabulary | None = None) -> str:
        """A deterministic English sentence saying what the program attends to ("" when none can be built)."""
        return ""

    # ------------------------------------------------------------ evaluation
    def features_needed(self, payload: Any) -> frozenset[str]:
        """Feature array names the program reads from ``batch_feature_arrays`` (none by default)."""
        return frozenset()

    def needs_text(self, payload: Any) -> bool:
        """Whether evaluation needs the decoded text of the sequences, not only their ids."""
        return True

    def sparse_rows(self, payload: Any) -> bool:
        """Whether it is evaluated as compressed rows (``SparseRows``, docs/architecture.md "Program tensors")."""
        return False

    def labels(self, payload: Any, sequences: list[Sequence], timeout: float) -> list[str] | None:
        """The label it returns with each sequence's matrix (EAPS's ``(label, matrix)``); None: this kind has none."""
        return None

    @abstractmethod
    def evaluate_scores(self, payload: Any, sequences: list[Sequence], causal: bool,
                        features: Mapping[str, np.ndarray] | None, timeout: float, pos_tags: Iterable[str] | None,
                        out: np.ndarray | None) -> np.ndarray:
        """Raw scores [B,N,N] before normalization, zero-padded."""

    @abstractmethod
    def evaluate(self, payload: Any, sequences: list[Sequence], causal: bool,
                 features: Mapping[str, np.ndarray] | None, timeout: float, pos_tags: Iterable[str] | None,
                 out: np.ndarray | None) -> np.ndarray:
        """Normalized attention float32 [B,N,N] (``headsurgeon.kernels.normalize.normalize_scores``)."""

    def evaluate_arrays(self, payload: Any, ids: np.ndarray, lengths: np.ndarray,
                        features: Mapping[str, np.ndarray] | None, causal: bool, pos_tags: Iterable[str] | None, normalize: bool,
                        out: np.ndarray | None) -> np.ndarray:
        """Evaluate on padded arrays directly; only kinds that read ids alone provide it."""
        raise TypeError(f"evaluate_arrays needs a DSL program; {self.label} programs read Sequences")

    def node(self, payload: Any) -> Any:
        """The DSL tree (DSL programs only)."""
        raise TypeError(f"a {self.label} program has no DSL tree")

    def describe(self, text: str, program_hash: str) -> str:
        """The inside of ``Program.__repr__``."""
        first = text.strip().splitlines()[0] if text.strip() else ""
        return f"{self.kind}: {first[:60]}{'...' if len(first) > 60 else ''}, hash={program_hash[:12]}"


def register_backend(backend: ProgramBackend, *, replace: bool = False) -> ProgramBackend:
    """Make ``backend`` the one for its kind; a kind already taken needs ``replace=True``."""
    if not isinstance(backend, ProgramBackend):
        raise TypeError(f"register_backend needs a ProgramBackend instance, got {type(backend).__name__}")
    kind = backend.kind
    if not isinstance(kind, str) or not kind.isidentifier():
        raise InputError(f"a backend's kind must be a short identifier, got {kind!r}")
    if kind in _REGISTRY and not replace and _REGISTRY[kind] is not backend:
        raise InputError(f"a program backend for kind {kind!r} is already registered; pass replace=True")
    _REGISTRY[kind] = backend
    return backend


def unregister_backend(kind: str) -> None:
    """Remove the backend of ``kind`` (a no-op when none is registered)."""
    _REGISTRY.pop(kind, None)


def get_backend(kind: Any) -> ProgramBackend:
    """The backend registered for ``kind``, or a ProgramValidationError listing the known kinds."""
    backend = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if backend is None:
        known = " or ".join(repr(k) for k in _REGISTRY)
        raise ProgramValidationError(f"unknown program kind {excerpt(kind)}: expected {known}")
    return backend


def backend_kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_REGISTRY)


def backend_for_document(obj: Any) -> ProgramBackend:
    """The backend of an untyped JSON record: the newest registered backend that claims it."""
    for backend in reversed(list(_REGISTRY.values())):
        if backend.claims(obj):
            return backend
    raise ProgramValidationError(f"no program kind reads this document: {excerpt(obj)}")
