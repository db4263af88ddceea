"""The sandbox side: a zygote that forks one job process per chunk, which runs the program on each sequence.

A zygote imports numpy and this package only (never torch or the caller's code), warms up what
programs use, hardens itself (:mod:`.hardening`) and then never runs program code. Each job process
adds the per-job limits, loads the program into restricted builtins, runs it under CPU and wall
timers and streams one frame per sequence (:mod:`.protocol`).
"""
from __future__ import annotations

import builtins
import json
import linecache
import math
import os
import pickle
import re
import resource
import select
import signal
import sys
import types
import traceback
from typing import Any

import numpy as np

from .. import pysafety
from .hardening import harden_child, harden_zygote
from .facade import TokenizerFacade
from . import spacy_shim
from .protocol import (CHILD_FD_RES, COSTLY, FD_CTL_IN, FD_CTL_OUT, FD_WAKE_R, FD_WAKE_W, MAX_DETAIL, MAX_LABEL,
                       MAX_MESSAGE, error_header, recv_message, send_frame)
from .views import SequenceView, sequence_view

PROGRAM_FILE = "<program>"
#: what ``import spacy`` gives a program: a module holding only ``load`` (headsurgeon/synth/sandbox/spacy_shim.py)
SPACY_MODULE = types.ModuleType("spacy")
SPACY_MODULE.__dict__["load"] = spacy_shim.load


class _SandboxTimeout(BaseException):
    """Raised inside the program by SIGALRM / SIGXCPU; BaseException so ``except Exception`` cannot swallow it."""


class _BadOutput(Exception):
    pass


_W: dict[str, Any] = {"in_user": False, "cpu_hard": resource.RLIM_INFINITY, "timer": "wall", "memory_mb": 0}


