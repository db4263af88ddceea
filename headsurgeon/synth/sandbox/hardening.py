"""Kernel-level containment of sandbox processes: seccomp filters, Landlock, namespaces, uid drop, rlimits.

The zygote hardens itself once (inherited by every job process): its own network, IPC, mount (an
empty root) and UTS namespaces, the uid drop, rlimits and the zygote filter. Each job process adds the
per-job filter (no processes, no signals, scheduling or prctl on others, no file-system or metadata
call), Landlock and its rlimits.
Every layer assumes the ones before it failed; SECURITY.md lists them.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import resource
import signal
import struct
from typing import Any

from .protocol import FD_CTL_IN, FD_CTL_OUT, FD_RES_OUT, FD_WAKE_R, FD_WAKE_W, CHILD_FD_RES


# Syscall numbers for the seccomp filters. "zygote": denied in the zygote and so in every job child (System V
# and POSIX IPC, the mount API, namespaces...; neither architecture has the multiplexed ipc(); an i386 entry
# point kills the process and x32 calls are refused). "child" and "files": additionally denied in job children
# (no new processes, no signals to others, no credential change (it would clear PR_SET_PDEATHSIG), no capget
# (it takes any pid), no kernel log, no file-system call at all, metadata included: a job child has every
# descriptor it needs before the program runs). Allowed in job children only for the job itself:
# "self_only" (first argument the caller's pid), "self_or_zero" (also 0, meaning the caller), "who_self"
# (setpriority/ioprio_*: first argument `which` as given, second the caller's pid or 0), "empty_path"
# (fstatat/statx only with AT_EMPTY_PATH in the flags argument given: fstat of an own descriptor; a path
# given anyway resolves in the zygote's empty root, see _enter_empty_root) and "prctl" (only PRCTL_ALLOWED).
_SECCOMP_TABLES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "arch": 0xC000003E, "x32": True, "seccomp_nr": 317, "pivot_root": 155,
        "zygote": {"execve": 59, "execveat": 322, "socket": 41, "socketpair": 53, "ptrace": 101,
                   "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308,
                   "mount": 165, "umount2": 166, "pivot_root": 155, "fsopen": 430, "fsconfig": 431,
                   "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428, "open_tree_attr": 467,
                   "mount_setattr": 442, "statmount": 457, "listmount": 458, "bpf": 321, "perf_event_open": 298,
                   "userfaultfd": 323, "add_key": 248, "request_key": 249, "keyctl": 250, "io_uring_setup": 425,
                   "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "msgget": 68, "msgsnd": 69,
                   "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
                   "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
                   "mq_notify": 244, "mq_getsetattr": 245},
        "child": {"fork": 57, "vfork": 58, "clone": 56, "setsid": 112, "setpgid": 109,
                  "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "pidfd_send_signal": 424,
                  "pidfd_getfd": 438, "kcmp": 312, "process_madvise": 440, "setuid": 105, "setgid": 106,
                  "setreuid": 113, "setregid": 114, "setresuid": 117, "setresgid": 119, "setfsuid": 122,
                  "setfsgid": 123, "setgroups": 116, "capset": 126, "capget": 125, "syslog": 103},
        "files": {"open": 2, "openat": 257, "openat2": 437, "creat": 85, "open_by_handle_at": 304,
                  "name_to_handle_at": 303, "memfd_create": 319, "unlink": 87, "unlinkat": 263, "rmdir": 84,
                  "rename": 82, "renameat": 264, "renameat2": 316, "mkdir": 83, "mkdirat": 258, "mknod": 133,
                  "mknodat": 259, "truncate": 76, "ftruncate": 77, "fallocate": 285, "getdents": 78,
                  "getdents64": 217, "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92,
                  "fchown": 93, "lchown": 94, "fchownat": 260, "link": 86, "linkat": 265, "symlink": 88,
                  "symlinkat": 266, "utime": 132, "utimes": 235, "utimensat": 280, "futimesat": 261,
                  "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
                  "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466, "chdir": 80, "fchdir": 81,
                  "chroot": 161, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300,
                  "stat": 4, "lstat": 6, "access": 21, "faccessat": 269, "faccessat2": 439, "readlink": 89,
                  "readlinkat": 267, "getxattr": 191, "lgetxattr": 192, "fgetxattr": 193, "listxattr": 194,
                  "llistxattr": 195, "flistxattr": 196, "getxattrat": 464, "listxattrat": 465,
                  "file_getattr": 468, "file_setattr": 469, "statfs": 137, "fstatfs": 138, "ustat": 136,
                  "sysfs": 139, "quotactl": 179, "quotactl_fd": 443, "uselib": 134},
        "enosys": {"clone3": 435},
        "self_only": {"kill": 62, "tkill": 200, "tgkill": 234},
        "self_or_zero": {"prlimit64": 302, "sched_setparam": 142, "sched_getparam": 143, "sched_setscheduler": 144,
                         "sched_getscheduler": 145, "sched_setaffinity": 203, "sched_getaffinity": 204,
                         "sched_setattr": 314, "sched_getattr": 315, "sched_rr_get_interval": 148,
                         "migrate_pages": 256, "move_pages": 279, "getpgid": 121, "getsid": 124,
                         "get_robust_list": 274},
        "who_self": {"setpriority": (141, 0), "getpriority": (140, 0), "ioprio_set": (251, 1),
                     "ioprio_get": (252, 1)},
        "empty_path": {"newfstatat": (262, 3), "statx": (332, 2)},
        "prctl": 157,
    },
    "aarch64": {
        "arch": 0xC00000B7, "x32": False, "seccomp_nr": 277, "pivot_root": 41,
        "zygote": {"execve": 221, "execveat": 281, "socket": 198, "socketpair": 199, "ptrace": 117,
                   "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97, "setns": 268,
                   "mount": 40, "umount2": 39, "pivot_root": 41, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
                   "fspick": 433, "move_mount": 429, "open_tree": 428, "open_tree_attr": 467,
                   "mount_setattr": 442, "statmount": 457, "listmount": 458, "bpf": 280, "perf_event_open": 241,
                   "userfaultfd": 282, "add_key": 217, "request_key": 218, "keyctl": 219, "io_uring_setup": 425,
                   "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "msgget": 186, "msgsnd": 189,
                   "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193, "semctl": 191, "semtimedop": 192,
                   "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
                   "mq_notify": 184, "mq_getsetattr": 185},
        "child": {"clone": 220, "setsid": 157, "setpgid": 154, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
                  "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "kcmp": 272,
                  "process_madvise": 440, "setuid": 146, "setgid": 144, "setreuid": 145, "setregid": 143,
                  "setresuid": 147, "setresgid": 149, "setfsuid": 151, "setfsgid": 152, "setgroups": 159,
                  "capset": 91, "capget": 90, "syslog": 116},
        "files": {"openat": 56, "openat2": 437, "open_by_handle_at": 265, "name_to_handle_at": 264,
                  "memfd_create": 279, "unlinkat": 35, "renameat": 38, "renameat2": 276, "mkdirat": 34,
                  "mknodat": 33, "truncate": 45, "ftruncate": 46, "fallocate": 47, "getdents64": 61, "fchmod": 52,
                  "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54, "linkat": 37, "symlinkat": 36,
                  "utimensat": 88, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14,
                  "lremovexattr": 15, "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466, "chdir": 49,
                  "fchdir": 50, "chroot": 51, "inotify_init1": 26, "fanotify_init": 262, "faccessat": 48,
                  "faccessat2": 439, "readlinkat": 78, "getxattr": 8, "lgetxattr": 9, "fgetxattr": 10,
                  "listxattr": 11, "llistxattr": 12, "flistxattr": 13, "getxattrat": 464, "listxattrat": 465,
                  "file_getattr": 468, "file_setattr": 469, "statfs": 43, "fstatfs": 44, "quotactl": 60,
                  "quotactl_fd": 443},
        "enosys": {"clone3": 435},
        "self_only": {"kill": 129, "tkill": 130, "tgkill": 131},
        "self_or_zero": {"prlimit64": 261, "sched_setparam": 118, "sched_getparam": 121, "sched_setscheduler": 119,
                         "sched_getscheduler": 120, "sched_setaffinity": 122, "sched_getaffinity": 123,
                         "sched_setattr": 274, "sched_getattr": 275, "sched_rr_get_interval": 127,
                         "migrate_pages": 238, "move_pages": 239, "getpgid": 155, "getsid": 156,
                         "get_robust_list": 100},
        "who_self": {"setpriority": (140, 0), "getpriority": (141, 0), "ioprio_set": (30, 1), "ioprio_get": (31, 1)},
        "empty_path": {"newfstatat": (79, 3), "statx": (291, 2)},
        "prctl": 167,
    },
}

# prctl options a job child may use once its filter is on. The sandbox itself needs none (strace of
# tests/synth/test_sandbox.py shows none); PR_SET_VMA only names the caller's own anonymous memory (newer
# glibc's malloc calls it and ignores a refusal). Everything else, PR_SET_PDEATHSIG above all, is EPERM.
PRCTL_ALLOWED = (0x53564D41,)  # PR_SET_VMA
_AT_EMPTY_PATH = 0x1000

_LD, _JA, _JEQ, _JGE, _JSET, _RET = 0x20, 0x05, 0x15, 0x35, 0x45, 0x06
_ALLOW, _EPERM, _ENOSYS, _KILL = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
_Insn = tuple[int, int, Any, Any]  # (opcode, constant, jump if true, jump if false); jumps may be labels
_PID = -1  # placeholder in a filter template for the job's own pid (patched in after fork by _install_seccomp)


def _arg(i: int) -> int:
    """Offset of syscall argument ``i`` (its low 32 bits, little endian) in struct seccomp_data."""
    return 16 + 8 * i


def _allow_if(*conds: tuple[int, Any]) -> list[_Insn]:
    """A rule body: allow if every ``(arg, values)`` holds (the argument is one of ``values``, or has
    AT_EMPTY_PATH set when ``values`` is "empty_path"), else EPERM; jumps stay inside the body."""
    body: list[_Insn] = []
    for n, (arg, values) in enumerate(conds):
        ok = "allow" if n == len(conds) - 1 else 0
        body.append((_LD, _arg(arg), 0, 0))
        if values == "empty_path":
            body.append((_JSET, _AT_EMPTY_PATH, ok, "eperm"))
            continue
        for j, v in enumerate(values):
            body.append((_JEQ, v, ok if ok else (len(values) - j - 1), "eperm" if j == len(values) - 1 else 0))
    return body + [(_RET, _ALLOW, 0, 0), (_RET, _EPERM, 0, 0)]


def _dispatch(rules: list[tuple[int, list[_Insn]]]) -> list[_Insn]:
    """Binary search over the sorted syscall numbers (in A), a short chain at the leaves; every path ends in a
    return, unmatched numbers in ALLOW. Logarithmic, so the kernel's per-syscall verdict cache is built fast."""
    if len(rules) <= 6:
        out: list[_Insn] = []
        for nr, body in rules:
            out.append((_JEQ, nr, 0, len(body)))
            labels = {"allow": len(body) - 2, "eperm": len(body) - 1}
            for i, (code, k, jt, jf) in enumerate(body):
                jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
                jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
                out.append((code, k, jt, jf))
        return out + [(_RET, _ALLOW, 0, 0)]
    mid = len(rules) // 2
    low, high = _dispatch(rules[:mid]), _dispatch(rules[mid:])
    return [(_JGE, rules[mid][0], 0, 1), (_JA, len(low), 0, 0)] + low + high


