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
