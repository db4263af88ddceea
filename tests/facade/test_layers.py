"""The layer rules of docs/architecture.md, enforced: import-linter's contracts (pyproject.toml) and private names."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def _only_python(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or (not n.endswith(".py") and not os.path.isdir(Path(folder) / n))]


def _lint_imports(tree: Path, *args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter", reason="pip install import-linter (in the test extra)")
    exe = Path(sys.executable).with_name("lint-imports")
    command = [str(exe)] if exe.is_file() else [shutil.which("lint-imports") or "lint-imports"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([*command, str(PYPROJECT), "--no-cache", *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, "import-linter contracts broken:\n" + r.stdout[r.stdout.find("Contracts"):] + r.stderr


def _plant(tmp_path: Path, file: str, code: str, contract: str) -> subprocess.CompletedProcess:
    """import-linter's ``contract`` on a copy of the package whose ``file`` (under headsurgeon/) ends with ``code``."""
    planted = tmp_path / "tree"
    shutil.copytree(ROOT / "headsurgeon", planted / "headsurgeon", ignore=_only_python)
    with open(planted / "headsurgeon" / file, "a", encoding="utf-8") as f:
        f.write(code)
    return _lint_imports(planted, "--contract", contract)


def test_layers_contract_catches_an_upward_import(tmp_path):
    """The contract is not vacuous: a kernel that imports the hub breaks it."""
    r = _plant(tmp_path, "core/fileio.py", "\nfrom headsurgeon.hub import zoo  # planted by the test\n",
               "layers")
    assert r.returncode != 0 and "headsurgeon.core.fileio -> headsurgeon.hub.zoo" in r.stdout, r.stdout


def test_acyclic_contract_covers_the_facade_subpackages(tmp_path):
    """A function-level import back from ray_run.py into run.py (a cycle between the two modules) breaks the contract."""
    r = _plant(tmp_path, "scaleout/ray_run.py",
               "\n\ndef _planted():\n    from .run import run_heads  # planted by the test\n", "acyclic")
    assert r.returncode != 0 and "headsurgeon.scaleout" in r.stdout, r.stdout


def _module_name(tree: Path, path: Path) -> str:
    parts = list(path.relative_to(tree).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_name_imports(tree: Path) -> list[str]:
    """``module:line: other.module._name`` for each private name a module takes from outside its own package.

    A private name of module ``P.m`` (or of package ``P`` itself) is shared within ``P`` and its subpackages.
    """
    files = {_module_name(tree, p): p for p in (tree / "headsurgeon").rglob("*.py")}

    def outside(importer: str, owner: str) -> bool:
        home = owner if files[owner].name == "__init__.py" else owner.rpartition(".")[0]
        return importer != home and not importer.startswith(home + ".")

    found = []
    for module, path in sorted(files.items()):
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        parsed = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}  # local name -> headsurgeon module it is bound to
        for node in ast.walk(parsed):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                if not source.startswith("headsurgeon"):
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in files:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif _private(alias.name) and source in files and outside(module, source):
                        found.append(f"{module}:{node.lineno}: {source}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("headsurgeon") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(parsed):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _private(node.attr) and outside(module, aliases[node.value.id])):
                found.append(f"{module}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(found))


def test_no_private_names_across_packages():
    """A leading underscore means private to the defining package; other packages use a public name instead."""
    found = private_name_imports(ROOT)
    assert not found, "private names used outside their package:\n" + "\n".join(found)


def test_private_name_check_sees_both_spellings(tmp_path):
    for folder in ("headsurgeon", "headsurgeon/synth", "headsurgeon/hub"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "headsurgeon/synth/a.py").write_text("_x = 1\n")
    (tmp_path / "headsurgeon/synth/b.py").write_text("from .a import _x\n")  # same package: allowed
    (tmp_path / "headsurgeon/hub/c.py").write_text(
        "from ..synth.a import _x\nfrom ..synth import a\ny = a._x\nfrom ..synth.a import __doc__\n")
    assert private_name_imports(tmp_path) == ["headsurgeon.hub.c:1: headsurgeon.synth.a._x",
                                              "headsurgeon.hub.c:3: headsurgeon.synth.a._x"]
