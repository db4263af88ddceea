"""AST validation of untrusted Python programs (docs/architecture.md, SECURITY.md): one function over the Sequence API.

A Python program is source text defining exactly ONE top-level function that takes one argument (a
Sequence view ``seq``) and returns an n x n array-like of scores. Optional top-level statements:
a docstring, imports of ``numpy`` / ``math`` / ``re`` and plain assignments of constants.

This module is the *first* layer of defence: it rejects anything outside a small allowlist of syntax,
names and attributes before the source ever reaches a sandbox worker. It does not execute anything
(``compile`` is called on the parsed tree only to surface compile-time syntax errors). The second
layer (restricted builtins and import hook) and the third (OS limits in the worker process) live in
:mod:`headsurgeon.synth.sandbox`; they assume this validation may be bypassed.

Policy summary (every rejection names the line, the construct and the reason):

* syntax: an allowlist of AST node types; no ``class``, ``async``/``await``, ``with``, ``match``,
  ``global``/``nonlocal``, decorators, bare ``except:``, and no ``return``/``break``/``continue`` inside
  ``finally`` (it would turn the sandbox's timeout into an accepted result);
* names: a name that is read must be bound by the program itself or be one of :data:`AVAILABLE_NAMES`
  (numpy as ``np``/``numpy``, ``math``, ``re``, safe builtins, common exception classes); reading an
  unbound :data:`FORBIDDEN_NAMES` entry (``eval``, ``open``, ``getattr``, ``os`` ...) gets its own reason;
* identifiers: nothing starting with ``__`` anywhere; no attribute starting with ``_``; no string
  literal containing a ``__dunder__`` (``str.format``-style attribute lookups);
* attributes: an **allowlist** (:func:`allowed_attributes`): the Sequence API and its feature views,
  the public names of numpy (and its allowed submodules), ``math`` and ``re``, the methods and
  attributes of ndarrays, numpy scalars, dtypes, ufuncs, random Generators, regex patterns/matches and
  plain Python containers and numbers. Anything else (``func_globals`` of a compiled numpy function,
  ``gi_frame``, ``obj`` of a memoryview ...) is refused, because a blocklist cannot be complete.
  Within the allowlist :data:`FORBIDDEN_ATTRIBUTES` still removes file I/O (``np.load``/``tofile``),
  raw memory (``ctypes``), ``str.format``, ``mro`` and module-valued attributes other than the
  allowed numpy submodules. No assignment/deletion of attributes (shared modules must stay intact);
* imports: only ``numpy`` (and its ``linalg``/``fft``/``random`` subpackages), ``math`` and ``re``;
* size: at most :data:`MAX_SOURCE_CHARS` characters and :data:`MAX_AST_NODES` syntax nodes.
"""
from __future__ import annotations

import ast
import re as _re
import types
from dataclasses import dataclass
from functools import lru_cache

from .errors import ProgramValidationError

__all__ = [
    "MAX_SOURCE_CHARS",
    "MAX_AST_NODES",
    "ALLOWED_IMPORTS",
    "ALLOWED_NUMPY_SUBMODULES",
    "MODULE_NAMES",
    "SAFE_BUILTINS",
    "SAFE_EXCEPTIONS",
    "AVAILABLE_NAMES",
    "FORBIDDEN_NAMES",
    "FORBIDDEN_ATTRIBUTES",
    "ProgramInfo",
    "validate_source",
    "analyze_source",
    "forbidden_attribute_reason",
    "allowed_attributes",
    "check_import",
]

MAX_SOURCE_CHARS = 50_000
MAX_AST_NODES = 20_000

# Modules a program may import (``import numpy.linalg`` etc. included) and the names bound for it.
ALLOWED_IMPORTS: frozenset[str] = frozenset({"numpy", "numpy.linalg", "numpy.fft", "numpy.random", "math", "re"})
ALLOWED_NUMPY_SUBMODULES: frozenset[str] = frozenset({"linalg", "fft", "random", "emath", "char", "strings"})
MODULE_NAMES: dict[str, str] = {"np": "numpy", "numpy": "numpy", "math": "math", "re": "re"}

