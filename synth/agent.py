"""The LLM agent (DESIGN section 7): ask a chat model for programs that reproduce each head, then refine.

Per head: a prompt with example ``synth`` sequences and their strongest ``query -> key (weight)`` pairs,
the DSL and the Sequence API (``headsurgeon.synth.prompts``) -> a JSON reply ``{hypothesis, kind,
program}`` -> parse -> validate (``Program.parse`` / ``Program.python``) -> evaluate (DSL kernels, or the
sandbox pool for Python) -> rank by JSD on ``synth`` -> ``rounds`` refinement rounds whose prompt shows
the best programs' worst sequences (real vs predicted keys per query, as token strings) and the failures
-> score the best ``keep`` candidates on ``select`` (IoU and JSD). The final choice across all searchers
happens elsewhere; ``search`` returns ``Candidate`` lists with scores ``{"synth": {"jsd", "iou"},
"select": {"iou", "jsd"}}``, best (select IoU) first.

Robustness, all counted in :class:`AgentStats`:

* every HTTP request goes through the real ``openai`` client with its own retries off
  (``max_retries=0``); this module retries timeouts, connection errors, unreadable responses, 408/409/429
  and 5xx with exponential backoff and jitter, honouring ``Retry-After`` / ``retry-after-ms``; other
  statuses fail the request at once;
* each request has a total wall-clock deadline of ``request_timeout`` seconds (headers and body together,
  however slowly the endpoint drips bytes), and a response larger than ``max_response_bytes`` is refused
  while it streams in, never read whole;
* at most ``concurrency`` requests are in flight (one bounded thread pool issues them all);
* a reply that is not a JSON object with ``hypothesis`` and ``program`` (malformed), or whose program does
  not parse / validate (invalid, e.g. ``import os``), is answered in the same conversation with what was
  wrong, up to ``max_reply_retries`` times;
* a program that crashes, times out, runs out of memory or returns garbage is a failed program: recorded,
  shown to the model in the next round, never fatal; what the model is told about any failure comes from
  ``prompts.failure_feedback`` (reason, known exception type, line: never text the program produced);
* token usage (``usage.prompt_tokens`` / ``completion_tokens``) and cost (per-1k-token prices) are summed;
  once the cost reaches ``cost_cap`` no further request starts (requests already in flight finish, so the
  overshoot is at most ``concurrency`` requests); the cap covers the whole journal, so resuming a capped
  run does not spend it again;
* a JSONL journal (``journal=PATH``): a ``run`` event with the inputs' fingerprint, an event per request /
  retry / unusable reply (flushed), and a ``head`` event per finished head with its candidates (programs as
  their JSON; flushed and fsynced). A new run on the same journal restores every head whose last
  ``head`` event has status ``done`` and does not ask about it again; heads that stopped on the cost cap
  or on request errors are redone.
"""
from __future__ import annotations

import email.utils
import functools
import json
import math
import os
import random
import re
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence as _Seq
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from headsurgeon.kernels.normalize import normalize_scores

from . import prompts as P
from .candidate import Candidate
from .errors import ProgramError, ProgramExecutionError
from .metrics import score_many
from .program import Program
from .sequence import Sequence, sequences_key

__all__ = [
    "AgentConfig", "AgentStats", "HeadStatus", "LLMAgent", "AgentConfigError", "JournalMismatchError",
    "RunJournal", "SOURCE",
]

SOURCE = "llm"
JOURNAL_VERSION = 1

#: numba kernels (DSL evaluation, normalization, metrics) run one call at a time across agent threads:
#: numba's default threading layer does not support concurrent parallel launches from several threads.
_NUMBA_LOCK = threading.Lock()


def _env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class AgentConfigError(ValueError):
    """The agent cannot start: no model, no endpoint/key, or an out-of-range setting."""


class JournalMismatchError(ValueError):
    """The journal was written for other inputs (sequences, splits or model) than this run."""


class _CostCapReached(Exception):
    pass


class _RequestFailed(Exception):
    pass


class _Stopped(Exception):
    pass


class _DeadlinePassed(Exception):
    """A request ran past its total deadline (``request_timeout``)."""


class _ReplyTooLarge(Exception):
    """A response is larger than ``max_response_bytes``."""


class _RefusedEncoding(Exception):
    """A response is compressed although ``identity`` was asked for (a decompression bomb is unbounded)."""


#: the deadline and byte budget of the request running on this thread (set by ``LLMAgent._send``)
_REQUEST = threading.local()


# ================================================================================================
# configuration and statistics
# ================================================================================================

