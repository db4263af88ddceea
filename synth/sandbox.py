"""Sandboxed execution of untrusted Python programs in a reusable pool of hardened worker processes.

Python programs (DESIGN section 2) are untrusted text. They are validated by the AST allowlist in
:mod:`headsurgeon.synth.pysafety` and then run *only* here, inside worker processes, never in the caller.

Layers (each assumes the previous one may fail):

1. **AST validation** (``pysafety.analyze_source``) in the parent before anything is sent.
2. **Restricted runtime** in the worker: programs get a builtins dict with only the safe builtins, an
   ``__import__`` that admits numpy/math/re only, and ``np``/``math``/``re`` pre-bound.
3. **Operating-system limits** applied to the worker once at start, *before* any program runs:

   - ``RLIMIT_AS`` (``memory_mb``, default 1 GiB): allocations beyond it raise ``MemoryError``;
   - ``RLIMIT_CPU``: hard limit per worker (``worker_cpu_seconds``; SIGKILL when exceeded, the worker is
     recycled well before), soft limit re-armed per sequence at ``timeout`` CPU-seconds (SIGXCPU ->
     timeout error); plus ``ITIMER_REAL`` at ``timeout`` wall-seconds for a graceful in-worker timeout;
   - ``RLIMIT_NPROC = 0``: no new processes or threads (fork bombs fail with EAGAIN). Root is exempt
     from NPROC, so a root worker first drops to uid/gid ``sandbox_uid`` (65534, "nobody"), which also
     takes away every capability (it cannot raise its hard limits back);
   - ``RLIMIT_FSIZE = 0`` (SIGXFSZ ignored): no file can grow; ``RLIMIT_CORE = 0``;
   - ``RLIMIT_NOFILE`` locked at the worker's 5 descriptors (stdin/stdout/stderr on /dev/null, the two
     protocol pipes): any ``open``/``socket``/``pipe`` fails with EMFILE, so no file reads, writes or sockets;
   - a private, empty network namespace (``unshare(CLONE_NEWNET)``; as non-root with a user namespace)
     where the kernel allows it, so even a socket that existed would reach nothing;
   - a seccomp filter (x86_64/aarch64) that denies fork/vfork/clone/clone3/execve/execveat, socket/
     socketpair, ptrace/process_vm_*, unshare/setns/mount, bpf/perf_event_open/userfaultfd/keyrings and
     signals to any process but itself; ``PR_SET_NO_NEW_PRIVS``; ``socket`` module functions replaced;
   - ``PR_SET_PDEATHSIG`` (SIGKILL) so workers die with the caller; a new session (no terminal signals).

4. **Parent-side enforcement**: a wall-clock deadline per sequence (``timeout`` + grace); on expiry,
   crash or protocol violation the worker is killed (SIGKILL) and replaced. Nothing the worker sends is
   unpickled: results come back as a small JSON header plus raw float32 bytes, checked against the
   expected shape and for finiteness.

What each layer reports is in :attr:`SandboxPool.hardening` (a worker records which limits really took
effect, e.g. ``netns: false`` where the kernel forbids namespaces).

Not enforced here: ``execve`` on architectures without the seccomp table (the new image would still
inherit every limit above); CPU *share* (a busy program occupies one core until its timeout); and
information leaks via timing. Workers are spawned (fork+exec of a fresh interpreter, like
multiprocessing's 'spawn' start method but without re-importing the caller's ``__main__``) from a
dedicated thread, with a minimal environment and one BLAS thread; they import only numpy and this
package's ``synth/errors.py``, ``synth/pysafety.py`` and ``synth/sandbox.py`` (not torch).

API::

    pool = SandboxPool(workers=2, memory_mb=1024)
    results = pool.run(source, sequences, timeout=5.0)   # list[np.ndarray | ProgramExecutionError]
    get_pool().run(...)                                  # shared, lazily started, closed at exit
"""
from __future__ import annotations

import atexit
import builtins
import collections
import ctypes
import fcntl
import json
import linecache
import math
import os
import pickle
import queue
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from . import pysafety
from .errors import ProgramExecutionError, ProgramValidationError
from .pysafety import validate_source

__all__ = [
    "SandboxPool",
    "get_pool",
    "shutdown_pool",
    "sequence_view",
    "validate_source",
    "SequenceView",
    "FeatureNamespace",
    "REASONS",
]

REASONS = frozenset({"crash", "timeout", "memory", "bad_output", "sandbox"})
_COSTLY = frozenset({"timeout", "memory"})  # failures that count toward ``max_failures``

_HDR = struct.Struct(">I")  # worker -> parent: JSON header length
_JOB = struct.Struct(">Q")  # parent -> worker: pickled job length
_MAX_HEADER = 1 << 20
_MAX_MESSAGE = 2000
_MAX_DETAIL = 6000
_PROGRAM_FILE = "<program>"
_SYNTH_DIR = os.path.dirname(os.path.abspath(__file__))

_SPACY_VIEWS_FALLBACK = ("pos", "tag", "lemma", "dep", "dep_head", "pos_index", "spacy_index", "spacy_sentence_index")
_WORDNET_VIEWS_FALLBACK = ("is_noun_wordnet", "is_verb_wordnet")