SAFE_BUILTINS: tuple[str, ...] = (
    "range", "len", "min", "max", "abs", "sum", "enumerate", "zip", "sorted", "reversed", "list", "dict",
    "set", "frozenset", "tuple", "int", "float", "bool", "str", "any", "all", "map", "filter", "round",
    "isinstance", "slice", "iter", "next", "divmod", "pow", "chr", "ord", "repr", "callable", "print",
)
SAFE_EXCEPTIONS: tuple[str, ...] = (
    "Exception", "ArithmeticError", "LookupError", "ValueError", "TypeError", "IndexError", "KeyError",
    "ZeroDivisionError", "OverflowError", "FloatingPointError", "RuntimeError", "AssertionError",
    "StopIteration", "NotImplementedError", "AttributeError",
)
AVAILABLE_NAMES: frozenset[str] = frozenset(SAFE_BUILTINS) | frozenset(SAFE_EXCEPTIONS) | frozenset(MODULE_NAMES)

_WHY_CODE = "it runs or compiles arbitrary code"
_WHY_INTROSPECT = "it exposes interpreter internals (namespaces, frames, attributes by name)"
_WHY_MODULE = "only numpy, math and re are available to programs"
FORBIDDEN_NAMES: dict[str, str] = {
    **{n: _WHY_CODE for n in ("eval", "exec", "compile", "__import__", "breakpoint", "help", "input")},
    **{n: _WHY_INTROSPECT for n in (
        "globals", "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr", "type", "object",
        "super", "classmethod", "staticmethod", "property", "id", "memoryview", "__builtins__",
    )},
    "open": "programs may not touch files",
    "exit": "programs may not stop the interpreter",
    "quit": "programs may not stop the interpreter",
    **{n: _WHY_MODULE for n in (
        "os", "sys", "subprocess", "socket", "importlib", "builtins", "ctypes", "shutil", "pathlib", "io",
        "pickle", "marshal", "mmap", "signal", "resource", "threading", "multiprocessing", "gc", "inspect",
        "types", "code", "codeop", "tempfile", "glob", "posix", "nt", "pty", "fcntl", "select", "asyncio",
        "urllib", "http", "ssl", "requests", "operator", "functools", "weakref", "copyreg", "linecache",
    )},
    "BaseException": "catching it would swallow the sandbox's own timeout signals",
    "SystemExit": "catching it would swallow the sandbox's own timeout signals",
    "KeyboardInterrupt": "catching it would swallow the sandbox's own timeout signals",
    "GeneratorExit": "catching it would swallow the sandbox's own timeout signals",
}

_WHY_FILE = "it reads or writes files"
_WHY_MEMORY = "it gives raw memory access"
_WHY_FRAME = "it exposes frames, code objects or module namespaces"
FORBIDDEN_ATTRIBUTES: dict[str, str] = {
    **{a: _WHY_FILE for a in (
        "load", "loads", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt", "fromfile",
        "tofile", "fromregex", "dump", "dumps", "memmap", "open_memmap", "DataSource",
    )},
    **{a: _WHY_MEMORY for a in ("ctypes", "ctypeslib", "as_strided", "byte_bounds")},
    **{a: "it runs external tools or test suites" for a in ("test", "show_config", "show_runtime", "f2py")},
    **{a: _WHY_MODULE for a in (
        "lib", "core", "distutils", "testing", "typing", "rec", "ma", "matlib", "matrixlib", "dtypes",
        "exceptions", "version", "polynomial", "compat", "bit_generator", "mtrand",
        "os", "sys", "subprocess", "socket", "importlib", "builtins", "shutil", "pathlib", "io", "pickle",
        "marshal", "mmap", "signal", "resource", "threading", "multiprocessing", "gc", "inspect", "types",
        "weakref", "copyreg", "enum", "functools", "operator", "linecache", "tempfile", "glob",
    )},
    **{a: "it is an operating-system call" for a in (
        "system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "spawnv", "kill", "environ",
        "putenv", "unlink", "rmdir", "chmod", "chown",
    )},
    "format": "str.format looks attributes up by name (e.g. '{0.__class__}'); use an f-string",
    "format_map": "str.format_map looks attributes up by name; use an f-string",
    "mro": _WHY_INTROSPECT,
}
_FRAME_PREFIXES = ("gi_", "cr_", "ag_", "f_", "tb_", "co_")
_DUNDER_STRING = _re.compile(r"__\w+__")

# AST node types a program may contain (everything else is rejected with its own reason).
_ALLOWED_NODES: tuple[type, ...] = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.For, ast.While, ast.If, ast.Raise, ast.Try, ast.ExceptHandler, ast.Assert, ast.Import, ast.ImportFrom,
    ast.alias, ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Delete, ast.BoolOp, ast.NamedExpr, ast.BinOp,
    ast.UnaryOp, ast.Lambda, ast.IfExp, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp, ast.Compare, ast.Call, ast.keyword, ast.FormattedValue, ast.JoinedStr, ast.Constant,
    ast.Attribute, ast.Subscript, ast.Starred, ast.Name, ast.List, ast.Tuple, ast.Slice, ast.comprehension,
    ast.Yield, ast.YieldFrom, ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)
