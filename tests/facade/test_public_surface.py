"""The typed `hs` surface: every lazy export is also imported under TYPE_CHECKING, and names stay the objects."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import headsurgeon

INIT = Path(headsurgeon.__file__)


def _type_checking_imports() -> dict[str, str]:
    """name → module of the ``if TYPE_CHECKING:`` block in headsurgeon/__init__.py."""
    tree = ast.parse(INIT.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    out = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names:
            out[alias.name] = f"headsurgeon.{node.module}"
    return out


def test_every_export_is_visible_to_type_checkers_from_the_same_module():
    assert _type_checking_imports() == headsurgeon._EXPORTS


def test_every_export_resolves_to_the_object_its_module_defines():
    for name, module in headsurgeon._EXPORTS.items():
        assert getattr(headsurgeon, name) is getattr(importlib.import_module(module), name), name


def test_hs_explain_is_the_function_whatever_is_imported():
    """No submodule is named like an export (headsurgeon/pipeline.py holds explain), so importing the package's
    modules never replaces ``hs.explain`` by a module."""
    import pkgutil

    clash = sorted(set(headsurgeon._EXPORTS) & {m.name for m in pkgutil.iter_modules(headsurgeon.__path__)})
    assert not clash, f"rename the modules {clash}: importing one would shadow the export of the same name"
    code = ("import headsurgeon as hs, headsurgeon.demo, headsurgeon.pipeline, headsurgeon.explain_measure\n"
            "assert callable(hs.explain) and hs.explain.__name__ == 'explain', hs.explain\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_program_set_takes_dsl_text_as_a_program():
    from headsurgeon import Program, ProgramSet

    ps = ProgramSet()
    ps.add("L0H1", "0.5*prev(1) + 0.5*first()")
    assert ps.entries[(0, 1)].program == Program.parse("0.5*prev(1) + 0.5*first()")