def _assemble(table: dict[str, Any], rules: list[tuple[int, list[_Insn]]]) -> tuple[bytes, list[int]]:
    """Classic-BPF seccomp filter: each rule is (syscall nr, body ending in returns); anything else is allowed,
    x32 syscalls are EPERM and any other architecture than the table's kills the process.
    Returns the program and the offsets of the instructions whose constant is the _PID placeholder."""
    by_nr: dict[int, list[_Insn]] = {}
    for nr, body in rules:
        if nr in by_nr:
            raise ValueError(f"syscall {nr} has two seccomp rules")
        by_nr[nr] = body
    prog: list[_Insn] = [(_LD, 4, 0, 0), (_JEQ, table["arch"], 1, 0), (_RET, _KILL, 0, 0), (_LD, 0, 0, 0)]
    if table["x32"]:
        prog += [(_JGE, 0x40000000, 0, 1), (_RET, _EPERM, 0, 0)]
    prog += _dispatch(sorted(by_nr.items()))
    out, pid_at = [], []
    for i, (code, k, jt, jf) in enumerate(prog):
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("seccomp rule body too long for 8-bit jumps")
        if k == _PID:
            pid_at.append(8 * i + 4)
        out.append(struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF))
    return b"".join(out), pid_at


def _rules(table: dict[str, Any], stage: str) -> list[tuple[int, list[_Insn]]]:
    """The filter's rules for ``stage`` ("zygote" or "child", which stacks on the zygote's); the child's compare
    against _PID."""
    deny, enosys = [(_RET, _EPERM, 0, 0)], [(_RET, _ENOSYS, 0, 0)]
    if stage == "zygote":
        return [(nr, deny) for nr in table["zygote"].values()] + [(nr, enosys) for nr in table["enosys"].values()]
    rules = [(nr, _allow_if((0, (0, _PID)))) for nr in table["self_or_zero"].values()]
    rules += [(nr, _allow_if((0, (_PID,)))) for nr in table["self_only"].values()]
    rules += [(nr, _allow_if((0, (which,)), (1, (0, _PID)))) for nr, which in table["who_self"].values()]
    rules += [(nr, _allow_if((flags, "empty_path"))) for nr, flags in table["empty_path"].values()]
    rules.append((table["prctl"], _allow_if((0, PRCTL_ALLOWED))))
    rules += [(nr, deny) for nr in list(table["child"].values()) + list(table["files"].values())]
    return rules + [(nr, enosys) for nr in table["enosys"].values()]