_NODE_REASONS: dict[str, str] = {
    "ClassDef": "class definitions allow metaclass and descriptor tricks; use functions and dicts",
    "AsyncFunctionDef": "async code is not supported; write a plain function",
    "Await": "async code is not supported",
    "AsyncFor": "async code is not supported",
    "AsyncWith": "async code is not supported",
    "Global": "programs may not rebind module-level names",
    "Nonlocal": "programs may not rebind enclosing names; return values instead",
    "With": "no context managers are available to programs",
    "Match": "class patterns read attributes by name; use if/elif",
    "TryStar": "exception groups are not supported",
}


@dataclass(frozen=True)
class ProgramInfo:
    """What validation learned about a program: its function name and the attributes/strings it mentions."""

    name: str
    attributes: frozenset[str]
    strings: frozenset[str]

    @property
    def uses_features(self) -> bool:
        """True when the program reads ``seq.features`` (the parent then computes them before sending)."""
        return "features" in self.attributes

    def mentions(self, names: "frozenset[str] | set[str] | tuple[str, ...]") -> bool:
        """True when any of ``names`` appears as an attribute or a string literal (e.g. spaCy views)."""
        return any(n in self.attributes or n in self.strings for n in names)


def _fail(node: ast.AST | None, construct: str, why: str) -> ProgramValidationError:
    line = getattr(node, "lineno", None)
    where = f"line {line}: " if line is not None else ""
    err = ProgramValidationError(f"{where}{construct} is not allowed: {why}")
    err.lineno = line  # type: ignore[attr-defined]
    return err


@lru_cache(maxsize=1)
def _module_attribute_bans() -> dict[str, str]:
    """Names of module-valued attributes of numpy/re/math (other than the allowed ones): reaching them escapes."""
    import math
    import re

    import numpy as np

    roots = [np, re, math] + [getattr(np, s) for s in sorted(ALLOWED_NUMPY_SUBMODULES) if hasattr(np, s)]
    safe = set(ALLOWED_NUMPY_SUBMODULES) | set(MODULE_NAMES)
    out: dict[str, str] = {}
    for mod in roots:
        for k, v in vars(mod).items():  # vars(): never triggers numpy's lazy submodule imports
            if isinstance(v, types.ModuleType) and not k.startswith("_") and k not in safe:
                out[k] = f"it is the module {v.__name__!r}; {_WHY_MODULE}"
    return out


@lru_cache(maxsize=1)
def allowed_attributes() -> frozenset[str]:
    """Every attribute name a program may read: the public API of the objects programs are given or can make."""
    import math
    import re

    import numpy as np

    from .features import BASIC_VIEWS, SPACY_VIEWS, WORDNET_VIEWS

    roots: list[object] = [np, math, re, np.ndarray, np.generic, np.dtype, np.ufunc, np.random.Generator,
                           np.flatiter, np.finfo, np.iinfo, np.errstate, re.Pattern, re.Match]
    roots += [getattr(np, s) for s in sorted(ALLOWED_NUMPY_SUBMODULES) if hasattr(np, s)]
    roots += [str, bytes, list, dict, set, frozenset, tuple, int, float, complex, bool, range, slice,
              type({}.keys()), type({}.values()), type({}.items())]
    names = {n for obj in roots for n in dir(obj) if not n.startswith("_")}
    names |= {"ids", "tokens", "text", "offsets", "n", "features", "keys", "to_dict"}  # the Sequence API
    names |= set(BASIC_VIEWS) | set(SPACY_VIEWS) | set(WORDNET_VIEWS)
    return frozenset(n for n in names if _blocked_reason(n) is None)


def forbidden_attribute_reason(attr: str) -> str | None:
    """Why a program may not read attribute ``attr`` (None when it may); shared with the worker's import hook."""
    why = _blocked_reason(attr)
    if why is None and attr not in allowed_attributes():
        why = ("it is not on the allowlist of attributes programs may read (the Sequence API, numpy, math, "
               "re and plain container methods); compute the value another way")
    return why