# ==================================================================================================
# What programs see (built in the worker from plain picklable dicts)
# ==================================================================================================


class FeatureNamespace:
    """``seq.features`` inside a program: precomputed views by attribute (``seq.features.word_index``)."""

    __slots__ = ("_values", "_missing")

    def __init__(self, values: dict[str, Any], missing: str | None = None) -> None:
        self._values = dict(values)
        self._missing = missing

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        missing = object.__getattribute__(self, "_missing")
        raise AttributeError(
            f"seq.features has no view {name!r}; available: {', '.join(sorted(values)) or 'none'}"
            + (f" ({missing})" if missing else "")
        )

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def keys(self) -> list[str]:
        """Names of the available views."""
        return sorted(self._values)

    def to_dict(self) -> dict[str, Any]:
        """All views as a plain dict (a shallow copy)."""
        return dict(self._values)

    def __repr__(self) -> str:
        return f"FeatureNamespace({', '.join(sorted(self._values))})"


class SequenceView:
    """``seq`` inside a program: ids (int64 [n]), tokens, text, offsets (int64 [n, 2]), n, features."""

    __slots__ = ("ids", "tokens", "text", "offsets", "n", "features")

    def __init__(self, view: Mapping[str, Any]) -> None:
        ids = np.array(view["ids"], dtype=np.int64).reshape(-1)
        offsets = np.array(view["offsets"], dtype=np.int64).reshape(-1, 2)
        ids.setflags(write=False)
        offsets.setflags(write=False)
        self.ids = ids
        self.tokens = list(view["tokens"])
        self.text = str(view["text"])
        self.offsets = offsets
        self.n = int(ids.shape[0])
        self.features = FeatureNamespace(view.get("features") or {}, view.get("features_missing"))

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"SequenceView(n={self.n})"


def sequence_view(seq: Any, features: Mapping[str, Any] | None = None, features_missing: str | None = None) -> dict:
    """Convert a Sequence (or a mapping with ids/tokens/text/offsets[/features]) to the plain picklable view sent to workers."""
    if isinstance(seq, Mapping):
        ids = np.asarray(seq["ids"], dtype=np.int64).reshape(-1)
        n = int(ids.shape[0])
        tokens = [str(t) for t in seq.get("tokens", [""] * n)]
        text = str(seq.get("text", ""))
        offsets = np.asarray(seq.get("offsets", np.zeros((n, 2), np.int64)), dtype=np.int64).reshape(-1, 2)
        feats = dict(features if features is not None else (seq.get("features") or {}))
    else:
        ids = np.asarray(seq.ids, dtype=np.int64).reshape(-1)
        n = int(ids.shape[0])
        tokens = [str(t) for t in seq.tokens]
        text = str(seq.text)
        offsets = np.asarray(seq.offsets, dtype=np.int64).reshape(-1, 2)
        feats = dict(features or {})
    if len(tokens) != n or offsets.shape[0] != n:
        raise ValueError(
            f"sequence fields disagree: {n} ids, {len(tokens)} tokens, {offsets.shape[0]} offsets; "
            "build them from one tokenization"
        )
    return {"ids": ids, "tokens": tokens, "text": text, "offsets": offsets, "n": n,
            "features": feats, "features_missing": features_missing}


# ==================================================================================================
# Worker side
# ==================================================================================================


class _SandboxTimeout(BaseException):
    """Raised inside the program by SIGALRM / SIGXCPU; BaseException so ``except Exception`` cannot swallow it."""


class _BadOutput(Exception):
    pass


_W: dict[str, Any] = {"in_user": False, "cpu_hard": 0, "timer": "wall"}

# x86_64 / aarch64 syscall numbers for the seccomp filter.
_SECCOMP_TABLES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "arch": 0xC000003E, "x32": True, "seccomp_nr": 317,
        "deny": {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone": 56, "socket": 41,
                 "socketpair": 53, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
                 "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "bpf": 321,
                 "perf_event_open": 298, "userfaultfd": 323, "add_key": 248, "request_key": 249,
                 "keyctl": 250, "io_uring_setup": 425},
        "enosys": {"clone3": 435},
        "self_only": {"kill": 62, "tkill": 200, "tgkill": 234},
    },
    "aarch64": {
        "arch": 0xC00000B7, "x32": False, "seccomp_nr": 277,
        "deny": {"clone": 220, "execve": 221, "execveat": 281, "socket": 198, "socketpair": 199,
                 "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97,
                 "setns": 268, "mount": 40, "umount2": 39, "bpf": 280, "perf_event_open": 241,
                 "userfaultfd": 282, "add_key": 217, "request_key": 218, "keyctl": 219, "io_uring_setup": 425},
        "enosys": {"clone3": 435},
        "self_only": {"kill": 129, "tkill": 130, "tgkill": 131},
    },
}


