"""Sandbox for untrusted Python programs: AST validation, restricted runtime and the worker's OS limits.

Every hostile program must come back as a clear error (ProgramValidationError at validation time, or a
ProgramExecutionError with the right ``reason`` at run time) and the pool must keep serving a normal
program afterwards, whose output is checked against a direct numpy computation.

Two layers are tested separately: the validator rejects escapes, AND, with the private
``_skip_validation`` / ``_unrestricted`` hooks, the worker's OS limits contain programs that got past it.
"""
from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from headsurgeon.synth.errors import ProgramExecutionError, ProgramValidationError
from headsurgeon.synth.pysafety import analyze_source, validate_source
from headsurgeon.synth.sandbox import SandboxPool, get_pool, shutdown_pool
from headsurgeon.synth.sequence import Sequence

MEMORY_MB = 384
T = 1.0  # per-sequence timeout used by the hostile tests

NORMAL = '''
"""Same-token attention: earlier occurrences of the query token, plus half a unit on the diagonal."""
import numpy as np

def same_token(seq):
    ids = seq.ids
    eq = (ids[:, None] == ids[None, :]).astype(np.float64)
    out = np.tril(eq, -1) + 0.5 * np.eye(seq.n)
    return out / np.maximum(out.sum(axis=1, keepdims=True), 1.0)
'''


def normal_reference(ids: np.ndarray) -> np.ndarray:
    """Independent loop transcription of NORMAL."""
    n = len(ids)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i):
            out[i, j] = 1.0 if ids[i] == ids[j] else 0.0
        out[i, i] = 0.5
        out[i] /= max(out[i].sum(), 1.0)
    return out


def make_seq(n: int, seed: int) -> Sequence:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 6, size=n)
    tokens = [f"t{int(i)}" for i in ids]
    text = " ".join(tokens)
    starts = np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]])
    offsets = np.stack([starts, starts + np.array([len(t) for t in tokens])], axis=1)
    return Sequence(ids=ids, tokens=tokens, text=text, offsets=offsets, doc=seed)


SEQS = [make_seq(n, seed) for seed, n in enumerate((1, 5, 9, 16, 3))]
SEQ = make_seq(8, 100)


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(workers=2, memory_mb=MEMORY_MB, chunk_size=4)
    yield p
    p.close()


def assert_healthy(pool: SandboxPool) -> None:
    """The pool still serves a normal program, and its output equals the direct computation."""
    res = pool.run(NORMAL, SEQS, timeout=10.0)
    assert len(res) == len(SEQS)
    for s, r in zip(SEQS, res):
        assert isinstance(r, np.ndarray), r
        assert r.dtype == np.float32 and r.shape == (s.n, s.n)
        np.testing.assert_allclose(r, normal_reference(s.ids), rtol=1e-6, atol=1e-7)


def run1(pool: SandboxPool, source: str, timeout: float = T, **kw) -> object:
    out = pool.run(source, [SEQ], timeout=timeout, **kw)
    assert len(out) == 1
    return out[0]


def assert_error(res: object, reason: str, *needles: str) -> ProgramExecutionError:
    assert isinstance(res, ProgramExecutionError), f"expected a {reason} error, got {res!r}"
    assert res.reason == reason, f"reason {res.reason!r} != {reason!r}: {res}"
    for needle in needles:
        assert needle.lower() in str(res).lower(), f"{needle!r} not in {str(res)!r}"
    return res


# ---------------------------------------------------------------------------------------------------
# Normal operation
# ---------------------------------------------------------------------------------------------------


def test_normal_program_matches_numpy(pool):
    assert validate_source(NORMAL) == "same_token"
    assert_healthy(pool)


