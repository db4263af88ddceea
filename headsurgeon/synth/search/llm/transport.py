"""Chat requests to an OpenAI-compatible endpoint: one client per thread, a total deadline and a byte cap per
response, retries with backoff on timeouts / 408 / 409 / 429 / 5xx, token and cost accounting, the cost cap."""
from __future__ import annotations

import email.utils
import functools
import math
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..base import StopCheck
from .config import AgentConfig, AgentStats
from .journal import RunJournal
from ....core import HeadsurgeonError
from ....core import Head


class CostCapReached(HeadsurgeonError):
    """The run's cost reached ``cost_cap``: no new request starts."""


class RequestFailed(HeadsurgeonError):
    """A request failed for good (not retryable, or out of retries)."""


class Stopped(HeadsurgeonError):
    """The run was stopped (interrupted, cancelled or out of its time budget)."""


class DeadlinePassed(HeadsurgeonError):
    """A request ran past its total deadline (``request_timeout``)."""


class ReplyTooLarge(HeadsurgeonError):
    """A response is larger than ``max_response_bytes``."""


class RefusedEncoding(HeadsurgeonError):
    """A response is compressed although ``identity`` was asked for (a decompression bomb is unbounded)."""


#: the deadline and byte budget of the request running on this thread (set by ``LLMAgent._send``)
_REQUEST = threading.local()


