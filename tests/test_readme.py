"""README.md's Python blocks run as written (its command lines: tests/test_readme_cli.py), in order, each in a fresh
namespace of one Python process (a Python start costs 4-5 s of imports per block)."""
from __future__ import annotations

import json
import sys

from readme_text import blocks, run, scratch, section

RUNNER = """
import json, sys, traceback
for i, code in enumerate(json.loads(sys.argv[1])):
    try:
        exec(compile(code, f"<README Python block {i}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        print(f"README Python block {i} failed:\\n{code}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def test_python_examples_run_as_written(tmp_path):
    codes = blocks(section("Python API"), "python")
    assert len(codes) >= 3
    r = run([sys.executable, "-c", RUNNER, json.dumps(codes)], scratch(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
