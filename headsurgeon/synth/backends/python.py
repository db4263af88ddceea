"""The sandboxed-Python program backend: source text defining one function over the Sequence API.

A Python program is AST-validated when built and runs only in the sandbox pool's job processes
(SECURITY.md), so loading one from someone else needs trust. Its payload is the canonical source
(LF line endings, no trailing blanks, one final newline); its file is that source, ``.py``.
"""
from __future__ import annotations

import ast

from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

import numpy as np

from headsurgeon.kernels.normalize import normalize_scores

from ..errors import ProgramExecutionError, ProgramValidationError
from ..sequence import Sequence
from .base import ProgramBackend, json_document

__all__ = ["PythonBackend", "normalize_source", "python_field"]


def sandbox_module() -> ModuleType:
    """Import the sandbox module, or explain that Python programs need it."""
    # Lazy on purpose: the sandbox needs POSIX (fcntl, resource, seccomp); DSL programs work without it.
    try:
        from .. import sandbox
    except ImportError as e:
        raise ImportError(
            "Python programs need headsurgeon.synth.sandbox (validate_source / get_pool), which could not "
            f"be imported ({e}); DSL programs work without it"
        ) from e
    return sandbox


def normalize_source(source: str) -> str:
    """Canonical Python source: LF line endings, no trailing whitespace, one final newline."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    text = "\n".join(line.rstrip() for line in lines).strip("\n")
    return text + "\n"


def python_field(obj: Any) -> str | None:
    """The source of a ``{"python": source}`` record, or None when ``obj`` is not one."""
    if not (isinstance(obj, dict) and len(obj) == 1 and "python" in obj):
        return None
    if not isinstance(obj["python"], str):
        raise ProgramValidationError('{"python": ...} must hold the source as a string')
    return obj["python"]


class PythonBackend(ProgramBackend):
    """Python programs: payload = canonical source; JSON = ``{"python": source}``; suffix ``.py``; needs trust."""

    kind = "python"
    label = "Python"
    suffix = ".py"
    needs_trust = True
    sandboxed = True

    def from_source(self, source: Any) -> str:
        """The canonical source, validated by the sandbox's AST allowlist (raises ProgramValidationError)."""
        if not isinstance(source, str) or not source.strip():
            raise ProgramValidationError("a Python program must be non-empty source text")
        source = normalize_source(source)
        sandbox_module().validate_source(source)
        return source

    def from_json(self, obj: Any) -> str:
        """The source of a ``{"python": source}`` record; a DSL document is refused."""
        source = python_field(json_document(obj))
        if source is None:
            raise ProgramValidationError('expected a Python program {"python": source}, got a DSL document')
        return self.from_source(source)

    def claims(self, obj: Any) -> bool:
        """A record of exactly one ``"python"`` field."""
        return python_field(obj) is not None

    def to_json(self, payload: str) -> Any:
        """``{"python": source}``."""
        return {"python": payload}

    def size(self, payload: str) -> int:
        """Syntax nodes of the source, plus one per constant."""
        tree = ast.parse(payload)
        return sum(1 + isinstance(node, ast.Constant) for node in ast.walk(tree))

    def text(self, payload: str) -> str:
        """The canonical source."""
        return payload

    def canonical(self, payload: str) -> str:
        """``python:`` + the canonical source."""
        return "python:" + payload

    def to_file(self, payload: str) -> bytes:
        """The source as UTF-8."""
        return payload.encode("utf-8")

    def from_file(self, data: bytes | str) -> str:
        """The validated source of a ``.py`` program file (AST validation only: nothing is executed)."""
        return self.from_source(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)

    def evaluate_scores(self, payload: str, sequences: list[Sequence], causal: bool,
                        features: Mapping[str, np.ndarray] | None, timeout: float, pos_tags: Iterable[str] | None,
                        out: np.ndarray | None) -> np.ndarray:
        """float64 raw scores from the sandbox pool (copied into ``out`` when given)."""
        scores = self._scores(payload, sequences, timeout)
        if out is not None:
            out[...] = scores
            return out
        return scores

    def evaluate(self, payload: str, sequences: list[Sequence], causal: bool,
                 features: Mapping[str, np.ndarray] | None, timeout: float, pos_tags: Iterable[str] | None,
                 out: np.ndarray | None) -> np.ndarray:
        """The sandbox's scores, normalized into ``out`` (or a new float32 array)."""
        lengths = np.array([s.n for s in sequences], dtype=np.int64)
        return normalize_scores(self._scores(payload, sequences, timeout), lengths, causal, out=out)

    def labels(self, payload: str, sequences: list[Sequence], timeout: float) -> list[str] | None:
        """Each sequence's label from the sandbox (empty where the program returned a bare matrix)."""
        return sandbox_module().get_pool().run_labeled(payload, sequences, timeout)[1]

    def node(self, payload: str) -> Any:
        """Python programs have no tree."""
        raise TypeError("a Python program has no DSL tree")

    def evaluate_arrays(self, payload: str, ids: np.ndarray, lengths: np.ndarray,
                        features: Mapping[str, np.ndarray] | None, causal: bool, pos_tags: Iterable[str] | None, normalize: bool,
                        out: np.ndarray | None) -> np.ndarray:
        """Python programs read Sequences, never bare arrays."""
        raise TypeError("evaluate_arrays needs a DSL program; Python programs read Sequences")

    @staticmethod
    def _scores(source: str, sequences: list[Sequence], timeout: float) -> np.ndarray:
        """Run the program in the sandbox pool; the first failing sequence raises ProgramExecutionError."""
        results = sandbox_module().get_pool().run(source, sequences, timeout)
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
