"""The LLM agent (:mod:`.agent`): asks a chat model for programs per head and refines them with feedback; requests in
:mod:`.transport`, scoring in :mod:`.scoring`, settings in :mod:`.config`, the resumable journal in :mod:`.journal`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ....core.lazy import lazy_package

if TYPE_CHECKING:  # the package's names, loaded on first use (headsurgeon/core/lazy.py)
    from .agent import ConversationResult, LLMAgent, LLMSearcher
    from .config import SOURCE, AgentConfig, AgentConfigError, AgentStats, HeadStatus
    from .endpoint import EndpointError, check_endpoint
    from ....core import JournalMismatchError
    from .journal import JOURNAL_VERSION, RunJournal
    from .transport import retry_after

__all__, __getattr__, __dir__ = lazy_package(__file__, __name__)
