"""README.md's Python blocks run in order, each in a fresh namespace of one Python process (a Python start costs 4-5 s
of imports per block), as written (slow) and on 12 windows of 24 tokens (by default; support/readme_text.py's SIZES);
its command lines: tests/facade/test_readme_cli.py."""
from __future__ import annotations

import pytest

from support.readme_text import SIZES, blocks, run_python_blocks, scratch, section, sized_python

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("small", SIZES)
def test_python_examples_run_as_written(tmp_path, small):
    codes = blocks(section("Python API"), "python")
    assert len(codes) >= 3
    run_python_blocks(sized_python(codes, small), scratch(tmp_path))
