"""Prompts for the LLM searcher (headsurgeon/synth/search/llm/): what the model is shown and how its replies are read.

Pure functions, no network: text.py (system and per-head prompts, references built from the code,
refinement feedback), summaries.py (strongest pairs, row JSD), feedback.py (the one way a failure is
described to the model, never with program output) and replies.py (the reply parser).
"""
from __future__ import annotations

from .feedback import MAX_FEEDBACK_CHARS, failure_feedback, safe_type_name
from .replies import MAX_HYPOTHESIS_CHARS, MAX_PROGRAM_CHARS, MAX_REPLY_CHARS, MalformedReply, ParsedReply, parse_reply
from .summaries import row_jsd, strongest_pairs, top_keys
from .text import (DSL_EXAMPLES, PYTHON_EXAMPLE, REPLY_FORMAT, dsl_reference, feedback_section, format_token, format_tokens, head_prompt, retry_message, sequence_api_reference, system_prompt)

__all__ = [
    "MalformedReply", "ParsedReply", "parse_reply", "strongest_pairs", "row_jsd", "top_keys",
    "dsl_reference", "sequence_api_reference", "system_prompt", "head_prompt", "feedback_section",
    "retry_message", "format_token", "format_tokens", "REPLY_FORMAT", "failure_feedback",
    "safe_type_name", "DSL_EXAMPLES", "PYTHON_EXAMPLE", "MAX_FEEDBACK_CHARS", "MAX_REPLY_CHARS", "MAX_PROGRAM_CHARS", "MAX_HYPOTHESIS_CHARS",
]
