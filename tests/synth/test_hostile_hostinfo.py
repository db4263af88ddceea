"""Hostile Python programs that read the host: install paths, home, hostname (SECURITY.md, headsurgeon/synth/pysafety/policy.py).

What a program returns can travel to an LLM endpoint (refinement feedback, an EAPS label), so no name the
attribute allowlist admits may hand a program the venv path, ``sys.prefix``, the home directory or the
hostname. The sweep calls every admitted public name of numpy (and of its allowed submodules, ``math`` and
``re``) with no arguments inside a real sandbox worker, and also takes its text; the explicit cases are the
known routes (``np.get_include()``, a module's repr).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from headsurgeon.synth.errors import ProgramValidationError
from headsurgeon.synth.pysafety import ALLOWED_NUMPY_SUBMODULES, allowed_attributes, validate_source
from headsurgeon.synth.sandbox import SandboxPool
from headsurgeon.synth.sequence import Sequence


def host_secrets() -> list[str]:
    """Strings about this machine that no program output may contain."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(np.__file__).resolve().parent.parent),
             os.path.expanduser("~"), socket.gethostname()}
    return sorted(s for s in found if s and s not in ("/", "."))


def secret_patterns() -> list[str]:
    """One regex per secret; a secret only counts as a whole word (a hostname like 'vm' is inside 'divmod')."""
    return [r"(?<![A-Za-z0-9_.-])" + re.escape(s) + r"(?![A-Za-z0-9_-])" for s in host_secrets()]


def roots() -> dict[str, types.ModuleType]:
    """The modules programs can name, keyed by how a program spells them."""
    out = {"np": np, "math": math, "re": re}
    out.update({f"np.{s}": getattr(np, s) for s in sorted(ALLOWED_NUMPY_SUBMODULES) if hasattr(np, s)})
    return out


def admitted_names() -> list[str]:
    """Every ``module.name`` the allowlist admits, except the submodules themselves (refused as values)."""
    allowed = allowed_attributes()
    names = []
    for spelled, mod in roots().items():
        for name in sorted(set(dir(mod)) | set(vars(mod))):  # dir(): numpy's lazily loaded names too
            if name in allowed and not isinstance(getattr(mod, name, None), types.ModuleType):
                names.append(f"{spelled}.{name}")
    return names


def sweep_source(names: list[str], first: int = 0) -> str:
    """One program that takes the text of each name and of calling it with no arguments, and reports hits."""
    lines = ["def f(seq):",
             f"    pats = {secret_patterns()!r}",
             "    hits = []",
             "    def texts(thunk):",
             "        out = []",
             "        try:",
             "            obj = thunk()",
             "            out.append(str(obj))",
             "            if callable(obj):",
             "                out.append(str(obj()))",
             "        except Exception:",  # a refused or failed call reveals nothing
             "            pass",
             "        return out",
             "    checks = ["]
    lines += [f"        ({first + k}, lambda: {name})," for k, name in enumerate(names)]
    lines += ["    ]",
              "    for k, thunk in checks:",
              "        if any(re.search(p, t) for t in texts(thunk) for p in pats):",
              "            hits.append(k)",
              "    label = 'clean' if not hits else ','.join(str(k) for k in hits)",
              "    return label[:200], np.zeros((seq.n, seq.n))"]
    return "\n".join(lines) + "\n"


def make_seq(n: int = 4) -> Sequence:
    tokens = [f"t{i}" for i in range(n)]
    starts = np.arange(n) * 3
    return Sequence(ids=np.arange(n), tokens=tokens, text=" ".join(tokens),
                    offsets=np.stack([starts, starts + 2], axis=1), doc=0)


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(workers=1, memory_mb=512, chunk_size=1)
    yield p
    p.close()


def test_the_secrets_are_real_and_the_patterns_find_them():
    secrets = host_secrets()
    assert any(s in np.__file__ for s in secrets)  # the install path is among them
    assert all(re.search(p, f"<x '{s}/lib'>") for p, s in zip(secret_patterns(), secrets))


