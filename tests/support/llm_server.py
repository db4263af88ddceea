"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for testing the LLM agent offline.

``ScriptedLLMServer`` runs ``http.server.ThreadingHTTPServer`` in a background thread on an ephemeral port
and answers ``POST /v1/chat/completions`` from a *responder*: a function of the recorded request that
returns a :class:`Reply` (a completion, an HTTP error with headers, a slow reply, one that blocks on an
event, or a hostile one: a body dripped one byte at a time, raw bytes such as a huge or deeply nested body). ``by_head`` builds a responder from per-head reply queues, keyed by the head name (``L0H1``) found
in the request's user messages. Every request is recorded (body, messages, head, reply sent, usage) and the
server tracks the largest number of requests in flight at once.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HEAD_RE = re.compile(r"\bL(\d+)H(\d+)\b")


@dataclass
class Reply:
    """What the server sends for one request.

    ``content``: assistant text (status 200). ``status`` != 200: an error with ``body`` and ``headers``
    (e.g. ``{"Retry-After": "0.3"}``). ``delay``: seconds to wait before answering (longer than the
    client timeout = a timeout). ``wait``: an event to block on before answering (kill-and-resume tests).
    ``prompt_tokens`` / ``completion_tokens``: the usage reported (default: characters / 4).
    ``drip``: send the headers, then the body one byte every ``drip`` seconds (``drip_headers``: the
    headers too). ``raw``: a 200 body sent as is instead of a completion: bytes, or a function returning
    an iterable of byte chunks (sent chunked when ``chunked``, else with ``raw_length`` as Content-Length).
    """

    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0
    wait: threading.Event | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    label: str = ""
    drip: float = 0.0
    drip_headers: bool = False
    raw: bytes | Callable[[], Iterable[bytes]] | None = None
    raw_length: int | None = None
    chunked: bool = False

    @classmethod
    def program(cls, program: Any, hypothesis: str = "a hypothesis", kind: str | None = None,
                **kw: Any) -> "Reply":
        """A well-formed JSON answer proposing ``program`` (DSL text, DSL JSON or Python source)."""
        obj: dict[str, Any] = {"hypothesis": hypothesis, "program": program}
        if kind is not None:
            obj["kind"] = kind
        kw.setdefault("label", f"program:{program if isinstance(program, str) else json.dumps(program)}"[:80])
        return cls(content=json.dumps(obj), **kw)

    @classmethod
    def error(cls, status: int, message: str = "scripted error", headers: dict[str, str] | None = None,
              **kw: Any) -> "Reply":
        """An HTTP error in the OpenAI error format."""
        kw.setdefault("label", f"http{status}")
        return cls(status=status, headers=dict(headers or {}),
                   body={"error": {"message": message, "type": "scripted", "code": status}}, **kw)

    @classmethod
    def stream(cls, chunk: bytes, count: int, chunked: bool = True, **kw: Any) -> "Reply":
        """A 200 body of ``count`` copies of ``chunk``, generated as it is sent (never held whole)."""
        kw.setdefault("label", f"stream:{len(chunk) * count}")
        return cls(raw=lambda: (chunk for _ in range(count)), raw_length=None if chunked else len(chunk) * count,
                   chunked=chunked, **kw)


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    index: int
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    started: float
    head: str | None = None
    reply: Reply | None = None
    finished: float | None = None
    usage: dict[str, int] | None = None
    dropped: bool = False
    sent_bytes: int = 0

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def user_text(self) -> str:
        """All user messages joined (what the head name and feedback are searched in)."""
        return "\n".join(str(m.get("content", "")) for m in self.messages if m.get("role") == "user")

    @property
    def last_user(self) -> str:
        users = [str(m.get("content", "")) for m in self.messages if m.get("role") == "user"]
        return users[-1] if users else ""

    @property
    def prompt_text(self) -> str:
        return "\n".join(str(m.get("content", "")) for m in self.messages)


def _peer_closed(h: BaseHTTPRequestHandler) -> bool:
    """True when the client closed its end of the connection (e.g. after its own timeout)."""
    import select
    import socket

    sock = h.connection
    try:
        readable = select.select([sock], [], [], 0)[0]
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


Responder = Callable[[RecordedRequest], Reply]


def head_of(text: str) -> str | None:
    """The first head name (``L<layer>H<head>``) in ``text``, or None."""
    m = HEAD_RE.search(text)
    return f"L{m.group(1)}H{m.group(2)}" if m else None


def by_head(script: dict[str, Iterable[Reply]], default: Reply | Callable[[RecordedRequest], Reply] | None = None
            ) -> Responder:
    """A responder popping replies from one queue per head name; ``default`` when a queue is empty.

    The queues are shared by all threads (a lock keeps the order of arrival).
    """
    queues = {k: deque(v) for k, v in script.items()}
    lock = threading.Lock()

    def respond(req: RecordedRequest) -> Reply:
        with lock:
            q = queues.get(req.head or "")
            if q:
                return q.popleft()
        if default is None:
            return Reply.error(500, f"no scripted reply left for head {req.head!r}")
        return default(req) if callable(default) else default

    return respond


