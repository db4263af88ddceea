"""Kernel-level containment of sandbox processes: seccomp filters, Landlock, namespaces, uid drop, rlimits.

The zygote hardens itself once (inherited by every job process); each job process adds the per-job
filter (no processes, no signals to others, no file-system call at all), Landlock and its rlimits.
Every layer assumes the ones before it failed; SECURITY.md lists them.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import signal
import struct
from typing import Any

from .protocol import FD_CTL_IN, FD_CTL_OUT, FD_RES_OUT, FD_WAKE_R, FD_WAKE_W, CHILD_FD_RES


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
    return None


def _net_blocked(*_a: Any, **_k: Any) -> Any:
    raise PermissionError("network access is disabled inside the program sandbox")


def _prctl(libc: Any, *args: int) -> int:
    return libc.prctl(*(ctypes.c_ulong(a) for a in (list(args) + [0, 0, 0, 0])[:5]))


def harden_zygote(cfg: dict[str, Any], ctl_in: int, ctl_out: int, res_out: int) -> dict[str, Any]:
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
    for target, fd in zip((FD_CTL_IN, FD_CTL_OUT, FD_RES_OUT, FD_WAKE_R, FD_WAKE_W), high):
        os.dup2(fd, target)
    os.closerange(FD_WAKE_W + 1, max(FD_WAKE_W + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    os.set_blocking(FD_WAKE_W, False)
    os.set_blocking(FD_WAKE_R, False)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_WAKE_W + 1, FD_WAKE_W + 1))
    except (ValueError, OSError) as e:
        notes.append(f"RLIMIT_NOFILE not locked in the zygote: {e}")
    abi = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_long(0), ctypes.c_long(1))
    report["landlock_abi"] = max(0, abi)  # job children apply it; 0: the kernel has none (seccomp still denies)
    if abi < 1:
        notes.append("Landlock unavailable; file-system calls are still denied by seccomp in job children")
    report["rlimits"] = {n: list(resource.getrlimit(getattr(resource, n)))
                         for n in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE")}
    return report


def harden_child(cfg: dict[str, Any], cpu_hard: int, zygote: int) -> None:
    """Per-job limits in a freshly forked job child: no processes, no new descriptors, CPU budget."""
    libc = ctypes.CDLL(None, use_errno=True)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _prctl(libc, 1, int(signal.SIGKILL))  # die with the zygote
    if os.getppid() != zygote:
        os._exit(3)
    os.dup2(FD_RES_OUT, CHILD_FD_RES)  # result pipe on 3, /dev/null on 4, nothing above
    os.dup2(0, 4)
    os.closerange(5, FD_WAKE_W + 1)
    _install_landlock(libc)  # needs one free descriptor: before NOFILE is locked; seccomp covers its absence
    resource.setrlimit(resource.RLIMIT_NOFILE, (5, 5))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
    if cfg.get("seccomp", True):
        why = _install_seccomp(libc, "child")
        if why is not None:  # fail closed: the zygote's filter worked, so this should not happen
            raise RuntimeError(why)