@functools.lru_cache(maxsize=4)
def _filter_template(machine: str, stage: str) -> tuple[bytes, tuple[int, ...]]:
    """The assembled filter for ``stage`` (built once in the zygote; job children only patch their pid in)."""
    code, pid_at = _assemble(_SECCOMP_TABLES[machine], _rules(_SECCOMP_TABLES[machine], stage))
    return code, tuple(pid_at)


class _Fprog(ctypes.Structure):
    """struct sock_fprog (made once: a ctypes class costs more to create than the filter does to install)."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(libc: Any, stage: str) -> str | None:
    """Install the zygote or child filter; returns None on success or why it was not installed."""
    import platform

    machine = platform.machine()
    table = _SECCOMP_TABLES.get(machine)
    if table is None:
        return f"no seccomp table for {machine}"
    template, pid_at = _filter_template(machine, stage)
    buf = ctypes.create_string_buffer(template, len(template))
    for off in pid_at:
        struct.pack_into("I", buf, off, os.getpid() & 0xFFFFFFFF)
    fprog = _Fprog(len(template) // 8, ctypes.addressof(buf))
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


_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
SANDBOX_HOSTNAME = b"sandbox"


def _unshare(libc: Any, was_root: bool, notes: list[str]) -> dict[str, bool]:
    """Enter new network, IPC, mount and UTS namespaces (all at once, else each alone); which ones were entered.

    In its UTS namespace the sandbox's host and domain name read ``SANDBOX_HOSTNAME``, not the machine's.
    """
    spaces = {"netns": _CLONE_NEWNET, "ipcns": _CLONE_NEWIPC, "mntns": _CLONE_NEWNS, "utsns": _CLONE_NEWUTS}
    every = _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWNS | _CLONE_NEWUTS
    if libc.unshare(ctypes.c_int(every)) == 0 or (
            not was_root and libc.unshare(ctypes.c_int(_CLONE_NEWUSER | every)) == 0):
        got = {name: True for name in spaces}
    else:
        got = {name: libc.unshare(ctypes.c_int(flag)) == 0 for name, flag in spaces.items()}
    missing = [name for name, ok in got.items() if not ok]
    if missing:
        notes.append(f"namespaces {', '.join(missing)} unavailable (errno {ctypes.get_errno()}); sockets, System V "
                     "IPC and file-system calls are still blocked by seccomp (and Landlock)")
    if got["utsns"]:
        name = ctypes.create_string_buffer(SANDBOX_HOSTNAME)
        got["utsns"] = (libc.sethostname(name, ctypes.c_size_t(len(SANDBOX_HOSTNAME))) == 0
                        and libc.setdomainname(name, ctypes.c_size_t(len(SANDBOX_HOSTNAME))) == 0)
    return got


def _enter_empty_root(libc: Any) -> str | None:
    """In this process's own mount namespace, make an empty read-only tmpfs the root and detach the old one.

    After this no path resolves to a host file (stat("/etc/passwd") and stat("/nonexistent") both fail with
    ENOENT): it covers the one metadata call seccomp cannot tell apart, fstatat/statx with AT_EMPTY_PATH and a
    path anyway. Called after the warm-up (nothing is imported later) and before the uid drop.
    """
    import platform

    table = _SECCOMP_TABLES.get(platform.machine())
    if table is None:
        return f"no syscall table for {platform.machine()}"
    ms_rdonly, ms_nosuid, ms_nodev, ms_noexec, ms_rec, ms_private = 1, 2, 4, 8, 0x4000, 1 << 18
    target = next((d for d in ("/tmp", "/dev", "/proc") if os.path.isdir(d)), None)
    if target is None:
        return "no directory to mount the empty root on"
    if libc.mount(b"none", b"/", None, ctypes.c_ulong(ms_rec | ms_private), None) != 0:
        return f"could not make the mounts private (errno {ctypes.get_errno()})"
    flags = ms_rdonly | ms_nosuid | ms_nodev | ms_noexec
    if libc.mount(b"none", target.encode(), b"tmpfs", ctypes.c_ulong(flags), b"size=4k,nr_inodes=1,mode=0555") != 0:
        return f"could not mount an empty tmpfs (errno {ctypes.get_errno()})"
    os.chdir(target)
    if libc.syscall(ctypes.c_long(table["pivot_root"]), b".", b".") != 0:  # old root stacked on the new one
        return f"pivot_root refused (errno {ctypes.get_errno()})"
    if libc.umount2(b".", ctypes.c_int(2)) != 0:  # MNT_DETACH: the host's tree leaves this namespace
        return f"could not detach the old root (errno {ctypes.get_errno()})"
    os.chdir("/")
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

    # 1. private network, IPC, mount and UTS namespaces (needs CAP_SYS_ADMIN, or an unprivileged user namespace);
    #    the mount namespace gets an empty root, so no path names a file any more (descriptors opened first)
    devnull = os.open(os.devnull, os.O_RDWR)
    spaces = _unshare(libc, was_root, notes)
    report.update(spaces)
    report["empty_root"] = False
    if spaces["mntns"]:
        why = _enter_empty_root(libc)
        report["empty_root"] = why is None
        if why is not None:
            notes.append(why + "; path lookups in the sandbox still see the host's file system")

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
    elif cfg.get("seccomp", True):
        import platform

        _filter_template(platform.machine(), "child")  # assembled once here; each job child patches its pid in

    # 7. descriptors: 0-2 on /dev/null, control in/out, result out, SIGCHLD wake-up pipe; nothing else
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 32) for fd in (ctl_in, ctl_out, res_out)]
    wake_r, wake_w = os.pipe()
    high += [fcntl.fcntl(wake_r, fcntl.F_DUPFD, 32), fcntl.fcntl(wake_w, fcntl.F_DUPFD, 32)]
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
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
