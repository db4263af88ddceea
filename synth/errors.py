"""Error types shared by programs, the sandbox and the searchers."""
from __future__ import annotations


class ProgramError(Exception):
    """Base class: a program could not be parsed, validated or run."""


class ProgramValidationError(ProgramError):
    """A program is malformed or uses something it may not (unknown primitive, forbidden name, bad arity)."""


class ProgramExecutionError(ProgramError):
    """A program failed while running; ``reason`` is one of: crash, timeout, memory, bad_output, sandbox."""

    def __init__(self, message: str, reason: str = "crash", detail: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail



def excerpt(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to about ``limit`` characters, so error messages never echo a huge hostile input."""
    try:
        text = repr(value[: limit + 1] if isinstance(value, (str, bytes)) else value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        return f"<{type(value).__name__} object>"
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else type(value).__name__
    return f"{text[:limit]}... ({size})"
