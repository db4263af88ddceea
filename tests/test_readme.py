"""README.md's Python blocks run as written (its command lines: tests/test_readme_cli.py)."""
from __future__ import annotations

import sys

import pytest

from readme_text import blocks, run, scratch, section


@pytest.mark.parametrize("index", range(len(blocks(section("Python API"), "python"))))
def test_python_examples_run_as_written(tmp_path, index):
    code = blocks(section("Python API"), "python")[index]
    r = run([sys.executable, "-c", code], scratch(tmp_path))
    assert r.returncode == 0, f"README Python block {index} failed:\n{code}\n{r.stderr[-3000:]}"
