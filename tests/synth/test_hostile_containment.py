"""Containment after an escape, continued: System V IPC, dying with the owner, scheduling of others,
metadata probing and protocol breakers, each checked in a real job process holding the real builtins
and ``os`` (the entry point of tests/synth/test_hostile_escapes.py; SECURITY.md, "Python programs").
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from headsurgeon.synth.errors import ProgramExecutionError
from headsurgeon.synth.sandbox import SandboxPool
from support.escapes import assert_refused, assert_serving, make_seq, run_escaped

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_RMID, IPC_NOWAIT = 0o1000, 0, 0o4000


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(workers=1, memory_mb=384, chunk_size=4)
    yield p
    p.close()


def _ipc_ids(kind: str) -> set[int]:
    """Ids of the System V IPC objects of ``kind`` (shm, msg, sem) in the test's own IPC namespace."""
    rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
    return {int(r.split()[1]) for r in rows if r.strip()}


class _Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 16)]


@pytest.fixture()
def host_ipc():
    """A 0666 shared-memory segment, message queue and semaphore set of the test process (another program's)."""
    if not Path("/proc/sysvipc/shm").exists():
        pytest.skip("this kernel has no System V IPC")
    shm = LIBC.shmget(0, 4096, IPC_CREAT | 0o666)
    msq = LIBC.msgget(0, IPC_CREAT | 0o666)
    sem = LIBC.semget(0, 1, IPC_CREAT | 0o666)
    assert min(shm, msq, sem) >= 0, f"System V IPC refused to the test process (errno {ctypes.get_errno()})"
    addr = LIBC.shmat(shm, None, 0)
    ctypes.memmove(addr, b"precious", 8)
    msg = _Msg(1, b"precious")
    assert LIBC.msgsnd(msq, ctypes.byref(msg), 16, IPC_NOWAIT) == 0
    try:
        yield {"shm": shm, "msq": msq, "sem": sem, "addr": addr}
    finally:
        LIBC.shmdt(ctypes.c_void_p(addr))
        LIBC.shmctl(shm, IPC_RMID, None)
        LIBC.msgctl(msq, IPC_RMID, None)
        LIBC.semctl(sem, 0, IPC_RMID)


LIBC_IN_JOB = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "def check(r, what):\n    if r == -1 or r == 2 ** 64 - 1:\n"
               "        e = ctypes.get_errno()\n        raise OSError(e, os.strerror(e) + ': ' + what)\n    return r\n")


def _ipc_bodies(ids: dict) -> dict[str, str]:
    return {
        "shmat_other": ("libc.shmat.restype = ctypes.c_void_p\n"
                        f"a = check(libc.shmat({ids['shm']}, None, 0), 'shmat')\n"
                        "raise ValueError(ctypes.string_at(a, 8))"),
        "shmctl_stat_other": (f"buf = ctypes.create_string_buffer(256)\n"
                              f"check(libc.shmctl({ids['shm']}, 2, buf), 'shmctl')"),
        "shmget_create": "check(libc.shmget(0, 1 << 20, 0o1000 | 0o666), 'shmget')",
        "msgrcv_other": ("buf = ctypes.create_string_buffer(32)\n"
                         f"check(libc.msgrcv({ids['msq']}, buf, 16, 0, 0o4000), 'msgrcv')\nraise ValueError(buf.raw)"),
        "msgget_create": "check(libc.msgget(0, 0o1000 | 0o666), 'msgget')",
        "semctl_other": f"check(libc.semctl({ids['sem']}, 0, 12), 'semctl GETVAL')",
        "semget_create": "check(libc.semget(0, 1, 0o1000 | 0o666), 'semget')",
        "mq_open_create": "check(libc.mq_open(b'/hs-escape', os.O_CREAT | os.O_RDWR, 0o600, None), 'mq_open')",
    }


