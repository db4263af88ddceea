"""Importing headsurgeon asks OpenMP for passive waits before torch loads its runtime, keeps a policy the user chose,
and where waits are passive the forwards take every usable core (headsurgeon/surgery/threads.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from headsurgeon.surgery.threads import passive_waits

PROBE = """
import headsurgeon, torch
from headsurgeon.surgery.threads import fit_threads, prefer_passive_waits, usable_cores
torch.ones(64, 64) @ torch.ones(64, 64)
print(prefer_passive_waits(), fit_threads() == usable_cores())
"""


def _probe(**env: str) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "HEADSURGEON_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, "OMP_DISPLAY_ENV": "VERBOSE", **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1], out.stderr


def test_waits_are_passive_only_where_the_runtime_loads_after_the_request_or_the_user_chose_them():
    assert passive_waits(None, torch_loaded=False)
    assert not passive_waits(None, torch_loaded=True)  # torch's runtime read the unset policy before headsurgeon
    assert passive_waits(" passive", torch_loaded=True) and not passive_waits("ACTIVE", torch_loaded=False)


def test_importing_headsurgeon_first_makes_openmp_wait_passively_and_the_forwards_take_every_core():
    stdout, stderr = _probe()
    assert "GOMP_SPINCOUNT = '0'" in stderr  # what libgomp itself read when torch loaded it (its default spins 300000)
    assert stdout == "True True"


def test_a_policy_the_user_set_is_kept():
    stdout, stderr = _probe(OMP_WAIT_POLICY="ACTIVE")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in stderr and "GOMP_SPINCOUNT = '0'" not in stderr
    assert stdout.startswith("False")
