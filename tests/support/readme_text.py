"""README.md's text and a scratch checkout to run its examples in (tests/facade/test_readme.py,
tests/facade/test_readme_cli.py, tests/facade/test_readme_cli_rest.py).

The text is read from README.md at test time, so a changed README is what gets tested. Commands run in
a scratch checkout folder whose ``../shared`` is the real one, so the README's relative paths hold.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHARED, need

README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 3)
    return README[start: end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def scratch(tmp_path: Path) -> Path:
    """A folder laid out like a checkout beside ../shared."""
    need(SHARED / "data")
    (tmp_path / "shared").symlink_to(SHARED)
    work = tmp_path / "checkout"
    work.mkdir()
    return work


def run(command: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def cli_lines() -> tuple[dict[str, str], list[str]]:
    """README's CLI variables (M, C) and its command lines, comments dropped."""
    text = section("Command line")
    variables = dict(re.findall(r'`(M|C)="?([^`"]+)"?`', text))
    lines = [line.split("  #")[0].strip() for line in blocks(text, "bash")[0].splitlines() if line.strip()]
    return variables, lines


#: the corpus README's examples run on by default: the same subcommands, calls, flags and outputs on 12 windows of 24
#: tokens (README's 60 windows of 64 tokens make its CLI and Python tests 5 minutes of the suite; `-m slow` runs them so)
SMALL_WINDOWS, SMALL_LEN = 12, 24
#: as written (slow) and small (by default), for pytest.mark.parametrize("small", SIZES)
SIZES = [pytest.param(False, id="as-written", marks=pytest.mark.slow), pytest.param(True, id="small")]


def sized(lines: list[str], small: bool) -> list[str]:
    """README's command lines, their ``--max-sequences 60`` read as the small corpus where ``small``."""
    if not small:
        return lines
    sizes = [line for line in lines if "--max-sequences" in line or "--max-len" in line]
    assert all("--max-sequences 60" in line and "--max-len" not in line for line in sizes), \
        "README's corpus flags changed: size its lines here"
    return [line.replace("--max-sequences 60", f"--max-sequences {SMALL_WINDOWS} --max-len {SMALL_LEN}")
            for line in lines]


def sized_python(codes: list[str], small: bool) -> list[str]:
    """README's Python blocks, their ``max_len=64, max_sequences=60`` read as the small corpus where ``small``."""
    if not small:
        return codes
    assert "max_len=64, max_sequences=60" in "".join(codes), "README's corpus size changed: size its blocks here"
    return [code.replace("max_len=64, max_sequences=60", f"max_len={SMALL_LEN}, max_sequences={SMALL_WINDOWS}")
            for code in codes]


def _outputs(line: str) -> list[str]:
    return re.findall(r"hs-out/[\w.\-/]+", line)


def chain(lines: list[str], first: str) -> list[str]:
    """The line starting with ``first`` and every later line that reads what a line of the chain wrote (a path under
    one of its ``hs-out/`` paths), in README order: a group of lines that can run in a folder of its own."""
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    group, written = [lines[start]], list(_outputs(lines[start]))
    for line in lines[start + 1:]:
        if any(p == w or p.startswith(w.rstrip("/") + "/") for p in _outputs(line) for w in written):
            group.append(line)
            written += _outputs(line)
    return group


#: runs README command lines in one fresh Python process through the console script's entry point
#: (headsurgeon.cli:main, pyproject.toml [project.scripts]): the same code and arguments as the shell's
#: ``headsurgeon`` and the same exit codes, without a Python start (4-5 s of imports) per line
RUNNER = """
import json, sys
from headsurgeon.cli import main
for line, argv in json.loads(sys.argv[1]):
    print("$", line, file=sys.stderr, flush=True)
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    if code:
        print(f"README command failed with exit code {code}: {line}", file=sys.stderr)
        sys.exit(1)
"""


def commands(line: str, variables: dict[str, str]) -> list[list[str]]:
    """A README command line as the argument lists of its ``headsurgeon`` commands (``&&`` chains them), its
    variables expanded and split as the shell splits an unquoted variable; any other shell syntax is refused."""
    for name, value in variables.items():
        line = line.replace(f"${name}", value)
    words = shlex.split(line)
    assert not any(ch in w for w in words for ch in "$|;<>`"), f"not a plain command: {line}"
    out: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            out.append([])
        else:
            out[-1].append(word)
    assert all(argv and argv[0] == "headsurgeon" for argv in out), f"not a headsurgeon command line: {line}"
    return [argv[1:] for argv in out]


#: runs README's Python blocks in order in one fresh Python process, each in a namespace of its own (as a new script)
PYTHON_RUNNER = """
import json, sys, traceback
for i, code in enumerate(json.loads(sys.argv[1])):
    try:
        exec(compile(code, f"<README Python block {i}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        print(f"README Python block {i} failed:\\n{code}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def run_python_blocks(codes: list[str], work: Path) -> None:
    """Run README's Python blocks in ``work``, failing with the first failing block and its traceback."""
    r = run([sys.executable, "-c", PYTHON_RUNNER, json.dumps(codes)], work)
    assert r.returncode == 0, r.stderr[-4000:]


def run_lines(lines: list[str], variables: dict[str, str], work: Path) -> None:
    """Run the lines in order in ``work`` (the README's variables set), failing on the first that fails."""
    plan = [(line, argv) for line in lines for argv in commands(line, variables)]
    r = run([sys.executable, "-c", RUNNER, json.dumps(plan)], work)
    assert r.returncode == 0, f"README command failed:\n{r.stderr[-3000:]}"
    assert not [p for p in work.iterdir() if p.name != "hs-out"], "README commands wrote outside hs-out/"