def test_escaped_system_v_ipc_is_denied(pool, host_ipc):
    before = {k: _ipc_ids(k) for k in ("shm", "msg", "sem")}
    for name, body in _ipc_bodies(host_ipc).items():
        res = run_escaped(pool, LIBC_IN_JOB + body)
        assert_refused(res, "PermissionError")
    assert ctypes.string_at(host_ipc["addr"], 8) == b"precious"
    got = _Msg()
    assert LIBC.msgrcv(host_ipc["msq"], ctypes.byref(got), 16, 0, IPC_NOWAIT) == 16 and got.mtext == b"precious"
    assert {k: _ipc_ids(k) for k in before} == before  # nothing created that outlives the job
    assert_serving(pool)


def test_ipc_namespace_alone_hides_the_hosts_objects(host_ipc):
    """With the seccomp filters off, the zygote's own IPC namespace still hides (and outlives) nothing."""
    p = SandboxPool(workers=1, memory_mb=384, seccomp=False)
    try:
        assert_serving(p)
        if not p.hardening.get("ipcns") and os.geteuid() != 0:  # root always gets one
            pytest.skip("no IPC namespace without privileges or user namespaces here")
        before = _ipc_ids("shm")
        bodies = _ipc_bodies(host_ipc)
        assert_refused(run_escaped(p, LIBC_IN_JOB + bodies["shmat_other"]), "Invalid argument")
        assert_refused(run_escaped(p, LIBC_IN_JOB + bodies["msgrcv_other"]), "Invalid argument")
        assert isinstance(run_escaped(p, LIBC_IN_JOB + bodies["shmget_create"]), np.ndarray)  # in its own namespace
        assert _ipc_ids("shm") == before
    finally:
        p.close()


# ---- every sandbox process dies with the process that owns the pool ---------------------------------

OWNER = r'''
import json, sys, threading, time
import numpy as np
from headsurgeon.synth.sandbox import SandboxPool
from headsurgeon.synth.sequence import Sequence

body = sys.argv[1]
src = "import os, signal\ndef f(seq):\n" + "".join("    " + l + "\n" for l in body.splitlines())
src += "    return np.zeros((seq.n, seq.n))\n"
seq = Sequence(ids=np.arange(3), tokens=["a", "b", "c"], text="a b c", offsets=np.array([[0, 1], [2, 3], [4, 5]]),
               doc=0)
pool = SandboxPool(workers=1, memory_mb=384).start()
threading.Thread(target=pool.run, args=(src, [seq]), kwargs={"timeout": 1.0, "_unrestricted": True},
                 daemon=True).start()
print(json.dumps({"zygote": next(iter(pool._all)).proc.pid}), flush=True)
time.sleep(120)
'''

LINGER = """import ctypes, time
ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
signal.signal(signal.SIGXCPU, signal.SIG_IGN)
while True:
    time.sleep(1)"""


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) of a live process; None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return None if state in "ZX" else (state, int(ppid))


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _proc_state(int(d.name))
            if st is not None and st[1] == pid:
                out.append(int(d.name))
    return out


def _ignores(pid: int, *signals: int) -> bool:
    try:
        line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    mask = int(line.split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in signals)