def _seccomp_program(table: dict[str, Any], pid: int) -> bytes:
    """Assemble a classic-BPF seccomp filter: deny listed syscalls (EPERM), clone3 (ENOSYS), signals to others."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, errno_, kill = 0x7FFF0000, 0x00050000, 0x80000000
    prog: list[list[Any]] = []

    def emit(code: int, k: int, jt: Any = 0, jf: Any = 0) -> None:
        prog.append([code, jt, jf, k])

    emit(ld, 4)  # seccomp_data.arch
    emit(jeq, table["arch"], 0, "kill")
    emit(ld, 0)  # seccomp_data.nr
    if table["x32"]:
        emit(jge, 0x40000000, "eperm", 0)  # x32 ABI syscalls
    for nr in table["deny"].values():
        emit(jeq, nr, "eperm", 0)
    for nr in table["enosys"].values():
        emit(jeq, nr, "enosys", 0)
    for nr in table["self_only"].values():
        emit(jeq, nr, "self", 0)
    emit(ret, allow)
    labels = {"self": len(prog)}
    emit(ld, 16)  # args[0], low 32 bits (little endian)
    emit(jeq, pid & 0xFFFFFFFF, "allow", "eperm")
    labels["allow"] = len(prog)
    emit(ret, allow)
    labels["eperm"] = len(prog)
    emit(ret, errno_ | 1)
    labels["enosys"] = len(prog)
    emit(ret, errno_ | 38)
    labels["kill"] = len(prog)
    emit(ret, kill)
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256
        out.append(struct.pack("HBBI", code, jt, jf, k))
    return b"".join(out)


def _install_seccomp(libc: Any) -> str | None:
    """Install the seccomp filter on all threads; returns None on success or why it was not installed."""
    import platform

    table = _SECCOMP_TABLES.get(platform.machine())
    if table is None:
        return f"no seccomp table for {platform.machine()}"
    code = _seccomp_program(table, os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(code) // 8, ctypes.addressof(buf))
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog); fall back to prctl(PR_SET_SECCOMP).
    L = ctypes.c_long
    rc = libc.syscall(L(table["seccomp_nr"]), L(1), L(1), ctypes.byref(fprog))
    if rc != 0:
        rc = libc.prctl(L(22), L(2), ctypes.byref(fprog), L(0), L(0))
    if rc != 0:
        return f"seccomp refused (errno {ctypes.get_errno()})"
    return None


def _net_blocked(*_a: Any, **_k: Any) -> Any:
    raise PermissionError("network access is disabled inside the program sandbox")


def _harden(cfg: dict[str, Any], rfd: int, wfd: int) -> tuple[dict[str, Any], int, int]:
    """Apply the OS limits to this worker (order matters); returns the report and the new protocol fds."""
    report: dict[str, Any] = {"pid": os.getpid(), "notes": []}
    notes: list[str] = report["notes"]
    libc = ctypes.CDLL(None, use_errno=True)
    was_root = os.geteuid() == 0

    # 1. empty network namespace (needs CAP_SYS_ADMIN, or an unprivileged user namespace)
    netns = False
    if libc.unshare(ctypes.c_int(0x40000000)) == 0:  # CLONE_NEWNET
        netns = True
    elif not was_root and libc.unshare(ctypes.c_int(0x10000000 | 0x40000000)) == 0:  # CLONE_NEWUSER | CLONE_NEWNET
        netns = True
    else:
        notes.append(f"network namespace unavailable (errno {ctypes.get_errno()}); relying on seccomp/NOFILE")
    report["netns"] = netns

    # 2. drop root: RLIMIT_NPROC does not bind root, and root could raise its own hard limits
    uid = cfg.get("sandbox_uid")
    if was_root and uid is not None:
        try:
            os.setgroups([])
            os.setgid(int(uid))
            os.setuid(int(uid))
        except OSError as e:
            notes.append(f"could not drop root to uid {uid}: {e}; fork is still blocked by seccomp")
    report["uid"] = os.getuid()
    report["euid"] = os.geteuid()

    # 3. no privilege gain through execve; die with the parent (set after setuid, which clears it)
    L = ctypes.c_ulong
    report["no_new_privs"] = libc.prctl(L(38), L(1), L(0), L(0), L(0)) == 0
    if cfg.get("pdeathsig"):
        libc.prctl(L(1), L(int(signal.SIGKILL)), L(0), L(0), L(0))
        if os.getppid() != cfg.get("parent_pid"):
            os._exit(3)  # parent already gone

    # 4. resource limits (soft == hard so the program cannot raise them)
    limits = {
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_FSIZE": (0, 0),
        "RLIMIT_NPROC": (0, 0),
        "RLIMIT_AS": (cfg["memory_bytes"], cfg["memory_bytes"]),
        "RLIMIT_CPU": (cfg["cpu_hard"], cfg["cpu_hard"]),
    }
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past FSIZE returns EFBIG instead of killing us
    applied = {}
    for name, (soft, hard) in limits.items():
        which = getattr(resource, name)
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as e:
            notes.append(f"{name} not applied: {e}")
        applied[name] = list(resource.getrlimit(which))
    _W["cpu_hard"] = cfg["cpu_hard"]

    # 5. friendlier errors for socket use (the kernel-level blocks are seccomp and NOFILE)
    import _socket
    import socket

    for mod in (socket, _socket):
        for fn in ("socket", "socketpair", "create_connection", "create_server", "fromfd", "getaddrinfo"):
            if hasattr(mod, fn):
                setattr(mod, fn, _net_blocked)

    # 6. seccomp
    why = _install_seccomp(libc) if cfg.get("seccomp", True) else "disabled by configuration"
    report["seccomp"] = why is None
    if why is not None:
        notes.append(why)

    # 7. descriptors: 0-2 on /dev/null, protocol on 3 (in) and 4 (out), nothing else; then lock NOFILE
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    tmp_r, tmp_w = fcntl.fcntl(rfd, fcntl.F_DUPFD, 16), fcntl.fcntl(wfd, fcntl.F_DUPFD, 16)
    for fd in (rfd, wfd, devnull):
        if 2 < fd < 16:
            os.close(fd)
    os.dup2(tmp_r, 3)
    os.dup2(tmp_w, 4)
    os.closerange(5, max(5, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (5, 5))
        report["nofile_locked"] = True
    except (ValueError, OSError) as e:
        report["nofile_locked"] = False
        notes.append(f"RLIMIT_NOFILE not locked: {e}")
    applied["RLIMIT_NOFILE"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
    report["rlimits"] = applied
    return report, 3, 4


def _warm_up() -> None:
    """Import/touch everything programs and the worker use, so nothing needs a new file after NOFILE is locked."""
    import _socket  # noqa: F401 - imported now: after the uid drop the files may be unreadable
    import platform
    import socket  # noqa: F401
    import warnings

    platform.machine()
    warnings.simplefilter("ignore")
    import importlib

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
    SequenceView(pickle.loads(pickle.dumps(views, protocol=pickle.HIGHEST_PROTOCOL))[0])
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
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == _PROGRAM_FILE]
        if frames:
            last = frames[-1]
            line = (last.line or "").strip()
            msg += f" (at line {last.lineno}" + (f": {line[:120]}" if line else "") + ")"
            shown = frames[-8:]
            detail = "Traceback (program frames, most recent call last):\n" + "".join(
                traceback.format_list(shown)
            ) + msg
    except Exception:  # noqa: BLE001
        pass
    return msg, detail[-_MAX_DETAIL:]


def _quiet_print(*_a: Any, **_k: Any) -> None:
    """``print`` inside programs: output is discarded (workers have no stdout)."""


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
        raise _SandboxTimeout()


def _cpu_used() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _arm(timeout: float) -> None:
    hard = _W["cpu_hard"]
    soft = min(hard, int(_cpu_used() + timeout) + 1)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass
    _W["in_user"] = True
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
        raise _BadOutput(
            f"the return value has dtype {arr.dtype} ({type(out).__name__}); scores must be real numbers"
        )
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
            f"score[{i}, {j}] is {arr[i, j]!r} ({bad} non-finite value(s)); scores must be finite "
            "(NaN/inf, or beyond float32 range) - fix the division/log that produced it"
        )
    return f32


def _send(fd: int, header: dict[str, Any], payload: Any = None) -> None:
    data = json.dumps(header).encode()
    _write_all(fd, _HDR.pack(len(data)) + data)
    if payload is not None:
        _write_all(fd, payload)


def _write_all(fd: int, data: Any, deadline: float | None = None) -> None:
    view = memoryview(data).cast("B")
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("write timed out")
        n = os.write(fd, view[: 1 << 20])
        view = view[n:]


def _read_exact_blocking(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _error_header(i: int, reason: str, message: str, detail: str = "") -> dict[str, Any]:
    return {"t": "result", "i": i, "ok": False, "reason": reason,
            "message": message[:_MAX_MESSAGE], "detail": detail[-_MAX_DETAIL:]}


def _run_guarded(fn: Any, arg: Any, timeout: float, post: Any = None) -> tuple[str, Any, str]:
    """Run ``fn(arg)`` (then ``post``) with the timers armed; returns (status, value|message, detail)."""
    try:
        _arm(timeout)
        try:
            value = fn(arg)
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
        return "memory", f"the program ran out of memory (the sandbox cap is {_W.get('memory_mb')} MiB): {msg}", detail
    except RecursionError as e:
        msg, detail = _describe_exception(e)
        return "crash", f"{msg}; avoid deep recursion (use loops)", detail
    except BaseException as e:  # noqa: BLE001 - anything the program raises is its error, not ours
        msg, detail = _describe_exception(e)
        return "crash", f"the program raised {msg}", detail


def _worker_loop(rfd: int, wfd: int, max_cells: int) -> None:
    np_err = np.geterr()
    while True:
        raw = _read_exact_blocking(rfd, _JOB.size)
        if raw is None:
            os._exit(0)
        body = _read_exact_blocking(rfd, _JOB.unpack(raw)[0])
        if body is None:
            os._exit(0)
        job = pickle.loads(body)  # from the trusted parent
        recycle = False
        source, name, timeout = job["source"], job["name"], float(job["timeout"])
        budget = int(job.get("max_failures", 2))
        failures: list[str] = []
        views = job["views"]
        linecache.cache[_PROGRAM_FILE] = (len(source), None, source.splitlines(True), _PROGRAM_FILE)
        np.seterr(**np_err)
        g = _program_globals(bool(job.get("unrestricted")))

        def load(_: Any) -> Any:
            exec(compile(source, _PROGRAM_FILE, "exec", dont_inherit=True), g)  # noqa: S102 - the sandbox
            fn = g.get(name)
            if not callable(fn):
                raise NameError(f"the program defines no function named {name!r}")
            return fn

        status, fn, detail = _run_guarded(load, None, timeout)
        if status != "ok":
            recycle = status == "memory"
            where = "while loading the program (top-level code)"
            _send(wfd, {"t": "loaded", "ok": False, "reason": status,
                        "message": f"{fn} {where}"[:_MAX_MESSAGE], "detail": detail})
        else:
            _send(wfd, {"t": "loaded", "ok": True})
            for i, v in enumerate(views):
                n = int(v["n"])
                if len(failures) >= budget:
                    _send(wfd, {**_error_header(
                        i, failures[-1], f"not run: the program already failed {len(failures)} time(s) in this "
                        f"call ({failures[-1]}); remaining sequences skipped"), "skipped": True})
                    continue
                try:
                    view = SequenceView(v)
                except Exception as e:  # noqa: BLE001
                    _send(wfd, _error_header(i, "sandbox", f"could not build the sequence view: {e!r}"))
                    continue
                np.random.seed(0)  # programs using the global RNG are reproducible per sequence
                status, value, detail = _run_guarded(fn, view, timeout, lambda out, n=n: _check_output(out, n, max_cells))
                if status == "ok":
                    _send(wfd, {"t": "result", "i": i, "ok": True, "nbytes": int(value.nbytes)}, value)
                else:
                    recycle = recycle or status == "memory"
                    if status in _COSTLY:
                        failures.append(status)
                    _send(wfd, _error_header(i, status, value, detail))
                del value
        _send(wfd, {"t": "done", "cpu": _cpu_used(), "recycle": recycle})
        if recycle:
            os._exit(0)


def _worker_main(cfg_json: str) -> None:
    """Entry point of a sandbox worker process (see the module docstring for the hardening order)."""
    cfg = json.loads(cfg_json)
    _W["memory_mb"] = cfg["memory_bytes"] >> 20
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGALRM, _on_timer)
    signal.signal(signal.SIGXCPU, _on_timer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _warm_up()
        report, rfd, wfd = _harden(cfg, rfd, wfd)
        report["memory_mb"] = _W["memory_mb"]
        _send(wfd, {"t": "ready", "report": report})
        _worker_loop(rfd, wfd, int(cfg["max_cells"]))
    except BaseException:  # noqa: BLE001 - our own failure: tell the parent, then die
        try:
            _send(wfd, {"t": "fatal", "error": traceback.format_exc()[-_MAX_DETAIL:]})
        finally:
            os._exit(70)


_BOOT = (
    "import sys, types\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    "for _n, _p in (('headsurgeon', []), ('headsurgeon.synth', [sys.argv[2]])):\n"
    "    _m = types.ModuleType(_n); _m.__path__ = _p; sys.modules[_n] = _m\n"
    "from headsurgeon.synth.sandbox import _worker_main\n"
    "_worker_main(sys.argv[1])\n"
)


# ==================================================================================================
# Parent side
# ==================================================================================================


class _WorkerGone(Exception):
    pass


class _ProtocolError(Exception):
    pass


class _Spawner:
    """One long-lived thread that starts every worker, so PR_SET_PDEATHSIG tracks a thread that does not exit early."""

    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="headsurgeon-sandbox-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

    def call(self, fn: Any) -> Any:
        fut: Future = Future()
        self._q.put((fn, fut))
        return fut.result()


_SPAWNER: _Spawner | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> _Spawner:
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


class _Worker:
    """Parent-side handle of one worker process: framed, deadline-bounded I/O; never unpickles its output."""

    def __init__(self, proc: subprocess.Popen, errfile: Any) -> None:
        self.proc = proc
        self.errfile = errfile
        self.wfd = proc.stdin.fileno()  # type: ignore[union-attr]
        self.rfd = proc.stdout.fileno()  # type: ignore[union-attr]
        self.report: dict[str, Any] = {}
        self.cpu = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send_job(self, job: dict[str, Any], deadline: float) -> None:
        data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(self.wfd, _JOB.pack(len(data)) + data, deadline)
        except (OSError, ValueError) as e:
            raise _WorkerGone(f"could not send the job: {e}") from None

    def _read(self, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                ready = select.select([self.rfd], [], [], left)[0]
            except (OSError, ValueError) as e:
                raise _WorkerGone(str(e)) from None
            if not ready:
                raise TimeoutError
            try:
                k = os.readv(self.rfd, [view[got:]])
            except OSError as e:
                raise _WorkerGone(str(e)) from None
            if k == 0:
                raise _WorkerGone("the worker closed its pipe")
            got += k
        return buf

    def read_header(self, deadline: float) -> dict[str, Any]:
        (size,) = _HDR.unpack(self._read(_HDR.size, deadline))
        if size > _MAX_HEADER:
            raise _ProtocolError(f"header of {size} bytes")
        try:
            header = json.loads(bytes(self._read(size, deadline)))
        except (ValueError, RecursionError) as e:
            raise _ProtocolError(f"unreadable header: {e}") from None
        if not isinstance(header, dict) or not isinstance(header.get("t"), str):
            raise _ProtocolError("header is not a frame")
        return header

    def read_payload(self, nbytes: int, deadline: float) -> bytearray:
        return self._read(nbytes, deadline)

    def kill(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.errfile):
            try:
                if f is not None:
                    f.close()
            except Exception:  # noqa: BLE001
                pass

    def death(self) -> str:
        """Describe why the worker process ended (waits briefly for it)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "the worker stopped responding"
        if code < 0:
            sig = -code
            hint = {
                signal.SIGSEGV: "segmentation fault: e.g. C-stack overflow from very deep recursion or nesting",
                signal.SIGKILL: "killed: the worker's CPU-time hard limit or the system's OOM killer",
                signal.SIGABRT: "aborted inside a C extension",
                signal.SIGXCPU: "CPU time limit",
                signal.SIGBUS: "bus error (memory mapping)",
            }.get(sig, "terminated by a signal")
            return f"the worker died with {_signal_name(sig)} ({hint})"
        return f"the worker exited with status {code}"


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

    def exhausted(self) -> bool:
        with self.lock:
            return self.failures >= self.max_failures