def test_dict_sequences_features_and_builtins(pool):
    src = '''
K = 2
def words(seq):
    w = seq.features.word_index
    same = (w[:, None] == w[None, :]).astype(float)
    lens = [len(t) for t in seq.tokens]
    return same * max(lens) + K * float(len(seq.text)) * np.eye(seq.n) + math.sqrt(4)
'''
    views = []
    for s in SEQS:
        w = np.arange(s.n) // 2
        views.append({"ids": s.ids, "tokens": s.tokens, "text": s.text, "offsets": s.offsets,
                      "features": {"word_index": w}})
    res = pool.run(src, views, timeout=5.0)
    for v, r in zip(views, res):
        w = v["features"]["word_index"]
        ref = (w[:, None] == w[None, :]) * max(len(t) for t in v["tokens"]) + 2 * len(v["text"]) * np.eye(len(w)) + 2
        np.testing.assert_allclose(r, ref, rtol=1e-6)
    # a view the parent did not send is a clear error naming it
    err = pool.run("def f(seq):\n    return seq.features.pos\n", views[1:2])[0]
    assert_error(err, "crash", "AttributeError", "'pos'", "word_index")


def test_real_sequence_features_are_sent(pool):
    try:
        ref = [s.features.to_dict()["word_index"] for s in SEQS]
    except Exception as e:  # noqa: BLE001 - features.py is another module; its own tests cover it
        pytest.skip(f"headsurgeon/synth/features cannot compute basic views here: {type(e).__name__}: {e}")
    src = "def f(seq):\n    w = seq.features.word_index\n    return (w[:, None] == w[None, :]) * 1.0\n"
    for r, w in zip(pool.run(src, SEQS, timeout=5.0), ref):
        np.testing.assert_array_equal(r, (w[:, None] == w[None, :]).astype(np.float32))


def test_order_batching_and_determinism(pool):
    seqs = [make_seq(n, 7 + n) for n in range(1, 30)]
    src = "def f(seq):\n    return np.random.rand(seq.n, seq.n) + seq.n\n"
    a = pool.run(src, seqs, timeout=5.0)
    b = pool.run(src, seqs, timeout=5.0)
    for s, x, y in zip(seqs, a, b):
        assert x.shape == (s.n, s.n) and x.min() >= s.n  # results come back in order
        np.testing.assert_array_equal(x, y)  # global RNG reseeded per sequence
    empty = {"ids": np.zeros(0, np.int64), "tokens": [], "text": "", "offsets": np.zeros((0, 2))}
    (r,) = pool.run(src, [empty], timeout=5.0)
    assert isinstance(r, np.ndarray) and r.shape == (0, 0)


def test_shared_pool_and_sequence_size_limit():
    p = get_pool()
    assert get_pool() is p
    r = p.run("def f(seq):\n    return np.ones((seq.n, seq.n))\n", [SEQ], timeout=10.0)[0]
    np.testing.assert_array_equal(r, np.ones((SEQ.n, SEQ.n)))
    shutdown_pool()
    assert p.closed and get_pool() is not p
    shutdown_pool()
    small = SandboxPool(workers=1, memory_mb=MEMORY_MB, max_n=4)
    try:
        out = small.run("def f(seq):\n    return np.ones((seq.n, seq.n))\n", [make_seq(3, 1), make_seq(9, 2)])
        assert isinstance(out[0], np.ndarray)
        assert_error(out[1], "sandbox", "max_n=4")
    finally:
        small.close()


# ---------------------------------------------------------------------------------------------------
# Layer 1: the validator rejects escapes (with line, construct and reason)
# ---------------------------------------------------------------------------------------------------

