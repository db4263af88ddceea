"""The built-in searchers' registry entries: each factory imports its searcher when first used (torch and openai
load only for the searchers that run)."""
from __future__ import annotations

from .base import Searcher, SearcherUnavailable, SearchSettings, register_searcher


def enumerative(settings: SearchSettings) -> Searcher:
    """The enumerative searcher; ``settings.options["enumerative"]``: an ``EnumerativeConfig`` or a mapping of its
    fields, with the run's seed."""
    from .enumerative.config import EnumerativeConfig
    from .enumerative.search import EnumerativeSearcher

    return EnumerativeSearcher(EnumerativeConfig.of(settings.option("enumerative"), seed=settings.seed))


def learned(settings: SearchSettings) -> Searcher:
    """The learned searcher; ``settings.options["learned"]``: keyword arguments of ``learned_search``."""
    from .learned.search import LearnedSearcher

    return LearnedSearcher(seed=settings.seed, **settings.option("learned", {}))


def llm(settings: SearchSettings) -> Searcher:
    """The LLM agent (``settings.options["llm"]``: an ``AgentConfig``); unavailable when no endpoint is configured.

    Its journal goes to ``settings.out / "llm_journal.jsonl"`` when ``out`` is set.
    """
    from .llm.agent import LLMSearcher
    from .llm.config import AgentConfig, AgentConfigError

    try:
        return LLMSearcher(settings.option("llm") or AgentConfig(progress=settings.progress),
                           journal=None if settings.out is None else settings.out / "llm_journal.jsonl")
    except AgentConfigError as e:
        raise SearcherUnavailable(f"LLM agent skipped: {e}") from e


def library(settings: SearchSettings) -> Searcher:
    """The user's own programs (``settings.options["library"]``: programs or their text), scored for every head."""
    from ..runcache import run_cache
    from .library import LibrarySearcher

    return LibrarySearcher(settings.option("library", ()), cache=run_cache(settings.out))


register_searcher("enumerative", enumerative)
register_searcher("learned", learned)
register_searcher("llm", llm)
register_searcher("library", library)