class SandboxPool:
    """A pool of hardened worker processes that run validated Python programs over sequences.

    ``workers``: processes (default: cpu_count - 1, at most 4; env HEADSURGEON_SANDBOX_WORKERS);
    ``memory_mb``: RLIMIT_AS per worker; ``max_n``: longest sequence accepted (output max_n x max_n);
    ``worker_cpu_seconds``: RLIMIT_CPU hard limit per worker (recycled at half of it);
    ``chunk_size``: sequences per worker round trip; ``sandbox_uid``: uid a root worker drops to;
    ``seccomp``: install the syscall filter; ``start_timeout``: seconds a worker may take to start.
    Workers start lazily on first use. Thread-safe; use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        memory_mb: int = 1024,
        max_n: int = 4096,
        worker_cpu_seconds: int = 600,
        chunk_size: int = 16,
        sandbox_uid: int | None = 65534,
        seccomp: bool = True,
        start_timeout: float = 60.0,
    ) -> None:
        self.workers = int(workers) if workers else _default_workers()
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if memory_mb < 128:
            raise ValueError(f"memory_mb={memory_mb} is too small for a Python+numpy worker; use >= 128")
        self.memory_mb = int(memory_mb)
        self.max_n = int(max_n)
        self.worker_cpu_seconds = max(10, int(worker_cpu_seconds))
        self.chunk_size = max(1, int(chunk_size))
        self.sandbox_uid = sandbox_uid
        self.seccomp = bool(seccomp)
        self.start_timeout = float(start_timeout)
        self.hardening: dict[str, Any] = {}
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._live = 0
        self._all: set[_Worker] = set()
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._all)

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> "SandboxPool":
        """Start all workers now (otherwise they start on first use); raises RuntimeError if one cannot start."""
        got = [self._checkout() for _ in range(self.workers)]
        for w in got:
            self._checkin(w)
        return self

    def close(self) -> None:
        """Kill every worker; the pool cannot be used afterwards."""
        with self._cond:
            self._closed = True
            self._idle.clear()
            self._cond.notify_all()
        _kill_all(self._all)

    @property
    def closed(self) -> bool:
        return self._closed

    def _spawn(self) -> _Worker:
        cfg = {
            "memory_bytes": self.memory_mb << 20,
            "cpu_hard": self.worker_cpu_seconds,
            "max_cells": self.max_n * self.max_n,
            "sandbox_uid": self.sandbox_uid,
            "seccomp": self.seccomp,
            "pdeathsig": True,
            "parent_pid": os.getpid(),
        }
        env = {
            "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1",
            "VECLIB_MAXIMUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
        }
        errfile = tempfile.TemporaryFile()
        argv = [sys.executable, "-s", "-c", _BOOT, json.dumps(cfg), _SYNTH_DIR]

        def popen() -> subprocess.Popen:
            return subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile, env=env, cwd="/",
                close_fds=True, start_new_session=True,
            )

        try:
            proc = _spawner().call(popen)
        except OSError as e:
            errfile.close()
            raise RuntimeError(f"could not start a sandbox worker ({sys.executable}): {e}") from None
        w = _Worker(proc, errfile)
        try:
            hdr = w.read_header(time.monotonic() + self.start_timeout)
            if hdr.get("t") == "fatal":
                raise _ProtocolError(f"worker error:\n{str(hdr.get('error'))[-_MAX_DETAIL:]}")
            if hdr.get("t") != "ready" or not isinstance(hdr.get("report"), dict):
                raise _ProtocolError("no ready frame")
        except (TimeoutError, _WorkerGone, _ProtocolError) as e:
            if w.alive():
                w.proc.kill()
            w.proc.wait()
            errfile.seek(0)
            tail = errfile.read()[-3000:].decode("utf-8", "replace").strip()
            w.kill()
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            raise RuntimeError(
                f"a sandbox worker failed to start ({why}; exit code {w.proc.returncode}); "
                f"its stderr ends with:\n{tail or '<empty>'}"
            ) from None
        w.report = hdr["report"]
        self.hardening = dict(w.report)
        errfile.close()
        w.errfile = None
        return w

    def _checkout(self) -> _Worker:
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

    def _forget(self, w: _Worker) -> None:
        """Drop a worker (caller holds the condition)."""
        self._all.discard(w)
        self._live -= 1
        w.kill()
        self._cond.notify()

    def _checkin(self, w: _Worker) -> None:
        with self._cond:
            if self._closed or not w.alive() or w.cpu > self.worker_cpu_seconds / 2:
                self._forget(w)
            else:
                self._idle.append(w)
                self._cond.notify()

    def _discard(self, w: _Worker) -> None:
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

        ``timeout``: wall-clock (and CPU) seconds per sequence. ``max_failures``: after this many
        timeouts, out-of-memory errors or worker deaths in one call, the remaining sequences are not run
        (each reports that), so a program that hangs costs about ``max_failures * timeout`` of wall time
        (each parallel worker may spend the remaining budget once), not ``n * timeout``.
        Raises :class:`ProgramValidationError` when the source fails validation; never raises for
        anything the program does. ``_skip_validation`` / ``_unrestricted`` (tests only) bypass the
        AST layer / also the restricted builtins, to show the OS limits hold on their own.
        """
        if os.getpid() != self._pid:
            raise RuntimeError("a SandboxPool cannot be used from a forked child; create a new one there")
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if _skip_validation or _unrestricted:
            info = _unvalidated_info(source)
        else:
            info = pysafety.analyze_source(source)
        sequences = list(sequences)
        state = _RunState(len(sequences), max(1, int(max_failures)))
        views = self._prepare(sequences, info, state)
        todo = [i for i, r in enumerate(state.results) if r is None]
        if not todo:
            return state.results
        per = max(1, min(self.chunk_size, math.ceil(len(todo) / self.workers)))
        for k in range(0, len(todo), per):
            state.chunks.append(todo[k:k + per])
        job = {"source": source, "name": info.name, "timeout": float(timeout), "unrestricted": bool(_unrestricted)}
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
        return state.results

    def _prepare(self, sequences: list, info: pysafety.ProgramInfo, state: _RunState) -> list[dict | None]:
        feats, missing = _features_for(sequences, info)
        views: list[dict | None] = []
        for i, s in enumerate(sequences):
            try:
                v = sequence_view(s, feats[i], missing[i])
            except Exception as e:  # noqa: BLE001
                state.results[i] = ProgramExecutionError(
                    f"sequence {i}: cannot be sent to the sandbox: {type(e).__name__}: {e}", "sandbox")
                views.append(None)
                continue
            if v["n"] > self.max_n:
                state.results[i] = ProgramExecutionError(
                    f"sequence {i} has {v['n']} tokens; the sandbox accepts at most max_n={self.max_n} "
                    "(the output is n x n); split the text or raise SandboxPool(max_n=...)", "sandbox")
                views.append(None)
                continue
            views.append(v)
        return views

    def _drive(self, job: dict[str, Any], views: list, state: _RunState, timeout: float) -> None:
        worker: _Worker | None = None
        try:
            while True:
                chunk = state.take()
                if chunk is None:
                    break
                if state.exhausted():
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

    def _run_chunk(self, w: _Worker, chunk: list[int], job: dict, views: list, state: _RunState,
                   timeout: float) -> _Worker | None:
        """Send one chunk, collect its results; returns the worker if it may be reused, else None."""
        grace = 1.0 + 0.25 * timeout
        pos = 0  # index into chunk of the sequence being waited for

        def fail_current(reason: str, message: str, requeue: bool = True) -> None:
            i = chunk[pos]
            state.results[i] = ProgramExecutionError(f"sequence {i}: {message}", reason)
            state.failed(reason, message)
            if requeue:
                state.requeue(chunk[pos + 1:])

        try:
            budget = max(1, state.max_failures - state.failures)  # the worker stops early on its own too
            w.send_job({**job, "views": [views[i] for i in chunk], "max_failures": budget}, time.monotonic() + 30.0)
            hdr = w.read_header(time.monotonic() + timeout + grace)
            if hdr.get("t") != "loaded":
                raise _ProtocolError(f"expected 'loaded', got {hdr.get('t')!r}")
            if not hdr.get("ok"):
                reason = hdr.get("reason") if hdr.get("reason") in REASONS else "crash"
                message = str(hdr.get("message", "the program failed to load"))[:_MAX_MESSAGE]
                detail = str(hdr.get("detail", ""))[-_MAX_DETAIL:]
                for i in chunk:
                    state.results[i] = ProgramExecutionError(f"sequence {i}: {message}", reason, detail)
                if reason in _COSTLY:
                    state.failed(reason, message)
                pos = len(chunk)
            while pos < len(chunk):
                i = chunk[pos]
                n = views[i]["n"]
                hdr = w.read_header(time.monotonic() + timeout + grace)
                if hdr.get("t") != "result" or hdr.get("i") != pos:
                    raise _ProtocolError(f"expected result {pos}, got {str(hdr)[:200]}")
                if hdr.get("ok") is True:
                    nbytes = hdr.get("nbytes")
                    if nbytes != n * n * 4:
                        raise _ProtocolError(f"result of {nbytes!r} bytes for n={n}")
                    buf = w.read_payload(nbytes, time.monotonic() + grace + nbytes / 50e6)
                    arr = np.frombuffer(buf, dtype="<f4").reshape(n, n)
                    if not np.isfinite(arr).all():
                        raise _ProtocolError("non-finite values in a result the worker had validated")
                    state.results[i] = arr
                else:
                    reason = hdr.get("reason")
                    if reason not in REASONS:
                        raise _ProtocolError(f"unknown reason {reason!r}")
                    message = str(hdr.get("message", ""))[:_MAX_MESSAGE]
                    state.results[i] = ProgramExecutionError(
                        f"sequence {i}: {message}", reason, str(hdr.get("detail", ""))[-_MAX_DETAIL:])
                    if reason in _COSTLY and not hdr.get("skipped"):
                        state.failed(reason, message)
                pos += 1
            hdr = w.read_header(time.monotonic() + grace)
            if hdr.get("t") != "done":
                raise _ProtocolError(f"expected 'done', got {hdr.get('t')!r}")
            cpu = hdr.get("cpu")
            w.cpu = float(cpu) if isinstance(cpu, (int, float)) else float("inf")
            if hdr.get("recycle"):
                self._discard(w)
                return None
            return w
        except TimeoutError:
            self._discard(w)
            if pos < len(chunk):
                fail_current("timeout", f"the program ran longer than {timeout:g} s (wall clock); its worker was "
                                        "killed and replaced")
            return None
        except _WorkerGone as e:
            why = w.death()
            self._discard(w)
            if pos < len(chunk):
                fail_current("crash", f"{why} while running the program; the worker was replaced")
            return None
        except _ProtocolError as e:
            self._discard(w)
            if pos < len(chunk):
                fail_current("sandbox", f"the sandbox worker broke protocol ({e}); it was killed and replaced")
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
    return pysafety.ProgramInfo(name=funcs[0].name, attributes=attrs, strings=frozenset())