ESCAPES = {
    "import_os": ("import os\ndef f(seq):\n    return os.fork()\n", "import of 'os'"),
    "fork_bomb": ("def f(seq):\n    while True:\n        __import__('os').fork()\n", "'__import__'"),
    "dunder_import": ("def f(seq):\n    m = __import__('os')\n    return m\n", "name '__import__'"),
    "importlib": ("import importlib\ndef f(seq):\n    return 0\n", "importlib"),
    "from_import": ("from os import system\ndef f(seq):\n    return 0\n", "import from 'os'"),
    "subclasses": ("def f(seq):\n    return ().__class__.__base__.__subclasses__()\n", "__class__"),
    "seq_class": ("def f(seq):\n    return seq.__class__\n", "__class__"),
    "globals_attr": ("def f(seq):\n    return (lambda: 0).__globals__\n", "__globals__"),
    "builtins_name": ("def f(seq):\n    return __builtins__\n", "__builtins__"),
    "frame_walk": ("def f(seq):\n    g = (x for x in [1])\n    return g.gi_frame.f_back\n", "gi_frame"),
    "format_escape": ("def f(seq):\n    return '{0.ids}'.format(seq)\n", ".format"),
    "dunder_string": ("def f(seq):\n    k = '__class__'\n    return k\n", "__dunder__"),
    "getattr": ("def f(seq):\n    return getattr(np, 'lib')\n", "getattr"),
    "eval": ("def f(seq):\n    return eval('1')\n", "eval"),
    "exec": ("def f(seq):\n    exec('x = 1')\n", "exec"),
    "open_write": ("def f(seq):\n    open('/tmp/x', 'w').write('pwned')\n", "open"),
    "socket": ("import socket\ndef f(seq):\n    return socket.socket()\n", "socket"),
    "np_lib": ("def f(seq):\n    return np.lib.stride_tricks.as_strided(seq.ids, (10**6,), (8,))\n", ".lib"),
    "np_save": ("def f(seq):\n    np.save('/tmp/x.npy', seq.ids)\n", ".save"),
    "tofile": ("def f(seq):\n    seq.ids.tofile('/tmp/x')\n", ".tofile"),
    "np_load": ("def f(seq):\n    return np.load('/etc/passwd')\n", ".load"),
    "ctypes": ("def f(seq):\n    return seq.ids.ctypes.data\n", ".ctypes"),
    "re_internals": ("def f(seq):\n    return re.functools\n", ".functools"),
    "patch_module": ("def f(seq):\n    np.zeros = None\n", "assigning"),
    "global_stmt": ("def f(seq):\n    global np\n    return 0\n", "global"),
    "bare_except": ("def f(seq):\n    try:\n        return 1\n    except:\n        return 2\n", "bare 'except:'"),
    "class_def": ("class A:\n    pass\ndef f(seq):\n    return 0\n", "classdef"),
    "type_builtin": ("def f(seq):\n    return type(seq)\n", "'type'"),
    "private_attr": ("def f(seq):\n    return seq.features._values\n", "._values"),
    "entry_last": ("def f(seq):\n    return 0\ndef g():\n    return 0\n", "the last top-level one"),
    "global_unassigned": ("x = 1\ndef f(seq):\n    global y\n    y = 2\n    return 0\n", "not assigned at the"),
    "no_argument": ("def f():\n    return 0\n", "exactly one required positional"),
    "top_level_call": ("def f(seq):\n    return 0\nf(None)\n", "top-level expr"),
    "huge_source": ("def f(seq):\n    return 0\n" + "# pad\n" * 20000, "limit"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_validator_rejects(name):
    source, needle = ESCAPES[name]
    with pytest.raises(ProgramValidationError) as info:
        validate_source(source)
    msg = str(info.value)
    assert needle.lower() in msg.lower(), msg
    assert "not allowed" in msg or "limit" in msg or "exactly one" in msg, msg


def test_validator_reports_line_and_pool_refuses(pool):
    with pytest.raises(ProgramValidationError, match=r"^line 3: attribute access '\.__class__'"):
        pool.run("def f(seq):\n    x = 1\n    return seq.__class__\n", [SEQ])
    info = analyze_source("def f(seq):\n    return seq.features.pos\n")
    assert info.name == "f" and info.uses_features and info.mentions(("pos",))


# ---------------------------------------------------------------------------------------------------
# Run-time containment of validated but hostile programs
# ---------------------------------------------------------------------------------------------------


def test_infinite_loop_times_out(pool):
    assert_error(run1(pool, "def f(seq):\n    while True:\n        pass\n"), "timeout", "1 s", "interrupted at line")
    assert_healthy(pool)


def test_loop_in_c_is_killed_by_the_parent(pool):
    # sum over range runs in C and never lets the in-worker timer fire: the parent's deadline kills the worker
    assert_error(run1(pool, "def f(seq):\n    return sum(range(10**14))\n", timeout=0.5), "timeout", "wall clock")
    assert_healthy(pool)


def test_catastrophic_regex_times_out(pool):
    src = "def f(seq):\n    re.match(r'(a+)+$', 'a' * 40 + 'b')\n    return np.zeros((seq.n, seq.n))\n"
    assert_error(run1(pool, src), "timeout")
    assert_healthy(pool)


def test_memory_bombs(pool):
    bomb = "def f(seq):\n    a = []\n    while True:\n        a.append([0] * 1000000)\n"
    assert_error(run1(pool, bomb, timeout=10.0), "memory", "MemoryError", f"{MEMORY_MB} MiB")
    assert_error(run1(pool, "def f(seq):\n    return np.ones((1 << 40,))\n"), "memory")
    assert_healthy(pool)


def test_deep_recursion(pool):
    assert_error(run1(pool, "def f(seq):\n    return f(seq)\n"), "crash", "RecursionError")
    assert_healthy(pool)


def test_huge_and_wrong_outputs(pool):
    cases = {
        "def f(seq):\n    return np.zeros((5000, 5000))\n": "shape (5000, 5000)",
        "def f(seq):\n    return np.zeros((seq.n, seq.n + 1))\n": "expected (8, 8)",
        "def f(seq):\n    return np.zeros(seq.n)\n": "shape (8,)",
        "def f(seq):\n    return None\n": "returned None",
        "def f(seq):\n    return [[0, 1]] * 3\n": "3 rows",
        "def f(seq):\n    return [['a'] * seq.n] * seq.n\n": "dtype",
        "def f(seq):\n    return [[1] * k for k in range(seq.n)]\n": "rectangular",
        "def f(seq):\n    return np.zeros((seq.n, seq.n)) + 1j\n": "dtype complex",
    }
    for src, needle in cases.items():
        assert_error(run1(pool, src), "bad_output", needle)
    assert_error(run1(pool, "def f(seq):\n    return np.zeros((100000, 100000))\n"), "memory")
    assert_healthy(pool)


def test_nan_and_inf(pool):
    nan = "def f(seq):\n    out = np.ones((seq.n, seq.n))\n    out[2, 1] = np.nan\n    return out\n"
    assert_error(run1(pool, nan), "bad_output", "score[2, 1]", "nan", "finite")
    assert_error(run1(pool, "def f(seq):\n    return np.full((seq.n, seq.n), 1e300)\n"), "bad_output", "float32")
    assert_error(run1(pool, "def f(seq):\n    return np.log(np.zeros((seq.n, seq.n)))\n"), "bad_output", "inf")
    assert_healthy(pool)


def test_raising_program(pool):
    src = "def f(seq):\n    x = 1\n    raise ValueError('boom ' + str(seq.n))\n"
    err = assert_error(run1(pool, src), "crash", "ValueError: boom 8", "line 3")
    assert "line 3" in err.detail and "raise ValueError" in err.detail
    # top-level code failing is reported for every sequence
    for r in pool.run("X = 1 // 0\ndef f(seq):\n    return 0\n", SEQS[:2]):
        assert_error(r, "crash", "ZeroDivisionError", "top-level")
    # a program cannot swallow the sandbox's timeout with `except Exception`
    src = ("def f(seq):\n    while True:\n        try:\n            while True:\n                pass\n"
           "        except Exception:\n            pass\n")
    assert_error(run1(pool, src), "timeout")
    assert_healthy(pool)


def test_failure_budget_skips_the_rest(pool):
    seqs = [make_seq(4, k) for k in range(12)]
    res = pool.run("def f(seq):\n    while True:\n        pass\n", seqs, timeout=0.3, max_failures=2)
    assert all(r.reason == "timeout" for r in res)
    ran = [r for r in res if "not run" not in str(r)]
    assert 2 <= len(ran) <= 2 * pool.workers, [str(r) for r in res]
    assert all("exceeded its 0.3 s time limit" in str(r) for r in ran)
    assert_healthy(pool)


# ---------------------------------------------------------------------------------------------------
# Layer 2: the restricted runtime (validation skipped)
# ---------------------------------------------------------------------------------------------------


def test_restricted_runtime_without_validation(pool):
    assert_error(run1(pool, "import os\ndef f(seq):\n    return 0\n", _skip_validation=True),
                 "crash", "ImportError", "blocked")
    assert_error(run1(pool, "def f(seq):\n    open('/tmp/x', 'w')\n", _skip_validation=True),
                 "crash", "NameError", "open")
    assert_error(run1(pool, "def f(seq):\n    return __import__('socket')\n", _skip_validation=True),
                 "crash", "ImportError")
    assert_healthy(pool)


# ---------------------------------------------------------------------------------------------------
# Layer 3: OS limits hold for code that escaped both layers above
# ---------------------------------------------------------------------------------------------------

ESCAPE_TO_OS = '''
def f(seq):
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            os = c.__init__.__globals__
            break
    pid = os["fork"]()
    if pid == 0:
        os["_exit"](0)
    return np.zeros((seq.n, seq.n))
'''


def test_escape_via_subclasses_cannot_fork(pool):
    # the classic escape works at the Python level once validation is skipped ... and the fork still fails
    assert_error(run1(pool, ESCAPE_TO_OS, _skip_validation=True), "crash", "fork", "Error")
    assert_healthy(pool)


def test_worker_limits_are_in_place(pool):
    src = '''
import os, resource
def f(seq):
    out = np.zeros((seq.n, seq.n))
    names = ["RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_CORE"]
    for k, name in enumerate(names):
        out[0, k], out[1, k] = resource.getrlimit(getattr(resource, name))
    out[2, 0] = os.getuid()
    return out
'''
    r = run1(pool, src, _unrestricted=True)
    assert isinstance(r, np.ndarray), r
    soft, hard = r[0], r[1]
    np.testing.assert_array_equal(soft[:5], hard[:5])  # soft == hard: the program cannot raise them
    assert hard[0] == 0 and hard[1] == 0 and hard[4] == 0  # NPROC, FSIZE, CORE
    assert hard[2] == MEMORY_MB << 20
    assert hard[3] == 5
    if os.geteuid() == 0:
        assert r[2, 0] != 0, "a root worker must drop to an unprivileged uid"
    report = pool.hardening
    assert report["rlimits"]["RLIMIT_FSIZE"] == [0, 0] and report["job_limits"]["RLIMIT_NPROC"] == [0, 0]
    assert report["no_new_privs"]


@pytest.mark.parametrize("action", ["fork", "system", "thread", "exec", "setuid", "raise_nproc"])
def test_unrestricted_process_escapes_fail(pool, action):
    body = {
        "fork": "pid = os.fork()\n    if pid == 0:\n        os._exit(0)",
        "system": "rc = os.system('true')\n    if rc == 0:\n        return np.ones((seq.n, seq.n))\n"
                  "    raise OSError('system failed with status %d' % rc)",
        "thread": "threading.Thread(target=print).start()",
        "exec": "os.execv('/bin/true', ['true'])",
        "setuid": "os.setuid(0)",
        "raise_nproc": "resource.setrlimit(resource.RLIMIT_NPROC, (100, 100))",
    }[action]
    src = f"import os, threading, resource\ndef f(seq):\n    {body}\n    return np.zeros((seq.n, seq.n))\n"
    if action == "setuid" and os.geteuid() != 0:
        pytest.skip("only meaningful when the caller is root")
    res = run1(pool, src, _unrestricted=True)
    assert_error(res, "crash", "Error")
    assert_healthy(pool)


def test_unrestricted_file_writes_fail(pool):
    target = Path("/tmp") / f"headsurgeon_sandbox_probe_{uuid.uuid4().hex}"
    victim = Path("/tmp") / f"headsurgeon_sandbox_victim_{uuid.uuid4().hex}"
    victim.write_text("precious")
    victim.chmod(0o666)  # world-writable: only the sandbox's own limits protect it
    try:
        for path, mode in ((target, "w"), (victim, "w"), (victim, "a")):
            src = (f"def f(seq):\n    open({str(path)!r}, {mode!r}).write('pwned')\n"
                   "    return np.zeros((seq.n, seq.n))\n")
            assert_error(run1(pool, src, _unrestricted=True), "crash", "PermissionError")  # seccomp, not NOFILE
        assert not target.exists()
        assert victim.read_text() == "precious"
    finally:
        victim.unlink(missing_ok=True)
        target.unlink(missing_ok=True)
    assert_healthy(pool)


def test_unrestricted_network_fails(pool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        for conn in (f"import socket\n    socket.create_connection(('127.0.0.1', {port}))",
                     f"import _socket\n    _socket.socket().connect(('127.0.0.1', {port}))"):
            src = f"def f(seq):\n    {conn}\n    return np.zeros((seq.n, seq.n))\n"
            assert_error(run1(pool, src, _unrestricted=True), "crash", "Error")
        with pytest.raises(socket.timeout):
            server.accept()  # nobody got through
    finally:
        server.close()
    assert_healthy(pool)


def test_unrestricted_timers_blocked_parent_still_kills(pool):
    src = ("import signal\ndef f(seq):\n"
           "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGXCPU})\n"
           "    while True:\n        pass\n")
    assert_healthy(pool)
    zygotes = {w.proc.pid for w in pool._all}
    assert_error(run1(pool, src, timeout=0.5, _unrestricted=True), "timeout", "wall clock", "was killed")
    assert_healthy(pool)
    assert {w.proc.pid for w in pool._all} == zygotes  # only the job process died; the zygotes were reused


def test_unrestricted_crashes_and_protocol_garbage(pool):
    cases = [
        ("import os\ndef f(seq):\n    os._exit(3)\n", "crash", "status 3"),
        ("import ctypes\ndef f(seq):\n    return ctypes.string_at(8, 8)\n", "crash", "SIGSEGV"),
        ("import os\ndef f(seq):\n    os.write(3, b'\\xff' * 64)\n    return np.zeros((seq.n, seq.n))\n",
         "sandbox", "protocol"),
        ("import os\ndef f(seq):\n    os.write(3, b'\\x00\\x00\\x00\\x40{\"t\": ')\n    os._exit(0)\n",
         "sandbox", "truncated"),
        ("import os\ndef f(seq):\n    os.kill(os.getppid(), 0)\n", "crash", "PermissionError"),
    ]
    for src, reason, needle in cases:
        assert_error(run1(pool, src, _unrestricted=True), reason, needle)
    assert_healthy(pool)


def test_programs_cannot_affect_later_programs(pool):
    """Each job runs in a fresh fork of a pristine process: mutations (even by escaped code) do not persist."""
    poison = "def f(seq):\n    np.typecodes['Character'] = 'x' * 50\n    return np.zeros((seq.n, seq.n))\n"
    patch = "import numpy\ndef f(seq):\n    numpy.tril = numpy.ones_like\n    return numpy.zeros((seq.n, seq.n))\n"
    probe = "def f(seq):\n    return np.full((seq.n, seq.n), len(np.typecodes['Character']))\n"
    for _ in range(2 * pool.workers):  # reach every zygote
        assert isinstance(run1(pool, poison), np.ndarray)
        assert isinstance(run1(pool, patch, _unrestricted=True), np.ndarray)
    for r in pool.run(probe, SEQS, timeout=5.0):
        np.testing.assert_array_equal(r, len(np.typecodes["Character"]))
    assert_healthy(pool)  # uses np.tril


@pytest.mark.parametrize("layer", ["rlimit_only", "seccomp_only"])
def test_fork_blocked_by_each_layer_alone(layer):
    """RLIMIT_NPROC (with the root uid drop) and seccomp each stop fork on their own."""
    if layer == "rlimit_only":
        p = SandboxPool(workers=1, memory_mb=MEMORY_MB, seccomp=False)
    else:
        p = SandboxPool(workers=1, memory_mb=MEMORY_MB, sandbox_uid=None)
    try:
        src = "import os\ndef f(seq):\n    if os.fork() == 0:\n        os._exit(0)\n    return 0\n"
        err = assert_error(run1(p, src, _unrestricted=True), "crash")
        expected = "BlockingIOError" if layer == "rlimit_only" else "PermissionError"
        assert expected in str(err), err
        assert p.hardening["seccomp"] is (layer == "seccomp_only")
        assert_healthy(p)
    finally:
        p.close()


def test_concurrent_callers(pool):
    results: list = [None] * 3

    def call(k: int) -> None:
        results[k] = pool.run(NORMAL, SEQS, timeout=10.0)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for res in results:
        for s, r in zip(SEQS, res):
            np.testing.assert_allclose(r, normal_reference(s.ids), rtol=1e-6, atol=1e-7)
