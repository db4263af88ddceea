"""README.md's `headsurgeon explain` line and the lines that read its output run in order in a scratch checkout, as
written (slow) and on 12 windows of 24 tokens (by default; support/readme_text.py's SIZES); the other command lines:
tests/facade/test_readme_cli_rest.py (two files, so that pytest-xdist runs them side by side)."""
from __future__ import annotations

import pytest

from support.readme_text import SIZES, chain, cli_lines, run_lines, scratch, sized

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("small", SIZES)
def test_explain_and_the_lines_reading_its_output_run_as_written(tmp_path, small):
    variables, lines = cli_lines()
    assert set(variables) == {"M", "C"} and len(lines) >= 8
    group = chain(lines, "headsurgeon explain")
    assert any(line.startswith("headsurgeon eval") for line in group)  # eval reads hs-out/explain/programs.json
    work = scratch(tmp_path)
    run_lines(sized(group, small), variables, work)
    assert (work / "hs-out" / "explain" / "report.html").is_file()
