"""Settings and counters of the LLM agent: the endpoint and budget (``AgentConfig``), per-head progress
(``HeadStatus``) and the run's counters (``AgentStats``)."""
from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ....core.argtypes import non_negative_float
from ....core.configs import setting
from ..base import SearcherUnavailable

SOURCE = "llm"


def env_value(*names: str) -> str | None:
    """The first non-empty environment variable of ``names``."""
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class AgentConfigError(ValueError, SearcherUnavailable):
    """The agent cannot start: no model, no endpoint/key, or an out-of-range setting."""


@dataclass
class AgentConfig:
    """Endpoint, budget and search settings of the LLM agent.

    ``base_url`` / ``model`` / ``api_key`` default to the environment: ``HEADSURGEON_LLM_BASE_URL`` or
    ``OPENAI_BASE_URL``; ``HEADSURGEON_LLM_MODEL``; ``HEADSURGEON_LLM_API_KEY`` or ``OPENAI_API_KEY``
    (a local endpoint without a key gets a placeholder key).
    """

    base_url: str | None = setting(default_factory=lambda: env_value("HEADSURGEON_LLM_BASE_URL", "OPENAI_BASE_URL"),
                                   help="OpenAI-compatible endpoint (or HEADSURGEON_LLM_BASE_URL)")
    model: str | None = setting(default_factory=lambda: env_value("HEADSURGEON_LLM_MODEL"),
                                help="chat model for the LLM agent (or HEADSURGEON_LLM_MODEL)")
    api_key: str | None = field(default_factory=lambda: env_value("HEADSURGEON_LLM_API_KEY", "OPENAI_API_KEY"),
                                repr=False)
    concurrency: int = 4                  # requests in flight at most
    request_timeout: float = 120.0        # seconds per HTTP request, all of it (a total deadline)
    max_response_bytes: int = 16 * 2**20  # larger responses are refused while they stream in
    max_retries: int = 5                  # retries of one request after timeouts / 429 / 5xx
    backoff_base: float = 1.0             # first backoff, doubled per retry
    backoff_max: float = 60.0
    jitter: float = 0.25                  # backoff * (1 + jitter * U[0, 1))
    retry_after_max: float = 300.0        # longest Retry-After honoured
    max_reply_retries: int = 2            # follow-ups after a malformed / invalid reply
    rounds: int = 2                       # refinement rounds after the first
    candidates_per_round: int = 3
    examples: int = 4                     # example sequences per prompt
    pair_mode: str = "top"                # "top" (top pair_frac per sequence) or "stratified"
    pair_frac: float = 0.025
    max_pairs: int = 48                   # pairs shown per example sequence
    max_tokens_shown: int = 96            # tokens shown per sequence
    refine_top: int = 2                   # best programs shown with their feedback
    feedback_sequences: int = 2           # worst sequences shown per program
    feedback_rows: int = 6                # worst query rows shown per sequence
    keep: int = 8                         # best (synth JSD) candidates scored on select and returned
    target_jsd: float = 1e-3              # stop refining a head once its best synth JSD is this low
    program_timeout: float = 5.0          # sandbox seconds per sequence (Python programs)
    temperature: float = 0.7
    max_tokens: int | None = 2048         # completion tokens per reply
    json_mode: bool = False               # send response_format={"type": "json_object"}
    cost_cap: float | None = setting(None, type=non_negative_float,  # USD; None = no cap
                                     help="stop LLM requests past this many USD")
    price_prompt_per_1k: float = 0.0      # USD per 1000 prompt tokens
    price_completion_per_1k: float = 0.0  # USD per 1000 completion tokens
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise AgentConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.request_timeout > 0 or not math.isfinite(self.request_timeout):
            raise AgentConfigError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if self.max_response_bytes < 4096:
            raise AgentConfigError(f"max_response_bytes must be >= 4096, got {self.max_response_bytes}")
        for name in ("max_retries", "max_reply_retries", "rounds"):
            if getattr(self, name) < 0:
                raise AgentConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("candidates_per_round", "examples", "max_pairs", "keep", "refine_top"):
            if getattr(self, name) < 1:
                raise AgentConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pair_mode not in ("top", "stratified"):
            raise AgentConfigError(f"pair_mode must be 'top' or 'stratified', got {self.pair_mode!r}")
        if self.cost_cap is not None and self.cost_cap < 0:
            raise AgentConfigError(f"cost_cap must be >= 0 USD or None, got {self.cost_cap}")

    def public(self) -> dict[str, Any]:
        """The settings without the API key (what the journal records)."""
        d = asdict(self)
        d.pop("api_key", None)
        return d


@dataclass
class HeadStatus:
    """Progress of one head: ``status`` is pending, running, done, resumed, cost_cap, stopped or error."""

    status: str = "pending"
    requests: int = 0
    rounds: int = 0
    candidates: int = 0
    failures: int = 0
    best_synth_jsd: float | None = None
    best_select_iou: float | None = None
    error: str = ""


@dataclass
class AgentStats:
    """Counters of one ``search`` call (``journal_*``: what earlier runs on the same journal spent)."""

    requests: int = 0
    retries: int = 0
    retry_reasons: Counter = field(default_factory=Counter)
    failed_requests: int = 0
    malformed: int = 0
    invalid_programs: int = 0
    failed_programs: int = 0
    failure_reasons: Counter = field(default_factory=Counter)
    duplicates: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    missing_usage: int = 0
    cost: float = 0.0
    cost_capped: bool = False
    max_in_flight: int = 0
    journal_prompt_tokens: int = 0
    journal_completion_tokens: int = 0
    journal_cost: float = 0.0
    resumed_heads: int = 0
    heads: dict[str, HeadStatus] = field(default_factory=dict)

    @property
    def total_cost(self) -> float:
        """Cost of this run plus earlier runs on the same journal (what the cap compares with)."""
        return self.cost + self.journal_cost

    def to_dict(self) -> dict[str, Any]:
        """The counters as JSON-ready values."""
        d = asdict(self)
        d["retry_reasons"] = dict(self.retry_reasons)
        d["failure_reasons"] = dict(self.failure_reasons)
        d["total_cost"] = self.total_cost
        return d

    def summary(self) -> str:
        """One line for logs and the CLI."""
        st = Counter(h.status for h in self.heads.values())
        return (f"{len(self.heads)} heads ({', '.join(f'{k} {v}' for k, v in sorted(st.items()))}); "
                f"{self.requests} requests, {self.retries} retries, {self.failed_requests} failed; "
                f"{self.malformed} malformed, {self.invalid_programs} invalid, {self.failed_programs} failed programs; "
                f"tokens {self.prompt_tokens} in / {self.completion_tokens} out; cost ${self.cost:.4f}"
                + (" (cost cap reached)" if self.cost_capped else ""))
