"""Running a payload as a program that already escaped the validator: a real sandbox job holding the real builtins
and ``os`` (tests/synth/test_hostile_escapes.py, tests/synth/test_hostile_containment.py; SECURITY.md, "Python
programs"), and the checks that it was refused and that the pool still serves ordinary programs."""
from __future__ import annotations

import numpy as np

from headsurgeon.synth.errors import ProgramExecutionError
from headsurgeon.synth.sandbox import SandboxPool
from headsurgeon.synth.sequence import Sequence

NORMAL = "def f(seq):\n    return np.tril(np.ones((seq.n, seq.n)))\n"


def make_seq(n: int) -> Sequence:
    ids = np.arange(n) % 5
    tokens = [f"t{int(i)}" for i in ids]
    starts = np.cumsum([0] + [3] * (n - 1))
    return Sequence(ids=ids, tokens=tokens, text=" ".join(tokens),
                    offsets=np.stack([starts, starts + 2], axis=1), doc=0)


SEQ = make_seq(6)


def run_escaped(pool: SandboxPool, body: str, timeout: float = 2.0) -> object:
    """Run ``body`` inside a real job process that holds the real builtins and ``os`` (the assumed escape)."""
    src = ("import os, socket, signal\n"
           "def f(seq):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
           + "    return np.zeros((seq.n, seq.n))\n")
    return pool.run(src, [SEQ], timeout=timeout, _unrestricted=True)[0]


def assert_refused(res: object, *needles: str) -> ProgramExecutionError:
    assert isinstance(res, ProgramExecutionError), f"the escaped payload succeeded: {res!r}"
    for needle in needles:
        assert needle.lower() in str(res).lower(), str(res)
    return res


def assert_serving(pool: SandboxPool) -> None:
    out = pool.run(NORMAL, [SEQ, make_seq(3)], timeout=5.0)
    for r, n in zip(out, (6, 3)):
        assert isinstance(r, np.ndarray), r
        np.testing.assert_array_equal(r, np.tril(np.ones((n, n))))
