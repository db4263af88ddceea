"""Error types shared by programs, the sandbox and the searchers."""
from __future__ import annotations

import reprlib
from ..core import HeadsurgeonError


class ProgramError(HeadsurgeonError):
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
    """A short ``repr(value)`` (about ``limit`` characters), so error messages never echo a huge hostile input."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit
    short.maxlist = short.maxtuple = short.maxset = short.maxdict = 20
    short.maxlevel = 3
    try:
        text = short.repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        return f"<{type(value).__name__} object>"
    if len(text) > limit:
        text = text[:limit] + "..."
    if isinstance(value, (str, bytes, list, tuple, dict, set)) and len(value) > 20:
        text += f" ({len(value)} {'characters' if isinstance(value, (str, bytes)) else 'items'})"
    return text
