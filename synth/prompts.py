"""Prompts for the LLM agent (the LLM searcher, synth/search/llm/): what the model is shown and how its replies are read.

Pure functions, no network: the system prompt (the scoring rule, the DSL and the Sequence API, both
described from their own modules so the prompt cannot drift from the code), the per-head prompt
(example sequences with their strongest ``query -> key (weight)`` pairs), the refinement feedback (the
worst sequences of the best programs, real vs predicted keys per query as token strings, failures), and
the reply parser (a JSON object ``{"hypothesis", "kind", "program"}``, tolerant of code fences and chatter),
and :func:`failure_feedback`, the one way a failure is described to the model.

Nothing computed by a proposed program is ever put into a prompt as text: a failure is described by its
kind, a known exception type name and a line number, plus at most ``MAX_FEEDBACK_CHARS`` characters of a
message the library itself wrote (see :func:`failure_feedback`).

Tokens are shown as ``index:"token"`` (JSON-quoted, so spaces and newlines stay visible).
"""
from __future__ import annotations

import builtins
import functools
import json
import math
import re
from collections.abc import Iterable, Sequence as _Seq
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dsl
from .errors import ProgramExecutionError, ProgramValidationError

__all__ = [
    "MalformedReply", "ParsedReply", "parse_reply", "strongest_pairs", "row_jsd", "top_keys",
    "dsl_reference", "sequence_api_reference", "system_prompt", "head_prompt", "feedback_section",
    "retry_message", "format_token", "format_tokens", "head_name", "REPLY_FORMAT", "failure_feedback",
    "safe_type_name", "MAX_FEEDBACK_CHARS", "MAX_REPLY_CHARS", "MAX_PROGRAM_CHARS", "MAX_HYPOTHESIS_CHARS",
]

#: longest failure message shown to the model (library-written text only)
MAX_FEEDBACK_CHARS = 300
#: longest reply read; longer replies are refused unread (parsing cost, echo back to the endpoint)
MAX_REPLY_CHARS = 200_000
#: longest program text accepted from a reply
MAX_PROGRAM_CHARS = 50_000
#: longest hypothesis kept
MAX_HYPOTHESIS_CHARS = 2_000
#: JSON objects tried per reply (each ``{`` is a candidate start)
_MAX_JSON_STARTS = 64

REPLY_FORMAT = (
    'Reply with ONLY one JSON object, no prose around it:\n'
    '{"hypothesis": "<one or two sentences: what the head attends to>", '
    '"kind": "dsl" or "python", "program": "<DSL text, or Python source defining one function>"}'
)

DSL_EXAMPLES = (
    "prev(1)",
    "0.7*prev(1) + 0.3*first()",
    "fallback(induction(), first())",
    "gate(punct, first(), prev(1))",
    "sharpen(decay(0.8), 2)",
    "recent(sent_end)",
)

PYTHON_EXAMPLE = '''def program(seq):
    n = seq.n
    scores = np.zeros((n, n))
    for i in range(1, n):
        scores[i, i - 1] = 1.0          # previous token
    scores[:, 0] += 0.2                 # a little mass on BOS
    return scores
'''


def head_name(head: tuple[int, int]) -> str:
    """``(layer, head)`` -> ``"L<layer>H<head>"`` (the name prompts, journals and stats use)."""
    return f"L{int(head[0])}H{int(head[1])}"


# ------------------------------------------------------------------------------------------------
# references built from the code itself
# ------------------------------------------------------------------------------------------------

def _plain(text: str) -> str:
    """reST docstring text -> plain prompt text (no table rules, no roles, single backquotes)."""
    text = re.sub(r":(?:data|meth|func|class|attr):`~?([^`]+)`", r"\1", text)
    text = text.replace("``", "`").replace(" (see module docstring)", "")
    return "\n".join(line for line in text.splitlines() if not re.fullmatch(r"[=\s]+", line) or not line.strip()
                     ).strip()


def dsl_reference() -> str:
    """The DSL's primitives, predicates and combinators, rendered from the DSL spec (synth/dsl/catalog.py)."""
    examples = "\n".join(f"  {e}" for e in DSL_EXAMPLES)
    return f"{dsl.reference_text()}\n\nExamples of whole DSL programs:\n{examples}"