def _blocked_reason(attr: str) -> str | None:
    """The explicit refusals, checked before (and inside) the allowlist."""
    if attr.startswith("__"):
        return "dunder attributes reach interpreter internals (the classic sandbox escape)"
    if attr.startswith("_"):
        return "private attributes are not part of any public API programs may use"
    if attr in FORBIDDEN_ATTRIBUTES:
        return FORBIDDEN_ATTRIBUTES[attr]
    if attr.startswith(_FRAME_PREFIXES):
        return _WHY_FRAME
    bans = _module_attribute_bans()
    if attr in bans:
        return bans[attr]
    return None


def check_import(name: str, fromlist: "tuple[str, ...] | list[str]" = (), level: int = 0) -> str | None:
    """Why ``import name`` / ``from name import fromlist`` is forbidden (None when allowed)."""
    if level:
        return "relative imports are not allowed"
    if name not in ALLOWED_IMPORTS:
        return f"only {', '.join(sorted(ALLOWED_IMPORTS))} may be imported"
    for item in fromlist or ():
        if item == "*":
            return "star imports are not allowed; import the names you need"
        why = forbidden_attribute_reason(item)
        if why is not None:
            return f"{name}.{item}: {why}"
    return None


def _check_identifier(node: ast.AST, kind: str, ident: str | None) -> None:
    if ident is None:
        return
    if ident.startswith("__"):
        raise _fail(node, f"{kind} {ident!r}", "dunder names reach interpreter internals (sandbox escape)")


