"""The parent's handle on one sandbox worker: spawning from a long-lived thread, deadline-bounded framed I/O.

Nothing a worker sends is unpickled; a frame that breaks the protocol is a :class:`ProtocolError`,
a worker that vanished a :class:`WorkerGone`.
"""
from __future__ import annotations

import json
import os
import pickle
import queue
import select
import signal
import subprocess
import threading
import time
from concurrent.futures import Future
from typing import Any

from .protocol import HDR, MAX_HEADER, MSG, write_all
from ...core import HeadsurgeonError


class WorkerGone(HeadsurgeonError):
    pass


class ProtocolError(HeadsurgeonError):
    pass


class _Spawner:
    """One long-lived thread that starts every zygote, so PR_SET_PDEATHSIG tracks a thread that does not exit early."""

    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="headsurgeon-sandbox-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - every failure goes to the waiting caller
                fut.set_exception(e)

    def call(self, fn: Any) -> Any:
        fut: Future = Future()
        self._q.put((fn, fut))
        return fut.result()


_SPAWNER: _Spawner | None = None
_SPAWNER_LOCK = threading.Lock()


def spawner() -> _Spawner:
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or not _SPAWNER._thread.is_alive():
            _SPAWNER = _Spawner()
        return _SPAWNER


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


_SIGNAL_HINTS: dict[int, str] = {
    signal.SIGSEGV: "segmentation fault: e.g. C-stack overflow from very deep recursion or nesting, "
                    "or a C-extension bug",
    signal.SIGKILL: "killed",
    signal.SIGABRT: "aborted inside a C extension",
    signal.SIGBUS: "bus error",
    signal.SIGSYS: "a forbidden system call",
}


def describe_status(hdr: dict[str, Any], cpu_hard: int) -> tuple[str, str]:
    """(reason, message) for a job child that ended before finishing its chunk."""
    status = hdr.get("status")
    if not isinstance(status, int):
        return "sandbox", "the sandbox reported an unreadable exit status"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        cpu = hdr.get("cpu")
        cpu = cpu if isinstance(cpu, (int, float)) else 0.0
        if sig in (signal.SIGKILL, signal.SIGXCPU) and cpu >= cpu_hard - 1:
            return "timeout", f"the program used up the job's CPU-time budget ({cpu_hard} s) and was killed"
        return "crash", f"the program's process died with {_signal_name(sig)} ({_SIGNAL_HINTS.get(sig, 'a signal')})"
    if os.WIFEXITED(status):
        return "crash", f"the program's process exited with status {os.WEXITSTATUS(status)}"
    return "crash", f"the program's process ended with wait status {status}"


class Worker:
    """Parent-side handle of one zygote: framed, deadline-bounded I/O; never unpickles what it receives."""

    def __init__(self, proc: subprocess.Popen, res_r: int) -> None:
        self.proc = proc
        self.ctl_w = proc.stdin.fileno()  # type: ignore[union-attr]  # Popen with PIPE: stdin is set
        self.ctl_r = proc.stdout.fileno()  # type: ignore[union-attr]  # Popen with PIPE: stdout is set
        self.res_r = res_r
        self.report: dict[str, Any] = {}
        self.jobs = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, msg: dict[str, Any], deadline: float) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            write_all(self.ctl_w, MSG.pack(len(data)) + data, deadline)
        except (OSError, ValueError) as e:
            raise WorkerGone(f"could not reach the sandbox process: {e}") from None

    def _read(self, fd: int, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        # while reading job-child output, the zygote's "done" with nothing left to read means a torn frame
        watch = [fd, self.ctl_r] if fd == self.res_r else [fd]
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                ready = select.select(watch, [], [], left)[0]
                if not ready:
                    raise TimeoutError
                if fd not in ready:
                    raise ProtocolError("a truncated frame: the job process died while writing it")
                k = os.readv(fd, [view[got:]])
            except (OSError, ValueError) as e:
                raise WorkerGone(str(e)) from None
            if k == 0:
                raise WorkerGone("the sandbox process closed its pipe")
            got += k
        return buf

    def read_header(self, fd: int, deadline: float) -> dict[str, Any]:
        (size,) = HDR.unpack(self._read(fd, HDR.size, deadline))
        if size > MAX_HEADER:
            raise ProtocolError(f"a frame header of {size} bytes")
        try:
            header = json.loads(bytes(self._read(fd, size, deadline)))
        except (ValueError, RecursionError) as e:
            raise ProtocolError(f"an unreadable frame header ({e})") from None
        if not isinstance(header, dict) or not isinstance(header.get("t"), str):
            raise ProtocolError("a frame that is not a JSON object with a type")
        return header

    def next_event(self, deadline: float) -> tuple[str, dict[str, Any]]:
        """The next frame from the job child ("res") or, when it has none left, the zygote ("ctl")."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:
            ready = select.select([self.res_r, self.ctl_r], [], [], left)[0]
        except (OSError, ValueError) as e:
            raise WorkerGone(str(e)) from None
        if self.res_r in ready:  # results first: they were written before the child ended
            return "res", self.read_header(self.res_r, time.monotonic() + 10.0)
        if self.ctl_r in ready:
            return "ctl", self.read_header(self.ctl_r, time.monotonic() + 10.0)
        raise TimeoutError

    def read_payload(self, nbytes: int) -> bytearray:
        return self._read(self.res_r, nbytes, time.monotonic() + 10.0 + nbytes / 50e6)

    def drain(self) -> None:
        """Discard whatever a dead job child left in the result pipe."""
        try:
            while select.select([self.res_r], [], [], 0)[0]:
                if not os.read(self.res_r, 1 << 16):
                    break
        except OSError:
            pass

    def kill(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the zygote and its job child
                except (ProcessLookupError, PermissionError):
                    self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - shutting down: the process may already be gone
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except Exception:  # noqa: BLE001 - shutting down: the pipe may already be closed
                pass
        try:
            os.close(self.res_r)
        except OSError:
            pass

    def death(self) -> str:
        """Describe why the zygote ended (waits briefly for it)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "the sandbox process stopped responding"
        if code < 0:
            return f"the sandbox process died with {_signal_name(-code)}"
        return f"the sandbox process exited with status {code}"
