"""explain in a fresh Python process, as a user's script runs it, for the tests of the pool and of Ray
(tests/facade/test_scaleout_pool.py, tests/facade/test_scaleout_ray.py): stories260K, 24 windows of 16 tokens, a
narrow enumerative search."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import CORPUS, NARROW_SEARCH, STORIES, need

MODEL = f"llama2c:{STORIES / 'stories260K.bin'}"
SETTINGS = dict(tokenizer=str(STORIES / "tok512.model"), max_len=16, max_sequences=24, searchers=["enumerative"],
                enumerative=NARROW_SEARCH, sweep_steps=[0.0, 1.0], progress=False, seed=0)

# the driver's last stdout line is a JSON summary: the run's notes, and whether it imported Ray (its own choice)
DRIVER = textwrap.dedent("""
    import json, signal, sys
    # a script started from a terminal: Ctrl-C raises KeyboardInterrupt even where the test runner itself was
    # started as a background job of a shell, which leaves SIGINT ignored in every child
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import torch
    torch.set_num_threads(1)
    from headsurgeon.pipeline import explain
    kw = json.loads(sys.argv[1])
    result = explain(kw.pop("model"), kw.pop("corpus"), kw.pop("out"), **kw)
    print(json.dumps({"ray_imported": "ray" in sys.modules, "notes": result.notes}))
""")


def drive(tmp: Path, out: Path, wait: bool = True, **kw) -> subprocess.Popen | dict:
    """Run explain with ``SETTINGS`` and ``kw`` into ``out`` in a fresh Python process of its own session; with
    ``wait``, its JSON summary once it succeeded, else the running process."""
    (tmp / "driver.py").write_text(DRIVER)
    args = json.dumps({"model": MODEL, "corpus": str(need(CORPUS)), "out": str(out), **SETTINGS, **kw})
    proc = subprocess.Popen([sys.executable, str(tmp / "driver.py"), args], cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    if not wait:
        return proc
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def programs(out: Path) -> dict:
    """The run's programs.json, parsed."""
    return json.loads((out / "programs.json").read_text())