def sequence_api_reference() -> str:
    """What a Python program's ``seq`` offers (synth/sandbox.py SequenceView, synth/features.py views)."""
    from . import features, pysafety

    views = list(getattr(features, "BASIC_VIEWS", ())) + list(getattr(features, "SPACY_VIEWS", ()))
    lines = []
    for name in views:
        attr = getattr(features.FeatureView, name, None)
        doc = (getattr(attr, "__doc__", None) or "").strip().splitlines()
        lines.append(f"  seq.features.{name}: {_plain(doc[0].strip()) if doc else ''}")
    pos = ", ".join(getattr(features, "POS_TAGS", ()))
    imports = ", ".join(sorted(pysafety.ALLOWED_IMPORTS))
    return (
        "A Python program is source text defining exactly ONE top-level function of one argument `seq` that "
        "returns an n x n array of non-negative scores (row i = query i, column j = key j). `np` (numpy), "
        f"`math` and `re` are available; only these may be imported: {imports}. No files, network, "
        "processes, dunder names or private attributes; CPU time and memory are limited.\n"
        "`seq` offers:\n"
        "  seq.n: int, the number of tokens\n"
        "  seq.ids: int64 [n], the token ids (read-only)\n"
        "  seq.tokens: list[str], the model's token strings\n"
        "  seq.text: str, the window's text\n"
        "  seq.offsets: int64 [n, 2], (start, end) character offsets of each token into seq.text; "
        "special tokens (BOS) have (0, 0)\n"
        + "\n".join(lines)
        + (f"\n  (POS tags: {pos}; spaCy views are slower: prefer the basic ones)" if pos else "")
        + "\nExample:\n" + PYTHON_EXAMPLE
    )


def system_prompt(causal: bool = True) -> str:
    """The system message: the task, the scoring rule, the DSL, the Python API and the reply format."""
    mask = ("The model is causal: query i only sees keys j <= i." if causal
            else "The model is bidirectional: every query sees every key.")
    return (
        "You reverse-engineer attention heads of a transformer language model. For one head you are shown "
        "example token sequences and the (query -> key, weight) pairs the head attends to most strongly. "
        "Propose a program that reproduces the head's whole attention pattern.\n\n"
        f"{mask} The framework, not your program, applies the mask, clips negative scores to 0 and "
        "normalizes each query row to sum to 1; a row with no mass attends to position 0 (BOS). Programs are "
        "scored on many held-out sequences by the Jensen-Shannon distance per query row (lower is better) "
        "and the soft IoU of the whole pattern (higher is better). Many heads put much of their attention on "
        "position 0 (BOS) when nothing else matches; model that too.\n\n"
        "Two kinds of program:\n\n"
        "1. DSL (preferred: fast and exact). " + dsl_reference() + "\n\n"
        "2. Python (when the DSL cannot express it). " + sequence_api_reference() + "\n\n"
        + REPLY_FORMAT
    )


# ------------------------------------------------------------------------------------------------
# pairs and rows
# ------------------------------------------------------------------------------------------------

def _visible(n: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)