def _parse(source: str) -> ast.Module:
    if not isinstance(source, str):
        raise ProgramValidationError(f"program source must be a str, got {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise ProgramValidationError(
            f"program source has {len(source)} characters; the limit is {MAX_SOURCE_CHARS}: shorten the program"
        )
    try:
        return ast.parse(source, filename="<program>", mode="exec")
    except SyntaxError as e:
        raise ProgramValidationError(f"line {e.lineno}: syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        raise ProgramValidationError(f"program could not be parsed ({type(e).__name__}: {e}); simplify it") from None


def _check_top_level(tree: ast.Module) -> ast.FunctionDef:
    funcs: list[ast.FunctionDef] = []
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, ast.FunctionDef):
            funcs.append(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            pass
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            pass  # docstring / string comment
        elif isinstance(stmt, ast.Assign) and all(_is_name_target(t) for t in stmt.targets):
            pass
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            pass
        else:
            raise _fail(
                stmt, f"top-level {type(stmt).__name__} statement",
                "a program is one function definition plus optional imports and NAME = value constants",
            )
    if len(funcs) != 1:
        raise ProgramValidationError(
            f"a program must define exactly one top-level function taking the Sequence; found {len(funcs)}"
            + (f" ({', '.join(f.name for f in funcs)})" if funcs else "")
        )
    fn = funcs[0]
    a = fn.args
    positional = list(a.posonlyargs) + list(a.args)
    required = len(positional) - len(a.defaults)
    if not positional or required != 1 or a.vararg or a.kwarg or any(d is None for d in a.kw_defaults):
        raise _fail(
            fn, f"signature of {fn.name}()",
            "the function must take exactly one required positional argument (the Sequence view), "
            "e.g. `def pattern(seq):`",
        )
    return fn


def _is_name_target(t: ast.expr) -> bool:
    if isinstance(t, ast.Name):
        return True
    if isinstance(t, (ast.Tuple, ast.List)):
        return all(_is_name_target(e) for e in t.elts)
    return False


def _finally_escape(body: list[ast.stmt]) -> ast.stmt | None:
    """The first return/break/continue that would leave a finally block (loops and functions inside it excepted)."""
    todo: list[tuple[ast.AST, bool]] = [(stmt, False) for stmt in body]
    while todo:
        node, in_loop = todo.pop()
        if isinstance(node, ast.Return) or (isinstance(node, (ast.Break, ast.Continue)) and not in_loop):
            return node  # type: ignore[return-value]
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            continue
        loop = in_loop or isinstance(node, (ast.For, ast.While))
        todo += [(child, loop) for child in ast.iter_child_nodes(node)]
    return None


def analyze_source(source: str) -> ProgramInfo:
    """Validate ``source`` and return what the sandbox needs to know about it; raises ProgramValidationError."""
    tree = _parse(source)
    fn = _check_top_level(tree)

    bound: set[str] = set()
    loads: list[ast.Name] = []
    attributes: set[str] = set()
    strings: set[str] = set()
    nodes: list[ast.AST] = []
    unlisted: ast.Attribute | None = None
    for node in ast.walk(tree):
        nodes.append(node)
        if len(nodes) > MAX_AST_NODES:
            raise ProgramValidationError(f"program has more than {MAX_AST_NODES} syntax nodes; simplify it")
    # report the first problem in reading order (innermost first among nodes starting at the same place)
    nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0),
                              getattr(n, "end_lineno", 0) or 0, getattr(n, "end_col_offset", 0) or 0))
    for node in nodes:
        kind = type(node).__name__
        if not isinstance(node, _ALLOWED_NODES):
            why = _NODE_REASONS.get(kind, "this syntax is outside the allowlist for programs")
            raise _fail(node, f"{kind} syntax", why)

        if isinstance(node, ast.Name):
            _check_identifier(node, "name", node.id)
            if isinstance(node.ctx, ast.Load):
                loads.append(node)
            else:
                bound.add(node.id)
        elif isinstance(node, ast.Attribute):
            why = _blocked_reason(node.attr)
            if why is not None:
                raise _fail(node, f"attribute access '.{node.attr}'", why)
            if unlisted is None and node.attr not in allowed_attributes():
                unlisted = node  # reported after the names: `open(...).write` is about `open`
            if not isinstance(node.ctx, ast.Load):
                raise _fail(
                    node, f"assigning or deleting attribute '.{node.attr}'",
                    "programs may not modify objects' attributes (shared modules must stay intact); "
                    "use local variables",
                )
            attributes.add(node.attr)
        elif isinstance(node, ast.FunctionDef):
            _check_identifier(node, "function name", node.name)
            if node.decorator_list:
                raise _fail(node, f"decorator on {node.name}()", "decorators run arbitrary code at definition time")
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            _check_identifier(node, "parameter", node.arg)
            bound.add(node.arg)
        elif isinstance(node, ast.keyword):
            _check_identifier(node, "keyword argument", node.arg)
        elif isinstance(node, ast.Try) and node.finalbody:
            escape = _finally_escape(node.finalbody)
            if escape is not None:
                raise _fail(
                    escape, f"'{type(escape).__name__.lower()}' inside 'finally'",
                    "leaving a finally block discards the exception in flight, including the sandbox's timeout; "
                    "move the statement after the try statement",
                )
        elif isinstance(node, ast.ExceptHandler):
            if node.type is None:
                raise _fail(
                    node, "bare 'except:'",
                    "it would swallow the sandbox's timeout signals; catch specific exceptions (e.g. ValueError)",
                )
            _check_identifier(node, "exception name", node.name)
            if node.name:
                bound.add(node.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                why = check_import(alias.name)
                if why is not None:
                    raise _fail(node, f"import of {alias.name!r}", why)
                _check_identifier(node, "import alias", alias.asname)
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            why = check_import(node.module or "", names, node.level)
            if why is not None:
                raise _fail(node, f"import from {('.' * node.level) + (node.module or '')!r}", why)
            for alias in node.names:
                _check_identifier(node, "import alias", alias.asname)
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, (str, bytes)):
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                if _DUNDER_STRING.search(text):
                    raise _fail(
                        node, "a string containing a __dunder__ name",
                        "dunder names in strings are how attribute-by-name escapes are written",
                    )
                if isinstance(node.value, str) and len(node.value) <= 64:
                    strings.add(node.value)

    for name in loads:  # free names: a program's own bindings are harmless, builtins/modules are not
        if name.id in bound:
            continue
        if name.id in FORBIDDEN_NAMES:
            raise _fail(name, f"name {name.id!r}", FORBIDDEN_NAMES[name.id])
        if name.id not in AVAILABLE_NAMES:
            raise _fail(
                name, f"name {name.id!r}",
                f"it is neither defined by the program nor available; available: np, numpy, math, re, "
                f"{', '.join(SAFE_BUILTINS)}, and exceptions {', '.join(SAFE_EXCEPTIONS)}",
            )

    if unlisted is not None:
        raise _fail(unlisted, f"attribute access '.{unlisted.attr}'", forbidden_attribute_reason(unlisted.attr) or "")

    try:  # surface compile-time errors ('return' outside function, ...) now; bounded constant folding only
        compile(tree, "<program>", "exec", dont_inherit=True)
    except SyntaxError as e:
        raise ProgramValidationError(f"line {e.lineno}: syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        raise ProgramValidationError(f"program could not be compiled ({type(e).__name__}: {e}); simplify it") from None
    return ProgramInfo(name=fn.name, attributes=frozenset(attributes), strings=frozenset(strings))


def validate_source(source: str) -> str:
    """Validate an untrusted program against the allowlist and return its function name.

    Raises :class:`~headsurgeon.synth.errors.ProgramValidationError` naming the line, the construct and why.
    """
    return analyze_source(source).name
