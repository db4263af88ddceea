"""README.md's `headsurgeon explain` line and the lines that read its output run as written, in order, in a scratch
checkout (the other command lines: tests/facade/test_readme_cli_rest.py; two files, so that pytest-xdist runs them
side by side)."""
from __future__ import annotations

import pytest

from support.readme_text import chain, cli_lines, run_lines, scratch

pytestmark = pytest.mark.e2e


def test_explain_and_the_lines_reading_its_output_run_as_written(tmp_path):
    variables, lines = cli_lines()
    assert set(variables) == {"M", "C"} and len(lines) >= 8
    group = chain(lines, "headsurgeon explain")
    assert any(line.startswith("headsurgeon eval") for line in group)  # eval reads hs-out/explain/programs.json
    work = scratch(tmp_path)
    run_lines(group, variables, work)
    assert (work / "hs-out" / "explain" / "report.html").is_file()
