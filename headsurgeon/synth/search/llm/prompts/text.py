"""What the model is shown: the system prompt (scoring rule, DSL and Sequence API references built from
the code itself), the per-head prompt with example sequences and their strongest pairs, and the
refinement feedback. Tokens are shown as ``index:"token"`` (JSON-quoted, so spaces and newlines stay visible).

Nothing computed by a proposed program is put into a prompt as text except the keys and weights of its
pattern in the refinement feedback (headsurgeon/synth/search/llm/prompts/feedback.py describes failures).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence as _Seq
from typing import Any

import numpy as np

from .... import dsl
from .... import features
from .... import pysafety
from .feedback import MAX_FEEDBACK_CHARS, reason_word
from .replies import clip
from .summaries import strongest_pairs
from .....core import Head

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


def _plain(text: str) -> str:
    """reST docstring text -> plain prompt text (no table rules, no roles, single backquotes)."""
    text = re.sub(r":(?:data|meth|func|class|attr):`~?([^`]+)`", r"\1", text)
    text = text.replace("``", "`").replace(" (see module docstring)", "")
    return "\n".join(line for line in text.splitlines() if not re.fullmatch(r"[=\s]+", line) or not line.strip()
                     ).strip()


def dsl_reference() -> str:
    """The DSL's primitives, predicates and combinators, rendered from the DSL spec (headsurgeon/synth/dsl/catalog.py)."""
    examples = "\n".join(f"  {e}" for e in DSL_EXAMPLES)
    return f"{dsl.reference_text()}\n\nExamples of whole DSL programs:\n{examples}"


def sequence_api_reference() -> str:
    """What a Python program's ``seq`` offers (headsurgeon/synth/sandbox/views.py SequenceView, headsurgeon/synth/features/ views)."""
    views = list(features.BASIC_VIEWS) + list(features.SPACY_VIEWS) + list(features.NER_VIEWS)
    lines = []
    for name in views:
        attr = getattr(features.FeatureView, name, None)
        doc = (getattr(attr, "__doc__", None) or "").strip().splitlines()
        lines.append(f"  seq.features.{name}: {_plain(doc[0].strip()) if doc else ''}")
    pos = ", ".join(features.POS_TAGS)
    imports = ", ".join(sorted(pysafety.ALLOWED_IMPORTS))
    return (
        "A Python program is source text defining exactly ONE top-level function of one argument `seq` that "
        "returns an n x n array of non-negative scores (row i = query i, column j = key j). `np` (numpy), "
        f"`math` and `re` are available; only these may be imported: {imports}. No files, network, "
        "processes, dunder names or private attributes; attributes are limited to the Sequence API, numpy, math, "
        "re and plain container methods; CPU time and memory are limited.\n"
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
        f"Head {Head.label(head)} (layer {head[0]}, head {head[1]}).",
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
            f"  - {_program_block(f['kind'], f['text'], 400)}\n    -> {reason_word(f['reason'])}: {clip(f['message'], MAX_FEEDBACK_CHARS)}"
            for f in failures))
    parts.append("Propose a better program that fixes the mismatches above (different from every program "
                 "already tried). " + REPLY_FORMAT)
    return "\n\n".join(parts)


def retry_message(reason: str) -> str:
    """The follow-up user message after an unusable reply (``reason`` from :func:`failure_feedback`)."""
    return (f"Your reply could not be used: {clip(reason, MAX_FEEDBACK_CHARS)}\n"
            "Fix this and answer again. " + REPLY_FORMAT)