def _features_for(sequences: list, info: pysafety.ProgramInfo) -> tuple[list[dict], list[str | None]]:
    """Feature dicts per sequence, computed in the parent only when the program reads ``seq.features``."""
    n = len(sequences)
    if not info.uses_features:
        return [{} for _ in range(n)], [None] * n
    try:
        from . import features as _features

        spacy_views = tuple(getattr(_features, "SPACY_VIEWS", _SPACY_VIEWS_FALLBACK))
        wordnet_views = tuple(getattr(_features, "WORDNET_VIEWS", _WORDNET_VIEWS_FALLBACK))
    except Exception as e:  # noqa: BLE001 - features.py missing or broken: programs get an explanation
        why = f"features unavailable: {type(e).__name__}: {e}"
        return [({} if not isinstance(s, Mapping) else dict(s.get("features") or {})) for s in sequences], [why] * n
    real = [s for s in sequences if not isinstance(s, Mapping) and hasattr(s, "features")]
    note: str | None = None
    if real and info.mentions(spacy_views):
        try:
            _features.compute_features(real, spacy=True)
        except Exception as e:  # noqa: BLE001
            note = f"spaCy views unavailable: {type(e).__name__}: {e}"
    want_wordnet = [v for v in wordnet_views if info.mentions((v,))]
    out: list[dict] = []
    missing: list[str | None] = []
    for s in sequences:
        if isinstance(s, Mapping):
            out.append(dict(s.get("features") or {}))
            missing.append(None)
            continue
        why = note
        try:
            fv = s.features
            for v in want_wordnet:
                try:
                    getattr(fv, v)
                except Exception as e:  # noqa: BLE001
                    why = f"WordNet views unavailable: {type(e).__name__}: {e}"
            out.append(dict(fv.to_dict()))
        except Exception as e:  # noqa: BLE001
            out.append({})
            why = f"features could not be computed: {type(e).__name__}: {e}"
        missing.append(why)
    return out, missing


# ==================================================================================================
# Shared pool
# ==================================================================================================

_SHARED: SandboxPool | None = None
_SHARED_LOCK = threading.Lock()


def get_pool() -> SandboxPool:
    """The process-wide pool (started lazily with default settings, closed at interpreter exit)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.closed or _SHARED._pid != os.getpid():
            _SHARED = SandboxPool()
        return _SHARED


def shutdown_pool() -> None:
    """Close the shared pool (a later :func:`get_pool` starts a new one)."""
    global _SHARED
    with _SHARED_LOCK:
        pool, _SHARED = _SHARED, None
    if pool is not None and pool._pid == os.getpid():
        pool.close()


atexit.register(shutdown_pool)