@dataclass
class AgentConfig:
    """Endpoint, budget and search settings of the LLM agent.

    ``base_url`` / ``model`` / ``api_key`` default to the environment: ``HEADSURGEON_LLM_BASE_URL`` or
    ``OPENAI_BASE_URL``; ``HEADSURGEON_LLM_MODEL``; ``HEADSURGEON_LLM_API_KEY`` or ``OPENAI_API_KEY``
    (a local endpoint without a key gets a placeholder key).
    """

    base_url: str | None = field(default_factory=lambda: _env("HEADSURGEON_LLM_BASE_URL", "OPENAI_BASE_URL"))
    model: str | None = field(default_factory=lambda: _env("HEADSURGEON_LLM_MODEL"))
    api_key: str | None = field(default_factory=lambda: _env("HEADSURGEON_LLM_API_KEY", "OPENAI_API_KEY"),
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
    cost_cap: float | None = None         # USD; None = no cap
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


class StoreLike(Protocol):
    """What the agent reads from an ``AttentionStore`` (duck-typed: synth does not import surgery)."""

    sequences: list[Sequence]
    causal: bool

    def batch(self, indices: list[int] | None = None, heads: list[tuple[int, int]] | None = None
              ) -> tuple[np.ndarray, np.ndarray]: ...


# ================================================================================================
# journal
# ================================================================================================

class RunJournal:
    """An append-only JSONL journal of one agent run (see the module docstring for the events)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: Any = None

    def read(self) -> list[dict[str, Any]]:
        """All complete events (a line cut short by a killed writer is ignored)."""
        if not self.path.is_file():
            return []
        events = []
        with open(self.path, "r", encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(ev, dict):
                    events.append(ev)
        return events

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = False
        if self.path.is_file() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._file = open(self.path, "a", encoding="utf-8")
        if needs_newline:  # a killed writer left half a line: end it so the next event stands alone
            self._file.write("\n")
            self._file.flush()

    def write(self, event: dict[str, Any], sync: bool = False) -> None:
        """Append one event; flush always, fsync when ``sync`` (finished heads)."""
        if self._file is None:
            return
        line = json.dumps({"time": round(time.time(), 3), **event}, sort_keys=True, default=_json_default)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            if sync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Counter):
        return dict(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _candidate_json(c: Candidate) -> dict[str, Any]:
    return {"program": c.program.to_json(), "kind": c.program.kind, "hash": c.program.hash,
            "hypothesis": c.hypothesis, "scores": c.scores}


def _candidate_from_json(head: tuple[int, int], obj: dict[str, Any]) -> Candidate:
    prog = Program.from_json(obj["program"], kind=obj.get("kind"))
    if obj.get("hash") and obj["hash"] != prog.hash:
        raise ValueError(f"program hash changed ({obj['hash'][:12]} -> {prog.hash[:12]})")
    return Candidate(head=head, program=prog, source=SOURCE, hypothesis=obj.get("hypothesis", ""),
                     scores={k: dict(v) for k, v in (obj.get("scores") or {}).items()})


# ================================================================================================
# the agent
# ================================================================================================

@dataclass
class _Attempt:
    program: Program
    hypothesis: str
    jsd: float
    iou: float
    seq_jsd: np.ndarray
    pattern: np.ndarray | None  # [B, N, N] on synth, kept only for the programs shown as feedback


@dataclass
class _Proposal:
    program: Program | None
    hypothesis: str
    rejected: list[dict[str, Any]]


@dataclass
class _Context:
    store: Any
    causal: bool
    synth_idx: list[int]
    select_idx: list[int]
    synth_seqs: list[Sequence]
    select_seqs: list[Sequence]
    system: str
    pool: ThreadPoolExecutor


class LLMAgent:
    """Searches programs for heads by asking a chat model (see the module docstring)."""

    def __init__(self, config: AgentConfig | None = None, *, client: Any = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``client``: an ``openai.OpenAI``-like object (default: one per request thread, built from ``config``,
        whose responses are size-capped); ``sleep``: backoff waits."""
        self.config = config or AgentConfig()
        cfg = self.config
        if not cfg.model:
            raise AgentConfigError("no LLM model configured: pass AgentConfig(model=...) or set HEADSURGEON_LLM_MODEL")
        if client is None:
            if not cfg.base_url and not cfg.api_key:
                raise AgentConfigError(
                    "no LLM endpoint configured: pass AgentConfig(base_url=..., api_key=...) or set "
                    "HEADSURGEON_LLM_BASE_URL (e.g. http://127.0.0.1:8000/v1 for vLLM) / OPENAI_API_KEY")
            try:
                import openai  # noqa: F401
            except ImportError as e:  # pragma: no cover - openai is a dependency
                raise AgentConfigError(f"the LLM agent needs the openai package ({e}): pip install openai") from e
        self._given_client = client
        self._local = threading.local()
        self._owned_clients: list[Any] = []
        self._sleep = sleep
        self._rng = random.Random(cfg.seed)
        self._lock = threading.Lock()
        self._store_lock = threading.Lock()
        self._in_flight = 0
        self._stop = False
        self.stats = AgentStats()
        self._journal: RunJournal | None = None

    # ------------------------------------------------------------------ clients
    @property
    def client(self) -> Any:
        """The client the calling thread sends its requests through."""
        if self._given_client is not None:
            return self._given_client
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._new_client()
            self._local.client = client
            with self._lock:
                self._owned_clients.append(client)
        return client

    def _new_client(self) -> Any:
        """An ``openai.OpenAI`` client whose HTTP responses are checked by ``_guard_response`` as they stream.

        Redirects are not followed: an endpoint must not make this machine send requests elsewhere.
        """
        import openai

        cfg = self.config
        factory = getattr(openai, "DefaultHttpxClient", None)
        http_client = None if factory is None else factory(
            timeout=cfg.request_timeout, headers={"Accept-Encoding": "identity"}, follow_redirects=False,
            event_hooks={"response": [_guard_response]})
        return openai.OpenAI(base_url=cfg.base_url, api_key=cfg.api_key or "not-needed",
                             timeout=cfg.request_timeout, max_retries=0, http_client=http_client)

    def _drop_client(self, client: Any) -> None:
        """Close an owned client (ends the connection of an abandoned request); the thread gets a new one."""
        if client is self._given_client:
            return
        if getattr(self._local, "client", None) is client:
            self._local.client = None
        with self._lock:
            if client in self._owned_clients:
                self._owned_clients.remove(client)
        _close_quietly(client)

    def _close_clients(self) -> None:
        """Close every client this agent built (at the end of ``search``)."""
        with self._lock:
            clients, self._owned_clients = self._owned_clients, []
        for client in clients:
            _close_quietly(client)
        self._local = threading.local()

    # ------------------------------------------------------------------ public
    def search(self, store: StoreLike, heads: _Seq[tuple[int, int]] | None = None,
               synth_idx: _Seq[int] | None = None, select_idx: _Seq[int] | None = None,
               journal: str | os.PathLike | None = None) -> dict[tuple[int, int], list[Candidate]]:
        """Candidates per head (best select IoU first) from the chat model; resumable through ``journal``.

        ``store``: an ``AttentionStore`` (``sequences``, ``causal``, ``batch``); ``heads``: default all of
        ``store.heads``; ``synth_idx`` / ``select_idx``: store indices of the fit (prompt + JSD ranking)
        and selection (IoU) sequences, which must not overlap.
        """
        cfg = self.config
        heads = [(int(h[0]), int(h[1])) for h in (store.heads if heads is None else heads)]
        if synth_idx is None or select_idx is None:
            raise ValueError("search needs synth_idx and select_idx (store indices of the two splits)")
        synth_idx, select_idx = [int(i) for i in synth_idx], [int(i) for i in select_idx]
        if not synth_idx or not select_idx:
            raise ValueError(f"search needs non-empty splits; got {len(synth_idx)} synth and "
                             f"{len(select_idx)} select sequences")
        if set(synth_idx) & set(select_idx):
            raise ValueError("synth_idx and select_idx overlap: select on sequences the prompts never showed")
        seqs = store.sequences
        causal = bool(getattr(store, "causal", True))
        synth_seqs = [seqs[i] for i in synth_idx]
        select_seqs = [seqs[i] for i in select_idx]
        self.stats = AgentStats()
        fingerprint = {"synth": sequences_key(synth_seqs), "select": sequences_key(select_seqs),
                       "causal": causal, "store_model": str(getattr(store, "model_name", "") or "")}

        results: dict[tuple[int, int], list[Candidate]] = {}
        self._journal = RunJournal(journal) if journal is not None else None
        if self._journal is not None:
            results.update(self._resume(self._journal, fingerprint, set(heads)))
            self._journal.open()
            self._journal.write({"event": "run", "version": JOURNAL_VERSION, "fingerprint": fingerprint,
                                 "heads": [list(h) for h in heads], "config": cfg.public()}, sync=True)
        for h in heads:
            name = P.head_name(h)
            if h in results:
                best = results[h][0].score("select", "iou") if results[h] else None
                self.stats.heads[name] = HeadStatus(status="resumed", candidates=len(results[h]),
                                                    best_select_iou=best)
            else:
                self.stats.heads[name] = HeadStatus()
        todo = [h for h in heads if h not in results]
        self.stats.resumed_heads = len(heads) - len(todo)

        from tqdm import tqdm

        self._stop = False
        req_pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="llm-request")
        head_pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="llm-head")
        try:
            with tqdm(total=len(heads), initial=len(heads) - len(todo), disable=not cfg.progress,
                      desc="llm agent", unit="head") as bar:
                ctx = _Context(store, causal, synth_idx, select_idx, synth_seqs, select_seqs,
                               P.system_prompt(causal), req_pool)
                futures = {head_pool.submit(self._run_head, h, ctx): h for h in todo}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update(1)
                    bar.set_postfix(cost=f"${self.stats.cost:.3f}", req=self.stats.requests, refresh=False)
        except BaseException:
            self._stop = True  # Ctrl-C: no new request starts; finished heads are already journaled
            head_pool.shutdown(wait=False, cancel_futures=True)
            req_pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            head_pool.shutdown(wait=True)
            req_pool.shutdown(wait=True)
            self._close_clients()
            if self._journal is not None:
                self._journal.write({"event": "end", "stats": self.stats.to_dict()}, sync=True)
                self._journal.close()
        return {h: results[h] for h in heads}

    # ------------------------------------------------------------------ resume
    def _resume(self, journal: RunJournal, fingerprint: dict[str, Any], wanted: set[tuple[int, int]]
                ) -> dict[tuple[int, int], list[Candidate]]:
        events = journal.read()
        runs = [e for e in events if e.get("event") == "run"]
        if runs and runs[-1].get("fingerprint") != fingerprint:
            old = runs[-1].get("fingerprint")
            raise JournalMismatchError(
                f"journal {journal.path} was written for other inputs ({old} != {fingerprint}); "
                "pass a new journal path, or delete the file to start over")
        last: dict[tuple[int, int], dict[str, Any]] = {}
        for e in events:
            if e.get("event") == "head" and isinstance(e.get("head"), list) and len(e["head"]) == 2:
                last[(int(e["head"][0]), int(e["head"][1]))] = e
            elif e.get("event") == "request" and e.get("status") == "ok":
                self.stats.journal_prompt_tokens += int(e.get("prompt_tokens") or 0)
                self.stats.journal_completion_tokens += int(e.get("completion_tokens") or 0)
                self.stats.journal_cost += float(e.get("cost") or 0.0)
        restored: dict[tuple[int, int], list[Candidate]] = {}
        for h, e in last.items():
            if h not in wanted or e.get("status") != "done":
                continue
            try:
                restored[h] = [_candidate_from_json(h, c) for c in e.get("candidates", [])]
            except (ProgramError, ValueError, KeyError, TypeError):
                continue  # an unreadable record: ask about this head again
        return restored

    # ------------------------------------------------------------------ one head
    def _run_head(self, head: tuple[int, int], ctx: _Context) -> list[Candidate]:
        name = P.head_name(head)
        hs = self.stats.heads[name]
        hs.status = "running"
        try:
            cands, status = self._search_head(head, ctx, hs)
        except Exception as e:  # noqa: BLE001 - one head's bug must not end the run; it is reported
            cands, status = [], "error"
            hs.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        hs.status = status
        hs.candidates = len(cands)
        if cands:
            hs.best_select_iou = cands[0].score("select", "iou")
        if self._journal is not None:
            self._journal.write({"event": "head", "head": list(head), "name": name, "status": status,
                                 "candidates": [_candidate_json(c) for c in cands],
                                 "stats": asdict(hs)}, sync=True)
        return cands

    def _search_head(self, head: tuple[int, int], ctx: _Context, hs: HeadStatus) -> tuple[list[Candidate], str]:
        cfg = self.config
        with self._store_lock:
            real, lengths = ctx.store.batch(ctx.synth_idx, [head])
        real = np.asarray(real, dtype=np.float32)
        B = len(ctx.synth_seqs)
        ex = np.unique(np.linspace(0, B - 1, min(cfg.examples, B)).round().astype(np.int64))
        examples = [(ctx.synth_seqs[b], real[0, b, : lengths[b], : lengths[b]]) for b in ex]
        base = P.head_prompt(head, examples, ctx.causal, cfg.pair_frac, cfg.max_pairs, cfg.pair_mode,
                             cfg.max_tokens_shown)
        attempts: list[_Attempt] = []
        failures: list[dict[str, Any]] = []
        new_failures: list[dict[str, Any]] = []
        seen: set[str] = set()
        status = "done"
        for rnd in range(1 + cfg.rounds):
            hs.rounds = rnd + 1
            user = base
            if rnd > 0:
                user = base + "\n\n" + self._feedback(attempts, failures[-6:], real, lengths, ctx)
            messages = [{"role": "system", "content": ctx.system}, {"role": "user", "content": user}]
            futs: list[Future] = [ctx.pool.submit(self._propose, messages, head, rnd)
                                  for _ in range(cfg.candidates_per_round)]
            proposals: list[_Proposal] = []
            for f in futs:
                try:
                    proposals.append(f.result())
                except _CostCapReached:
                    status = "cost_cap"
                except _Stopped:
                    status = "stopped"
                except _RequestFailed as e:
                    if status == "done":
                        status = "error"
                    hs.error = str(e)
            new_failures = []
            programs: list[tuple[Program, str]] = []
            for prop in proposals:
                new_failures.extend(prop.rejected)
                if prop.program is None:
                    continue
                if prop.program.hash in seen:
                    with self._lock:
                        self.stats.duplicates += 1
                    continue
                seen.add(prop.program.hash)
                programs.append((prop.program, prop.hypothesis))
            attempts.extend(self._score_synth(programs, real, lengths, ctx, head, new_failures))
            failures.extend(new_failures)
            hs.failures = len(failures)
            attempts.sort(key=lambda a: (a.jsd, -a.iou))
            for a in attempts[cfg.refine_top:]:
                a.pattern = None  # only the programs shown as feedback keep their patterns
            if attempts:
                hs.best_synth_jsd = attempts[0].jsd
            if status != "done" or (attempts and attempts[0].jsd <= cfg.target_jsd):
                break
        cands = self._score_select(head, attempts[: cfg.keep], ctx, failures)
        hs.failures = len(failures)
        return cands, status

    # ------------------------------------------------------------------ asking
    def _propose(self, messages: list[dict[str, str]], head: tuple[int, int], rnd: int) -> _Proposal:
        """One candidate: ask, and re-ask in the same conversation while the reply is unusable."""
        name = P.head_name(head)
        msgs = list(messages)
        rejected: list[dict[str, Any]] = []
        for _ in range(self.config.max_reply_retries + 1):
            content = self._chat(msgs, head, rnd)
            try:
                parsed = P.parse_reply(content)
            except P.MalformedReply as e:
                with self._lock:
                    self.stats.malformed += 1
                reason = P.failure_feedback(e)
                self._event({"event": "malformed", "head": name, "round": rnd, "reason": reason,
                             "reply": (content or "")[:500]})
            else:
                try:
                    program = (Program.python(parsed.program) if parsed.kind == "python"
                               else Program.from_dsl_json(parsed.program) if not isinstance(parsed.program, str)
                               else Program.parse(parsed.program))
                    return _Proposal(program, parsed.hypothesis, rejected)
                except (ProgramError, ValueError, TypeError, RecursionError) as e:
                    with self._lock:
                        self.stats.invalid_programs += 1
                        self.stats.failure_reasons["invalid"] += 1
                    msg = P.failure_feedback(e)
                    rejected.append({"kind": parsed.kind, "text": parsed.text, "reason": "invalid", "message": msg})
                    self._event({"event": "invalid", "head": name, "round": rnd, "kind": parsed.kind,
                                 "message": _excerpt(str(e) or type(e).__name__, 500)})
                    reason = f"the {parsed.kind} program is invalid: {msg}"
            msgs = msgs + [{"role": "assistant", "content": _echo(content)},
                           {"role": "user", "content": P.retry_message(reason)}]
        return _Proposal(None, "", rejected)

    def _check_budget(self) -> None:
        if self._stop:
            raise _Stopped()
        cap = self.config.cost_cap
        if cap is None:
            return
        with self._lock:
            if self.stats.total_cost >= cap:
                self.stats.cost_capped = True
                raise _CostCapReached()

    def _chat(self, messages: list[dict[str, str]], head: tuple[int, int], rnd: int) -> str:
        """One chat completion with retries on timeouts, connection errors, bad responses, 408/409/429 and 5xx."""
        cfg = self.config
        name = P.head_name(head)
        hs = self.stats.heads[name]
        kwargs: dict[str, Any] = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature}
        if cfg.max_tokens is not None:
            kwargs["max_tokens"] = cfg.max_tokens
        if cfg.json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        for attempt in range(cfg.max_retries + 1):
            self._check_budget()
            with self._lock:
                self.stats.requests += 1
                hs.requests += 1
                self._in_flight += 1
                self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
            t0 = time.monotonic()
            try:
                resp = self._send(kwargs)
            except Exception as e:  # noqa: BLE001 - every way a request can fail is classified here
                reason, retryable, detail, retry_after = self._request_failure(e)
            else:
                return self._account(resp, name, rnd, time.monotonic() - t0)
            finally:
                with self._lock:
                    self._in_flight -= 1
            if not retryable or attempt == cfg.max_retries:
                with self._lock:
                    self.stats.failed_requests += 1
                self._event({"event": "request", "head": name, "round": rnd, "status": "failed", "reason": reason,
                             "message": detail, "latency": round(time.monotonic() - t0, 4)})
                raise _RequestFailed(detail if not retryable else
                                     f"gave up after {attempt + 1} attempts (last: {reason}: {detail})")
            delay = retry_after if retry_after is not None else self._backoff(attempt)
            with self._lock:
                self.stats.retries += 1
                self.stats.retry_reasons[reason] += 1
            self._event({"event": "request", "head": name, "round": rnd, "status": "retry", "reason": reason,
                         "delay": round(delay, 4), "latency": round(time.monotonic() - t0, 4)})
            self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, kwargs: dict[str, Any]) -> Any:
        """One chat completion under a total deadline of ``request_timeout`` s; a late one is cut off.

        The call runs on its own thread so that the deadline holds however the endpoint drips bytes (HTTP
        client timeouts apply per read); at the deadline its connection is closed and the call abandoned.
        """
        cfg = self.config
        client = self.client
        deadline = time.monotonic() + cfg.request_timeout
        box: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            _REQUEST.deadline, _REQUEST.max_bytes = deadline, cfg.max_response_bytes
            try:
                box["response"] = client.chat.completions.create(**kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=call, name="llm-call", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            self._drop_client(client)
            raise _DeadlinePassed()
        if "error" in box:
            raise box["error"]
        return box["response"]

    def _request_failure(self, error: BaseException) -> tuple[str, bool, str, float | None]:
        """(reason, retryable, message, retry-after seconds) of a failed request."""
        import openai

        cfg = self.config
        where = cfg.base_url or "the endpoint"
        chain = list(_exception_chain(error))
        if any(isinstance(e, _ReplyTooLarge) for e in chain):
            return ("too_large", False, f"the response from {where} exceeds max_response_bytes="
                    f"{cfg.max_response_bytes}; refused without reading the rest", None)
        if any(isinstance(e, _RefusedEncoding) for e in chain):
            return ("encoding", False, f"the response from {where} is compressed although 'identity' was asked "
                    "for; compressed responses are refused", None)
        if any(isinstance(e, (_DeadlinePassed, openai.APITimeoutError)) for e in chain):
            return "timeout", True, f"no complete response within request_timeout={cfg.request_timeout:g} s", None
        if isinstance(error, openai.APIStatusError):
            code = int(error.status_code)
            text = f"HTTP {code} from {where}: {_excerpt(getattr(error, 'message', ''))}"
            if code == 429 or code in (408, 409) or code >= 500:
                reason = "429" if code == 429 else "5xx" if code >= 500 else str(code)
                return reason, True, text, _retry_after(getattr(error, "response", None), cfg.retry_after_max)
            return str(code), False, text, None
        if isinstance(error, openai.APIConnectionError):
            return "connection", True, f"could not connect to {where} or the connection broke", None
        return "bad_response", True, f"unreadable response from {where} ({type(error).__name__})", None

    def _backoff(self, attempt: int) -> float:
        cfg = self.config
        with self._lock:
            u = self._rng.random()
        return min(cfg.backoff_max, cfg.backoff_base * (2.0 ** attempt)) * (1.0 + cfg.jitter * u)

    def _account(self, resp: Any, name: str, rnd: int, latency: float) -> str:
        cfg = self.config
        usage = getattr(resp, "usage", None)
        pt = _token_count(getattr(usage, "prompt_tokens", 0)) if usage is not None else 0
        ct = _token_count(getattr(usage, "completion_tokens", 0)) if usage is not None else 0
        cost = pt / 1000.0 * cfg.price_prompt_per_1k + ct / 1000.0 * cfg.price_completion_per_1k
        with self._lock:
            self.stats.prompt_tokens += pt
            self.stats.completion_tokens += ct
            self.stats.cost += cost
            if usage is None:
                self.stats.missing_usage += 1
        self._event({"event": "request", "head": name, "round": rnd, "status": "ok", "prompt_tokens": pt,
                     "completion_tokens": ct, "cost": cost, "latency": round(latency, 4)})
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            return ""
        content = getattr(getattr(choices[0], "message", None), "content", None)
        return content if isinstance(content, str) else ""

    def _event(self, event: dict[str, Any]) -> None:
        if self._journal is not None:
            self._journal.write(event)

    # ------------------------------------------------------------------ evaluation
    def _patterns(self, program: Program, seqs: list[Sequence], causal: bool) -> np.ndarray:
        """Normalized patterns [B, N, N]; Python programs run in the sandbox outside the numba lock."""
        if program.kind == "python":
            scores = program.evaluate_scores(seqs, causal, timeout=self.config.program_timeout)
            lengths = np.array([s.n for s in seqs], dtype=np.int64)
            with _NUMBA_LOCK:
                return np.asarray(normalize_scores(scores, lengths, causal), dtype=np.float32)
        with _NUMBA_LOCK:
            return np.asarray(program.evaluate(seqs, causal), dtype=np.float32)

    def _try_patterns(self, program: Program, seqs: list[Sequence], causal: bool, head: tuple[int, int],
                      failures: list[dict[str, Any]], split: str) -> np.ndarray | None:
        try:
            return self._patterns(program, seqs, causal)
        except Exception as e:  # noqa: BLE001 - e.g. a feature view that needs a missing spaCy model
            error: Exception = e
        reason = error.reason if isinstance(error, ProgramExecutionError) else "error"
        local = str(error) if isinstance(error, ProgramExecutionError) else f"{type(error).__name__}: {error}"
        with self._lock:
            self.stats.failed_programs += 1
            self.stats.failure_reasons[reason] += 1
        failures.append({"kind": program.kind, "text": program.text, "reason": reason,
                         "message": P.failure_feedback(error, program.text)})
        self._event({"event": "program_failed", "head": P.head_name(head), "split": split, "reason": reason,
                     "hash": program.hash, "message": _excerpt(local, 500)})
        return None

    def _score_synth(self, programs: list[tuple[Program, str]], real: np.ndarray, lengths: np.ndarray,
                     ctx: _Context, head: tuple[int, int], failures: list[dict[str, Any]]) -> list[_Attempt]:
        ok: list[tuple[Program, str, np.ndarray]] = []
        for prog, hyp in programs:
            pat = self._try_patterns(prog, ctx.synth_seqs, ctx.causal, head, failures, "synth")
            if pat is not None:
                ok.append((prog, hyp, pat))
        if not ok:
            return []
        cand = np.stack([_pad(p, real.shape[-1]) for _, _, p in ok])
        with _NUMBA_LOCK:
            sc = score_many(real, cand, lengths, ctx.causal, metrics=("jsd", "iou"), per_sequence=True)
        out = []
        for k, (prog, hyp, pat) in enumerate(ok):
            seq_jsd = np.asarray(sc["jsd"][0, k], dtype=np.float64)
            out.append(_Attempt(prog, hyp, float(seq_jsd.mean()), float(np.mean(sc["iou"][0, k])), seq_jsd, pat))
        return out

    def _score_select(self, head: tuple[int, int], attempts: list[_Attempt], ctx: _Context,
                      failures: list[dict[str, Any]]) -> list[Candidate]:
        if not attempts:
            return []
        with self._store_lock:
            real, lengths = ctx.store.batch(ctx.select_idx, [head])
        real = np.asarray(real, dtype=np.float32)
        ok: list[tuple[_Attempt, np.ndarray]] = []
        for a in attempts:
            pat = self._try_patterns(a.program, ctx.select_seqs, ctx.causal, head, failures, "select")
            if pat is not None:
                ok.append((a, pat))
        if not ok:
            return []
        cand = np.stack([_pad(p, real.shape[-1]) for _, p in ok])
        with _NUMBA_LOCK:
            sc = score_many(real, cand, lengths, ctx.causal, metrics=("iou", "jsd"))
        cands = []
        for k, (a, _) in enumerate(ok):
            cands.append(Candidate(head=head, program=a.program, source=SOURCE, hypothesis=a.hypothesis, scores={
                "synth": {"jsd": a.jsd, "iou": a.iou},
                "select": {"iou": float(sc["iou"][0, k]), "jsd": float(sc["jsd"][0, k])},
            }))
        cands.sort(key=lambda c: (-c.scores["select"]["iou"], c.scores["synth"]["jsd"]))
        return cands

    def _feedback(self, attempts: list[_Attempt], failures: list[dict[str, Any]], real: np.ndarray,
                  lengths: np.ndarray, ctx: _Context) -> str:
        cfg = self.config
        shown = []
        for a in attempts[: cfg.refine_top]:
            if a.pattern is None:
                continue
            worst = np.argsort(-a.seq_jsd, kind="stable")[: cfg.feedback_sequences]
            seqs = []
            for b in worst:
                n = int(lengths[b])
                p, q = real[0, b, :n, :n], a.pattern[b, :n, :n]
                if ctx.causal:
                    p, q = np.tril(p), np.tril(q)
                rows_jsd = P.row_jsd(p, q)
                rows = [(int(i), P.top_keys(p[i]), P.top_keys(q[i]))
                        for i in np.argsort(-rows_jsd, kind="stable")[: cfg.feedback_rows] if rows_jsd[i] > 1e-6]
                rows.sort()
                seqs.append({"seq": ctx.synth_seqs[b], "jsd": float(a.seq_jsd[b]), "rows": rows})
            shown.append({"kind": a.program.kind, "text": a.program.text, "hypothesis": a.hypothesis,
                          "jsd": a.jsd, "iou": a.iou, "sequences": seqs})
        others = [{"kind": a.program.kind, "text": a.program.text, "jsd": a.jsd} for a in attempts[len(shown):][:8]]
        return P.feedback_section(shown, failures, others, cfg.max_tokens_shown)


def _exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and its causes / contexts, each once."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _excerpt(text: Any, limit: int = 300) -> str:
    """``str(text)`` cut to ``limit`` characters (for local logs and errors)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _echo(content: str | None, limit: int = 4000) -> str:
    """A reply as it is sent back in the conversation: cut when long (the endpoint sent it; no need to resend)."""
    content = content or ""
    return content if len(content) <= limit else content[:limit] + f"\n... ({len(content) - limit} more characters cut)"


def _token_count(value: Any) -> int:
    """A usage count from the endpoint as an int in [0, 1e9] (0 when it is not a number)."""
    try:
        count = int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0
    return min(max(count, 0), 10**9)


def _close_quietly(client: Any) -> None:
    """Close a client; errors (e.g. from a connection another thread is using) do not matter here."""
    try:
        client.close()
    except Exception:  # noqa: BLE001
        pass


def _guard_response(response: Any) -> None:
    """httpx response hook: refuse compressed or oversized responses; cap the body and its deadline as it streams."""
    limit = getattr(_REQUEST, "max_bytes", None)
    if limit is None:
        return
    encoding = str(response.headers.get("content-encoding", "")).strip().lower()
    if encoding not in ("", "identity"):
        raise _RefusedEncoding(encoding[:40])
    length = str(response.headers.get("content-length", "")).strip()
    if re.fullmatch(r"[0-9]+", length) and (len(length) > 15 or int(length) > limit):
        raise _ReplyTooLarge(f"Content-Length {length[:20]} > {limit}")
    base = next((c for c in type(response.stream).__mro__ if c.__name__ == "SyncByteStream"), None)
    if base is not None:
        response.stream = _capped_stream_class(base)(response.stream, limit, getattr(_REQUEST, "deadline", None))


@functools.lru_cache(maxsize=4)
def _capped_stream_class(base: type) -> type:
    """A subclass of ``base`` (the HTTP library's SyncByteStream) that stops at a byte cap or a deadline."""

    class CappedStream(base):  # type: ignore[misc, valid-type]
        """A response body read chunk by chunk, never past ``limit`` bytes or ``deadline``."""

        def __init__(self, inner: Any, limit: int, deadline: float | None) -> None:
            self._inner, self._limit, self._deadline = inner, limit, deadline

        def __iter__(self) -> Iterator[bytes]:
            total = 0
            for chunk in self._inner:
                total += len(chunk)
                if total > self._limit:
                    raise _ReplyTooLarge(f"more than {self._limit} bytes")
                if self._deadline is not None and time.monotonic() > self._deadline:
                    raise _DeadlinePassed()
                yield chunk

        def close(self) -> None:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()

    return CappedStream


def _pad(pattern: np.ndarray, width: int) -> np.ndarray:
    """Zero-pad a [B, n, n] pattern to [B, width, width] (programs pad to their own batch's longest)."""
    if pattern.shape[-1] == width:
        return pattern
    out = np.zeros(pattern.shape[:-2] + (width, width), dtype=np.float32)
    m = min(width, pattern.shape[-1])
    out[..., :m, :m] = pattern[..., :m, :m]
    return out


def _retry_after(response: Any, limit: float) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if present."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value: float | None = None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = None
    if value is None:
        ra = headers.get("retry-after")
        if ra:
            try:
                value = float(ra)
            except ValueError:
                try:
                    when = email.utils.parsedate_to_datetime(ra)
                    value = when.timestamp() - time.time()
                except (TypeError, ValueError, IndexError, OverflowError):
                    value = None
    if value is None or not math.isfinite(value):
        return None
    return min(max(0.0, value), limit)
