"""Reading a reply: one JSON object ``{"hypothesis", "kind", "program"}``, tolerant of code fences and chatter,
with sizes capped before anything is parsed."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args
from .....core import HeadsurgeonError

#: the program kinds a reply may name: the prompt's own vocabulary (text.py REPLY_FORMAT), each the name of a
#: program backend whose record ``{kind: text}`` Program.from_json reads (headsurgeon/synth/backends/)
ReplyKind = Literal["dsl", "python"]
REPLY_KINDS: tuple[ReplyKind, ...] = get_args(ReplyKind)


#: longest reply read; longer replies are refused unread (parsing cost, echo back to the endpoint)
MAX_REPLY_CHARS = 200_000
#: longest program text accepted from a reply
MAX_PROGRAM_CHARS = 50_000
#: longest hypothesis kept
MAX_HYPOTHESIS_CHARS = 2_000
#: JSON objects tried per reply (each ``{`` is a candidate start)
_MAX_JSON_STARTS = 64



def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (marked when cut)."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."



class MalformedReply(HeadsurgeonError, ValueError):
    """A reply is not a JSON object with the required fields; the message says what is wrong."""


@dataclass
class ParsedReply:
    """A reply's fields: ``kind`` is "dsl" or "python"; ``program`` is text (or DSL JSON for "dsl")."""

    hypothesis: str
    kind: ReplyKind
    program: Any

    @property
    def text(self) -> str:
        """The program as text (DSL JSON is dumped)."""
        return self.program if isinstance(self.program, str) else _dumps(self.program)


def _dumps(obj: Any) -> str:
    """``json.dumps(obj)``, or a placeholder for JSON too deeply nested to write back."""
    try:
        return json.dumps(obj)
    except (RecursionError, ValueError, TypeError):
        return "(JSON too deeply nested to show)"


_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*\n(.*?)```", re.S)


def _json_objects(text: str) -> Iterable[Any]:
    """JSON objects embedded in ``text``: fenced blocks first, then the first ``_MAX_JSON_STARTS`` ``{``.

    Too deeply nested JSON is skipped like malformed JSON (it would raise RecursionError).
    """
    dec = json.JSONDecoder()
    for block in _FENCE_RE.findall(text)[:_MAX_JSON_STARTS]:
        try:
            yield json.loads(block)
        except (json.JSONDecodeError, RecursionError):
            pass
    for k, m in enumerate(re.finditer(r"\{", text)):
        if k >= _MAX_JSON_STARTS:
            return
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except (json.JSONDecodeError, RecursionError):
            continue
        yield obj


def parse_reply(text: str | None) -> ParsedReply:
    """Read ``{"hypothesis", "program"[, "kind"]}`` from a reply; raise MalformedReply saying why not.

    Without ``kind`` (or with an unknown one) the kind is detected: source containing ``def `` is Python,
    anything else DSL. A DSL program may also be given as its JSON form (an object).
    """
    if text is None or not str(text).strip():
        raise MalformedReply("the reply was empty")
    text = str(text)
    if len(text) > MAX_REPLY_CHARS:
        raise MalformedReply(f"the reply is {len(text)} characters long; at most {MAX_REPLY_CHARS} are read: "
                             "answer with one short JSON object")
    found = None
    for obj in _json_objects(text):
        if isinstance(obj, dict) and "program" in obj:
            found = obj
            break
        if found is None and isinstance(obj, dict):
            found = obj
    if found is None:
        raise MalformedReply("no JSON object found in the reply")
    if "program" not in found:
        keys = clip(", ".join(map(str, list(found)[:20])) or "none", 120)
        raise MalformedReply(f"the JSON object has no \"program\" field (it has: {keys})")
    program = found["program"]
    hypothesis = found.get("hypothesis", "")
    if not isinstance(hypothesis, str):
        hypothesis = _dumps(hypothesis)
    if "hypothesis" not in found:
        raise MalformedReply("the JSON object has no \"hypothesis\" field")
    if isinstance(program, str):
        if not program.strip():
            raise MalformedReply("the \"program\" field is empty")
        if len(program) > MAX_PROGRAM_CHARS:
            raise MalformedReply(f"the program is {len(program)} characters long; at most {MAX_PROGRAM_CHARS} "
                                 "are allowed: write a shorter program")
    elif not isinstance(program, (dict, list)):
        raise MalformedReply(f"\"program\" must be a string (DSL text or Python source), got {type(program).__name__}")
    named = found.get("kind")
    named = named.strip().lower() if isinstance(named, str) else ""
    kind: ReplyKind = "python" if isinstance(program, str) and re.search(r"(^|\n)\s*def\s", program) else "dsl"
    kind = next((k for k in REPLY_KINDS if k == named), kind)
    if kind == "python" and not isinstance(program, str):
        raise MalformedReply("a Python program must be source text in the \"program\" string")
    return ParsedReply(hypothesis=clip(hypothesis.strip(), MAX_HYPOTHESIS_CHARS), kind=kind, program=program)
