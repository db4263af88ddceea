"""The one trust gate: programs that arrive from someone else run only when the user trusts them (SECURITY.md).

A program "from someone else" is one read from a file or record (programs.json, a checkpoint, the explain
journal); programs built in your own process (``Program.python(...)``, a searcher's candidates) are your code.
Whether a kind needs trust is its backend's ``needs_trust`` (headsurgeon/synth/backends/): DSL never does, Python does.
Every path that runs such programs calls :func:`require_trusted` on **every** program a head holds (its
replacement, its explanation and each frontier point), so no slot is left unchecked.

``trust`` is ``True`` (trust everything), ``False``/``None`` (trust nothing), one program hash, or a collection
of program hashes (trust exactly the programs you have read).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Union

from .errors import ProgramError

__all__ = ["TrustPrograms", "UntrustedProgramError", "trust_value", "trusts", "require_trusted", "API_FLAG", "CLI_FLAG",
           "LM_EVAL_FLAG"]

#: how each face lifts the refusal, for the error message
API_FLAG = "trust_programs=True (or trust_programs={hash, ...})"
CLI_FLAG = "--trust-programs"
LM_EVAL_FLAG = ("trust_programs=True (lm-eval: trust_programs=true, or trust_programs=HASH1+HASH2, in "
                "--model_args)")

#: what ``trust_programs`` takes on every face: True, False/None, "true"/"false", a hash ("H1+H2"), or hashes
TrustPrograms = Union[bool, str, Collection[str], None]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off", "none")


class UntrustedProgramError(ProgramError):
    """Programs from someone else (a file, a checkpoint) hold code (Python) that the user has not trusted."""


def trust_value(value: Any) -> bool | frozenset[str]:
    """``trust`` in the gate's terms from any face: a bool, "true"/"false" (lm-eval's model args), a hash, or hashes."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        return frozenset(h for h in text.replace("+", " ").split() if h)  # "HASH" or "HASH1+HASH2"
    if isinstance(value, Collection):
        return frozenset(str(h).strip().lower() for h in value)
    raise TypeError(f"trust_programs must be True, False or a set of program hashes, got {type(value).__name__}")


def trusts(trust: TrustPrograms, *hashes: str) -> bool:
    """Whether ``trust`` covers a program known by any of ``hashes`` (its program hash, or its file's sha256)."""
    value = trust_value(trust)
    if isinstance(value, bool):
        return value
    return any(h.lower() in value for h in hashes if isinstance(h, str))


def require_trusted(slots: Iterable[tuple[str, str, Any]], trust: TrustPrograms, *, origin: str,
                    flag: str = API_FLAG, fix: str | None = None) -> None:
    """Refuse unless ``trust`` covers every program that needs it; ``slots`` are (head, slot, Program) triples.

    The error names each untrusted program's head, slot (replacement, explanation, frontier point) and hash,
    where they came from (``origin``) and how to lift the refusal (``flag``, or the whole ``fix``).
    """
    value = trust_value(trust)
    if value is True:
        return
    refused = [(head, slot, program) for head, slot, program in slots
               if program.needs_trust and not trusts(value, program.hash)]
    if not refused:
        return
    shown = "; ".join(f"{head} {slot} ({program.kind}, hash {program.hash})" for head, slot, program in refused[:5])
    more = f"; and {len(refused) - 5} more" if len(refused) > 5 else ""
    kinds = sorted({program.backend.label for _, _, program in refused})
    raise UntrustedProgramError(
        f"{origin} holds {' and '.join(kinds)} code someone else wrote: {shown}{more}. Such programs run (in the "
        f"sandbox) only when you trust them: {fix or f'read them, then pass {flag}'}")
