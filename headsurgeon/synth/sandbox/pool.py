"""SandboxPool: the one class callers use; a thread-safe pool of hardened workers that runs a program over sequences.

It is long because it is one protocol: chunking, checkout/checkin of workers, and the per-chunk state
machine that turns every frame, timeout or death into a result or a named error.
"""
from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

import numpy as np

from .. import pysafety
from ..errors import ProgramExecutionError, ProgramValidationError
from .parent import ProtocolError, Worker, WorkerGone, describe_status, spawner
from .protocol import COSTLY, MAX_DETAIL, MAX_MESSAGE, REASONS, label_problem
from .views import features_for, sequence_view, spacy_documents
from .worker import BOOT
from ...core import InputError

SYNTH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _default_workers() -> int:
    env = os.environ.get("HEADSURGEON_SANDBOX_WORKERS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(4, (os.cpu_count() or 2) - 1))


def _kill_all(workers: set) -> None:
    for w in list(workers):
        w.kill()
    workers.clear()


class _RunState:
    def __init__(self, n: int, max_failures: int) -> None:
        self.results: list[Any] = [None] * n
        self.labels: list[str | None] = [None] * n
        self.chunks: collections.deque[list[int]] = collections.deque()
        self.lock = threading.Lock()
        self.failures = 0
        self.max_failures = max_failures
        self.last_failure: tuple[str, str] = ("crash", "")

    def take(self) -> list[int] | None:
        with self.lock:
            return self.chunks.popleft() if self.chunks else None

    def requeue(self, chunk: list[int]) -> None:
        if chunk:
            with self.lock:
                self.chunks.appendleft(chunk)

    def failed(self, reason: str, message: str) -> None:
        with self.lock:
            self.failures += 1
            self.last_failure = (reason, message)

    def remaining_budget(self) -> int:
        with self.lock:
            return self.max_failures - self.failures


class SandboxPool:
    """A pool of hardened sandbox processes that run validated Python programs over sequences.

    ``workers``: parallel zygotes (default: cpu_count - 1, at most 4; env HEADSURGEON_SANDBOX_WORKERS);
    ``memory_mb``: RLIMIT_AS per job; ``max_n``: longest sequence accepted (output max_n x max_n);
    ``chunk_size``: sequences per job (one fork, ~10 ms, and one round trip); ``sandbox_uid``: uid a root sandbox
    drops to (None keeps root: tests only); ``seccomp``: install the syscall filters;
    ``start_timeout``: seconds a zygote may take to start. Zygotes start lazily on first use.
    Thread-safe; use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        memory_mb: int = 1024,
        max_n: int = 4096,
        chunk_size: int = 32,
        sandbox_uid: int | None = 65534,
        seccomp: bool = True,
        start_timeout: float = 60.0,
    ) -> None:
        self.workers = int(workers) if workers else _default_workers()
        if self.workers < 1:
            raise InputError(f"workers must be >= 1, got {workers}")
        if memory_mb < 128:
            raise InputError(f"memory_mb={memory_mb} is too small for a Python+numpy sandbox; use >= 128")
        self.memory_mb = int(memory_mb)
        self.max_n = int(max_n)
        self.chunk_size = max(1, int(chunk_size))
        self.sandbox_uid = sandbox_uid
        self.seccomp = bool(seccomp)
        self.start_timeout = float(start_timeout)
        self.hardening: dict[str, Any] = {}
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._live = 0
        self._all: set[Worker] = set()
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._all)

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> "SandboxPool":
        """Start all zygotes now (otherwise they start on first use); raises RuntimeError if one cannot start."""
        got = [self._checkout() for _ in range(self.workers)]
        for w in got:
            self._checkin(w)
        return self

    def close(self) -> None:
        """Kill every sandbox process; the pool cannot be used afterwards."""
        with self._cond:
            self._closed = True
            self._idle.clear()
            self._cond.notify_all()
        _kill_all(self._all)

    @property
    def closed(self) -> bool:
        return self._closed

    def _spawn(self) -> Worker:
        res_r, res_w = os.pipe()
        cfg = {
            "memory_bytes": self.memory_mb << 20,
            "max_cells": self.max_n * self.max_n,
            "sandbox_uid": self.sandbox_uid,
            "seccomp": self.seccomp,
            "parent_pid": os.getpid(),
            "res_fd": res_w,
        }
        env = {
            "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1",
            "VECLIB_MAXIMUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
        }
        errfile = tempfile.TemporaryFile()
        argv = [sys.executable, "-s", "-c", BOOT, json.dumps(cfg), SYNTH_DIR]

        def popen() -> subprocess.Popen:
            return subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile, env=env, cwd="/",
                close_fds=True, pass_fds=(res_w,), start_new_session=True,
            )

        try:
            proc = spawner().call(popen)
        except OSError as e:
            errfile.close()
            os.close(res_r)
            raise RuntimeError(f"could not start a sandbox process ({sys.executable}): {e}") from None
        finally:
            os.close(res_w)
        w = Worker(proc, res_r)
        try:
            hdr = w.read_header(w.ctl_r, time.monotonic() + self.start_timeout)
            if hdr.get("t") == "fatal":
                raise ProtocolError(f"it reported:\n{str(hdr.get('error'))[-MAX_DETAIL:]}")
            if hdr.get("t") != "ready" or not isinstance(hdr.get("report"), dict):
                raise ProtocolError("it sent no ready frame")
        except (TimeoutError, WorkerGone, ProtocolError) as e:
            w.kill()
            errfile.seek(0)
            tail = errfile.read()[-3000:].decode("utf-8", "replace").strip()
            errfile.close()
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            raise RuntimeError(
                f"a sandbox process failed to start ({why}; exit code {w.proc.returncode}); "
                f"its stderr ends with:\n{tail or '<empty>'}"
            ) from None
        errfile.close()
        w.report = dict(hdr["report"])
        w.report["job_limits"] = {
            "RLIMIT_NPROC": [0, 0], "RLIMIT_NOFILE": [5, 5], "RLIMIT_CPU": "per job: timeout * (chunk + 1) + 2 s",
            "seccomp": ("fork/vfork/clone/clone3/setsid/setpgid, signals, prlimit and scheduling calls on "
                        "others, prctl, System V and POSIX IPC, every file-system call (open, unlink, rename, "
                        "mkdir, truncate, getdents, chmod, chown, link ...) and metadata call (stat, access, "
                        "readlink, xattrs, statfs; fstat only with AT_EMPTY_PATH)"
                        if w.report.get("seccomp") else "off"),
            "empty_root": bool(w.report.get("empty_root")),
            "landlock": (f"ABI {w.report['landlock_abi']}: no file-system access" if w.report.get("landlock_abi")
                         else "unavailable"),
        }
        self.hardening = dict(w.report)
        return w

    def _checkout(self) -> Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("this SandboxPool is closed; create a new one or use get_pool()")
                while self._idle:
                    w = self._idle.pop()
                    if w.alive():
                        return w
                    self._forget(w)
                if self._live < self.workers:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            w = self._spawn()
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._all.add(w)
            if self._closed:
                self._forget(w)
                raise RuntimeError("this SandboxPool is closed")
        return w

    def _forget(self, w: Worker) -> None:
        """Drop a zygote (caller holds the condition)."""
        self._all.discard(w)
        self._live -= 1
        w.kill()
        self._cond.notify()

    def _checkin(self, w: Worker) -> None:
        with self._cond:
            if self._closed or not w.alive():
                self._forget(w)
            else:
                self._idle.append(w)
                self._cond.notify()

    def _discard(self, w: Worker) -> None:
        with self._cond:
            self._forget(w)

    # ---- running ----------------------------------------------------------------------------------
    def run(
        self,
        source: str,
        sequences: list,
        timeout: float = 5.0,
        *,
        max_failures: int = 2,
        _skip_validation: bool = False,
        _unrestricted: bool = False,
    ) -> list[np.ndarray | ProgramExecutionError]:
        """Run the program on each sequence; returns, per sequence, a float32 [n, n] array or a ProgramExecutionError.

        A program may be ``f(seq)`` or EAPS's ``prog(sentence, tokenizer)`` (the window's text and a tokenizer
        facade, headsurgeon/synth/sandbox/facade.py), and may return ``(label, matrix)``; :meth:`run_labeled` also
        returns the labels.

        ``timeout``: wall-clock (and CPU) seconds per sequence. ``max_failures``: after this many
        timeouts, out-of-memory errors, process deaths or broken result frames in one call (exceptions
        the program raises are its per-sequence result and cost nothing), the remaining sequences are not run
        (each reports that), so a program that hangs costs about ``max_failures * timeout`` of wall time
        (each parallel worker may spend the remaining budget once), not ``n * timeout``.
        Raises :class:`ProgramValidationError` when the source fails validation; never raises for
        anything the program does. ``_skip_validation`` / ``_unrestricted`` (tests only) bypass the
        AST layer / also the restricted builtins, to show the OS limits hold on their own.
        """
        return self.run_labeled(source, sequences, timeout, max_failures=max_failures,
                                _skip_validation=_skip_validation, _unrestricted=_unrestricted)[0]

    def run_labeled(
        self,
        source: str,
        sequences: list,
        timeout: float = 5.0,
        *,
        max_failures: int = 2,
        _skip_validation: bool = False,
        _unrestricted: bool = False,
    ) -> tuple[list[np.ndarray | ProgramExecutionError], list[str | None]]:
        """:meth:`run`, plus per sequence the label the program returned beside its matrix (None: no label)."""
        if os.getpid() != self._pid:
            raise RuntimeError("a SandboxPool cannot be used from a forked child; create a new one there")
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if _skip_validation or _unrestricted:
            info = _unvalidated_info(source)
        else:
            info = pysafety.analyze_source(source)
        sequences = list(sequences)
        state = _RunState(len(sequences), max(1, int(max_failures)))
        views = self._prepare(sequences, info, state)
        todo = [i for i, r in enumerate(state.results) if r is None]
        if not todo:
            return state.results, state.labels
        per = max(1, min(self.chunk_size, math.ceil(len(todo) / self.workers)))
        for k in range(0, len(todo), per):
            state.chunks.append(todo[k:k + per])
        job = {"op": "job", "source": source, "name": info.name, "timeout": float(timeout),
               "unrestricted": bool(_unrestricted), "params": int(info.params)}
        n_threads = min(self.workers, len(state.chunks))
        if n_threads <= 1:
            self._drive(job, views, state, timeout)
        else:
            threads = [threading.Thread(target=self._drive, args=(job, views, state, timeout), daemon=True)
                       for _ in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for i, r in enumerate(state.results):  # belt and braces: the caller always gets one entry per sequence
            if r is None:
                state.results[i] = ProgramExecutionError(f"sequence {i}: no result (internal sandbox error)", "sandbox")
        return state.results, state.labels

    def _prepare(self, sequences: list, info: pysafety.ProgramInfo, state: _RunState) -> list[dict | None]:
        feats, missing = features_for(sequences, info)
        parses: list = [None] * len(sequences)
        if info.uses_spacy:  # the window's parse, made here (headsurgeon/synth/sandbox/spacy_shim.py)
            try:
                parses = spacy_documents(sequences)
            except Exception as e:  # noqa: BLE001 - e.g. no spaCy model installed: each sequence says why
                why = f"the program imports spacy, and its parses could not be made here: {type(e).__name__}: {e}"
                for i in range(len(sequences)):
                    state.results[i] = ProgramExecutionError(f"sequence {i}: {why}"[:MAX_MESSAGE], "sandbox")
                return [None] * len(sequences)
        words = info.params == 2 and info.mentions(("word_ids",))  # the facade's Encoding.word_ids()
        views: list[dict | None] = []
        for i, s in enumerate(sequences):
            try:
                v = sequence_view(s, feats[i], missing[i], words=words)
                if parses[i] is not None:
                    v["spacy"] = parses[i]
            except Exception as e:  # noqa: BLE001 - any failure to build a view is that sequence's error
                state.results[i] = ProgramExecutionError(
                    f"sequence {i}: cannot be sent to the sandbox: {type(e).__name__}: {e}", "sandbox")
                views.append(None)
                continue
            if v["n"] > self.max_n:
                state.results[i] = ProgramExecutionError(
                    f"sequence {i} has {v['n']} tokens; the sandbox accepts at most max_n={self.max_n} "
                    "(the output is n x n): split the text or raise SandboxPool(max_n=...)", "sandbox")
                views.append(None)
                continue
            views.append(v)
        return views

    def _drive(self, job: dict[str, Any], views: list, state: _RunState, timeout: float) -> None:
        worker: Worker | None = None
        try:
            while True:
                chunk = state.take()
                if chunk is None:
                    break
                if state.remaining_budget() <= 0:
                    reason, last = state.last_failure
                    for i in chunk:
                        state.results[i] = ProgramExecutionError(
                            f"sequence {i}: not run: the program already failed {state.failures} time(s) in this "
                            f"call (last: {last}); remaining sequences skipped", reason)
                    continue
                if worker is None:
                    try:
                        worker = self._checkout()
                    except RuntimeError as e:
                        for i in chunk:
                            state.results[i] = ProgramExecutionError(f"sequence {i}: {e}", "sandbox")
                        continue
                worker = self._run_chunk(worker, chunk, job, views, state, timeout)
        except BaseException as e:  # noqa: BLE001 - never let a driver thread die silently
            if worker is not None:
                self._discard(worker)
                worker = None
            for i, r in enumerate(state.results):
                if r is None:
                    state.results[i] = ProgramExecutionError(
                        f"sequence {i}: internal sandbox error: {type(e).__name__}: {e}", "sandbox")
            if not isinstance(e, Exception):
                raise
        finally:
            if worker is not None:
                self._checkin(worker)

    def _run_chunk(self, w: Worker, chunk: list[int], job: dict, views: list, state: _RunState,
                   timeout: float) -> Worker | None:
        """Run one chunk as one job; returns the zygote if it may be reused, else None (it was killed)."""
        grace = 1.0 + 0.25 * timeout
        cpu_hard = int(math.ceil(timeout * (len(chunk) + 1))) + 2
        pos = 0  # index into chunk of the sequence being waited for
        loaded = False

        def fail(reason: str, message: str, detail: str = "", whole: bool = False) -> None:
            """Record a failure of the current sequence (or all of an unloaded chunk) and charge it to the
            program's budget, whatever it was (a timeout, a death, a broken frame); requeue the rest."""
            targets = chunk[pos:] if whole else chunk[pos:pos + 1]
            for i in targets:
                state.results[i] = ProgramExecutionError(f"sequence {i}: {message}", reason, detail)
            state.failed(reason, message)
            if not whole:
                state.requeue(chunk[pos + 1:])

        try:
            budget = max(1, state.remaining_budget())  # the job child stops early on its own too
            job_id = os.urandom(8).hex()
            w.send({**job, "job": job_id, "views": [views[i] for i in chunk], "max_failures": budget,
                    "cpu_hard": cpu_hard}, time.monotonic() + 30.0)
            w.jobs += 1
            while True:
                finished = loaded and pos >= len(chunk)
                kind, hdr = w.next_event(time.monotonic() + (grace if finished else timeout + grace))
                if kind == "ctl":
                    if hdr["t"] != "done":
                        raise ProtocolError(f"expected 'done' from the zygote, got {hdr['t']!r}")
                    if not finished:  # the job child died early
                        reason, message = describe_status(hdr, cpu_hard)
                        where = "while loading the program" if not loaded else "while running the program"
                        fail(reason, f"{message} {where}", whole=not loaded)
                    w.drain()
                    return w
                t = hdr["t"]
                if t == "fatal":
                    raise ProtocolError(f"internal error in the job process: {str(hdr.get('error'))[-1500:]}")
                if hdr.get("job") != job_id:
                    raise ProtocolError(f"a frame for another request ({str(hdr.get('job'))[:40]!r})")
                if not loaded:
                    if t != "loaded":
                        raise ProtocolError(f"expected 'loaded', got {t!r}")
                    loaded = True
                    if not hdr.get("ok"):
                        reason = str(hdr.get("reason")) if hdr.get("reason") in REASONS else "crash"
                        fail(reason, str(hdr.get("message", "the program failed to load"))[:MAX_MESSAGE],
                             str(hdr.get("detail", ""))[-MAX_DETAIL:], whole=True)
                        pos = len(chunk)
                    continue
                if finished or t != "result" or hdr.get("i") != pos:
                    raise ProtocolError(f"unexpected frame {str(hdr)[:200]}")
                i = chunk[pos]
                n = views[i]["n"]
                if hdr.get("ok") is True:
                    bad = label_problem(hdr.get("label"))
                    if bad is not None:
                        raise ProtocolError(bad)
                    nbytes = hdr.get("nbytes")
                    if nbytes != n * n * 4:
                        raise ProtocolError(f"a result of {nbytes!r} bytes for n={n}")
                    arr = np.frombuffer(w.read_payload(nbytes), dtype="<f4").reshape(n, n)
                    if not np.isfinite(arr).all():
                        raise ProtocolError("non-finite values in a result the job process had validated")
                    state.results[i] = arr
                    state.labels[i] = hdr.get("label")
                else:
                    if hdr.get("reason") not in REASONS:
                        raise ProtocolError(f"unknown reason {hdr.get('reason')!r}")
                    reason = str(hdr.get("reason"))
                    message = str(hdr.get("message", ""))[:MAX_MESSAGE]
                    state.results[i] = ProgramExecutionError(
                        f"sequence {i}: {message}", reason, str(hdr.get("detail", ""))[-MAX_DETAIL:])
                    if reason in COSTLY and not hdr.get("skipped"):
                        state.failed(reason, message)
                pos += 1
        except TimeoutError:
            if pos < len(chunk):
                fail("timeout", f"the program ran longer than {timeout:g} s (wall clock) without yielding to the "
                                "in-process timer (e.g. a long C-level loop); its process was killed")
            return self._abort(w)
        except ProtocolError as e:
            if pos < len(chunk):
                fail("sandbox", f"the program's process broke the result protocol ({e}); it was killed")
            return self._abort(w)
        except WorkerGone as e:  # the zygote itself (which never runs program code) is gone
            why = w.death() if not w.alive() else str(e)
            self._discard(w)
            if pos < len(chunk):
                fail("sandbox", f"{why} while running the program; it was replaced")
            return None

    def _abort(self, w: Worker) -> Worker | None:
        """Have the zygote SIGKILL its job child; if it does not confirm promptly, kill the zygote too."""
        try:
            w.send({"op": "kill"}, time.monotonic() + 2.0)
            deadline = time.monotonic() + 5.0
            while True:
                hdr = w.read_header(w.ctl_r, deadline)
                if hdr["t"] == "done":
                    break
            w.drain()
            return w
        except (TimeoutError, WorkerGone, ProtocolError):
            self._discard(w)
            return None


def _unvalidated_info(source: str) -> pysafety.ProgramInfo:
    """Function name and mentions of an UNVALIDATED source (test hooks only)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ProgramValidationError(f"line {e.lineno}: syntax error: {e.msg}") from None
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if not funcs:
        raise ProgramValidationError("the program defines no top-level function")
    attrs = frozenset(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    a = funcs[-1].args
    params = 2 if len(a.posonlyargs) + len(a.args) - len(a.defaults) == 2 else 1
    spacy = any(isinstance(n, ast.Import) and any(x.name == "spacy" for x in n.names) for n in ast.walk(tree))
    return pysafety.ProgramInfo(name=funcs[-1].name, attributes=attrs, strings=frozenset(), params=params,
                                uses_spacy=spacy)
