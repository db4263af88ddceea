"""The LLM agent: ask a chat model for programs that reproduce each head, then refine.

Per head: a prompt with example ``synth`` sequences and their strongest ``query -> key (weight)`` pairs,
the DSL and the Sequence API (``headsurgeon.synth.search.llm.prompts``) -> a JSON reply ``{hypothesis, kind,
program}`` -> parse -> validate (``Program.parse`` / ``Program.python``) -> evaluate (DSL kernels, or the
sandbox pool for Python) -> rank by JSD on ``synth`` -> ``rounds`` refinement rounds whose prompt shows
the best programs' worst sequences (real vs predicted keys per query, as token strings) and the failures
-> score the best ``keep`` candidates on ``select`` (IoU and JSD). The final choice across all searchers
happens elsewhere; ``search`` returns ``ScoredProgram`` lists with scores ``{"synth": {"jsd", "iou"},
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

import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from . import prompts
from ...scored import ScoredProgram
from ...errors import ProgramError
from ...program import Program
from ...sequence import sequences_key
from ..base import CandidateMap, PatternSource, StopCheck
from ...splits import StoreSplits
from .config import AgentConfig, AgentConfigError, AgentStats, HeadStatus
from .journal import JOURNAL_VERSION, RunJournal, candidate_from_json, candidate_to_json
from .scoring import HeadContext, ProgramScoring, SynthFit
from .transport import ChatRequests, CostCapReached, RequestFailed, Stopped, echo, excerpt
from ....core import Head, InputError, JournalMismatchError


@dataclass
class ConversationResult:
    """What one conversation with the model produced: a valid program (or None) and the replies it rejected."""

    program: Program | None
    hypothesis: str
    rejected: list[dict[str, Any]]


class LLMAgent(ChatRequests, ProgramScoring):
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
                import openai  # noqa: F401 - imported only to fail early with the install hint
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
        self._should_stop = StopCheck()
        self.stats = AgentStats()
        self._journal: RunJournal | None = None

    def search(self, store: PatternSource, heads: Sequence[tuple[int, int]] | None = None,
               synth_idx: Sequence[int] | None = None, select_idx: Sequence[int] | None = None,
               journal: str | os.PathLike | None = None, *, budget: float | None = None,
               cancel: threading.Event | None = None) -> dict[tuple[int, int], list[ScoredProgram]]:
        """Candidates per head (best select IoU first) from the chat model; resumable through ``journal``.

        ``store``: an ``AttentionStore`` (``sequences``, ``causal``, ``batch``); ``heads``: default all of
        ``store.heads``; ``synth_idx`` / ``select_idx``: store indices of the fit (prompt + JSD ranking)
        and selection (IoU) sequences, which must not overlap; ``budget`` (seconds) / ``cancel``: no new request
        starts once passed / set (like the cost cap), and the heads stop where they are.
        """
        cfg = self.config
        heads = [(int(h[0]), int(h[1])) for h in (store.heads if heads is None else heads)]
        if synth_idx is None or select_idx is None:
            raise InputError("search needs synth_idx and select_idx (store indices of the two splits)")
        synth_idx, select_idx = [int(i) for i in synth_idx], [int(i) for i in select_idx]
        if not synth_idx or not select_idx:
            raise InputError(f"search needs non-empty splits; got {len(synth_idx)} synth and "
                             f"{len(select_idx)} select sequences")
        if set(synth_idx) & set(select_idx):
            raise InputError("synth_idx and select_idx overlap: select on sequences the prompts never showed")
        seqs = store.sequences
        causal = bool(getattr(store, "causal", True))
        synth_seqs = [seqs[i] for i in synth_idx]
        select_seqs = [seqs[i] for i in select_idx]
        self.stats = AgentStats()
        fingerprint = {"synth": sequences_key(synth_seqs), "select": sequences_key(select_seqs),
                       "causal": causal, "store_model": str(getattr(store, "model_name", "") or "")}

        results: dict[tuple[int, int], list[ScoredProgram]] = {}
        self._journal = RunJournal(journal) if journal is not None else None
        if self._journal is not None:
            results.update(self._resume(self._journal, fingerprint, set(heads)))
            self._journal.open()
            self._journal.write({"event": "run", "version": JOURNAL_VERSION, "fingerprint": fingerprint,
                                 "heads": [list(h) for h in heads], "config": cfg.public()}, sync=True)
        for h in heads:
            name = Head.label(h)
            if h in results:
                best = results[h][0].score("select", "iou") if results[h] else None
                self.stats.heads[name] = HeadStatus(status="resumed", candidates=len(results[h]),
                                                    best_select_iou=best)
            else:
                self.stats.heads[name] = HeadStatus()
        todo = [h for h in heads if h not in results]
        self.stats.resumed_heads = len(heads) - len(todo)

        self._stop = False
        self._should_stop = StopCheck(budget, cancel)
        req_pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="llm-request")
        head_pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="llm-head")
        try:
            with tqdm(total=len(heads), initial=len(heads) - len(todo), disable=not cfg.progress,
                      desc="llm agent", unit="head") as bar:
                ctx = HeadContext(store, causal, synth_idx, select_idx, synth_seqs, select_seqs,
                               prompts.system_prompt(causal), req_pool)
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

    def _resume(self, journal: RunJournal, fingerprint: dict[str, Any], wanted: set[tuple[int, int]]
                ) -> dict[tuple[int, int], list[ScoredProgram]]:
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
        restored: dict[tuple[int, int], list[ScoredProgram]] = {}
        for h, e in last.items():
            if h not in wanted or e.get("status") != "done":
                continue
            try:
                restored[h] = [candidate_from_json(c) for c in e.get("candidates", [])]
            except (ProgramError, ValueError, KeyError, TypeError):
                continue  # an unreadable record: ask about this head again
        return restored

    def _run_head(self, head: tuple[int, int], ctx: HeadContext) -> list[ScoredProgram]:
        name = Head.label(head)
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
                                 "candidates": [candidate_to_json(c) for c in cands],
                                 "stats": asdict(hs)}, sync=True)
        return cands

    def _search_head(self, head: tuple[int, int], ctx: HeadContext, hs: HeadStatus) -> tuple[list[ScoredProgram], str]:
        cfg = self.config
        with self._store_lock:
            real, lengths = ctx.store.batch(ctx.synth_idx, [head])
        real = np.asarray(real, dtype=np.float32)
        B = len(ctx.synth_seqs)
        ex = np.unique(np.linspace(0, B - 1, min(cfg.examples, B)).round().astype(np.int64))
        examples = [(ctx.synth_seqs[b], real[0, b, : lengths[b], : lengths[b]]) for b in ex]
        base = prompts.head_prompt(head, examples, ctx.causal, cfg.pair_frac, cfg.max_pairs, cfg.pair_mode,
                             cfg.max_tokens_shown)
        attempts: list[SynthFit] = []
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
            proposals: list[ConversationResult] = []
            for f in futs:
                try:
                    proposals.append(f.result())
                except CostCapReached:
                    status = "cost_cap"
                except Stopped:
                    status = "stopped"
                except RequestFailed as e:
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

    def _propose(self, messages: list[dict[str, str]], head: tuple[int, int], rnd: int) -> ConversationResult:
        """One candidate: ask, and re-ask in the same conversation while the reply is unusable."""
        name = Head.label(head)
        msgs = list(messages)
        rejected: list[dict[str, Any]] = []
        for _ in range(self.config.max_reply_retries + 1):
            content = self._chat(msgs, head, rnd)
            try:
                parsed = prompts.parse_reply(content)
            except prompts.MalformedReply as e:
                with self._lock:
                    self.stats.malformed += 1
                reason = prompts.failure_feedback(e)
                self._event({"event": "malformed", "head": name, "round": rnd, "reason": reason,
                             "reply": (content or "")[:500]})
            else:
                try:
                    # text as the backend's record {"dsl"|"python": text}; DSL JSON as it is
                    program = Program.from_json({parsed.kind: parsed.program} if isinstance(parsed.program, str)
                                                else parsed.program, kind=parsed.kind)
                    return ConversationResult(program, parsed.hypothesis, rejected)
                except (ProgramError, ValueError, TypeError, RecursionError) as e:
                    with self._lock:
                        self.stats.invalid_programs += 1
                        self.stats.failure_reasons["invalid"] += 1
                    msg = prompts.failure_feedback(e)
                    rejected.append({"kind": parsed.kind, "text": parsed.text, "reason": "invalid", "message": msg})
                    self._event({"event": "invalid", "head": name, "round": rnd, "kind": parsed.kind,
                                 "message": excerpt(str(e) or type(e).__name__, 500)})
                    reason = f"the {parsed.kind} program is invalid: {msg}"
            msgs = msgs + [{"role": "assistant", "content": echo(content)},
                           {"role": "user", "content": prompts.retry_message(reason)}]
        return ConversationResult(None, "", rejected)


class LLMSearcher:
    """The LLM agent as a :class:`~headsurgeon.synth.search.base.Searcher`; ``journal``: a JSONL path to resume from."""

    name = "llm"

    def __init__(self, config: AgentConfig | None = None, *, journal: str | os.PathLike | None = None,
                 client: Any = None) -> None:
        self.agent = LLMAgent(config, client=client)
        self.journal = journal

    def search(self, store: PatternSource, splits: StoreSplits, *, heads: Sequence[Head] | None = None,
               progress: bool = True, budget: float | None = None,
               cancel: threading.Event | None = None) -> CandidateMap:
        """Candidates per head, best select IoU first (see :meth:`LLMAgent.search`)."""
        synth, select = splits.checked("the LLM searcher")
        if not progress and self.agent.config.progress:
            self.agent.config = replace(self.agent.config, progress=False)
        found = self.agent.search(store, heads, synth, select, journal=self.journal, budget=budget, cancel=cancel)
        return {Head(*h): cands for h, cands in found.items()}

    def report(self) -> str:
        """The agent's counters in one line."""
        return f"LLM agent: {self.agent.stats.summary()}"
