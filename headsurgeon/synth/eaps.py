"""Program library files in EAPS's style: ``prog(sentence, tokenizer) -> (label, matrix)`` functions as Python programs.

A library file is Python source, untrusted like any program from someone else (SECURITY.md): it is parsed
here (never imported or run), split into one program per function, and each program is validated by
headsurgeon/synth/pysafety/ and runs only in the sandbox (headsurgeon/synth/sandbox/), with the window's text and the tokenizer
facade of headsurgeon/synth/sandbox/facade.py. The file format:

* **Which functions are programs**: the top-level functions named ``prog`` or ``prog_<anything>``; in a file
  with none of those (EAPS's own files name them freely), every top-level function that no other code calls,
  whose name does not start with ``_`` and that takes arguments. The other functions are helpers.
* **Signature**: ``prog(sentence, tokenizer)`` (EAPS's shape) or ``prog(seq)`` (the Sequence API, in files with
  ``prog*`` names); either may return ``(label, matrix)`` or the bare n x n matrix. The label (a str of at most
  200 printable characters) becomes the candidate's hypothesis; without one the function's name does.
* **Shared top level**: each program is its function, placed last, after the helper functions and top-level
  statements it needs, transitively, in file order (imports, ``nlp = spacy.load(...)``, constants, caches
  rebound with ``global``): what running the file and then calling the function sees. It is validated and run
  as one module in the sandbox, so the file's top-level code runs only there, and only what a program needs.
* **spaCy**: ``import spacy`` gives the sandbox's spaCy (headsurgeon/synth/sandbox/spacy_shim.py): ``spacy.load(
  "en_core_web_sm")`` and ``nlp(sentence)`` return the parse the parent made of the window's text, behind the
  Doc/Token/Span attributes EAPS's files use. No NLTK call occurs in EAPS's files, so none is offered.
* **Dropped, since they only serve type hints**: annotations (parameters, returns, annotated assignments)
  and imports from ``__future__``, ``typing`` and ``transformers`` whose names nothing reads.
* **Refusals are per program**: a program that fails validation is reported with why (:class:`LibraryLoad`) and
  the others load; a file none of whose programs can run is an error. ``max_programs`` (the per-file budget,
  ``--library-max-programs``) keeps the first accepted ones and reports the rest.
* Programs are re-rendered from the syntax tree (``ast.unparse``), so comments are not kept; a function
  defined twice under one name (EAPS's collected files do that) gives two programs, ``name`` and ``name#2``.
"""
from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .errors import ProgramError, ProgramValidationError
from ..core import InputError

if TYPE_CHECKING:  # the DSL loads numba: imported where a program is built (the search configs read this module)
    from .program import Program

__all__ = ["MAX_LIBRARY_BYTES", "MAX_LIBRARY_PROGRAMS", "LIBRARY_BUDGET_S", "LibraryLoad", "LibraryProgram",
           "load_library", "load_library_file", "probe_labels", "read_library", "split_library_source"]