def _wait_for(cond, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_every_sandbox_process_dies_with_the_owner():
    """A job that clears its parent-death signal, ignores its timers and sleeps still dies with the owner."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, LINGER], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        zygote = json.loads(owner.stdout.readline())["zygote"]
        pids.append(zygote)
        assert _wait_for(lambda: any(_ignores(c, signal.SIGALRM, signal.SIGXCPU) for c in _children(zygote))), \
            "the job never reached its sleep"
        pids += _children(zygote)  # the job (it has run the prctl: it ignores both timer signals now)
        owner.kill()
        owner.wait()
        assert _wait_for(lambda: all(_proc_state(p) is None for p in pids), 10.0), \
            f"sandbox processes outlived their owner: {[p for p in pids if _proc_state(p) is not None]}"
    finally:
        owner.kill()
        owner.wait()
        for p in pids:
            if _proc_state(p) is not None:
                os.kill(p, signal.SIGKILL)


def test_escaped_job_cannot_drop_its_parent_death_signal(pool):
    """prctl is refused, and so is any credential change (it would clear PR_SET_PDEATHSIG too)."""
    assert_refused(run_escaped(pool, LIBC_IN_JOB + "check(libc.prctl(1, 0, 0, 0, 0), 'PR_SET_PDEATHSIG')"),
                   "PermissionError")
    assert_refused(run_escaped(pool, LIBC_IN_JOB + "check(libc.prctl(36, 1, 0, 0, 0), 'PR_SET_CHILD_SUBREAPER')"),
                   "PermissionError")
    assert_refused(run_escaped(pool, "u = os.getuid()\nos.setresuid(u, u, u)"), "PermissionError")
    assert_serving(pool)


# ---- scheduling calls reach the job itself only ------------------------------------------------------

_SCHED_NR = {"x86_64": {"sched_setattr": 314, "ioprio_set": 251, "ioprio_get": 252},
             "aarch64": {"sched_setattr": 274, "ioprio_set": 30, "ioprio_get": 31}}


@pytest.fixture()
def sibling(pool):
    """A process of the sandbox's own uid (so only the filter, not permissions, protects it)."""
    assert_serving(pool)
    uid = pool.hardening["uid"]
    proc = subprocess.Popen(["sleep", "60"], user=uid if os.geteuid() == 0 and uid != 0 else None)
    yield proc.pid
    proc.kill()
    proc.wait()


def _sched_of(pid: int) -> tuple:
    io = LIBC.syscall(ctypes.c_long(_SCHED_NR[platform.machine()]["ioprio_get"]), 1, pid)
    return (os.getpriority(os.PRIO_PROCESS, pid), os.sched_getaffinity(pid), os.sched_getscheduler(pid),
            os.sched_getparam(pid).sched_priority, io)


def test_escaped_scheduling_of_other_processes_is_denied(pool, sibling):
    if platform.machine() not in _SCHED_NR:
        pytest.skip(f"no syscall numbers for {platform.machine()}")
    nr = _SCHED_NR[platform.machine()]
    before = _sched_of(sibling)
    cpu = min(os.sched_getaffinity(0))
    # struct sched_attr: size 48, SCHED_OTHER, nice 19 (raising one's nice needs no privilege)
    attr = ("struct = ctypes.create_string_buffer(48)\nctypes.memmove(struct, (48).to_bytes(4, 'little'), 4)\n"
            "ctypes.memmove(ctypes.addressof(struct) + 16, (19).to_bytes(4, 'little'), 4)\n")
    bodies = {
        "setpriority": f"os.setpriority(os.PRIO_PROCESS, {sibling}, 19)",
        "setpriority_group": "os.setpriority(os.PRIO_PGRP, 0, 19)",
        "setpriority_user": "os.setpriority(os.PRIO_USER, 0, 19)",
        "sched_setaffinity": f"os.sched_setaffinity({sibling}, {{{cpu}}})",
        "sched_setscheduler": f"os.sched_setscheduler({sibling}, os.SCHED_IDLE, os.sched_param(0))",
        "sched_setparam": f"os.sched_setparam({sibling}, os.sched_param(0))",
        "sched_setattr": attr + f"check(libc.syscall({nr['sched_setattr']}, {sibling}, struct, 0), 'sched_setattr')",
        "ioprio_set": f"check(libc.syscall({nr['ioprio_set']}, 1, {sibling}, 3 << 13), 'ioprio_set')",
        "ioprio_set_user": f"check(libc.syscall({nr['ioprio_set']}, 3, os.getuid(), 3 << 13), 'ioprio_set user')",
        "setpriority_parent": f"os.setpriority(os.PRIO_PROCESS, {os.getpid()}, 19)",
    }
    for name, body in bodies.items():
        assert_refused(run_escaped(pool, LIBC_IN_JOB + body), "PermissionError")
    assert _sched_of(sibling) == before
    # on itself the job may still do all of it
    own = ("os.setpriority(os.PRIO_PROCESS, 0, 1)\nos.setpriority(os.PRIO_PROCESS, os.getpid(), 2)\n"
           "os.sched_setaffinity(0, os.sched_getaffinity(0))\nos.sched_setparam(os.getpid(), os.sched_param(0))\n"
           + attr + f"check(libc.syscall({nr['sched_setattr']}, 0, struct, 0), 'sched_setattr')")
    assert isinstance(run_escaped(pool, LIBC_IN_JOB + own), np.ndarray)
    assert_serving(pool)


# ---- metadata: existence, sizes and owners of files and processes are not observable -------------------

MISSING = f"/nonexistent-{uuid.uuid4().hex}"
PROBED = ["/etc/passwd", "/proc/1", f"/proc/{os.getpid()}", str(Path(__file__).resolve()), "/proc/self/exe",
          MISSING, "/proc/999999999", "/etc"]
PROBES = {
    "stat": "os.stat(p)",
    "lstat": "os.lstat(p)",
    "access": "os.access(p, os.F_OK)",
    "exists": "os.path.exists(p)",
    "readlink": "os.readlink(p)",
    "statvfs": "os.statvfs(p)",
    "getxattr": "os.getxattr(p, 'user.x')",
    "listxattr": "os.listxattr(p)",
}


def _outcomes(pool: SandboxPool, expr: str) -> list[str]:
    body = ("out = []\n"
            f"for p in {PROBED!r}:\n"
            "    try:\n"
            f"        out.append('ok:' + repr(bool({expr})))\n"
            "    except OSError as e:\n"
            "        out.append('E' + str(e.errno))\n"
            "raise ValueError('OUT ' + ' '.join(out))")
    return _parse_outcomes(run_escaped(pool, body))


def _parse_outcomes(res: object) -> list[str]:
    assert isinstance(res, ProgramExecutionError), res
    m = re.search(r"OUT ((?:(?:E\d+|ok:\w+) ?)+)", str(res))
    assert m, str(res)
    return m.group(1).split()


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_escaped_metadata_calls_cannot_tell_files_apart(pool, probe):
    got = _outcomes(pool, PROBES[probe])
    assert len(got) == len(PROBED)
    assert len(set(got)) == 1, dict(zip(PROBED, got))  # existing and missing paths look the same
    assert got[0] in ("E1", "ok:False"), dict(zip(PROBED, got))  # EPERM (or False from the bool helpers)


@pytest.mark.parametrize("call", ["newfstatat", "statx"])
def test_escaped_fstat_with_a_path_sees_only_the_empty_root(pool, call):
    """fstatat/statx with AT_EMPTY_PATH (allowed: fstat of an own descriptor) and a path anyway: no path exists."""
    assert_serving(pool)
    if not pool.hardening.get("empty_root") and os.geteuid() != 0:  # root always gets one
        pytest.skip("no mount namespace without privileges or user namespaces: this call is not contained here")
    nr = {"x86_64": {"newfstatat": 262, "statx": 332}, "aarch64": {"newfstatat": 79, "statx": 291}}
    if platform.machine() not in nr:
        pytest.skip(f"no syscall numbers for {platform.machine()}")
    n = nr[platform.machine()][call]
    args = "-100, p.encode(), 0x1000, 0x7ff, buf" if call == "statx" else "-100, p.encode(), buf, 0x1000"
    expr = f"check(libc.syscall({n}, {args}), '{call}') + 1"
    body = (LIBC_IN_JOB + "buf = ctypes.create_string_buffer(512)\nout = []\n"
            f"for p in {PROBED!r}:\n"
            "    try:\n"
            f"        out.append('ok:' + repr(bool({expr})))\n"
            "    except OSError as e:\n"
            "        out.append('E' + str(e.errno))\n"
            "raise ValueError('OUT ' + ' '.join(out))")
    got = _parse_outcomes(run_escaped(pool, body))
    assert got == ["E2"] * len(PROBED), dict(zip(PROBED, got))  # ENOENT for all, existing or not


_PID_PROBES = {"x86_64": {"capget": 125, "get_robust_list": 274}, "aarch64": {"capget": 90, "get_robust_list": 100}}


def test_escaped_job_cannot_tell_which_processes_exist(pool):
    """Calls that take any pid answer the same for init, the parent and a pid that does not exist."""
    if platform.machine() not in _PID_PROBES:
        pytest.skip(f"no syscall numbers for {platform.machine()}")
    nr = {**_PID_PROBES[platform.machine()], "ioprio_get": _SCHED_NR[platform.machine()]["ioprio_get"]}
    exprs = {
        "kill0": "os.kill(p, 0)",
        "getpgid": "os.getpgid(p)",
        "getsid": "os.getsid(p)",
        "getpriority": "os.getpriority(os.PRIO_PROCESS, p)",
        "sched_getscheduler": "os.sched_getscheduler(p)",
        "sched_getaffinity": "os.sched_getaffinity(p)",
        "ioprio_get": f"check(libc.syscall({nr['ioprio_get']}, 1, p), 'ioprio_get')",
        "capget": ("check(libc.syscall({n}, ctypes.create_string_buffer((0x20080522).to_bytes(4, 'little') + "
                   "p.to_bytes(4, 'little')), ctypes.create_string_buffer(24)), 'capget')").format(n=nr["capget"]),
        "get_robust_list": ("check(libc.syscall({n}, p, ctypes.byref(ctypes.c_void_p()), "
                            "ctypes.byref(ctypes.c_size_t())), 'get_robust_list')").format(n=nr["get_robust_list"]),
    }
    pids = [1, os.getpid(), 999999999]
    for name, expr in exprs.items():
        body = (LIBC_IN_JOB + "out = []\n"
                f"for p in {pids!r}:\n"
                "    try:\n"
                f"        out.append('ok:' + repr(bool({expr})))\n"
                "    except OSError as e:\n"
                "        out.append('E' + str(e.errno))\n"
                "raise ValueError('OUT ' + ' '.join(out))")
        got = _parse_outcomes(run_escaped(pool, body))
        assert got == ["E1"] * len(pids), (name, dict(zip(pids, got)))
    assert_serving(pool)


def test_escaped_job_sees_the_sandbox_hostname_only(pool):
    assert_serving(pool)
    if not pool.hardening.get("utsns") and os.geteuid() != 0:  # root always gets one
        pytest.skip("no UTS namespace without privileges or user namespaces here")
    res = run_escaped(pool, "raise ValueError('NODE ' + os.uname().nodename + ' ' + socket.gethostname())")
    assert "NODE sandbox sandbox" in str(res), str(res)


def test_escaped_job_can_still_fstat_its_own_descriptors(pool):
    body = ("import stat\nst = [os.fstat(fd) for fd in range(5)]\n"
            "assert stat.S_ISFIFO(st[3].st_mode) and stat.S_ISCHR(st[0].st_mode), st")
    assert isinstance(run_escaped(pool, body), np.ndarray)
    assert_serving(pool)


# ---- a program that breaks the protocol spends its failure budget -----------------------------------

BREAK = "os.write(3, b'\\x00\\x00\\x00\\x05{bad}')\nos._exit(0)"


def test_protocol_breakers_spend_the_failure_budget(pool):
    seqs = [make_seq(4) for _ in range(6)]
    src = "import os\ndef f(seq):\n" + "".join(f"    {line}\n" for line in BREAK.splitlines())
    res = pool.run(src, seqs, timeout=2.0, max_failures=2, _unrestricted=True)
    assert all(isinstance(r, ProgramExecutionError) for r in res), res
    skipped = [r for r in res if "not run: the program already failed 2 time(s)" in str(r)]
    broke = [r for r in res if "broke the result protocol" in str(r) and r not in skipped]
    assert len(broke) == 2 and len(skipped) == 4, [str(r) for r in res]
    assert all("broke the result protocol" in str(r) for r in skipped)  # the skip names the last failure
    assert_serving(pool)


# ---- the filters themselves, evaluated for both architectures ---------------------------------------

def _run_bpf(code: bytes, nr: int, args: tuple[int, ...] = (), arch: int | None = None, table=None) -> int:
    """Evaluate a classic-BPF seccomp program on one syscall (a tiny interpreter of the opcodes it uses)."""
    import struct

    data = struct.pack("iI", nr, table["arch"] if arch is None else arch) + b"\0" * 8
    data += b"".join(struct.pack("Q", a & 0xFFFFFFFFFFFFFFFF) for a in (tuple(args) + (0,) * 6)[:6])
    prog = [struct.unpack_from("HBBI", code, 8 * i) for i in range(len(code) // 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = prog[pc]
        pc += 1
        if op == 0x20:
            acc = struct.unpack_from("I", data, k)[0]
        elif op == 0x06:
            return k
        elif op == 0x05:
            pc += k
        else:
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if hit else jf


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_filters_give_every_listed_syscall_its_verdict(machine):
    from headsurgeon.synth.sandbox import hardening as h

    table, me, other = h._SECCOMP_TABLES[machine], 4242, 4343
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
    zygote = h._filter_template(machine, "zygote")[0]
    child = bytearray(h._filter_template(machine, "child")[0])
    for off in h._filter_template(machine, "child")[1]:
        child[off:off + 4] = me.to_bytes(4, "little")
    child = bytes(child)

    def run(code, nr, *args, **kw):
        return _run_bpf(code, nr, args, table=table, **kw)

    for nr in table["zygote"].values():
        assert run(zygote, nr, 0) == eperm and run(child, nr, 0) == allow  # stacked: the zygote's filter denies
    for nr in list(table["child"].values()) + list(table["files"].values()):
        assert run(child, nr, me, 0x1000) == eperm and run(zygote, nr) == allow
    for nr in table["enosys"].values():
        assert run(zygote, nr) == enosys and run(child, nr) == enosys
    for nr in table["self_only"].values():
        assert (run(child, nr, me), run(child, nr, 0), run(child, nr, other)) == (allow, eperm, eperm)
    for nr in table["self_or_zero"].values():
        assert (run(child, nr, me), run(child, nr, 0), run(child, nr, other)) == (allow, allow, eperm)
    for nr, which in table["who_self"].values():
        assert (run(child, nr, which, me), run(child, nr, which, 0), run(child, nr, which, other),
                run(child, nr, which + 1, me)) == (allow, allow, eperm, eperm)
    for nr, flags in table["empty_path"].values():
        with_flag = [0, 0, 0, 0]
        with_flag[flags] = 0x1000 | 0x100
        without = [0, 0, 0, 0]
        without[flags] = 0x100
        assert run(child, nr, *with_flag) == allow and run(child, nr, *without) == eperm
    assert run(child, table["prctl"], h.PRCTL_ALLOWED[0]) == allow
    assert run(child, table["prctl"], 1, 0) == eperm  # PR_SET_PDEATHSIG
    listed = set(table["zygote"].values()) | set(table["child"].values()) | set(table["files"].values())
    unlisted = [nr for nr in range(0, 470) if nr not in listed and all(
        nr not in table[k].values() and nr not in [v[0] for v in table[k].values() if isinstance(v, tuple)]
        for k in ("enosys", "self_only", "self_or_zero", "who_self", "empty_path")) and nr != table["prctl"]]
    assert all(run(child, nr, other) == allow and run(zygote, nr, other) == allow for nr in unlisted)
    assert run(child, 0, arch=0x40000003) == kill and run(zygote, 0, arch=0x40000003) == kill  # i386 entry
    if table["x32"]:
        assert run(child, 0x40000000 | 1) == eperm and run(zygote, 0x40000000 | 1) == eperm
