"""The typed `hs` surface: every lazy export is also imported under TYPE_CHECKING, and names stay the objects."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import headsurgeon

INIT = Path(headsurgeon.__file__)


def test_the_surface_has_two_levels():
    """The pipeline's names on ``hs``, read from the one TYPE_CHECKING list; the rest only in their modules."""
    assert {"load_model", "capture", "explain", "replace_heads", "build_hybrid", "save_hybrid", "load_hybrid",
            "Head", "HeadsurgeonError"} <= set(headsurgeon.__all__)
    assert not set(headsurgeon._EXPORTS) & set(headsurgeon._MOVED)
    assert "soft_iou" not in headsurgeon.__all__ and "soft_iou" not in dir(headsurgeon)


def test_a_name_that_moved_still_resolves_with_a_warning_naming_its_module():
    from headsurgeon.synth.metrics import soft_iou

    with pytest.warns(DeprecationWarning, match="from headsurgeon.synth.metrics import soft_iou"):
        assert headsurgeon.soft_iou is soft_iou
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        headsurgeon.nothing_here  # noqa: B018 - the attribute access is the test


def test_every_moved_name_resolves_to_its_module_object():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name, module in headsurgeon._MOVED.items():
            assert getattr(headsurgeon, name) is getattr(importlib.import_module(module), name), name


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


LAZY_PACKAGES = ["headsurgeon.scaleout", "headsurgeon.synth.search.enumerative", "headsurgeon.synth.search.learned",
                 "headsurgeon.synth.search.llm", "headsurgeon.tp"]


def test_the_lazy_packages_are_every_package_that_uses_lazy_package():
    found = sorted(".".join(p.relative_to(INIT.parent.parent).with_suffix("").parts[:-1])
                   for p in INIT.parent.rglob("__init__.py") if "lazy_package(__file__" in p.read_text())
    assert found == sorted(LAZY_PACKAGES)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_lazy_name_resolves_to_its_module_object(package):
    """Each name a lazy package lists (its TYPE_CHECKING imports) loads and is the object its module defines, and no
    submodule of the package is named like one of them (importing it would shadow the name)."""
    import pkgutil

    from headsurgeon.core.lazy import exports_of

    pkg = importlib.import_module(package)
    exports = exports_of(pkg.__file__, package)
    assert sorted(exports) == pkg.__all__ == dir(pkg)
    assert not set(exports) & {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    for name, module in exports.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(module), name), f"{package}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        pkg.nothing_here  # noqa: B018 - the attribute access is the test