def test_sweep_every_admitted_name_called_in_the_sandbox_reveals_no_host_detail(pool):
    names = admitted_names()
    assert "np.zeros" in names and "np.random.default_rng" in names and len(names) > 300
    hits: list[str] = []
    per = 300  # names per program, to stay under the validator's source size limit
    for first in range(0, len(names), per):
        source = sweep_source(names[first:first + per], first)
        validate_source(source)  # every name the sweep uses is admitted, so the program itself is legal
        results, labels = pool.run_labeled(source, [make_seq()], timeout=60.0)
        assert isinstance(results[0], np.ndarray), results[0]
        if labels[0] != "clean":
            hits += [names[int(k)] for k in labels[0].split(",") if k]
    assert not hits, f"these names reveal the host to programs: {hits}"


_PRINT_SWEEP = r"""
import contextlib, io, json, re, sys, warnings
import numpy as np
names, pats = json.loads(sys.stdin.read())
warnings.simplefilter("ignore")
hits = []
for name in names:
    mod_name, _, attr = name.rpartition(".")
    obj = eval(mod_name, {"np": np, "math": __import__("math"), "re": re})
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            getattr(obj, attr)()
        except Exception:
            pass
    if any(re.search(p, buf.getvalue()) for p in pats):
        hits.append(name)
print(json.dumps(hits))
"""


def test_sweep_no_admitted_name_prints_a_host_detail():
    """Sandbox processes discard printing (headsurgeon/synth/sandbox/worker.py); still, no admitted call may print the host."""
    payload = json.dumps([admitted_names(), secret_patterns()])
    out = subprocess.run([sys.executable, "-c", _PRINT_SWEEP], input=payload, capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("source, needle", [
    ("def f(seq):\n    return np.get_include()\n", "reveals the host"),
    ("from numpy import get_include\ndef f(seq):\n    return 0\n", "reveals the host"),
    ("def f(seq):\n    return str(np)\n", "install path"),
    ("def f(seq):\n    return repr(re)\n", "install path"),
    ("def f(seq):\n    return str(math)\n", "install path"),
    ("def f(seq):\n    return f'{np.linalg}'\n", "install path"),
    ("def f(seq):\n    return str(np.random)\n", "install path"),
    ("def f(seq):\n    m = np.char\n    return 0\n", "install path"),
    ("def f(seq):\n    return [np.fft][0]\n", "install path"),
    ("import numpy.linalg as la\ndef f(seq):\n    return str(la)\n", "install path"),
    ("from numpy import strings\ndef f(seq):\n    return str(strings)\n", "install path"),
    ("import numpy\ndef f(seq):\n    return str(numpy.emath)\n", "install path"),
    ("def f(seq):\n    return np.show_config()\n", "external tools"),
    ("def f(seq):\n    return np.lib.utils\n", "only numpy"),
    ("def f(seq):\n    return np.__config__\n", "dunder"),
    ("def f(seq):\n    return np.__file__\n", "dunder"),
    ("def f(seq):\n    return np.testing.__file__\n", "only numpy"),
    ("def f(seq):\n    return np.f2py\n", "external tools"),
    ("def f(seq):\n    return np.ctypeslib\n", "raw memory"),
    ("def f(seq):\n    return np.version.version\n", "only numpy"),
])
def test_host_revealing_routes_are_refused(source, needle):
    with pytest.raises(ProgramValidationError) as info:
        validate_source(source)
    assert needle in str(info.value), str(info.value)


def test_modules_still_reach_their_functions():
    source = ("import numpy as np\nfrom numpy import random, linalg\n"
              "def f(seq):\n    rng = random.default_rng(0)\n    m = np.random.default_rng(1).random((seq.n, seq.n))\n"
              "    re = seq.n\n    return m + linalg.norm(m) + np.linalg.norm(m) + math.sqrt(re) + len(str(re))\n")
    assert validate_source(source) == "f"


def test_get_include_really_names_the_install_path():
    """The refusal is not hypothetical: the call it prevents returns the environment's path."""
    assert any(re.search(p, np.get_include()) for p in secret_patterns())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print(np.linalg)
    assert any(re.search(p, buf.getvalue()) for p in secret_patterns())