class ChatRequests:
    """The request side of :class:`~headsurgeon.synth.search.llm.agent.LLMAgent` (a mixin: it uses the agent's
    ``config``, ``stats``, ``_lock``, ``_local``, ``_given_client``, ``_owned_clients``, ``_rng``, ``_sleep``,
    ``_in_flight``, ``_stop``, ``_should_stop`` and ``_journal``)."""

    config: AgentConfig
    stats: AgentStats
    _lock: threading.Lock
    _local: threading.local
    _given_client: Any
    _owned_clients: list[Any]
    _rng: random.Random
    _sleep: Callable[[float], None]
    _in_flight: int
    _stop: bool
    _should_stop: StopCheck
    _journal: RunJournal | None

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
        """An ``openai.OpenAI`` client whose HTTP responses are checked by ``guard_response`` as they stream.

        Redirects are not followed: an endpoint must not make this machine send requests elsewhere.
        """
        import openai

        cfg = self.config
        factory = getattr(openai, "DefaultHttpxClient", None)
        http_client = None if factory is None else factory(
            timeout=cfg.request_timeout, headers={"Accept-Encoding": "identity"}, follow_redirects=False,
            event_hooks={"response": [guard_response]})
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
        close_quietly(client)

    def _close_clients(self) -> None:
        """Close every client this agent built (at the end of ``search``)."""
        with self._lock:
            clients, self._owned_clients = self._owned_clients, []
        for client in clients:
            close_quietly(client)
        self._local = threading.local()

    def _check_budget(self) -> None:
        if self._stop or self._should_stop():
            raise Stopped()
        cap = self.config.cost_cap
        if cap is None:
            return
        with self._lock:
            if self.stats.total_cost >= cap:
                self.stats.cost_capped = True
                raise CostCapReached()

    def _chat(self, messages: list[dict[str, str]], head: tuple[int, int], rnd: int) -> str:
        """One chat completion with retries on timeouts, connection errors, bad responses, 408/409/429 and 5xx."""
        cfg = self.config
        name = Head.label(head)
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
                raise RequestFailed(detail if not retryable else
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
            raise DeadlinePassed()
        if "error" in box:
            raise box["error"]
        return box["response"]

    def _request_failure(self, error: BaseException) -> tuple[str, bool, str, float | None]:
        """(reason, retryable, message, retry-after seconds) of a failed request."""
        import openai

        cfg = self.config
        where = cfg.base_url or "the endpoint"
        chain = list(exception_chain(error))
        if any(isinstance(e, ReplyTooLarge) for e in chain):
            return ("too_large", False, f"the response from {where} exceeds max_response_bytes="
                    f"{cfg.max_response_bytes}; refused without reading the rest", None)
        if any(isinstance(e, RefusedEncoding) for e in chain):
            return ("encoding", False, f"the response from {where} is compressed although 'identity' was asked "
                    "for; compressed responses are refused", None)
        if any(isinstance(e, (DeadlinePassed, openai.APITimeoutError)) for e in chain):
            return "timeout", True, f"no complete response within request_timeout={cfg.request_timeout:g} s", None
        if isinstance(error, openai.APIStatusError):
            code = int(error.status_code)
            text = f"HTTP {code} from {where}: {excerpt(getattr(error, 'message', ''))}"
            if code == 429 or code in (408, 409) or code >= 500:
                reason = "429" if code == 429 else "5xx" if code >= 500 else str(code)
                return reason, True, text, retry_after(getattr(error, "response", None), cfg.retry_after_max)
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
        pt = token_count(getattr(usage, "prompt_tokens", 0)) if usage is not None else 0
        ct = token_count(getattr(usage, "completion_tokens", 0)) if usage is not None else 0
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


def exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and its causes / contexts, each once."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def excerpt(text: Any, limit: int = 300) -> str:
    """``str(text)`` cut to ``limit`` characters (for local logs and errors)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def echo(content: str | None, limit: int = 4000) -> str:
    """A reply as it is sent back in the conversation: cut when long (the endpoint sent it; no need to resend)."""
    content = content or ""
    return content if len(content) <= limit else content[:limit] + f"\n... ({len(content) - limit} more characters cut)"


def token_count(value: Any) -> int:
    """A usage count from the endpoint as an int in [0, 1e9] (0 when it is not a number)."""
    try:
        count = int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0
    return min(max(count, 0), 10**9)


def close_quietly(client: Any) -> None:
    """Close a client; errors (e.g. from a connection another thread is using) do not matter here."""
    try:
        client.close()
    except Exception:  # noqa: BLE001 - closing is best effort (see the docstring)
        pass


def guard_response(response: Any) -> None:
    """httpx response hook: refuse compressed or oversized responses; cap the body and its deadline as it streams."""
    limit = getattr(_REQUEST, "max_bytes", None)
    if limit is None:
        return
    encoding = str(response.headers.get("content-encoding", "")).strip().lower()
    if encoding not in ("", "identity"):
        raise RefusedEncoding(encoding[:40])
    length = str(response.headers.get("content-length", "")).strip()
    if re.fullmatch(r"[0-9]+", length) and (len(length) > 15 or int(length) > limit):
        raise ReplyTooLarge(f"Content-Length {length[:20]} > {limit}")
    base = next((c for c in type(response.stream).__mro__ if c.__name__ == "SyncByteStream"), None)
    if base is not None:
        response.stream = capped_stream_class(base)(response.stream, limit, getattr(_REQUEST, "deadline", None))


@functools.lru_cache(maxsize=4)
def capped_stream_class(base: type) -> type:
    """A subclass of ``base`` (the HTTP library's SyncByteStream) that stops at a byte cap or a deadline."""

    class CappedStream(base):
        """A response body read chunk by chunk, never past ``limit`` bytes or ``deadline``."""

        def __init__(self, inner: Any, limit: int, deadline: float | None) -> None:
            self._inner, self._limit, self._deadline = inner, limit, deadline

        def __iter__(self) -> Iterator[bytes]:
            total = 0
            for chunk in self._inner:
                total += len(chunk)
                if total > self._limit:
                    raise ReplyTooLarge(f"more than {self._limit} bytes")
                if self._deadline is not None and time.monotonic() > self._deadline:
                    raise DeadlinePassed()
                yield chunk

        def close(self) -> None:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()

    return CappedStream


def retry_after(response: Any, limit: float) -> float | None:
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