def _warm_up() -> None:
    """Import/touch everything programs and the sandbox use, so nothing needs a new file after hardening."""
    import _socket  # noqa: F401 - imported now: after the uid drop the files may be unreadable
    import importlib
    import platform
    import socket  # noqa: F401 - imported now: after the uid drop the files may be unreadable
    import warnings

    platform.machine()
    warnings.simplefilter("ignore")
    pysafety.allowed_attributes()  # cached before hardening: the import hook consults it for `from numpy import x`
    for mod in ("numpy._core._methods", "numpy._core._internal", "numpy._core._exceptions", "numpy._core.arrayprint",
                "numpy._core._dtype", "numpy._core._ufunc_config", "numpy.exceptions", "numpy.dtypes"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    a = np.arange(16, dtype=np.float64).reshape(4, 4) + np.eye(4)
    np.linalg.norm(a), np.linalg.inv(a), np.linalg.eigh(a + a.T), np.linalg.svd(a), np.linalg.solve(a, a[0])
    np.fft.fft(a[0]), np.fft.rfft(a[0]), np.random.default_rng(0).random(3), np.random.seed(0)
    np.char.upper(np.array(["a"])), np.strings.lower(np.array(["A"])), np.emath.sqrt(-1.0)
    np.einsum("ij->i", a), np.convolve(a[0], a[1]), np.unique(a), np.tril(a), np.searchsorted(a[0], 2.0)
    np.argwhere(np.isfinite(a)), np.array2string(a), repr(a), str(np.float32(1.5)), np.cumsum(a, axis=1)
    a.sum(axis=1, keepdims=True), a.mean(0), a.std(), a.max(1), a.argmax(1), a.clip(0, 1), a.round(2)
    try:
        np.asarray([[1, 2], [3]])
    except ValueError:
        pass
    with np.errstate(all="ignore"):
        (a / 0).astype(np.float32)
    for pat in (r"\w+", r"[.!?]$", r"(?i)^[A-Z]"):
        re.compile(pat).findall("Ab c. d!"), re.sub(pat, "", "x"), re.split(pat, "a b")
    math.sqrt(2.0), math.log(2.0), math.exp(1.0)
    views = [sequence_view({"ids": [1, 2], "tokens": ["a", "b"], "text": "ab", "offsets": [[0, 1], [1, 2]],
                            "features": {"i": np.zeros(2, np.int64), "b": np.zeros(2, bool), "s": ["x", "y"],
                                         "f": np.zeros(2, np.float32), "u": np.array(["q", "r"])}})]
    view = SequenceView(pickle.loads(pickle.dumps(views, protocol=pickle.HIGHEST_PROTOCOL))[0])
    tok = _facade(view, views[0])
    tok("ab", return_tensors="pt").input_ids[0], tok.convert_ids_to_tokens([1, 2]), tok.decode([1, 2]), tok.tokenize("a")
    spacy_shim.set_documents({"ab": ((("ab", 0, "", "X", "X", "ROOT", 0, "ab", "", False, False, False, False, True,
                                       True),), (), ((0, 1),))})
    doc = spacy_shim.load()("ab")
    [(t.head.i, list(t.children), t.sent.start) for t in doc], doc.ents, list(doc.sents), doc[0:1].text
    spacy_shim.set_documents({})
    _split_label(("warm-up", np.zeros((2, 2))))
    try:
        raise ValueError("warm-up")
    except ValueError as e:
        _describe_exception(e)
    json.dumps({"a": [1.5, "x"]})


def _describe_exception(e: BaseException) -> tuple[str, str]:
    """One-line message (type, text, program line) and a traceback restricted to the program's frames."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break reporting
        text = "<unprintable>"
    if len(text) > 500:
        text = text[:500] + "..."
    msg = f"{type(e).__name__}: {text}" if text else type(e).__name__
    detail = ""
    try:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == PROGRAM_FILE]
        if frames:
            last = frames[-1]
            line = (last.line or "").strip()
            msg += f" (at line {last.lineno}" + (f": {line[:120]}" if line else "") + ")"
            detail = ("Traceback (program frames, most recent call last):\n"
                      + "".join(traceback.format_list(frames[-8:])) + msg)
    except Exception:  # noqa: BLE001 - the plain message stands when the traceback cannot be read
        pass
    return msg, detail[-MAX_DETAIL:]


def _quiet_print(*_a: Any, **_k: Any) -> None:
    """``print`` inside programs: output is discarded (sandbox processes have no stdout)."""


def _safe_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """``__import__`` for programs: the allowlist, plus numpy's own C-level lazy imports of loaded modules.

    numpy's C code imports helpers (e.g. ``numpy._core._methods``) through the *calling frame's*
    builtins, i.e. through this hook; those calls (``PyImport_Import``) pass an empty *list* as
    ``fromlist`` (``import`` statements pass None or a tuple) and only name modules already loaded.
    """
    if (isinstance(fromlist, list) and not fromlist and not level and name.startswith("numpy.")
            and name in sys.modules):
        return builtins.__import__(name, globals, locals, fromlist, level)
    why = pysafety.check_import(name, tuple(fromlist or ()), level)
    if why is not None:
        raise ImportError(f"import of {name!r} is blocked in the program sandbox: {why}")
    if name in pysafety.SHIMMED_IMPORTS:
        return SPACY_MODULE
    return builtins.__import__(name, globals, locals, fromlist, level)


def _program_globals(unrestricted: bool) -> dict[str, Any]:
    if unrestricted:  # test hook only: shows the OS layer holds against arbitrary code
        b: Any = builtins
    else:
        b = {n: getattr(builtins, n) for n in pysafety.SAFE_BUILTINS + pysafety.SAFE_EXCEPTIONS if hasattr(builtins, n)}
        b["print"] = _quiet_print
        b["__import__"] = _safe_import
    return {"__builtins__": b, "__name__": "__program__", "np": np, "numpy": np, "math": math, "re": re}


def _on_timer(signum: int, _frame: Any) -> None:
    if _W["in_user"]:
        _W["timer"] = "CPU" if signum == signal.SIGXCPU else "wall"
        _W["fired"] = True  # remembered: a program that swallows the exception still timed out
        raise _SandboxTimeout()


def _cpu_used() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _arm(timeout: float) -> None:
    hard = _W["cpu_hard"]
    soft = int(_cpu_used() + timeout) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass
    _W["in_user"], _W["fired"] = True, False
    signal.setitimer(signal.ITIMER_REAL, max(timeout, 1e-3))


def _disarm() -> None:
    _W["in_user"] = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    hard = _W["cpu_hard"]
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    except (ValueError, OSError):
        pass


def _check_output(out: Any, n: int, max_cells: int) -> np.ndarray:
    """Validate a program's return value: a numeric, finite n x n array-like; returns C-contiguous float32."""
    if out is None:
        raise _BadOutput("the function returned None; return an n x n array of scores (row i = query i)")
    if isinstance(out, (list, tuple)) and len(out) != n:
        raise _BadOutput(f"the function returned a {type(out).__name__} of {len(out)} rows; expected {n} (n x n)")
    try:
        arr = np.asarray(out)
    except (ValueError, TypeError) as e:
        raise _BadOutput(f"the return value is not a rectangular numeric array ({type(e).__name__}: {e})") from None
    if arr.dtype.kind not in "biuf":
        raise _BadOutput(f"the return value has dtype {arr.dtype} ({type(out).__name__}); scores must be real numbers")
    if arr.ndim != 2 or arr.shape != (n, n):
        raise _BadOutput(f"the return value has shape {tuple(arr.shape)}; expected ({n}, {n}) for this sequence")
    if arr.size > max_cells:
        raise _BadOutput(f"the return value has {arr.size} cells; the sandbox limit is {max_cells}")
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(f32)
    if not finite.all():
        i, j = (int(x) for x in np.argwhere(~finite)[0])
        bad = int((~finite).sum())
        raise _BadOutput(
            f"score[{i}, {j}] is {float(arr[i, j])!r} ({bad} non-finite value(s)); scores must be finite "
            "(not NaN/inf, within float32 range): fix the division or log that produced it"
        )
    return f32


def _split_label(out: Any) -> tuple[str | None, Any]:
    """``(label, matrix)`` -> the checked label and the matrix; anything else is a bare matrix (label None)."""
    if not (isinstance(out, tuple) and len(out) == 2 and np.ndim(out[1]) == 2):
        return None, out
    label = out[0]
    if not isinstance(label, str):
        raise _BadOutput(f"the label (first item of the returned pair) must be a str, got {type(label).__name__}")
    if len(label) > MAX_LABEL:
        raise _BadOutput(f"the label has {len(label)} characters; at most {MAX_LABEL} are allowed (a short name)")
    if not label.isprintable():
        raise _BadOutput("the label must be one line of printable characters (no newlines or control characters)")
    return label, out[1]


def _facade(view: SequenceView, raw: dict[str, Any]) -> TokenizerFacade:
    """The tokenizer facade of one window (headsurgeon/synth/sandbox/facade.py)."""
    return TokenizerFacade(view.text, view.ids.tolist(), view.tokens, view.offsets, bool(raw.get("has_bos")),
                           features=view.features, words=raw.get("words"))


def _run_guarded(fn: Any, arg: Any, timeout: float, post: Any = None) -> tuple[str, Any, str]:
    """Run ``fn(arg)`` (then ``post``) with the timers armed; returns (status, value|message, detail)."""
    try:
        _arm(timeout)
        try:
            value = fn(arg)
            if _W.get("fired"):
                raise _SandboxTimeout()
            if post is not None:
                value = post(value)
        finally:
            _disarm()
        return "ok", value, ""
    except _SandboxTimeout as e:
        msg, detail = _describe_exception(e)
        where = msg.split(" (at ", 1)[1].rstrip(")") if " (at " in msg else "an unknown line"
        kind = "CPU time" if _W["timer"] == "CPU" else "time"
        return "timeout", f"the program exceeded its {timeout:g} s {kind} limit (interrupted at {where})", detail
    except _BadOutput as e:
        return "bad_output", str(e), ""
    except MemoryError as e:
        msg, detail = _describe_exception(e)
        return "memory", f"the program ran out of memory (the sandbox cap is {_W['memory_mb']} MiB): {msg}", detail
    except RecursionError as e:
        msg, detail = _describe_exception(e)
        return "crash", f"{msg}; avoid deep recursion (use loops)", detail
    except BaseException as e:  # noqa: BLE001 - anything the program raises is its error, not ours
        msg, detail = _describe_exception(e)
        return "crash", f"the program raised {msg}", detail


def _run_job(job: dict[str, Any], out: int, max_cells: int) -> None:
    """In the job child: load the program, run it on each sequence, stream one frame per sequence."""
    source, name, timeout = job["source"], job["name"], float(job["timeout"])
    eaps = int(job.get("params", 1)) == 2

    def send(header: dict[str, Any], payload: Any = None) -> None:
        send_frame(out, {**header, "job": job["job"]}, payload)  # the parent accepts frames only for this job

    budget = int(job.get("max_failures", 2))
    failures: list[str] = []
    linecache.cache[PROGRAM_FILE] = (len(source), None, source.splitlines(True), PROGRAM_FILE)
    g = _program_globals(bool(job.get("unrestricted")))

    def load(_: Any) -> Any:
        exec(compile(source, PROGRAM_FILE, "exec", dont_inherit=True), g)  # noqa: S102 - this is the sandbox
        fn = g.get(name)
        if not callable(fn):
            raise NameError(f"the program defines no function named {name!r}")
        return fn

    status, fn, detail = _run_guarded(load, None, timeout)
    if status != "ok":
        send({"t": "loaded", "ok": False, "reason": status, "detail": detail,
                    "message": f"{fn} while loading the program (top-level code)"[:MAX_MESSAGE]})
        return
    send({"t": "loaded", "ok": True})
    for i, v in enumerate(job["views"]):
        if len(failures) >= budget:
            send({**error_header(
                i, failures[-1], f"not run: the program already failed {len(failures)} time(s) in this call "
                f"({failures[-1]}); remaining sequences skipped"), "skipped": True})
            continue
        n = int(v["n"])
        try:
            view = SequenceView(v)
        except Exception as e:  # noqa: BLE001 - a bad view is that sequence's error, not the worker's
            send(error_header(i, "sandbox", f"could not build the sequence view: {e!r}"))
            continue
        np.random.seed(0)  # programs using the global RNG are reproducible per sequence
        spacy_shim.set_documents(v.get("spacy") or {})  # this window's parses, made by the parent
        if eaps:  # prog(sentence, tokenizer): the window's exact text and its tokenizer facade
            tok = _facade(view, v)
            call: Any = lambda sv, tok=tok: fn(sv.text, tok)  # noqa: E731 - the two-argument EAPS call adapted in place
        else:
            call = fn

        def post(o: Any, n: int = n) -> tuple[str | None, np.ndarray]:
            label, matrix = _split_label(o)
            return label, _check_output(matrix, n, max_cells)

        status, value, detail = _run_guarded(call, view, timeout, post)
        if status == "ok":
            label, arr = value
            header = {"t": "result", "i": i, "ok": True, "nbytes": int(arr.nbytes)}
            if label is not None:
                header["label"] = label
            send(header, arr)
        else:
            if status in COSTLY:
                failures.append(status)
            send(error_header(i, status, value, detail))
        del value, view


def _reap(pid: int) -> tuple[int, float, bool]:
    """In the zygote: wait for the job child, killing it if the parent asks; returns (status, cpu, killed)."""
    killed = False
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid == pid:
            return status, usage.ru_utime + usage.ru_stime, killed
        ready = select.select([FD_CTL_IN, FD_WAKE_R], [], [], 0.25)[0]
        if FD_WAKE_R in ready:
            try:
                while os.read(FD_WAKE_R, 512):
                    pass
            except BlockingIOError:
                pass
        if FD_CTL_IN in ready:
            msg = recv_message(FD_CTL_IN)
            if msg is None:  # the parent went away
                os.kill(pid, signal.SIGKILL)
                os.wait4(pid, 0)
                os._exit(0)
            if msg.get("op") == "kill" and not killed:
                os.kill(pid, signal.SIGKILL)
                killed = True


def _zygote_loop(cfg: dict[str, Any]) -> None:
    max_cells = int(cfg["max_cells"])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(FD_WAKE_W, warn_on_full_buffer=False)
    me = os.getpid()
    while True:
        msg = recv_message(FD_CTL_IN)
        if msg is None:
            os._exit(0)
        if msg.get("op") != "job":
            continue  # a late "kill" for a job that already ended
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                harden_child(cfg, int(msg["cpu_hard"]), me)
                _W["cpu_hard"] = int(msg["cpu_hard"])
                _run_job(msg, CHILD_FD_RES, max_cells)
                code = 0
            except BaseException:  # noqa: BLE001 - our own failure: try to say so, then die
                try:
                    send_frame(CHILD_FD_RES, {"t": "fatal", "error": traceback.format_exc()[-MAX_DETAIL:]})
                except BaseException:  # noqa: BLE001 - the parent is gone: nothing is left to tell
                    pass
            finally:
                os._exit(code)
        status, cpu, killed = _reap(pid)
        send_frame(FD_CTL_OUT, {"t": "done", "status": status, "cpu": cpu, "killed": killed})


def worker_main(cfg_json: str) -> None:
    """Entry point of a sandbox zygote process (see the module docstring for the hardening order)."""
    cfg = json.loads(cfg_json)
    _W["memory_mb"] = cfg["memory_bytes"] >> 20
    ctl_in, ctl_out, res_out = os.dup(0), os.dup(1), int(cfg["res_fd"])
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGALRM, _on_timer)
    signal.signal(signal.SIGXCPU, _on_timer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out_fd = ctl_out
    try:
        _warm_up()
        report = harden_zygote(cfg, ctl_in, ctl_out, res_out)
        out_fd = FD_CTL_OUT
        report["memory_mb"] = _W["memory_mb"]
        send_frame(FD_CTL_OUT, {"t": "ready", "report": report})
    except BaseException:  # noqa: BLE001 - tell the parent why, then die
        try:
            send_frame(out_fd, {"t": "fatal", "error": traceback.format_exc()[-MAX_DETAIL:]})
        finally:
            os._exit(70)
    _zygote_loop(cfg)


BOOT = (
    "import sys, types\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    "for _n, _p in (('headsurgeon', []), ('headsurgeon.synth', [sys.argv[2]])):\n"
    "    _m = types.ModuleType(_n); _m.__path__ = _p; sys.modules[_n] = _m\n"
    "from headsurgeon.synth.sandbox.worker import worker_main\n"
    "worker_main(sys.argv[1])\n"
)