class ScriptedLLMServer:
    """A real HTTP server speaking the chat-completions protocol with scripted replies (see module doc)."""

    def __init__(self, responder: Responder, model: str = "scripted-model") -> None:
        self.responder = responder
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "ScriptedLLMServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                server._handle(self)

            def do_GET(self) -> None:  # noqa: N802
                self._send(404, {"error": {"message": "only POST /v1/chat/completions is scripted"}})

            def _send(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "ScriptedLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries for tests
    def requests_for(self, head: str) -> list[RecordedRequest]:
        with self.lock:
            return [r for r in self.requests if r.head == head]

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no request is being handled (slow replies finished); True if that happened in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.in_flight == 0:
                    return True
            time.sleep(0.02)
        return False

    def usage_totals(self) -> tuple[int, int]:
        """Prompt and completion tokens reported in successful (200) replies."""
        with self.lock:
            done = [r.usage for r in self.requests if r.usage is not None]
        return sum(u["prompt_tokens"] for u in done), sum(u["completion_tokens"] for u in done)

    # ------------------------------------------------------------------ hostile replies
    def _drip(self, h: BaseHTTPRequestHandler, req: RecordedRequest, data: bytes, reply: Reply) -> None:
        """Send the headers (dripped too when ``drip_headers``), then ``data`` one byte per ``reply.drip`` s."""
        head = _header_block(200, {"Content-Type": "application/json", "Content-Length": str(len(data)),
                                   **reply.headers})
        h.close_connection = True
        if not reply.drip_headers:
            _write(h, req, head)
            head = b""
        for k in range(len(head) + len(data)):
            _write(h, req, (head + data)[k:k + 1])
            time.sleep(reply.drip)

    def _send_raw(self, h: BaseHTTPRequestHandler, req: RecordedRequest, reply: Reply) -> None:
        """Send ``reply.raw`` as a 200 body (chunked, or with its Content-Length)."""
        chunks: Iterable[bytes] = [reply.raw] if isinstance(reply.raw, bytes) else reply.raw()  # type: ignore[misc]
        headers = {"Content-Type": "application/json", **reply.headers}
        if reply.chunked:
            headers["Transfer-Encoding"] = "chunked"
        else:
            length = reply.raw_length if reply.raw_length is not None else len(reply.raw)  # type: ignore[arg-type]
            headers["Content-Length"] = str(length)
        h.close_connection = True
        _write(h, req, _header_block(200, headers))
        for chunk in chunks:
            _write(h, req, b"%x\r\n%s\r\n" % (len(chunk), chunk) if reply.chunked else chunk)
        if reply.chunked:
            _write(h, req, b"0\r\n\r\n")

    # ------------------------------------------------------------------ the handler
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        with self.lock:
            req = RecordedRequest(index=len(self.requests), path=h.path, body=body,
                                  headers={k.lower(): v for k, v in h.headers.items()}, started=time.monotonic())
            self.requests.append(req)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if not h.path.rstrip("/").endswith("/chat/completions"):
                h._send(404, {"error": {"message": f"unknown path {h.path}"}})  # type: ignore[attr-defined]
                return
            req.head = head_of(req.user_text)
            reply = self.responder(req)
            req.reply = reply
            if reply.wait is not None:
                reply.wait.wait()
            if reply.delay:
                time.sleep(reply.delay)
            if (reply.delay or reply.wait is not None) and _peer_closed(h):
                req.dropped = True  # the client timed out or went away: it never sees this reply
                return
            if reply.raw is not None:
                self._send_raw(h, req, reply)
                return
            if reply.status != 200:
                h._send(reply.status, reply.body if reply.body is not None else {"error": {"message": "error"}},  # type: ignore[attr-defined]
                        reply.headers)
                return
            prompt = req.prompt_text
            usage = {
                "prompt_tokens": reply.prompt_tokens if reply.prompt_tokens is not None else max(1, len(prompt) // 4),
                "completion_tokens": (reply.completion_tokens if reply.completion_tokens is not None
                                      else max(1, len(reply.content) // 4)),
            }
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            completion = completion_body(req, reply, body.get("model") or self.model, usage)
            if reply.drip:
                self._drip(h, req, json.dumps(completion).encode(), reply)
                return
            h._send(200, completion, reply.headers)  # type: ignore[attr-defined]
            req.usage = usage  # counted only once the client could have read it
        except (BrokenPipeError, ConnectionResetError):
            req.dropped = True  # the client gave up (timeout, refused reply): nothing more to send
        finally:
            with self.lock:
                self.in_flight -= 1
                req.finished = time.monotonic()


def completion_body(req: RecordedRequest, reply: Reply, model: str, usage: dict[str, int]) -> dict[str, Any]:
    """The chat-completion JSON object answering ``req`` with ``reply.content``."""
    return {
        "id": f"chatcmpl-scripted-{req.index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": usage,
    }


def _write(h: BaseHTTPRequestHandler, req: RecordedRequest, data: bytes) -> None:
    """Write and flush ``data`` to the client, counting it in ``req.sent_bytes``."""
    h.wfile.write(data)
    h.wfile.flush()
    req.sent_bytes += len(data)


def _header_block(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} OK"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
