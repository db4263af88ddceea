"""``Program``: the one type every part of headsurgeon uses for "what replaces a head".

Two kinds (DESIGN section 2):

* ``"dsl"``: an expression over kernel primitives (``headsurgeon.synth.dsl``); safe by construction,
  evaluated in-process by numba kernels;
* ``"python"``: source defining one function over the Sequence API; validated by
  ``headsurgeon.synth.sandbox.validate_source`` when built and executed only in the sandbox pool.

Either way ``evaluate`` returns normalized attention float32 ``[B, N, N]`` (padded, zero beyond each
length) produced by ``headsurgeon.kernels.normalize.normalize_scores``. Programs compare and hash by
their canonical form (``.hash`` = sha256 hex of it), which is what caches and checkpoints key on.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from headsurgeon.kernels.normalize import normalize_scores

from . import dsl
from .errors import ProgramExecutionError, ProgramValidationError, excerpt
from .sequence import Sequence, pad_ids

__all__ = ["Program"]

DEFAULT_TIMEOUT = 10.0


def _sandbox() -> Any:
    """Import the sandbox module, or explain that Python programs need it."""
    try:
        from . import sandbox
    except ImportError as e:
        raise ImportError(
            "Python programs need headsurgeon.synth.sandbox (validate_source / get_pool), which could not "
            f"be imported ({e}); DSL programs work without it"
        ) from e
    return sandbox


def _json_document(obj: Any) -> Any:
    """Parse a JSON string or bytes (objects pass through), with a ProgramValidationError for bad JSON."""
    return dsl.json_loads(obj) if isinstance(obj, (str, bytes, bytearray)) else obj


def _python_field(obj: Any) -> str | None:
    """The source of a ``{"python": source}`` record, or None when ``obj`` is not one."""
    if not (isinstance(obj, dict) and len(obj) == 1 and "python" in obj):
        return None
    if not isinstance(obj["python"], str):
        raise ProgramValidationError('{"python": ...} must hold the source as a string')
    return obj["python"]


def _normalize_source(source: str) -> str:
    """Canonical Python source: LF line endings, no trailing whitespace, one final newline."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    text = "\n".join(line.rstrip() for line in lines).strip("\n")
    return text + "\n"


