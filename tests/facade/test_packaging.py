"""`pip install .` and `pip install -e .` both install the headsurgeon package tree, the folder tree as it is."""
from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import ROOT

CHECK = (
    "import importlib.util as u, headsurgeon.surgery, headsurgeon.kernels, headsurgeon.synth, headsurgeon.tp, "
    "headsurgeon.hub, headsurgeon.cli; "
    "assert all(u.find_spec(n) is None for n in ('kernels', 'surgery', 'synth', 'hub')), 'bare top-level package'; "
    "print(headsurgeon.kernels.__file__)"
)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    """One fresh venv (with pip, without the repository) for both installs: each install replaces the last."""
    env_dir = tmp_path_factory.mktemp("packaging") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    return env_dir / "bin" / "python"


@pytest.mark.parametrize("editable", [False, True], ids=["regular", "editable"])
def test_install_imports_from_outside_the_repository(tmp_path, venv_python, editable):
    py = venv_python
    cmd = [str(py), "-m", "pip", "install", "-q", "--no-deps", *(["-e"] if editable else []), str(ROOT)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    if r.returncode != 0 and ("Could not find a version" in r.stderr or "Network is unreachable" in r.stderr):
        pytest.skip(f"pip cannot fetch the build backend here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    location = Path(r.stdout.strip())
    if editable:
        assert location == ROOT / "headsurgeon" / "kernels" / "__init__.py"
    else:
        assert "site-packages" in location.parts and location.parent.name == "kernels"
        assert location.parent.parent.name == "headsurgeon"
        installed = location.parent.parent
        missing = [str(rel) for rel in repository_packages() if not (installed / rel / "__init__.py").is_file()]
        assert not missing, f"subpackages left out of the wheel (list them in pyproject.toml): {missing}"
        assert (installed / "surgery" / "measure" / "lm_eval_tasks" / "eaps6.yaml").is_file(), "the eaps6 task group is package data"
        assert (installed / "py.typed").is_file(), "type checkers read the package's annotations (PEP 561)"


def repository_packages() -> list[Path]:
    """Every package folder of the repository's headsurgeon/, relative to it."""
    package = ROOT / "headsurgeon"
    return [init.parent.relative_to(package) for init in package.rglob("__init__.py") if "__pycache__" not in init.parts]


def test_headsurgeon_is_the_only_package_at_the_root():
    """The folder tree is the package tree: every library module lives under headsurgeon/, so none can shadow an
    installed package when Python runs from the checkout."""
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert packages == ["headsurgeon"]