def strongest_pairs(pattern: np.ndarray, causal: bool = True, frac: float = 0.025, max_pairs: int = 48,
                    mode: str = "top", max_query: int | None = None) -> list[tuple[int, int, float]]:
    """The (query, key, weight) pairs shown for one sequence, sorted by query then weight (descending).

    ``mode="top"``: the ``ceil(frac * visible cells)`` heaviest positive cells (ties: row-major order),
    at most ``max_pairs``. ``mode="stratified"``: ``max_pairs`` positive cells evenly spaced over the
    weight ranking, so light attention is shown as well as the peaks. Queries >= ``max_query`` are
    left out (they are not shown in the prompt).
    """
    p = np.asarray(pattern, dtype=np.float64)
    n = p.shape[0]
    vis = _visible(n, causal)
    if max_query is not None:
        vis[max_query:, :] = False
    flat = np.where(vis & (p > 0), p, 0.0).reshape(-1)
    pos = np.flatnonzero(flat > 0)
    if pos.size == 0:
        return []
    order = pos[np.argsort(-flat[pos], kind="stable")]  # heaviest first, row-major among ties
    if mode == "top":
        q = max(1, math.ceil(frac * int(_visible(n, causal).sum()) - 1e-9))
        chosen = order[: min(q, max_pairs)]
    elif mode == "stratified":
        k = min(max_pairs, order.size)
        chosen = order[np.unique(np.linspace(0, order.size - 1, k).round().astype(np.int64))]
    else:
        raise ValueError(f"pair mode must be 'top' or 'stratified', got {mode!r}")
    pairs = [(int(c // n), int(c % n), float(flat[c])) for c in chosen]
    pairs.sort(key=lambda t: (t[0], -t[2], t[1]))
    return pairs


def row_jsd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon distance (natural log) per row of two [n, n] row-stochastic matrices."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kp = np.where(p > 0, p * np.log(p / np.where(m > 0, m, 1.0)), 0.0).sum(-1)
        kq = np.where(q > 0, q * np.log(q / np.where(m > 0, m, 1.0)), 0.0).sum(-1)
    return np.sqrt(np.clip(0.5 * kp + 0.5 * kq, 0.0, None))


def top_keys(row: np.ndarray, k: int = 3, min_weight: float = 0.01) -> list[tuple[int, float]]:
    """The ``k`` heaviest keys of one row with weight >= ``min_weight`` (at least the heaviest one)."""
    row = np.asarray(row, dtype=np.float64)
    if row.size == 0 or row.max() <= 0:
        return []
    order = np.argsort(-row, kind="stable")[:k]
    out = [(int(j), float(row[j])) for j in order if row[j] >= min_weight]
    return out or [(int(order[0]), float(row[order[0]]))]


# ------------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------------

def format_token(tokens: _Seq[str], i: int) -> str:
    """``index:"token"`` with the token JSON-quoted (newlines and spaces stay visible)."""
    return f"{i}:{json.dumps(str(tokens[i]), ensure_ascii=False)}"


def format_tokens(tokens: _Seq[str], limit: int | None = None) -> str:
    """The token list as ``0:"<s>" 1:"Once" ...``, cut after ``limit`` tokens."""
    n = len(tokens) if limit is None else min(len(tokens), limit)
    text = " ".join(format_token(tokens, i) for i in range(n))
    if n < len(tokens):
        text += f" ... ({len(tokens) - n} more)"
    return text


def _format_keys(tokens: _Seq[str], keys: Iterable[tuple[int, float]]) -> str:
    return ", ".join(f"{format_token(tokens, j)} {w:.2f}" for j, w in keys) or "(nothing)"


def head_prompt(head: tuple[int, int], examples: _Seq[tuple[Any, np.ndarray]], causal: bool = True,
                frac: float = 0.025, max_pairs: int = 48, mode: str = "top", max_tokens: int = 96) -> str:
    """The user message for one head: its name and, per example (sequence, real pattern), tokens and pairs."""
    what = (f"the top {frac:.1%} of visible cells (at most {max_pairs})" if mode == "top"
            else f"{max_pairs} cells spread evenly over the weight ranking, strongest to weakest")
    parts = [
        f"Head {head_name(head)} (layer {head[0]}, head {head[1]}).",
        "Tokens are shown as index:\"token\"; a leading \"▁\" or \"Ġ\" marks a space before the word. "
        f"For each example, the head's strongest attention ({what}), grouped by query as "
        "`query -> key weight, key weight, ...`.",
    ]
    for e, (seq, pattern) in enumerate(examples, 1):
        tokens = list(seq.tokens)
        shown = min(len(tokens), max_tokens)
        pairs = strongest_pairs(pattern, causal, frac, max_pairs, mode, max_query=shown)
        by_query: dict[int, list[tuple[int, float]]] = {}
        for i, j, w in pairs:
            by_query.setdefault(i, []).append((j, w))
        rows = "\n".join(f"  {format_token(tokens, i)} -> {_format_keys(tokens, keys)}" for i, keys in by_query.items())
        parts.append(f"Example {e} (n={len(tokens)}):\ntokens: {format_tokens(tokens, shown)}\n"
                     f"strongest attention:\n{rows or '  (none)'}")
    parts.append("What does this head attend to? " + REPLY_FORMAT)
    return "\n\n".join(parts)


def _program_block(kind: str, text: str, limit: int = 1500) -> str:
    text = text.strip()
    if len(text) > limit:
        text = text[:limit] + "\n... (cut)"
    if kind == "python" or "\n" in text:
        return f"[{kind}]\n{text}"
    return f"[{kind}] {text}"


def feedback_section(attempts: _Seq[dict[str, Any]], failures: _Seq[dict[str, Any]] = (),
                     others: _Seq[dict[str, Any]] = (), max_tokens: int = 96) -> str:
    """The refinement feedback appended to the head prompt.

    ``attempts`` (best first): dicts with ``kind``, ``text``, ``hypothesis``, ``jsd``, ``iou`` and
    ``sequences``: a list of ``{"seq": Sequence, "jsd": float, "rows": [(query, real_keys, pred_keys)]}``
    (the program's worst sequences, and in each its worst query rows). ``failures``: dicts with ``kind``,
    ``text``, ``reason``, ``message``. ``others``: further tried programs (``kind``, ``text``, ``jsd``).
    """
    parts = ["Feedback on your earlier proposals (JSD: mean Jensen-Shannon distance per query row on the "
             "fit sequences, lower is better; IoU: soft IoU, higher is better)."]
    for a, att in enumerate(attempts, 1):
        block = [f"Proposal {a}: {_program_block(att['kind'], att['text'])}",
                 f"hypothesis: {att.get('hypothesis') or '(none)'}",
                 f"score: JSD {att['jsd']:.3f}, IoU {att['iou']:.3f}"]
        for s in att.get("sequences", ()):
            tokens = list(s["seq"].tokens)
            block.append(f"  A poorly fitted sequence (JSD {s['jsd']:.3f}, n={len(tokens)}):\n"
                         f"  tokens: {format_tokens(tokens, max_tokens)}")
            for i, real, pred in s["rows"]:
                block.append(f"    query {format_token(tokens, i)}  real: {_format_keys(tokens, real)}"
                             f"  | predicted: {_format_keys(tokens, pred)}")
        parts.append("\n".join(block))
    if others:
        parts.append("Also tried (worse):\n" + "\n".join(
            f"  - {_program_block(o['kind'], o['text'], 300)} (JSD {o['jsd']:.3f})" for o in others))
    if failures:
        parts.append("These proposals failed (do not repeat them):\n" + "\n".join(
            f"  - {_program_block(f['kind'], f['text'], 400)}\n    -> {_reason(f['reason'])}: {_cap(f['message'])}"
            for f in failures))
    parts.append("Propose a better program that fixes the mismatches above (different from every program "
                 "already tried). " + REPLY_FORMAT)
    return "\n\n".join(parts)


def retry_message(reason: str) -> str:
    """The follow-up user message after an unusable reply (``reason`` from :func:`failure_feedback`)."""
    return (f"Your reply could not be used: {_cap(reason)}\n"
            "Fix this and answer again. " + REPLY_FORMAT)


# ------------------------------------------------------------------------------------------------
# failures shown to the model
# ------------------------------------------------------------------------------------------------

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


def _reason(reason: Any) -> str:
    """A failure reason as shown: one of the library's own reason words, else "failed"."""
    return reason if reason in _REASONS_SHOWN else "failed"


def _cap(text: str, limit: int = MAX_FEEDBACK_CHARS) -> str:
    """``text`` cut to ``limit`` characters (marked when cut)."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    return _cap(text)


# ------------------------------------------------------------------------------------------------
# replies
# ------------------------------------------------------------------------------------------------

class MalformedReply(ValueError):
    """A reply is not a JSON object with the required fields; the message says what is wrong."""


@dataclass
class ParsedReply:
    """A reply's fields: ``kind`` is "dsl" or "python"; ``program`` is text (or DSL JSON for "dsl")."""

    hypothesis: str
    kind: str
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
        keys = _cap(", ".join(map(str, list(found)[:20])) or "none", 120)
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
    kind = found.get("kind")
    kind = kind.strip().lower() if isinstance(kind, str) else ""
    if kind not in ("dsl", "python"):
        kind = "python" if isinstance(program, str) and re.search(r"(^|\n)\s*def\s", program) else "dsl"
    if kind == "python" and not isinstance(program, str):
        raise MalformedReply("a Python program must be source text in the \"program\" string")
    return ParsedReply(hypothesis=_cap(hypothesis.strip(), MAX_HYPOTHESIS_CHARS), kind=kind, program=program)
