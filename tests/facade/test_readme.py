"""README.md's Python blocks run as written (its command lines: tests/facade/test_readme_cli.py), in order, each in a
fresh namespace of one Python process (a Python start costs 4-5 s of imports per block)."""
from __future__ import annotations

import pytest

from support.readme_text import blocks, run_python_blocks, scratch, section

pytestmark = pytest.mark.e2e


def test_python_examples_run_as_written(tmp_path):
    codes = blocks(section("Python API"), "python")
    assert len(codes) >= 3
    run_python_blocks(codes, scratch(tmp_path))
