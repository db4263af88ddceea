"""Packages whose names load on first use: a package lists its public names once, as imports under
``if TYPE_CHECKING:`` (what type checkers read), and ``lazy_package`` turns that block into ``__getattr__``, so
importing the package (``headsurgeon --help`` reads the configs beside torch- and numba-heavy modules) loads none of
them until a name is used."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["exports_of", "lazy_package"]


def exports_of(init_file: str, package: str) -> dict[str, str]:
    """name → absolute module, read from the ``if TYPE_CHECKING:`` imports of the package file ``init_file``."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {alias.asname or alias.name: importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def lazy_package(init_file: str, package: str) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for the package ``package`` whose ``__init__`` is ``init_file``."""
    exports = exports_of(init_file, package)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return sorted(exports), __getattr__, __dir__
