"""CI runs the suite exactly as README tells a developer to (.ci/run's last command is README's test command)."""
from __future__ import annotations

import re
import shlex

from conftest import ROOT


def readme_test_command() -> str:
    """The one command in README's "Run the tests" bash block."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Run the tests"):]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)[:1]
    (line,) = [line for line in block.splitlines() if line.strip()]
    return line.strip()


def test_ci_runs_readmes_test_command():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == readme_test_command(), "make .ci/run's last line README's \"Run the tests\" command"


def test_parallel_runs_keep_each_file_on_one_worker():
    """Module fixtures (one explain run, one Ray cluster) are built once only if a file's tests share a worker."""
    args = shlex.split(readme_test_command())
    if "-n" in args:
        assert "--dist" in args and args[args.index("--dist") + 1] == "loadfile", "add --dist loadfile beside -n"

