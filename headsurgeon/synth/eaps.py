"""Program library files in EAPS's style: ``prog(sentence, tokenizer) -> (label, matrix)`` functions as Python programs.

A library file is Python source, untrusted like any program from someone else (SECURITY.md): it is parsed
here (never imported or run), split into one program per function, and each program is validated by
headsurgeon/synth/pysafety/ and runs only in the sandbox (headsurgeon/synth/sandbox/), with the window's text and the tokenizer
facade of headsurgeon/synth/sandbox/facade.py. The file format:

* **Which functions are programs**: the top-level functions named ``prog`` or ``prog_<anything>``; a file
  with none of those (EAPS's own files name them freely) makes every top-level function a program. When
  ``prog*`` functions exist, any other top-level function is an error: helpers go inside the program.
* **Signature**: ``prog(sentence, tokenizer)`` (EAPS's shape) or ``prog(seq)`` (the Sequence API); either
  may return ``(label, matrix)`` or the bare n x n matrix. The label (a str of at most 200 printable
  characters) becomes the candidate's hypothesis; without one the function's name does.
* **Shared top level**: each program is its function plus the file's other top-level statements (imports of
  numpy/math/re, ``NAME = constant`` assignments, docstrings), in file order.
* **Dropped, since they only serve type hints**: annotations (parameters, returns, annotated assignments)
  and imports from ``__future__``, ``typing`` and ``transformers``. Anything else (``import spacy``, a
  ``nlp = spacy.load(...)``) is refused by validation; spaCy's views are ``tokenizer.features.pos``,
  ``.dep``, ``.dep_head``, ``.lemma``, ``.ent_type``, ``.children`` ... (headsurgeon/synth/features/view.py).
* Programs are re-rendered from the syntax tree (``ast.unparse``), so comments are not kept; a function
  defined twice under one name (EAPS's collected files do that) gives two programs, ``name`` and ``name#2``.
"""
from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .errors import ProgramError, ProgramValidationError
from .program import Program
from ..kernels.core import InputError

__all__ = ["MAX_LIBRARY_BYTES", "MAX_LIBRARY_PROGRAMS", "LIBRARY_BUDGET_S", "LibraryProgram", "load_library",
           "load_library_file", "probe_labels", "split_library_source"]

MAX_LIBRARY_BYTES = 2_000_000
MAX_LIBRARY_PROGRAMS = 256  # each one runs in the sandbox for every head: 2 MB of source would be ~30,000 programs
LIBRARY_BUDGET_S = 600.0  # seconds the library searcher may spend, in total across heads (headsurgeon/synth/search/library.py)
_DROPPED_MODULES = ("__future__", "typing", "transformers")


@dataclass(frozen=True)
class LibraryProgram:
    """One program of a library file: the validated Python program, its function name, the file, a hypothesis,
    and the time budget (seconds, total across heads) of the library search it takes part in."""

    program: Program
    name: str
    origin: str
    hypothesis: str = ""
    budget: float | None = LIBRARY_BUDGET_S