MAX_LIBRARY_BYTES = 2_000_000
MAX_LIBRARY_PROGRAMS = 256  # the default per-file budget of programs (--library-max-programs); the rest are reported
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


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds (a def's name, import aliases, assignment targets)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in stmt.names}
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def _read_names(node: ast.AST) -> set[str]:
    """Names ``node`` reads (or declares ``global``): what it needs from the file's top level."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.Global):
            out.update(n.names)
    return out


def _hint_only_import(stmt: ast.stmt, read: set[str]) -> bool:
    """An import from ``typing``/``transformers``/``__future__`` whose names nothing reads: it only served hints."""
    if isinstance(stmt, ast.ImportFrom):
        mods = [(stmt.module or "").split(".")[0]] if not stmt.level else [""]
    elif isinstance(stmt, ast.Import):
        mods = [a.name.split(".")[0] for a in stmt.names]
    else:
        return False
    return all(m in _DROPPED_MODULES for m in mods) and not (_bound_names(stmt) & read)


class _DropHintImports(ast.NodeTransformer):
    """Replaces hint-only imports anywhere (a ``from typing import Tuple`` inside a function too) by ``pass``."""

    def __init__(self, read: set[str]) -> None:
        self.read = read

    def visit_Import(self, node: ast.Import) -> ast.stmt:
        return ast.copy_location(ast.Pass(), node) if _hint_only_import(node, self.read) else node

    visit_ImportFrom = visit_Import  # type: ignore[assignment]  # one visitor for both import forms


def _is_helper(f: ast.FunctionDef, referenced: set[str]) -> bool:
    """In a file without ``prog*`` names: a function other code calls, a ``_private`` one, or one without arguments."""
    return f.name in referenced or f.name.startswith("_") or not (f.args.posonlyargs or f.args.args)


def _signature_problem(f: ast.FunctionDef, eaps_style: bool) -> str | None:
    """Why ``f`` cannot be called as a program, known from its signature alone (None: it may be)."""
    a = f.args
    params = [x.arg for x in list(a.posonlyargs) + list(a.args)][: len(a.posonlyargs) + len(a.args) - len(a.defaults)]
    if eaps_style and len(params) == 1:
        return (f"{f.name}({params[0]}) takes one argument: EAPS programs take (sentence, tokenizer) and return "
                "(label, matrix) over the model's own tokens; a one-argument function of a file without prog* names "
                "is a helper or tokenizes by itself (golden_programs_new.py's gpt2_tokenize), which cannot match "
                "the model's windows")
    return None


def _module_source(module: ast.Module) -> str:
    """A program unit's source, unparsed only when someone reads it."""
    return ast.unparse(ast.fix_missing_locations(module)) + "\n"


def _library_units(source: str, origin: str) -> tuple[list[tuple[str, Callable[[], str] | None, str | None]], int]:
    """Per candidate program: ``(name, its source when called, or None; why refused or None)``, and how many
    functions the file defines (sources are rendered on demand: a budget may need only the first ones). Each program's source is its function last, after the helper functions and top-level statements
    it needs (transitively, in file order): what running the file and then calling it would see."""
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as e:
        raise ProgramValidationError(f"{origin}: line {e.lineno}: syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ProgramValidationError(f"{origin}: could not be parsed ({type(e).__name__})") from None
    tree = _StripHints().visit(tree)
    top_reads = [_read_names(s) for s in tree.body]  # imports read nothing: dropping them changes no entry
    tree = _DropHintImports(set().union(*top_reads)).visit(tree)
    kept = [k for k, s in enumerate(tree.body) if not (isinstance(s, ast.Pass) or (
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))]
    body = [tree.body[k] for k in kept]
    reads = [top_reads[k] for k in kept]
    funcs = [s for s in body if isinstance(s, ast.FunctionDef)]
    if not funcs:
        raise ProgramValidationError(f"{origin}: defines no function; a library file defines prog(sentence, tokenizer)")
    chosen = [f for f in funcs if f.name == "prog" or f.name.startswith("prog_")]
    eaps_style = not chosen
    if eaps_style:
        referenced: set[str] = set()
        for s, r in zip(body, reads):
            referenced |= r - ({s.name} if isinstance(s, ast.FunctionDef) else set())
        chosen = [f for f in funcs if not _is_helper(f, referenced)]
    binders: dict[str, list[int]] = {}
    for k, s in enumerate(body):
        for name in _bound_names(s):
            binders.setdefault(name, []).append(k)
    seen: Counter[str] = Counter()
    out: list[tuple[str, Callable[[], str] | None, str | None]] = []
    where = {id(s): k for k, s in enumerate(body)}
    for f in chosen:
        seen[f.name] += 1
        name = f.name if seen[f.name] == 1 else f"{f.name}#{seen[f.name]}"
        why = _signature_problem(f, eaps_style)
        if why is not None:
            out.append((name, None, why))
            continue
        me = where[id(f)]
        need, todo, done = set(), list(reads[me] - {f.name}), set()
        while todo:
            n = todo.pop()
            if n in done:
                continue
            done.add(n)
            for k in binders.get(n, ()):
                if k != me and k not in need:
                    need.add(k)
                    todo.extend(reads[k])
        module = ast.Module(body=[body[k] for k in sorted(need)] + [f], type_ignores=[])
        out.append((name, functools.partial(_module_source, module), None))
    return out, len(funcs)


def split_library_source(source: str, origin: str = "<library>") -> list[tuple[str, str]]:
    """``(name, program source)`` per program of a library file (module docstring); nothing is validated yet.

    A function refused by its signature alone is left out (``read_library`` reports it)."""
    units, _ = _library_units(source, origin)
    return [(name, text()) for name, text, _why in units if text is not None]


@dataclass(frozen=True)
class LibraryLoad:
    """What reading one library file gave: the programs accepted, those refused with why, and those past the
    per-file budget of programs (``max_programs``)."""

    path: str
    functions: int
    programs: list[LibraryProgram]
    refused: list[tuple[str, str]]
    over_budget: list[str]
    max_programs: int | None

    def summary(self) -> str:
        """One paragraph: counts, then the refusals grouped by reason (most common first)."""
        head = (f"{self.path}: {self.functions} functions; {len(self.programs)} programs accepted, "
                f"{len(self.refused)} refused")
        if self.over_budget:
            head += (f", {len(self.over_budget)} past the budget of {self.max_programs} programs per file (not "
                     "validated or run: raise --library-max-programs, or split the file)")
        reasons = Counter(_reason_kind(why) for _, why in self.refused)
        lines = [head] + [f"  {k} x {why}" for why, k in reasons.most_common()]
        return "\n".join(lines)


def _reason_kind(why: str) -> str:
    """A refusal without its line number and program name, so that equal reasons group."""
    why = re.sub(r"^line \d+: ", "", why)
    why = re.sub(r"^\w+\((\w+)\) takes one argument", r"f(\1) takes one argument", why)
    return why[:220]


def read_library(path: str | Path, budget: float | None = LIBRARY_BUDGET_S,
                 max_programs: int | None = MAX_LIBRARY_PROGRAMS) -> LibraryLoad:
    """Read one library file: each program validated like any Python program; a refused one is reported, not fatal
    (:func:`load_library_file` is an error when none is accepted).

    ``max_programs``: the per-file budget of programs (the first ones accepted are kept, the rest reported; None:
    all); ``budget``: seconds the library search may spend on them, in total across heads (None: no limit).
    """
    if budget is not None and not budget >= 0:
        raise InputError(f"the library time budget must be >= 0 seconds or None; got {budget}")
    if max_programs is not None and not (isinstance(max_programs, int) and max_programs >= 1):
        raise InputError(f"the per-file budget of programs must be a whole number >= 1 or None; got {max_programs!r}")
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
    from .program import Program

    units, functions = _library_units(source, str(p))
    accepted: list[LibraryProgram] = []
    refused: list[tuple[str, str]] = []
    over: list[str] = []
    for name, text, why in units:
        if why is None and max_programs is not None and len(accepted) >= max_programs:
            over.append(name)
            continue
        if why is None:
            try:
                accepted.append(LibraryProgram(Program.python(text() if text else ""), name, str(p), budget=budget))
                continue
            except ProgramValidationError as e:
                why = str(e)
        refused.append((name, why))
    return LibraryLoad(str(p), functions, accepted, refused, over, max_programs)


def _require_programs(load: LibraryLoad) -> LibraryLoad:
    """``load`` when it has a program; otherwise the error naming the file, the count and the first refusal."""
    if not load.programs:
        name, why = load.refused[0] if load.refused else ("", "no program")
        raise ProgramValidationError(f"{load.path}: no program of this file can run ({len(load.refused)} refused); "
                                     f"{name}(): {why}".replace("\n", " "))
    return load


def load_library_file(path: str | Path, budget: float | None = LIBRARY_BUDGET_S,
                      max_programs: int | None = MAX_LIBRARY_PROGRAMS) -> list[LibraryProgram]:
    """The accepted programs of one library file (:func:`read_library` says which were refused and why)."""
    return _require_programs(read_library(path, budget, max_programs)).programs


def load_library(paths: Iterable[str | Path], budget: float | None = LIBRARY_BUDGET_S,
                 max_programs: int | None = MAX_LIBRARY_PROGRAMS,
                 notes: list[str] | None = None) -> list[LibraryProgram]:
    """The programs of several library files, in order (``--library``, ``--library-budget`` and
    ``--library-max-programs`` of ``explain``); ``notes`` receives each file's :meth:`LibraryLoad.summary`."""
    out: list[LibraryProgram] = []
    for path in paths:
        load = _require_programs(read_library(path, budget, max_programs))
        if notes is not None:
            notes.append(load.summary())
        out.extend(load.programs)
    return out


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
