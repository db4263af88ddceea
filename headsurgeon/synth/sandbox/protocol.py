"""The framing between the parent, a sandbox worker (zygote) and its job processes.

Parent -> zygote: a length-prefixed pickle (the parent is trusted). Sandbox -> parent: a
length-prefixed JSON header, then raw float32 bytes for a result; nothing a sandbox process sends is
ever unpickled.
"""
from __future__ import annotations

import json
import os
import pickle
import select
import struct
import time
from typing import Any

REASONS = frozenset({"crash", "timeout", "memory", "bad_output", "sandbox"})
COSTLY = frozenset({"timeout", "memory"})  # job-reported failures that count toward ``max_failures`` (pool.py
# also counts every failure it detects itself: a death, a missed deadline, a broken frame)

HDR = struct.Struct(">I")  # sandbox -> parent: JSON header length
MSG = struct.Struct(">Q")  # parent -> zygote: pickled message length
MAX_HEADER = 1 << 20
MAX_MESSAGE = 2000
MAX_DETAIL = 6000
MAX_LABEL = 200  # a program's (label, matrix) label: one printable line, sent in the result's JSON header

# Descriptor layout inside a zygote (after hardening) and inside a job child.
FD_CTL_IN, FD_CTL_OUT, FD_RES_OUT, FD_WAKE_R, FD_WAKE_W = 3, 4, 5, 6, 7
CHILD_FD_RES = 3


def write_all(fd: int, data: Any, deadline: float | None = None) -> None:
    view = memoryview(data).cast("B")
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("write timed out")
        n = os.write(fd, view[: 1 << 20])
        view = view[n:]


def send_frame(fd: int, header: dict[str, Any], payload: Any = None) -> None:
    data = json.dumps(header).encode()
    write_all(fd, HDR.pack(len(data)) + data)
    if payload is not None:
        write_all(fd, payload)


def read_exact_blocking(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def recv_message(fd: int) -> dict[str, Any] | None:
    raw = read_exact_blocking(fd, MSG.size)
    if raw is None:
        return None
    body = read_exact_blocking(fd, MSG.unpack(raw)[0])
    return None if body is None else pickle.loads(body)  # from the trusted parent


def label_problem(label: object) -> str | None:
    """Why a result header's ``label`` breaks the protocol (None: absent, or a short printable str)."""
    if label is None:
        return None
    if not isinstance(label, str):
        return f"a label of type {type(label).__name__}"
    if len(label) > MAX_LABEL or not label.isprintable():
        return f"a label of {len(label)} characters that is not one short printable line"
    return None


def error_header(i: int, reason: str, message: str, detail: str = "") -> dict[str, Any]:
    return {"t": "result", "i": i, "ok": False, "reason": reason,
            "message": message[:MAX_MESSAGE], "detail": detail[-MAX_DETAIL:]}