class _StripHints(ast.NodeTransformer):
    """Removes annotations: they name typing/transformers classes the sandbox does not have."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.stmt:
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)


def _dropped_import(stmt: ast.stmt) -> bool:
    """An import that only serves type hints (``from typing import Tuple``, ``transformers``...)."""
    if isinstance(stmt, ast.ImportFrom):
        return (stmt.module or "").split(".")[0] in _DROPPED_MODULES and not stmt.level
    if isinstance(stmt, ast.Import):
        return all(a.name.split(".")[0] in _DROPPED_MODULES for a in stmt.names)
    return False


def split_library_source(source: str, origin: str = "<library>") -> list[tuple[str, str]]:
    """``(name, program source)`` per program of a library file (module docstring); nothing is validated yet."""
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as e:
        raise ProgramValidationError(f"{origin}: line {e.lineno}: syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ProgramValidationError(f"{origin}: could not be parsed ({type(e).__name__})") from None
    tree = _StripHints().visit(tree)
    funcs = [s for s in tree.body if isinstance(s, ast.FunctionDef)]
    header = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              and not _dropped_import(s)]
    chosen = [f for f in funcs if f.name == "prog" or f.name.startswith("prog_")]
    if chosen:
        helpers = [f.name for f in funcs if f not in chosen]
        if helpers:
            raise ProgramValidationError(
                f"{origin}: top-level function(s) {', '.join(helpers)} beside the prog* programs: each program is "
                "one function, so define helpers inside it (or name every program prog_<name>)")
    else:
        chosen = funcs
    if not chosen:
        raise ProgramValidationError(f"{origin}: defines no function; a library file defines prog(sentence, tokenizer)")
    if len(chosen) > MAX_LIBRARY_PROGRAMS:
        raise ProgramValidationError(
            f"{origin}: {len(chosen)} programs; a library file may hold at most {MAX_LIBRARY_PROGRAMS} (each runs in "
            "the sandbox for every head): split it into files of the programs you mean to try, or keep the best ones")
    others = [s for s in tree.body if isinstance(s, (ast.AsyncFunctionDef, ast.ClassDef))]
    if others:
        raise ProgramValidationError(f"{origin}: line {others[0].lineno}: {type(others[0]).__name__} is not allowed "
                                     "in a library file (plain functions only)")
    seen: Counter[str] = Counter()
    out: list[tuple[str, str]] = []
    for f in chosen:
        seen[f.name] += 1
        name = f.name if seen[f.name] == 1 else f"{f.name}#{seen[f.name]}"
        module = ast.Module(body=header + [f], type_ignores=[])
        out.append((name, ast.unparse(ast.fix_missing_locations(module)) + "\n"))
    return out


def load_library_file(path: str | Path, budget: float | None = LIBRARY_BUDGET_S) -> list[LibraryProgram]:
    """The programs of one library file, each validated like any Python program (ProgramValidationError names it).

    At most :data:`MAX_LIBRARY_PROGRAMS` per file; ``budget``: seconds the library search may spend on them, in
    total across heads (None: no limit).
    """
    if budget is not None and not budget >= 0:
        raise InputError(f"the library time budget must be >= 0 seconds or None; got {budget}")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"library file {str(p)!r} does not exist or is not a file")
    size = p.stat().st_size
    if size > MAX_LIBRARY_BYTES:
        raise ProgramValidationError(f"{p}: {size} bytes; a library file may have at most {MAX_LIBRARY_BYTES}")
    try:
        source = p.read_bytes()[:MAX_LIBRARY_BYTES].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProgramValidationError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    out: list[LibraryProgram] = []
    for name, text in split_library_source(source, str(p)):
        try:
            program = Program.python(text)
        except ProgramValidationError as e:
            hint = (" (spaCy is not available inside the sandbox: read tokenizer.features.pos, .dep, .dep_head, "
                    ".lemma, .ent_type, .children ... instead)" if "spacy" in str(e) else "")
            raise ProgramValidationError(f"{p}: {name}(): {e}{hint}") from None
        out.append(LibraryProgram(program, name, str(p), budget=budget))
    return out


def load_library(paths: Iterable[str | Path], budget: float | None = LIBRARY_BUDGET_S) -> list[LibraryProgram]:
    """The programs of several library files, in order (``--library`` and ``--library-budget`` of ``explain``)."""
    return [lp for path in paths for lp in load_library_file(path, budget)]


def probe_labels(programs: list[Program], sequences: list[Any], timeout: float = 5.0) -> dict[str, str]:
    """Per program hash, its most common label on ``sequences`` (Python programs, run in the sandbox); absent when
    none (kinds without labels, such as DSL, are skipped by their backend)."""
    out: dict[str, str] = {}
    for p in programs:
        if not sequences:
            continue
        try:
            labels = p.labels(sequences, timeout)
        except ProgramError:
            continue
        found = Counter(label for label in labels or () if label)
        if found:
            out[p.hash] = found.most_common(1)[0][0]
    return out
