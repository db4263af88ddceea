"""Sandboxed execution of untrusted Python programs in a reusable pool of hardened worker processes.

Python programs (DESIGN section 2) are untrusted text. They are validated by the AST allowlist in
:mod:`headsurgeon.synth.pysafety` and then run *only* here, in sandbox processes, never in the caller.

Process model (forkserver-style). Each pool slot is a *zygote*: a fresh interpreter spawned (fork+exec,
like multiprocessing's 'spawn', but without re-importing the caller's ``__main__``) with a minimal
environment and one BLAS thread, that imports numpy and this module only (not torch), hardens itself
once and then never runs program code. For every job (a chunk of sequences) it forks a *job child*
that adds the per-job limits, runs the program and exits. So every job starts from the same pristine
state: nothing a program does (patching a numpy dict, a full escape) can leak into another
program's results, and a timeout or crash costs a fork (about 10 ms), not a new interpreter (about 0.4 s).

Layers (each assumes the previous one may fail):

1. **AST validation** (``pysafety.analyze_source``) in the parent before anything is sent.
2. **Restricted runtime** in the job child: only the safe builtins, an ``__import__`` that admits
   numpy/math/re, and ``np``/``math``/``re`` pre-bound.
3. **Operating-system limits** (what took effect is recorded in :attr:`SandboxPool.hardening`):

   zygote, once, inherited by every job child:
   - a private, empty network namespace (``unshare(CLONE_NEWNET)``; as non-root via a user namespace)
     where the kernel allows it: even a socket that existed would reach nothing;
   - a root zygote drops to uid/gid ``sandbox_uid`` (65534, "nobody"): no capabilities, so no limit
     below can be raised back, and RLIMIT_NPROC binds (root is exempt from it); ``PR_SET_NO_NEW_PRIVS``;
   - ``RLIMIT_AS`` (``memory_mb``, default 1 GiB): allocations beyond it raise ``MemoryError``;
   - ``RLIMIT_FSIZE = 0`` (SIGXFSZ ignored): no file can grow; ``RLIMIT_CORE = 0``;
   - seccomp filter: execve/execveat, socket/socketpair, ptrace/process_vm_*, unshare/setns/mount,
     bpf/perf_event_open/userfaultfd/keyrings/io_uring denied (x86_64 and aarch64);
   - ``socket`` module functions replaced (clear errors); ``PR_SET_PDEATHSIG`` so it dies with the caller.

   job child, per job:
   - ``RLIMIT_NPROC = 0`` and a second seccomp filter denying fork/vfork/clone/clone3/setsid/setpgid
     and signals to any other process: no fork bombs, no threads;
   - ``RLIMIT_NOFILE`` locked at its 5 descriptors (stdio on /dev/null and the result pipe): any
     ``open``/``socket``/``pipe`` fails with EMFILE, so no file reads, writes or sockets;
   - ``RLIMIT_CPU``: hard limit = the job's budget (SIGKILL), soft limit re-armed per sequence at
     ``timeout`` CPU-seconds (SIGXCPU), plus ``ITIMER_REAL`` at ``timeout`` wall-seconds: both raise a
     BaseException inside the program, reported as a timeout naming the interrupted line;
   - ``PR_SET_PDEATHSIG``: dies with its zygote.

4. **Parent-side enforcement**: a wall-clock deadline per sequence (``timeout`` + grace). On expiry the
   zygote is asked to SIGKILL the job child; if the zygote does not answer, the whole process group is
   killed and the slot respawned. Nothing a sandbox process sends is unpickled: results are a small
   JSON header plus raw float32 bytes, checked against the expected shape and for finiteness; job
   children write results to their own pipe, zygotes report job ends on a separate control pipe.

Not enforced here: ``execve`` on architectures without a seccomp table (a new image would still inherit
every limit above); CPU *share* (a busy program occupies one core until its timeout); timing side
channels. With ``sandbox_uid=None`` a root caller's sandbox keeps root's capabilities (tests only).

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

_HDR = struct.Struct(">I")  # sandbox -> parent: JSON header length
_MSG = struct.Struct(">Q")  # parent -> zygote: pickled message length
_MAX_HEADER = 1 << 20
_MAX_MESSAGE = 2000
_MAX_DETAIL = 6000
_PROGRAM_FILE = "<program>"
_SYNTH_DIR = os.path.dirname(os.path.abspath(__file__))

# Descriptor layout inside a zygote (after hardening) and inside a job child.
_FD_CTL_IN, _FD_CTL_OUT, _FD_RES_OUT, _FD_WAKE_R, _FD_WAKE_W = 3, 4, 5, 6, 7
_CHILD_FD_RES = 3

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
    """The plain picklable view of a Sequence (or of a mapping with ids/tokens/text/offsets[/features]) sent to the sandbox."""
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
# Sandbox side: zygote and job child
# ==================================================================================================


class _SandboxTimeout(BaseException):
    """Raised inside the program by SIGALRM / SIGXCPU; BaseException so ``except Exception`` cannot swallow it."""


class _BadOutput(Exception):
    pass


_W: dict[str, Any] = {"in_user": False, "cpu_hard": resource.RLIM_INFINITY, "timer": "wall", "memory_mb": 0}

# Syscall numbers for the seccomp filters. "zygote": denied in the zygote and so in every job child;
# "child" and "files": additionally denied in job children (no new processes, no signals to others, no
# file-system call at all: a job child has every descriptor it needs before the program runs);
# "self_only": allowed only with the caller's own pid as first argument (prlimit64 also with 0, meaning itself).
_SECCOMP_TABLES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "arch": 0xC000003E, "x32": True, "seccomp_nr": 317,
        "zygote": {"execve": 59, "execveat": 322, "socket": 41, "socketpair": 53, "ptrace": 101,
                   "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308,
                   "mount": 165, "umount2": 166, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                   "add_key": 248, "request_key": 249, "keyctl": 250, "io_uring_setup": 425},
        "child": {"fork": 57, "vfork": 58, "clone": 56, "setsid": 112, "setpgid": 109,
                  "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "pidfd_send_signal": 424,
                  "pidfd_getfd": 438, "kcmp": 312, "process_madvise": 440},
        "files": {"open": 2, "openat": 257, "openat2": 437, "creat": 85, "open_by_handle_at": 304,
                  "name_to_handle_at": 303, "memfd_create": 319, "unlink": 87, "unlinkat": 263, "rmdir": 84,
                  "rename": 82, "renameat": 264, "renameat2": 316, "mkdir": 83, "mkdirat": 258, "mknod": 133,
                  "mknodat": 259, "truncate": 76, "ftruncate": 77, "fallocate": 285, "getdents": 78,
                  "getdents64": 217, "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92,
                  "fchown": 93, "lchown": 94, "fchownat": 260, "link": 86, "linkat": 265, "symlink": 88,
                  "symlinkat": 266, "utime": 132, "utimes": 235, "utimensat": 280, "futimesat": 261,
                  "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
                  "fremovexattr": 199, "chdir": 80, "fchdir": 81, "chroot": 161, "inotify_init": 253,
                  "inotify_init1": 294, "fanotify_init": 300},
        "enosys": {"clone3": 435},
        "self_only": {"kill": 62, "tkill": 200, "tgkill": 234, "prlimit64": 302},
    },
    "aarch64": {
        "arch": 0xC00000B7, "x32": False, "seccomp_nr": 277,
        "zygote": {"execve": 221, "execveat": 281, "socket": 198, "socketpair": 199, "ptrace": 117,
                   "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97, "setns": 268,
                   "mount": 40, "umount2": 39, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                   "add_key": 217, "request_key": 218, "keyctl": 219, "io_uring_setup": 425},
        "child": {"clone": 220, "setsid": 157, "setpgid": 154, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
                  "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "kcmp": 272,
                  "process_madvise": 440},
        "files": {"openat": 56, "openat2": 437, "open_by_handle_at": 265, "name_to_handle_at": 264,
                  "memfd_create": 279, "unlinkat": 35, "renameat": 38, "renameat2": 276, "mkdirat": 34,
                  "mknodat": 33, "truncate": 45, "ftruncate": 46, "fallocate": 47, "getdents64": 61, "fchmod": 52,
                  "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54, "linkat": 37, "symlinkat": 36,
                  "utimensat": 88, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14,
                  "lremovexattr": 15, "fremovexattr": 16, "chdir": 49, "fchdir": 50, "chroot": 51,
                  "inotify_init1": 26, "fanotify_init": 262},
        "enosys": {"clone3": 435},
        "self_only": {"kill": 129, "tkill": 130, "tgkill": 131, "prlimit64": 261},
    },
}


def _seccomp_program(table: dict[str, Any], deny: list[int], enosys: list[int], self_only: list[int],
                     pid: int) -> bytes:
    """Assemble a classic-BPF seccomp filter: ``deny`` -> EPERM, ``enosys`` -> ENOSYS, ``self_only`` -> EPERM unless
    its first argument is ``pid``; any other architecture than the table's kills the process."""
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
    for nr in deny:
        emit(jeq, nr, "eperm", 0)
    for nr in enosys:
        emit(jeq, nr, "enosys", 0)
    for nr in self_only:
        emit(jeq, nr, "self0" if nr == table["self_only"].get("prlimit64") else "self", 0)
    emit(ret, allow)
    labels = {"self0": len(prog)}
    emit(ld, 16)  # args[0], low 32 bits (little endian)
    emit(jeq, 0, "allow", 0)  # prlimit64(0, ...) is the caller itself (kill(0, ...) would be its process group)
    labels["self"] = len(prog)
    emit(ld, 16)
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
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("seccomp program too long for 8-bit jumps")
        out.append(struct.pack("HBBI", code, jt, jf, k))
    return b"".join(out)