class Program:
    """A head-replacing program (DSL or sandboxed Python); immutable, hashable by canonical form."""

    __slots__ = ("kind", "text", "hash", "_node", "_canonical")

    def __init__(self, kind: str, text: str, node: dsl.Node | None, canonical: str) -> None:
        """Internal: use ``Program.parse``, ``from_dsl_json``, ``from_json``, ``python`` or ``from_node``."""
        self.kind = kind
        self.text = text
        self._node = node
        self._canonical = canonical
        self.hash = hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_node(cls, node: dsl.Node) -> "Program":
        """Wrap an already-built (valid) DSL tree."""
        return cls("dsl", dsl.to_text(node), node, "dsl:" + dsl.canonical_json(node))

    @classmethod
    def parse(cls, text: str) -> "Program":
        """A DSL program from its text form, e.g. ``Program.parse("0.7*prev(1) + 0.3*first()")``."""
        return cls.from_node(dsl.parse(text))

    @classmethod
    def python(cls, source: str) -> "Program":
        """A Python program, validated by the sandbox's AST allowlist (raises ProgramValidationError)."""
        if not isinstance(source, str) or not source.strip():
            raise ProgramValidationError("a Python program must be non-empty source text")
        source = _normalize_source(source)
        _sandbox().validate_source(source)
        return cls("python", source, None, "python:" + source)

    @classmethod
    def from_json(cls, obj: Any, *, kind: str | None = None) -> "Program":
        """From ``to_json()`` output, the record form (DSL JSON, ``{"dsl": text}`` or ``{"python": src}``).

        ``kind="dsl"`` or ``kind="python"`` pins what the document must hold (a mismatch is a
        ProgramValidationError); ``kind=None`` accepts either, for programs.json and agent journals.
        A Python program is only AST-validated here, never executed.
        """
        if kind is None:
            obj = _json_document(obj)
            source = _python_field(obj)
            return cls.from_dsl_json(obj) if source is None else cls.python(source)
        if kind == "dsl":
            return cls.from_dsl_json(obj)
        if kind == "python":
            source = _python_field(_json_document(obj))
            if source is None:
                raise ProgramValidationError('expected a Python program {"python": source}, got a DSL document')
            return cls.python(source)
        raise ProgramValidationError(f"unknown program kind {excerpt(kind)}: expected 'dsl' or 'python'")

    @classmethod
    def from_dsl_json(cls, obj: Any) -> "Program":
        """A DSL program from DSL JSON (tree or ``{"dsl": text}``); never returns Python, whatever the input holds."""
        obj = _json_document(obj)
        if isinstance(obj, dict) and "python" in obj:
            raise ProgramValidationError(
                'a DSL program document holds {"python": ...}: DSL JSON can never carry Python source; '
                "load Python programs with Program.python (or as a trusted Python program file)"
            )
        if isinstance(obj, dict) and len(obj) == 1 and "dsl" in obj:
            value = obj["dsl"]
            return cls.parse(value) if isinstance(value, str) else cls.from_node(dsl.from_json(value))
        return cls.from_node(dsl.from_json(obj))

    # ---------------------------------------------------------------- properties

    @property
    def node(self) -> dsl.Node:
        """The DSL tree (DSL programs only)."""
        if self._node is None:
            raise TypeError("a Python program has no DSL tree")
        return self._node

    @property
    def features_needed(self) -> frozenset[str]:
        """Feature array names the program reads (DSL); Python programs read views themselves: empty."""
        return dsl.features_needed(self._node) if self._node is not None else frozenset()

    @property
    def canonical(self) -> str:
        """The canonical form the hash is computed from."""
        return self._canonical

    def to_json(self) -> Any:
        """JSON-serializable form: the DSL JSON, or ``{"python": source}``."""
        if self._node is None:
            return {"python": self.text}
        return dsl.to_json(self._node)

    # ---------------------------------------------------------------- evaluation

    def _features(self, sequences: list[Sequence], features: Mapping[str, np.ndarray] | None) -> dict:
        need = self.features_needed
        have = dict(features or {})
        missing = sorted(need - set(have))
        if missing:
            from .features import batch_feature_arrays

            have.update(batch_feature_arrays(sequences, missing))
        return have

    def evaluate_scores(self, sequences: list[Sequence], causal: bool = True,
                        features: Mapping[str, np.ndarray] | None = None,
                        timeout: float = DEFAULT_TIMEOUT, pos_tags: Any = None,
                        out: np.ndarray | None = None) -> np.ndarray:
        """Raw scores [B,N,N] before normalization, padded with zeros (float32 for DSL, float64 for Python).

        ``out`` (DSL only): a float32 [B,N,N] buffer to write into instead of allocating.
        """
        sequences = list(sequences)
        if self._node is not None:
            ids, lengths = pad_ids(sequences)
            feats = self._features(sequences, features)
            return dsl.evaluate_scores(self._node, ids, lengths, feats, causal, pos_tags, out)
        scores = self._python_scores(sequences, timeout)
        if out is not None:
            out[...] = scores
            return out
        return scores

    def evaluate(self, sequences: list[Sequence], causal: bool = True,
                 features: Mapping[str, np.ndarray] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, pos_tags: Any = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Normalized attention float32 [B,N,N] for a batch of sequences (zeros beyond each length).

        ``features`` may supply precomputed ``batch_feature_arrays`` output (padded like the ids);
        missing names are fetched lazily. Python programs run in the sandbox pool with ``timeout``
        seconds per sequence; the first failure is raised as ``ProgramExecutionError``. ``out``: an
        optional C-contiguous float32 [B,N,N] buffer that receives the result (saves the allocation
        when evaluating many programs block by block).
        """
        sequences = list(sequences)
        lengths = np.array([s.n for s in sequences], dtype=np.int64)
        if self._node is not None:
            scores = self.evaluate_scores(sequences, causal, features, timeout, pos_tags, out)
            # our own float32 buffer, zero outside the visible grid: normalize in place
            return normalize_scores(scores, lengths, causal, out=scores, masked=True)
        scores = self._python_scores(sequences, timeout)
        return normalize_scores(scores, lengths, causal, out=out)

    def evaluate_arrays(self, ids: np.ndarray, lengths: np.ndarray,
                        features: Mapping[str, np.ndarray] | None = None, causal: bool = True,
                        pos_tags: Any = None, normalize: bool = True,
                        out: np.ndarray | None = None) -> np.ndarray:
        """DSL only: evaluate on padded arrays directly (ids [B,N], lengths [B], feature arrays [B,N])."""
        if self._node is None:
            raise TypeError("evaluate_arrays needs a DSL program; Python programs read Sequences")
        if normalize:
            return dsl.evaluate(self._node, ids, lengths, features, causal, pos_tags, out)
        return dsl.evaluate_scores(self._node, ids, lengths, features, causal, pos_tags, out)

    def _python_scores(self, sequences: list[Sequence], timeout: float) -> np.ndarray:
        results = _sandbox().get_pool().run(self.text, sequences, timeout)
        if len(results) != len(sequences):
            raise ProgramExecutionError(
                f"sandbox returned {len(results)} results for {len(sequences)} sequences", reason="sandbox"
            )
        width = max((s.n for s in sequences), default=0)
        out = np.zeros((len(sequences), width, width), dtype=np.float64)  # full precision until normalization
        for b, (seq, res) in enumerate(zip(sequences, results)):
            if isinstance(res, BaseException):
                if isinstance(res, ProgramExecutionError):
                    msg = str(res.args[0]) if res.args else str(res)
                    if not msg.startswith("sequence "):  # sandbox errors already name the sequence
                        res.args = (f"sequence {b}: {msg}",) + tuple(res.args[1:])
                    raise res
                raise ProgramExecutionError(f"sequence {b}: {res!r}", reason="crash") from res
            arr = np.asarray(res)
            if arr.shape != (seq.n, seq.n):
                raise ProgramExecutionError(
                    f"sequence {b}: the program returned shape {arr.shape}; expected ({seq.n}, {seq.n})",
                    reason="bad_output",
                )
            if not np.isfinite(arr).all():
                raise ProgramExecutionError(
                    f"sequence {b}: the program returned NaN/inf scores", reason="bad_output"
                )
            out[b, : seq.n, : seq.n] = arr
        return out

    # ---------------------------------------------------------------- identity

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and other._canonical == self._canonical

    def __hash__(self) -> int:
        return hash(self._canonical)

    def __repr__(self) -> str:
        if self.kind == "dsl":
            return f"Program(dsl: {self.text})"
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return f"Program(python: {first[:60]}{'...' if len(first) > 60 else ''}, hash={self.hash[:12]})"

    def __str__(self) -> str:
        return self.text
