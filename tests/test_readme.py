"""README.md's examples run as written: its Python blocks and every command line of its CLI section.

The text is read from README.md at test time, so a changed README is what gets tested. Commands run in
a scratch checkout folder whose ``../shared`` is the real one, so the README's relative paths hold.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED, need

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("index", range(len(blocks(section("Python API"), "python"))))
def test_python_examples_run_as_written(tmp_path, index):
    code = blocks(section("Python API"), "python")[index]
    r = run([sys.executable, "-c", code], scratch(tmp_path))
    assert r.returncode == 0, f"README Python block {index} failed:\n{code}\n{r.stderr[-3000:]}"


def cli_lines() -> tuple[dict[str, str], list[str]]:
    text = section("Command line")
    variables = dict(re.findall(r'`(M|C)="?([^`"]+)"?`', text))
    lines = [line.split("  #")[0].strip() for line in blocks(text, "bash")[0].splitlines() if line.strip()]
    return variables, lines


def test_cli_examples_run_as_written(tmp_path):
    variables, lines = cli_lines()
    assert set(variables) == {"M", "C"} and len(lines) >= 8
    work = scratch(tmp_path)
    prefix = " ".join(f"{k}={shlex.quote(v)};" for k, v in variables.items())
    for line in lines:
        r = run(["bash", "-c", f"{prefix} {line}"], work)
        assert r.returncode == 0, f"README command failed: {line}\n{r.stderr[-3000:]}"
    assert (work / "hs-out" / "explain" / "report.html").is_file()
    demo = work / "hs-out" / "demo"  # the demo exits 1 unless the reloaded hybrid's logits are identical
    for name in ("report.html", "programs.json", "sweep.png", "hybrid/manifest.json", "hybrid/README.md"):
        assert (demo / name).exists(), name
    from headsurgeon.hub.checkpoint import load_hybrid

    again = load_hybrid(demo / "hybrid")
    assert again.replaced and again.handle.n_layers * again.handle.n_heads == 16  # tiny-stories: 4 x 4 heads
    again.restore()
    assert not [p for p in work.iterdir() if p.name != "hs-out"], "README commands wrote outside hs-out/"
