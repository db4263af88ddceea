"""The LLM agent, at its historical import path; the code lives in ``headsurgeon.synth.search.llm``."""
from __future__ import annotations

from .search.llm import (
    JOURNAL_VERSION, SOURCE, AgentConfig, AgentConfigError, AgentStats, HeadStatus, JournalMismatchError, LLMAgent,
    LLMSearcher, RunJournal, retry_after,
)

__all__ = [
    "AgentConfig", "AgentStats", "HeadStatus", "LLMAgent", "LLMSearcher", "AgentConfigError", "JournalMismatchError",
    "RunJournal", "SOURCE", "JOURNAL_VERSION", "retry_after",
]