def _install_seccomp(libc: Any, stage: str) -> str | None:
    """Install the zygote or child filter; returns None on success or why it was not installed."""
    import platform

    table = _SECCOMP_TABLES.get(platform.machine())
    if table is None:
        return f"no seccomp table for {platform.machine()}"
    if stage == "zygote":
        code = _seccomp_program(table, list(table["zygote"].values()), list(table["enosys"].values()), [], 0)
    else:
        deny = list(table["child"].values()) + list(table["files"].values())
        code = _seccomp_program(table, deny, list(table["enosys"].values()), list(table["self_only"].values()),
                                os.getpid())
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
        return f"seccomp ({stage}) refused (errno {ctypes.get_errno()})"
    return None


_LANDLOCK_CREATE_RULESET, _LANDLOCK_RESTRICT_SELF = 444, 446  # the same numbers on x86_64 and aarch64


def _install_landlock(libc: Any) -> str | None:
    """Deny every file-system access the kernel's Landlock knows (no rules: nothing is allowed); None on success.

    Applied in each job child on top of seccomp: it also covers paths reached through descriptors opened
    before hardening, and (ABI 6+) signals to processes outside the job's own domain.
    """
    L = ctypes.c_long
    abi = libc.syscall(L(_LANDLOCK_CREATE_RULESET), None, L(0), L(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return f"Landlock unavailable (errno {ctypes.get_errno()})"
    fs = (1 << 13) - 1  # ABI 1: execute, read/write files, read dirs, remove and make every kind of node
    fs |= (1 << 13) if abi >= 2 else 0  # refer (links and renames across directories)
    fs |= (1 << 14) if abi >= 3 else 0  # truncate
    fs |= (1 << 15) if abi >= 5 else 0  # ioctl on devices
    net = 0b11 if abi >= 4 else 0  # bind and connect TCP
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets and signals outside the domain
    attr = struct.pack("QQQ", fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(L(_LANDLOCK_CREATE_RULESET), buf, L(size), L(0))
    if fd < 0:
        return f"Landlock ruleset refused (errno {ctypes.get_errno()})"
    try:
        if libc.syscall(L(_LANDLOCK_RESTRICT_SELF), L(fd), L(0)) != 0:
            return f"Landlock restriction refused (errno {ctypes.get_errno()})"
    finally:
        os.close(fd)
    _W["landlock_abi"] = abi
    return None


def _net_blocked(*_a: Any, **_k: Any) -> Any:
    raise PermissionError("network access is disabled inside the program sandbox")


def _prctl(libc: Any, *args: int) -> int:
    return libc.prctl(*(ctypes.c_ulong(a) for a in (list(args) + [0, 0, 0, 0])[:5]))


def _harden_zygote(cfg: dict[str, Any], ctl_in: int, ctl_out: int, res_out: int) -> dict[str, Any]:
    """Apply the zygote's OS limits (order matters) and move its descriptors to the fixed layout."""
    report: dict[str, Any] = {"pid": os.getpid(), "notes": []}
    notes: list[str] = report["notes"]
    libc = ctypes.CDLL(None, use_errno=True)
    was_root = os.geteuid() == 0

    # 1. empty network namespace (needs CAP_SYS_ADMIN, or an unprivileged user namespace)
    netns = libc.unshare(ctypes.c_int(0x40000000)) == 0  # CLONE_NEWNET
    if not netns and not was_root:
        netns = libc.unshare(ctypes.c_int(0x10000000 | 0x40000000)) == 0  # + CLONE_NEWUSER
    if not netns:
        notes.append(f"network namespace unavailable (errno {ctypes.get_errno()}); sockets are still "
                     "blocked by seccomp and RLIMIT_NOFILE")
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
    elif was_root:
        notes.append("running as root (sandbox_uid=None): rlimits can be raised by a program that escapes")
    report["uid"], report["euid"] = os.getuid(), os.geteuid()

    # 3. no privilege gain through execve; die with the parent (set after setuid, which clears it)
    report["no_new_privs"] = _prctl(libc, 38, 1) == 0
    _prctl(libc, 1, int(signal.SIGKILL))
    if os.getppid() != cfg.get("parent_pid"):
        os._exit(3)  # the parent is already gone

    # 4. resource limits inherited by every job child (soft == hard: a program cannot raise them)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past FSIZE returns EFBIG instead of killing
    for name, lim in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", 0), ("RLIMIT_AS", cfg["memory_bytes"])):
        try:
            resource.setrlimit(getattr(resource, name), (lim, lim))
        except (ValueError, OSError) as e:
            notes.append(f"{name} not applied: {e}")

    # 5. friendlier errors for socket use (the kernel-level blocks are seccomp and NOFILE)
    import _socket
    import socket

    for mod in (socket, _socket):
        for fn in ("socket", "socketpair", "create_connection", "create_server", "fromfd", "getaddrinfo"):
            if hasattr(mod, fn):
                setattr(mod, fn, _net_blocked)

    # 6. seccomp (the zygote part; job children add the fork/signal filter)
    why = _install_seccomp(libc, "zygote") if cfg.get("seccomp", True) else "seccomp disabled by configuration"
    report["seccomp"] = why is None
    if why is not None:
        notes.append(why)

    # 7. descriptors: 0-2 on /dev/null, control in/out, result out, SIGCHLD wake-up pipe; nothing else
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 32) for fd in (ctl_in, ctl_out, res_out)]
    wake_r, wake_w = os.pipe()
    high += [fcntl.fcntl(wake_r, fcntl.F_DUPFD, 32), fcntl.fcntl(wake_w, fcntl.F_DUPFD, 32)]
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for target, fd in zip((_FD_CTL_IN, _FD_CTL_OUT, _FD_RES_OUT, _FD_WAKE_R, _FD_WAKE_W), high):
        os.dup2(fd, target)
    os.closerange(_FD_WAKE_W + 1, max(_FD_WAKE_W + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    os.set_blocking(_FD_WAKE_W, False)
    os.set_blocking(_FD_WAKE_R, False)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_FD_WAKE_W + 1, _FD_WAKE_W + 1))
    except (ValueError, OSError) as e:
        notes.append(f"RLIMIT_NOFILE not locked in the zygote: {e}")
    abi = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_long(0), ctypes.c_long(1))
    report["landlock_abi"] = max(0, abi)  # job children apply it; 0: the kernel has none (seccomp still denies)
    if abi < 1:
        notes.append("Landlock unavailable; file-system calls are still denied by seccomp in job children")
    report["rlimits"] = {n: list(resource.getrlimit(getattr(resource, n)))
                         for n in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE")}
    return report


def _harden_child(cfg: dict[str, Any], cpu_hard: int, zygote: int) -> None:
    """Per-job limits in a freshly forked job child: no processes, no new descriptors, CPU budget."""
    libc = ctypes.CDLL(None, use_errno=True)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _prctl(libc, 1, int(signal.SIGKILL))  # die with the zygote
    if os.getppid() != zygote:
        os._exit(3)
    os.dup2(_FD_RES_OUT, _CHILD_FD_RES)  # result pipe on 3, /dev/null on 4, nothing above
    os.dup2(0, 4)
    os.closerange(5, _FD_WAKE_W + 1)
    _install_landlock(libc)  # needs one free descriptor: before NOFILE is locked; seccomp covers its absence
    resource.setrlimit(resource.RLIMIT_NOFILE, (5, 5))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
    _W["cpu_hard"] = cpu_hard
    if cfg.get("seccomp", True):
        why = _install_seccomp(libc, "child")
        if why is not None:  # fail closed: the zygote's filter worked, so this should not happen
            raise RuntimeError(why)


def _warm_up() -> None:
    """Import/touch everything programs and the sandbox use, so nothing needs a new file after hardening."""
    import _socket  # noqa: F401 - imported now: after the uid drop the files may be unreadable
    import importlib
    import platform
    import socket  # noqa: F401
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
            detail = ("Traceback (program frames, most recent call last):\n"
                      + "".join(traceback.format_list(frames[-8:])) + msg)
    except Exception:  # noqa: BLE001
        pass
    return msg, detail[-_MAX_DETAIL:]


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


def _write_all(fd: int, data: Any, deadline: float | None = None) -> None:
    view = memoryview(data).cast("B")
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("write timed out")
        n = os.write(fd, view[: 1 << 20])
        view = view[n:]


def _send(fd: int, header: dict[str, Any], payload: Any = None) -> None:
    data = json.dumps(header).encode()
    _write_all(fd, _HDR.pack(len(data)) + data)
    if payload is not None:
        _write_all(fd, payload)


def _read_exact_blocking(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _recv_message(fd: int) -> dict[str, Any] | None:
    raw = _read_exact_blocking(fd, _MSG.size)
    if raw is None:
        return None
    body = _read_exact_blocking(fd, _MSG.unpack(raw)[0])
    return None if body is None else pickle.loads(body)  # from the trusted parent


def _error_header(i: int, reason: str, message: str, detail: str = "") -> dict[str, Any]:
    return {"t": "result", "i": i, "ok": False, "reason": reason,
            "message": message[:_MAX_MESSAGE], "detail": detail[-_MAX_DETAIL:]}


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

    def send(header: dict[str, Any], payload: Any = None) -> None:
        _send(out, {**header, "job": job["job"]}, payload)  # the parent accepts frames only for this job

    budget = int(job.get("max_failures", 2))
    failures: list[str] = []
    linecache.cache[_PROGRAM_FILE] = (len(source), None, source.splitlines(True), _PROGRAM_FILE)
    g = _program_globals(bool(job.get("unrestricted")))

    def load(_: Any) -> Any:
        exec(compile(source, _PROGRAM_FILE, "exec", dont_inherit=True), g)  # noqa: S102 - this is the sandbox
        fn = g.get(name)
        if not callable(fn):
            raise NameError(f"the program defines no function named {name!r}")
        return fn

    status, fn, detail = _run_guarded(load, None, timeout)
    if status != "ok":
        send({"t": "loaded", "ok": False, "reason": status, "detail": detail,
                    "message": f"{fn} while loading the program (top-level code)"[:_MAX_MESSAGE]})
        return
    send({"t": "loaded", "ok": True})
    for i, v in enumerate(job["views"]):
        if len(failures) >= budget:
            send({**_error_header(
                i, failures[-1], f"not run: the program already failed {len(failures)} time(s) in this call "
                f"({failures[-1]}); remaining sequences skipped"), "skipped": True})
            continue
        n = int(v["n"])
        try:
            view = SequenceView(v)
        except Exception as e:  # noqa: BLE001
            send(_error_header(i, "sandbox", f"could not build the sequence view: {e!r}"))
            continue
        np.random.seed(0)  # programs using the global RNG are reproducible per sequence
        status, value, detail = _run_guarded(fn, view, timeout, lambda o, n=n: _check_output(o, n, max_cells))
        if status == "ok":
            send({"t": "result", "i": i, "ok": True, "nbytes": int(value.nbytes)}, value)
        else:
            if status in _COSTLY:
                failures.append(status)
            send(_error_header(i, status, value, detail))
        del value, view


def _reap(pid: int) -> tuple[int, float, bool]:
    """In the zygote: wait for the job child, killing it if the parent asks; returns (status, cpu, killed)."""
    killed = False
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid == pid:
            return status, usage.ru_utime + usage.ru_stime, killed
        ready = select.select([_FD_CTL_IN, _FD_WAKE_R], [], [], 0.25)[0]
        if _FD_WAKE_R in ready:
            try:
                while os.read(_FD_WAKE_R, 512):
                    pass
            except BlockingIOError:
                pass
        if _FD_CTL_IN in ready:
            msg = _recv_message(_FD_CTL_IN)
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
    signal.set_wakeup_fd(_FD_WAKE_W, warn_on_full_buffer=False)
    me = os.getpid()
    while True:
        msg = _recv_message(_FD_CTL_IN)
        if msg is None:
            os._exit(0)
        if msg.get("op") != "job":
            continue  # a late "kill" for a job that already ended
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                _harden_child(cfg, int(msg["cpu_hard"]), me)
                _run_job(msg, _CHILD_FD_RES, max_cells)
                code = 0
            except BaseException:  # noqa: BLE001 - our own failure: try to say so, then die
                try:
                    _send(_CHILD_FD_RES, {"t": "fatal", "error": traceback.format_exc()[-_MAX_DETAIL:]})
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                os._exit(code)
        status, cpu, killed = _reap(pid)
        _send(_FD_CTL_OUT, {"t": "done", "status": status, "cpu": cpu, "killed": killed})


def _worker_main(cfg_json: str) -> None:
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
        report = _harden_zygote(cfg, ctl_in, ctl_out, res_out)
        out_fd = _FD_CTL_OUT
        report["memory_mb"] = _W["memory_mb"]
        _send(_FD_CTL_OUT, {"t": "ready", "report": report})
    except BaseException:  # noqa: BLE001 - tell the parent why, then die
        try:
            _send(out_fd, {"t": "fatal", "error": traceback.format_exc()[-_MAX_DETAIL:]})
        finally:
            os._exit(70)
    _zygote_loop(cfg)


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


_SIGNAL_HINTS = {
    signal.SIGSEGV: "segmentation fault: e.g. C-stack overflow from very deep recursion or nesting, "
                    "or a C-extension bug",
    signal.SIGKILL: "killed",
    signal.SIGABRT: "aborted inside a C extension",
    signal.SIGBUS: "bus error",
    signal.SIGSYS: "a forbidden system call",
}


def _describe_status(hdr: dict[str, Any], cpu_hard: int) -> tuple[str, str]:
    """(reason, message) for a job child that ended before finishing its chunk."""
    status = hdr.get("status")
    if not isinstance(status, int):
        return "sandbox", "the sandbox reported an unreadable exit status"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        cpu = hdr.get("cpu") if isinstance(hdr.get("cpu"), (int, float)) else 0.0
        if sig in (signal.SIGKILL, signal.SIGXCPU) and cpu >= cpu_hard - 1:
            return "timeout", f"the program used up the job's CPU-time budget ({cpu_hard} s) and was killed"
        return "crash", f"the program's process died with {_signal_name(sig)} ({_SIGNAL_HINTS.get(sig, 'a signal')})"
    if os.WIFEXITED(status):
        return "crash", f"the program's process exited with status {os.WEXITSTATUS(status)}"
    return "crash", f"the program's process ended with wait status {status}"


class _Worker:
    """Parent-side handle of one zygote: framed, deadline-bounded I/O; never unpickles what it receives."""

    def __init__(self, proc: subprocess.Popen, res_r: int) -> None:
        self.proc = proc
        self.ctl_w = proc.stdin.fileno()  # type: ignore[union-attr]
        self.ctl_r = proc.stdout.fileno()  # type: ignore[union-attr]
        self.res_r = res_r
        self.report: dict[str, Any] = {}
        self.jobs = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, msg: dict[str, Any], deadline: float) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(self.ctl_w, _MSG.pack(len(data)) + data, deadline)
        except (OSError, ValueError) as e:
            raise _WorkerGone(f"could not reach the sandbox process: {e}") from None

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
                    raise _ProtocolError("a truncated frame: the job process died while writing it")
                k = os.readv(fd, [view[got:]])
            except (OSError, ValueError) as e:
                raise _WorkerGone(str(e)) from None
            if k == 0:
                raise _WorkerGone("the sandbox process closed its pipe")
            got += k
        return buf

    def read_header(self, fd: int, deadline: float) -> dict[str, Any]:
        (size,) = _HDR.unpack(self._read(fd, _HDR.size, deadline))
        if size > _MAX_HEADER:
            raise _ProtocolError(f"a frame header of {size} bytes")
        try:
            header = json.loads(bytes(self._read(fd, size, deadline)))
        except (ValueError, RecursionError) as e:
            raise _ProtocolError(f"an unreadable frame header ({e})") from None
        if not isinstance(header, dict) or not isinstance(header.get("t"), str):
            raise _ProtocolError("a frame that is not a JSON object with a type")
        return header

    def next_event(self, deadline: float) -> tuple[str, dict[str, Any]]:
        """The next frame from the job child ("res") or, when it has none left, the zygote ("ctl")."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:
            ready = select.select([self.res_r, self.ctl_r], [], [], left)[0]
        except (OSError, ValueError) as e:
            raise _WorkerGone(str(e)) from None
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
        except Exception:  # noqa: BLE001
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except Exception:  # noqa: BLE001
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
            raise ValueError(f"workers must be >= 1, got {workers}")
        if memory_mb < 128:
            raise ValueError(f"memory_mb={memory_mb} is too small for a Python+numpy sandbox; use >= 128")
        self.memory_mb = int(memory_mb)
        self.max_n = int(max_n)
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

    def _spawn(self) -> _Worker:
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
        argv = [sys.executable, "-s", "-c", _BOOT, json.dumps(cfg), _SYNTH_DIR]

        def popen() -> subprocess.Popen:
            return subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile, env=env, cwd="/",
                close_fds=True, pass_fds=(res_w,), start_new_session=True,
            )

        try:
            proc = _spawner().call(popen)
        except OSError as e:
            errfile.close()
            os.close(res_r)
            raise RuntimeError(f"could not start a sandbox process ({sys.executable}): {e}") from None
        finally:
            os.close(res_w)
        w = _Worker(proc, res_r)
        try:
            hdr = w.read_header(w.ctl_r, time.monotonic() + self.start_timeout)
            if hdr.get("t") == "fatal":
                raise _ProtocolError(f"it reported:\n{str(hdr.get('error'))[-_MAX_DETAIL:]}")
            if hdr.get("t") != "ready" or not isinstance(hdr.get("report"), dict):
                raise _ProtocolError("it sent no ready frame")
        except (TimeoutError, _WorkerGone, _ProtocolError) as e:
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
            "seccomp": ("fork/vfork/clone/clone3/setsid/setpgid, signals to others, every file-system call "
                        "(open, unlink, rename, mkdir, truncate, getdents, chmod, chown, link ...)"
                        if w.report.get("seccomp") else "off"),
            "landlock": (f"ABI {w.report['landlock_abi']}: no file-system access" if w.report.get("landlock_abi")
                         else "unavailable"),
        }
        self.hardening = dict(w.report)
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
        """Drop a zygote (caller holds the condition)."""
        self._all.discard(w)
        self._live -= 1
        w.kill()
        self._cond.notify()

    def _checkin(self, w: _Worker) -> None:
        with self._cond:
            if self._closed or not w.alive():
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
        timeouts, out-of-memory errors or process deaths in one call, the remaining sequences are not run
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
        job = {"op": "job", "source": source, "name": info.name, "timeout": float(timeout),
               "unrestricted": bool(_unrestricted)}
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
                    "(the output is n x n): split the text or raise SandboxPool(max_n=...)", "sandbox")
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

    def _run_chunk(self, w: _Worker, chunk: list[int], job: dict, views: list, state: _RunState,
                   timeout: float) -> _Worker | None:
        """Run one chunk as one job; returns the zygote if it may be reused, else None (it was killed)."""
        grace = 1.0 + 0.25 * timeout
        cpu_hard = int(math.ceil(timeout * (len(chunk) + 1))) + 2
        pos = 0  # index into chunk of the sequence being waited for
        loaded = False

        def fail(reason: str, message: str, detail: str = "", whole: bool = False) -> None:
            """Record a failure of the current sequence (or all of an unloaded chunk); requeue the rest."""
            targets = chunk[pos:] if whole else chunk[pos:pos + 1]
            for i in targets:
                state.results[i] = ProgramExecutionError(f"sequence {i}: {message}", reason, detail)
            if reason in _COSTLY or reason == "crash":
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
                        raise _ProtocolError(f"expected 'done' from the zygote, got {hdr['t']!r}")
                    if not finished:  # the job child died early
                        reason, message = _describe_status(hdr, cpu_hard)
                        where = "while loading the program" if not loaded else "while running the program"
                        fail(reason, f"{message} {where}", whole=not loaded)
                    w.drain()
                    return w
                t = hdr["t"]
                if t == "fatal":
                    raise _ProtocolError(f"internal error in the job process: {str(hdr.get('error'))[-1500:]}")
                if hdr.get("job") != job_id:
                    raise _ProtocolError(f"a frame for another request ({str(hdr.get('job'))[:40]!r})")
                if not loaded:
                    if t != "loaded":
                        raise _ProtocolError(f"expected 'loaded', got {t!r}")
                    loaded = True
                    if not hdr.get("ok"):
                        reason = hdr.get("reason") if hdr.get("reason") in REASONS else "crash"
                        fail(reason, str(hdr.get("message", "the program failed to load"))[:_MAX_MESSAGE],
                             str(hdr.get("detail", ""))[-_MAX_DETAIL:], whole=True)
                        pos = len(chunk)
                    continue
                if finished or t != "result" or hdr.get("i") != pos:
                    raise _ProtocolError(f"unexpected frame {str(hdr)[:200]}")
                i = chunk[pos]
                n = views[i]["n"]
                if hdr.get("ok") is True:
                    nbytes = hdr.get("nbytes")
                    if nbytes != n * n * 4:
                        raise _ProtocolError(f"a result of {nbytes!r} bytes for n={n}")
                    arr = np.frombuffer(w.read_payload(nbytes), dtype="<f4").reshape(n, n)
                    if not np.isfinite(arr).all():
                        raise _ProtocolError("non-finite values in a result the job process had validated")
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
        except TimeoutError:
            if pos < len(chunk):
                fail("timeout", f"the program ran longer than {timeout:g} s (wall clock) without yielding to the "
                                "in-process timer (e.g. a long C-level loop); its process was killed")
            return self._abort(w)
        except _ProtocolError as e:
            if pos < len(chunk):
                fail("sandbox", f"the program's process broke the result protocol ({e}); it was killed")
            return self._abort(w)
        except _WorkerGone as e:  # the zygote itself (which never runs program code) is gone
            why = w.death() if not w.alive() else str(e)
            self._discard(w)
            if pos < len(chunk):
                i = chunk[pos]
                state.results[i] = ProgramExecutionError(
                    f"sequence {i}: {why} while running the program; it was replaced", "sandbox")
                state.requeue(chunk[pos + 1:])
            return None

    def _abort(self, w: _Worker) -> _Worker | None:
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
        except (TimeoutError, _WorkerGone, _ProtocolError):
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
