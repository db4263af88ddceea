"""How a failed program is described to the model: its kind, a known exception type name and a line number,
plus at most ``MAX_FEEDBACK_CHARS`` characters of a message the library itself wrote; never program output."""
from __future__ import annotations

import builtins
import functools
import re
from typing import Any

import numpy as np

from ....errors import ProgramExecutionError, ProgramValidationError
from .replies import MalformedReply, clip


#: longest failure message shown to the model (library-written text only)
MAX_FEEDBACK_CHARS = 300


_TYPE_NAME_RE = re.compile(r"[A-Za-z_]{1,40}")
_RAISED_RE = re.compile(r"^sequence \d+: (?:the program raised ([A-Za-z_][A-Za-z0-9_]*)|(RecursionError):)")
_AT_LINE_RE = re.compile(r"\((?:at|interrupted at) line (\d{1,6})\b")
_SIGNAL_RE = re.compile(r"^sequence \d+: the program's process died with (SIG[A-Z0-9]{1,10})\b")
_LOADING = "while loading the program (top-level code)"

_EXECUTION_SUMMARY = {
    "crash": "the program raised {exc}",
    "timeout": "the program exceeded its time limit",
    "memory": "the program ran out of memory (MemoryError); use smaller arrays",
    "bad_output": "the program's return value is not a valid n x n array of finite scores",
    "sandbox": "the sandbox could not run the program",
}

_REASONS_SHOWN = frozenset({"crash", "timeout", "memory", "bad_output", "sandbox", "invalid", "error"})

#: fixed descriptions of bad outputs, chosen by a phrase of the library's own message
_BAD_OUTPUT = (
    ("returned None", "the program returned None; it must return an n x n array of scores"),
    ("rows; expected", "the program returned the wrong number of rows; it must return an n x n array"),
    ("shape", "the program returned an array of the wrong shape; it must be n x n for each sequence"),
    ("not a rectangular", "the program's return value is not a rectangular numeric array"),
    ("dtype", "the program's return value is not made of real numbers"),
    ("cells; the sandbox limit", "the program's return value is larger than the sandbox allows"),
    ("finite", "the program returned NaN or inf scores; scores must be finite"),
    ("NaN/inf", "the program returned NaN or inf scores; scores must be finite"),
)


@functools.lru_cache(maxsize=1)
def _known_exception_names() -> frozenset[str]:
    """Names of the exception types a program can raise: Python's builtins and numpy's own."""
    names = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    for mod in (getattr(np, "exceptions", None), np.linalg):
        for n, v in vars(mod or object).items():
            if isinstance(v, type) and issubclass(v, BaseException):
                names.add(n)
    return frozenset(names | {"error", "PatternError", "AxisError", "LinAlgError"})


def reason_word(reason: Any) -> str:
    """A failure reason as shown: one of the library's own reason words, else "failed"."""
    return reason if reason in _REASONS_SHOWN else "failed"


def safe_type_name(name: Any, known_only: bool = False) -> str | None:
    """An exception type name fit for a prompt: a known name, else (unless ``known_only``) [A-Za-z_]{1,40}."""
    if not isinstance(name, str):
        return None
    if name in _known_exception_names():
        return name
    return name if not known_only and _TYPE_NAME_RE.fullmatch(name) else None


def _line_number(error: ProgramExecutionError, message: str, program_text: str | None) -> int | None:
    """The program line of a failure, from a structured field or the library's ``(at line N`` suffix."""
    value = getattr(error, "lineno", None)
    if not isinstance(value, int):
        found = _AT_LINE_RE.findall(message)
        value = int(found[-1]) if found else None
    if value is None or program_text is None:
        return None
    return value if 1 <= value <= program_text.count("\n") + 1 else None


def _raised_type(error: ProgramExecutionError, message: str) -> str | None:
    """The type name of the exception a program raised: structured field or the library's prefix, if known."""
    name = getattr(error, "exc_type", None)
    if name is None:
        m = _RAISED_RE.match(message)
        name = (m.group(1) or m.group(2)) if m else None
    return safe_type_name(name, known_only=True)


def _execution_feedback(error: ProgramExecutionError, program_text: str | None) -> str:
    """A failed run described by reason, known type name and line only: the program's own text never shows."""
    message = str(error.args[0]) if error.args else ""
    reason = error.reason if error.reason in _EXECUTION_SUMMARY else "crash"
    if reason == "bad_output":
        return next((text for phrase, text in _BAD_OUTPUT if phrase in message), _EXECUTION_SUMMARY[reason])
    exc = _raised_type(error, message)
    signal_match = _SIGNAL_RE.match(message) if reason == "crash" and exc is None else None
    if signal_match:
        text = f"the program's process was killed by {signal_match.group(1)}"
    elif reason == "crash":
        text = _EXECUTION_SUMMARY["crash"].format(exc=exc or "an exception")
    else:
        text = _EXECUTION_SUMMARY[reason]
    line = _line_number(error, message, program_text)
    if line is not None:
        text += f" (at line {line})"
    if message.endswith(_LOADING):
        text += " while loading the program (top-level code)"
    if exc == "RecursionError":
        text += "; avoid deep recursion (use loops)"
    return text


def failure_feedback(error: BaseException, program_text: str | None = None) -> str:
    """What the model is told about a failure: safe against programs that try to leak data through errors.

    Library-written messages about the reply itself (malformed, rejected by validation) are kept, cut to
    ``MAX_FEEDBACK_CHARS``. A failed run (``ProgramExecutionError``) is described by its reason, a known
    exception type name and a line number within ``program_text``; the program's exception text, traceback,
    output and computed values never show. Any other error shows its (sanitized) type name only.
    """
    if isinstance(error, ProgramExecutionError):
        text = _execution_feedback(error, program_text)
    elif isinstance(error, (MalformedReply, ProgramValidationError)):
        text = str(error) or type(error).__name__
    elif isinstance(error, RecursionError):
        text = "RecursionError: the program is nested too deeply"
    elif type(error).__name__ == "FeatureDependencyError":
        text = "a linguistic feature view the program uses is not installed here; use the basic views"
    else:
        text = f"{safe_type_name(type(error).__name__) or 'an error'} (details withheld)"
    return clip(text, MAX_FEEDBACK_CHARS)
