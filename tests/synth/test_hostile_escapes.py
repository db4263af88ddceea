"""Hostile Python programs: escape routes the validator refuses, and containment that holds after an escape.

Two layers, tested apart (SECURITY.md):
* the attribute allowlist and AST rules refuse every known escape route before anything runs;
* assuming an escape anyway, a real sandbox worker given the real builtins and ``os`` (the test-only
  ``_unrestricted`` / ``_skip_validation`` hooks of ``SandboxPool.run``) can open, list, create, delete,
  truncate, connect, fork, exec and signal nothing, and the pool keeps serving the next program.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pytest

from headsurgeon.synth.errors import ProgramExecutionError, ProgramValidationError
from headsurgeon.synth.pysafety import allowed_attributes, validate_source
from headsurgeon.synth.sandbox import SandboxPool
from support.escapes import SEQ, assert_refused, assert_serving, run_escaped

FW = "\uff46\uff55\uff4e\uff43"  # fullwidth "func": NFKC-normalized to ASCII by the parser
FWC = "\uff43\uff4c\uff41\uff53\uff53"  # fullwidth "class": NFKC "class"

# name -> (source, a word the refusal must contain)
ROUTES: dict[str, tuple[str, str]] = {
    "numpy_func_globals": ("def f(seq):\n    return np.random.rand.func_globals\n", "func_globals"),
    "numpy_func_code": ("def f(seq):\n    return np.random.rand.func_code\n", "func_code"),
    "numpy_func_closure": ("def f(seq):\n    return np.random.randint.func_closure\n", "func_closure"),
    "nfkc_func_globals": (f"def f(seq):\n    return np.random.rand.{FW}_globals\n", "func_globals"),
    "nfkc_dunder_class": (f"def f(seq):\n    return (1).__{FWC}__\n", "dunder"),
    "subclasses": ("def f(seq):\n    return ().__class__.__base__.__subclasses__()\n", "dunder"),
    "format_string": ("def f(seq):\n    return '{0.__class__}'.format(seq)\n", "dunder"),
    "format_attribute": ("def f(seq):\n    return '{0.ids.base}'.format(seq)\n", "format"),
    "format_map": ("def f(seq):\n    return '{x.ids}'.format_map({'x': seq})\n", "format_map"),
    "fstring_dunder": ("def f(seq):\n    return f'{seq.__class__}'\n", "dunder"),
    "generator_frame": ("def f(seq):\n    g = (x for x in [])\n    return g.gi_frame.f_back.f_globals\n", "gi_frame"),
    "traceback_frame": ("def f(seq):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n"
                        "        return e.__traceback__.tb_frame\n", "dunder"),
    "with_traceback": ("def f(seq):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n"
                       "        return e.with_traceback(None)\n", "allowlist"),
    "memoryview_obj": ("def f(seq):\n    return seq.ids.data.obj\n", "allowlist"),
    "ndarray_ctypes": ("def f(seq):\n    return seq.ids.ctypes.data\n", "raw memory"),
    "ctypeslib": ("def f(seq):\n    return np.ctypeslib.as_array\n", "raw memory"),
    "from_numpy_import_ctypeslib": ("from numpy import ctypeslib\ndef f(seq):\n    return 0\n", "raw memory"),
    "open_memmap": ("def f(seq):\n    return np.lib.format.open_memmap('/tmp/x')\n", "only numpy"),
    "np_load": ("def f(seq):\n    return np.load('/etc/hostname')\n", "files"),
    "np_fromfile": ("def f(seq):\n    return np.fromfile('/etc/hostname')\n", "files"),
    "tofile": ("def f(seq):\n    seq.ids.tofile('/tmp/x')\n    return 0\n", "files"),
    "import_os": ("import os\ndef f(seq):\n    return 0\n", "may be imported"),
    "dunder_import": ("def f(seq):\n    return __import__('os')\n", "dunder"),
    "eval": ("def f(seq):\n    return eval('1')\n", "arbitrary code"),
    "getattr_by_name": ("def f(seq):\n    return getattr(np, 'lib')\n", "interpreter internals"),
    "globals": ("def f(seq):\n    return globals()\n", "interpreter internals"),
    "type_with_array_hook": ("def f(seq):\n    X = type('X', (), {'__array__': lambda s: 0})\n    return X()\n",
                             "dunder"),
    "class_with_array_hook": ("def f(seq):\n    class X:\n        def __array__(self):\n            return 0\n"
                              "    return X()\n", "class"),
    "private_features": ("def f(seq):\n    return seq.features._values\n", "private"),
    "private_numpy_rng": ("def f(seq):\n    return np.random.mtrand._rand\n", "only numpy"),
    "bit_generator": ("def f(seq):\n    return np.random.default_rng(0).bit_generator\n", "only numpy"),
    "re_internals": ("def f(seq):\n    return re.functools\n", "only numpy"),
    "dtype_mro": ("def f(seq):\n    return seq.ids.dtype.type.mro()\n", "interpreter internals"),
    "vectorize_pyfunc": ("def f(seq):\n    return np.vectorize(len).pyfunc\n", "allowlist"),
    "dunder_string_key": ("def f(seq):\n    return seq.features['__class__']\n", "dunder"),
    "open_builtin": ("def f(seq):\n    return open('/etc/hostname').read()\n", "files"),
    "finally_return": ("def f(seq):\n    try:\n        while True:\n            pass\n    finally:\n"
                       "        return np.zeros((seq.n, seq.n))\n", "finally"),
    "finally_continue": ("def f(seq):\n    for i in range(2):\n        try:\n            pass\n        finally:\n"
                         "            continue\n    return 0\n", "finally"),
    "decorator": ("@print\ndef f(seq):\n    return 0\n", "decorator"),
    "star_import": ("from math import *\ndef f(seq):\n    return 0\n", "star"),
    "show_config": ("def f(seq):\n    return np.show_config()\n", "external tools"),
    "match_class_pattern": ("def f(seq):\n    match seq:\n        case object(ids=x):\n            return x\n", "Match"),
}


def test_at_least_25_escape_routes_are_covered():
    assert len(ROUTES) >= 25


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_escape_route_is_refused(name):
    source, needle = ROUTES[name]
    with pytest.raises(ProgramValidationError) as info:
        validate_source(source)
    assert needle.lower() in str(info.value).lower(), str(info.value)


def test_allowlist_holds_no_known_escape_attribute():
    dangerous = {"func_globals", "func_code", "func_closure", "func_dict", "gi_frame", "gi_code", "cr_frame",
                 "f_back", "f_globals", "f_locals", "tb_frame", "tb_next", "co_code", "obj", "cell_contents",
                 "with_traceback", "mro", "format", "format_map", "ctypes", "ctypeslib", "lib", "load", "tofile",
                 "fromfile", "memmap", "pyfunc", "bit_generator", "im_func", "im_self", "f_builtins"}
    assert not dangerous & allowed_attributes()
    assert {"ids", "tokens", "n", "features", "word_index", "tril", "sum", "argmax", "append", "findall",
            "group", "integers"} <= allowed_attributes()


def test_ordinary_programs_still_validate():
    source = '''
import numpy as np
import re

def pattern(seq):
    """Attend to the previous word start, and to sentence ends found with a regex."""
    n = seq.n
    out = np.zeros((n, n))
    starts = np.flatnonzero(seq.features.is_word_start)
    ends = [m.start() for m in re.finditer(r"[.!?]", seq.text)]
    for i in range(n):
        prev = starts[starts < i]
        out[i, prev[-1] if prev.size else 0] += 1.0
    out += np.tril(np.ones((n, n)), -1) * (len(ends) > 0)
    rng = np.random.default_rng(0)
    out += 1e-3 * rng.random((n, n))
    return out / out.sum(axis=1, keepdims=True).clip(1e-9)
'''
    assert validate_source(source) == "pattern"


# ---------------------------------------------------------------------------------------------------
# Containment after an escape: a real worker, the real builtins and `os` in hand
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(workers=1, memory_mb=384, chunk_size=4)
    yield p
    p.close()


@pytest.fixture()
def victim():
    """A world-writable file and directory in /tmp that only the sandbox's own limits protect."""
    d = Path("/tmp") / f"headsurgeon_victim_{uuid.uuid4().hex}"
    d.mkdir()
    d.chmod(0o777)
    f = d / "precious.txt"
    f.write_text("precious")
    f.chmod(0o666)
    yield d, f
    for p in sorted(d.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
    d.rmdir()


READS = {
    "etc_hostname": "/etc/hostname",
    "parent_cmdline": f"/proc/{os.getpid()}/cmdline",
    "project_source": str(Path(__file__).resolve()),
}


@pytest.mark.parametrize("what", sorted(READS))
def test_escaped_read_after_freeing_a_descriptor_fails(pool, what):
    # the reported exploit: close a descriptor to get under RLIMIT_NOFILE, then open a world-readable file
    res = run_escaped(pool, f"os.close(4)\nraise ValueError(open({READS[what]!r}, 'rb').read()[:64])")
    assert_refused(res, "PermissionError")
    assert_serving(pool)


def test_escaped_os_open_and_listing_fail(pool):
    for body in ("os.close(4)\nos.open('/etc/hostname', os.O_RDONLY)",
                 "os.close(4)\nraise ValueError(os.listdir('/tmp'))",
                 "os.close(4)\nraise ValueError(list(os.scandir('/')))",
                 "raise ValueError(os.listdir('/proc/self/fd'))"):
        assert_refused(run_escaped(pool, body), "Error")
    assert_serving(pool)


def test_escaped_file_system_changes_fail(pool, victim):
    d, f = victim
    bodies = [
        f"os.close(4)\nopen({str(d / 'new.txt')!r}, 'w')",
        f"os.unlink({str(f)!r})",
        f"os.truncate({str(f)!r}, 0)",
        f"os.close(4)\nopen({str(f)!r}, 'r+').truncate(0)",
        f"os.rename({str(f)!r}, {str(d / 'moved.txt')!r})",
        f"os.mkdir({str(d / 'sub')!r})",
        f"os.rmdir({str(d)!r})",
        f"os.symlink('/etc/passwd', {str(d / 'link')!r})",
        f"os.link({str(f)!r}, {str(d / 'hard')!r})",
        f"os.chmod({str(f)!r}, 0o777)",
        f"os.mkfifo({str(d / 'fifo')!r})",
        f"os.utime({str(f)!r}, (0, 0))",
    ]
    for body in bodies:
        assert_refused(run_escaped(pool, body), "PermissionError")
    assert f.read_text() == "precious"
    assert sorted(p.name for p in d.iterdir()) == ["precious.txt"]
    assert (f.stat().st_mode & 0o777) == 0o666
    assert_serving(pool)


def test_escaped_network_process_and_signal_calls_fail(pool):
    parent = os.getpid()
    bodies = {
        "socket": "socket.socket()",
        "raw_socket": "import _socket\n_socket.socket()",
        "fork": "pid = os.fork()\nif pid == 0:\n    os._exit(0)",
        "exec": "os.execv('/bin/true', ['true'])",
        "posix_spawn": "os.posix_spawn('/bin/true', ['true'], {})",
        "kill_parent": f"os.kill({parent}, signal.SIGTERM)",
        "kill_zygote": "os.kill(os.getppid(), signal.SIGTERM)",
        "kill_group": "os.kill(0, signal.SIGUSR1)",
        "kill_everyone": "os.kill(-1, signal.SIGUSR1)",
        "pidfd": f"os.pidfd_open({parent})",
    }
    for name, body in bodies.items():
        assert_refused(run_escaped(pool, body), "Error")
    assert_serving(pool)


def test_escape_through_func_globals_is_contained_end_to_end(pool):
    # the reported exploit, written as a program would write it, past the validator (skipped here):
    # the restricted builtins are bypassed through a compiled numpy function's globals
    src = '''
def f(seq):
    b = np.random.rand.func_globals["_" * 2 + "builtins" + "_" * 2]
    os = (b["_" * 2 + "import" + "_" * 2] if isinstance(b, dict) else b.__import__)("os")
    os.close(4)
    raise ValueError(os.listdir("/tmp") + [open("/etc/hostname").read()])
'''
    with pytest.raises(ProgramValidationError, match="not allowed"):
        validate_source(src)
    res = pool.run(src, [SEQ], timeout=2.0, _skip_validation=True)[0]
    assert_refused(res, "PermissionError", "os.listdir")  # the escape reached the real `os`; the kernel refused
    assert_serving(pool)


def test_swallowed_timeout_is_still_a_timeout(pool):
    # `finally: return` is refused by the validator; the runtime guard holds without it
    src = ("def f(seq):\n    try:\n        while True:\n            pass\n    finally:\n"
           "        return np.zeros((seq.n, seq.n))\n")
    res = pool.run(src, [SEQ], timeout=0.5, _skip_validation=True)[0]
    assert isinstance(res, ProgramExecutionError) and res.reason == "timeout", res
    assert_serving(pool)


FORGE = """
import sys, json, struct
fr = sys._getframe(0)
while fr is not None and not isinstance(fr.f_locals.get("job"), dict):
    fr = fr.f_back
tag = fr.f_locals["job"]["job"] if {real_tag} else "0" * 16
h = json.dumps({{"t": "result", "i": {i}, "ok": True, "nbytes": {nbytes}, "job": tag}}).encode()
os.write(3, struct.pack(">I", len(h)) + h + b"\\x00" * {nbytes})
os._exit(0)
"""


@pytest.mark.parametrize("case", ["other_request", "other_sequence", "wrong_size"])
def test_forged_result_frames_are_refused(pool, case):
    """An escaped program that writes frames itself: one for another request, sequence or size is refused."""
    full = SEQ.n * SEQ.n * 4
    real_tag, i, nbytes = {"other_request": (False, 0, full), "other_sequence": (True, 3, full),
                           "wrong_size": (True, 0, 4)}[case]
    res = run_escaped(pool, FORGE.format(real_tag=real_tag, i=i, nbytes=nbytes))
    assert_refused(res, "protocol")
    assert_serving(pool)


def test_forged_frame_for_its_own_request_is_only_its_own_output(pool):
    """With the request id read from its own memory, a forged frame is no more than returning that array."""
    res = run_escaped(pool, FORGE.format(real_tag=True, i=0, nbytes=SEQ.n * SEQ.n * 4))
    assert isinstance(res, np.ndarray) and res.shape == (SEQ.n, SEQ.n) and not res.any()
    assert_serving(pool)


def test_ordinary_programs_run_inside_the_contained_worker(pool):
    """Containment leaves the program API whole: from-imports, numpy, re, features and the global RNG."""
    src = ("from numpy import tril, ones\nimport re\nfrom math import sqrt\n"
           "def f(seq):\n    w = len(re.findall(r't', seq.text)) + sqrt(4.0) + np.random.rand()\n"
           "    return tril(ones((seq.n, seq.n))) * w\n")
    res = pool.run(src, [SEQ], timeout=5.0)[0]
    assert isinstance(res, np.ndarray), res
    assert res[0, 0] > SEQ.n + 2.0 and res[0, 1] == 0.0


def test_hardening_report_names_the_file_system_layers(pool):
    assert_serving(pool)
    limits = pool.hardening["job_limits"]
    assert "open" in limits["seccomp"] and "unlink" in limits["seccomp"]
    assert "landlock" in limits


def test_landlock_alone_denies_files_when_seccomp_is_off():
    """Each file-system layer holds on its own: with the seccomp filters off, Landlock still refuses."""
    p = SandboxPool(workers=1, memory_mb=384, seccomp=False)
    try:
        assert_serving(p)
        if not p.hardening.get("landlock_abi"):
            pytest.skip("this kernel has no Landlock")
        # "/" exists in the sandbox's empty root too (hardening.py), so only Landlock can refuse these
        assert_refused(run_escaped(p, "os.close(4)\nos.open('/', os.O_RDONLY | os.O_DIRECTORY)"), "PermissionError")
        assert_refused(run_escaped(p, "os.close(4)\nraise ValueError(os.listdir('/'))"), "PermissionError")
        assert_serving(p)
    finally:
        p.close()
