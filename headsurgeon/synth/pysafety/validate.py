"""The AST validator: one function over the Sequence API, checked against the policy before anything runs."""
from __future__ import annotations

import ast
import importlib
import sys
import types
from dataclasses import dataclass

from ..errors import ProgramValidationError
from .policy import (ALLOWED_IMPORTS, ALLOWED_NUMPY_SUBMODULES, AVAILABLE_NAMES, FORBIDDEN_NAMES, MODULE_NAMES,
                     MODULE_VALUE_REASON, SHIMMED_IMPORTS, SAFE_BUILTINS, SAFE_EXCEPTIONS, DUNDER_STRING, allowed_attributes,
                     blocked_reason, check_import, forbidden_attribute_reason)

MAX_SOURCE_CHARS = 50_000
MAX_AST_NODES = 20_000

_ALLOWED_NODES: tuple[type, ...] = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.For, ast.While, ast.If, ast.Raise, ast.Try, ast.ExceptHandler, ast.Assert, ast.Import, ast.ImportFrom,
    ast.alias, ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Delete, ast.BoolOp, ast.NamedExpr, ast.BinOp,
    ast.UnaryOp, ast.Lambda, ast.IfExp, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp, ast.Compare, ast.Call, ast.keyword, ast.FormattedValue, ast.JoinedStr, ast.Constant,
    ast.Attribute, ast.Subscript, ast.Starred, ast.Name, ast.List, ast.Tuple, ast.Slice, ast.comprehension,
    ast.Yield, ast.YieldFrom, ast.Global, ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)
_NODE_REASONS: dict[str, str] = {
    "ClassDef": "class definitions allow metaclass and descriptor tricks; use functions and dicts",
    "AsyncFunctionDef": "async code is not supported; write a plain function",
    "Await": "async code is not supported",
    "AsyncFor": "async code is not supported",
    "AsyncWith": "async code is not supported",
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
    params: int = 1  # 1: ``f(seq)``; 2: EAPS's ``prog(sentence, tokenizer)`` (headsurgeon/synth/sandbox/facade.py)
    uses_spacy: bool = False  # imports spacy: the parent sends the window's parses (headsurgeon/synth/sandbox/spacy_shim.py)

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
    err.lineno = line  # type: ignore[attr-defined]  # SyntaxError carries lineno
    return err


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


def _check_top_level(tree: ast.Module) -> tuple[ast.FunctionDef, int]:
    funcs: list[ast.FunctionDef] = []
    for stmt in tree.body:
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
                "a program is function definitions (the last is the entry) plus optional imports and NAME = value "
                "assignments",
            )
    if not funcs:
        raise ProgramValidationError("a program must define a top-level function taking the Sequence; found none")
    fn = funcs[-1]  # the entry point; the functions before it are its helpers (headsurgeon/synth/eaps.py puts them first)
    a = fn.args
    positional = list(a.posonlyargs) + list(a.args)
    required = len(positional) - len(a.defaults)
    if not positional or required not in (1, 2) or a.vararg or a.kwarg or any(d is None for d in a.kw_defaults):
        raise _fail(
            fn, f"signature of {fn.name}()",
            "the function (the last top-level one; those before it are helpers) must take exactly one required positional argument (the Sequence view), "
            "e.g. `def pattern(seq):`, or two (EAPS's shape) `def prog(sentence, tokenizer):`",
        )
    return fn, required


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
            return node
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            continue
        loop = in_loop or isinstance(node, (ast.For, ast.While))
        todo += [(child, loop) for child in ast.iter_child_nodes(node)]
    return None


def _module_bindings(nodes: list[ast.AST], plain: set[str]) -> dict[str, types.ModuleType]:
    """The names that hold a module: np/numpy/math/re unless rebound, and what the (already checked) imports bind."""
    out = {k: sys.modules[v] for k, v in MODULE_NAMES.items() if k not in plain}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name if a.asname else a.name.split(".")[0]
                out[a.asname or top] = _SHIM if top in SHIMMED_IMPORTS else importlib.import_module(top)
        elif isinstance(node, ast.ImportFrom) and node.module in ALLOWED_IMPORTS:
            base = importlib.import_module(node.module)
            for a in node.names:
                value = getattr(base, a.name, None) if a.name in ALLOWED_NUMPY_SUBMODULES else None
                if isinstance(value, types.ModuleType):
                    out[a.asname or a.name] = value
    return out


_SHIM = types.ModuleType("spacy")  # stands for the sandbox's spacy (headsurgeon/synth/sandbox/spacy_shim.py): never imported here


def _spacy_aliases(tree: ast.Module) -> set[str]:
    """Names an ``import spacy`` binds anywhere in the program (``spacy.load`` is allowed on them only)."""
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for a in node.names if a.name in SHIMMED_IMPORTS}


def _check_spacy_bindings(nodes: list[ast.AST], spacy_names: set[str]) -> None:
    """A name ``import spacy`` binds may be bound by nothing else: ``spacy.load`` must never reach ``np.load``."""
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.FunctionDef):
            names = [node.name]
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names = [node.name]
        elif isinstance(node, ast.Import):
            names = [a.asname or a.name.split(".")[0] for a in node.names if a.name not in SHIMMED_IMPORTS]
        elif isinstance(node, ast.ImportFrom):
            names = [a.asname or a.name for a in node.names]
        for name in names:
            if name in spacy_names:
                raise _fail(node, f"binding {name!r} other than by 'import spacy'",
                            "a name that holds the spacy module may not be rebound; use another name")


def _check_globals(tree: ast.Module, nodes: list[ast.AST]) -> None:
    """``global NAME`` only for a name the program's own top level assigns: it rebinds the program's module only."""
    top: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                top |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    for node in nodes:
        if isinstance(node, ast.Global):
            for name in node.names:
                _check_identifier(node, "global name", name)
                if name not in top:
                    raise _fail(node, f"'global {name}'", f"{name} is not assigned at the program's top level; "
                                "`global` may only rebind the program's own module-level names (e.g. a cache "
                                "`_nlp = None`)")


def _check_module_values(nodes: list[ast.AST], modules: dict[str, types.ModuleType]) -> None:
    """A module may only be the base of an attribute access: ``str(np)``, ``f"{np.linalg}"`` name the install path."""
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    for node in nodes:
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in modules):
            continue
        expr: ast.AST = node
        module = modules[node.id]
        while True:  # walk up through allowed submodules (np.random.default_rng: np, then np.random)
            parent = parents.get(id(expr))
            if not (isinstance(parent, ast.Attribute) and parent.value is expr):
                raise _fail(expr, f"using the module {ast.unparse(expr)!r} as a value", MODULE_VALUE_REASON)
            value = getattr(module, parent.attr, None) if parent.attr in ALLOWED_NUMPY_SUBMODULES else None
            if not isinstance(value, types.ModuleType):
                break
            expr, module = parent, value


def analyze_source(source: str) -> ProgramInfo:
    """Validate ``source`` and return what the sandbox needs to know about it; raises ProgramValidationError."""
    tree = _parse(source)
    fn, params = _check_top_level(tree)

    bound: set[str] = set()
    bound_plain: set[str] = set()  # bound other than by an import
    loads: list[ast.Name] = []
    attributes: set[str] = set()
    strings: set[str] = set()
    nodes: list[ast.AST] = []
    unlisted: ast.Attribute | None = None
    spacy_names = _spacy_aliases(tree)
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
            raise _fail(node, f"{kind} syntax", _NODE_REASONS.get(kind, "this syntax is outside the allowlist for programs"))

        if isinstance(node, ast.Name):
            _check_identifier(node, "name", node.id)
            if isinstance(node.ctx, ast.Load):
                loads.append(node)
            else:
                bound.add(node.id)
                bound_plain.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr == "load" and isinstance(node.value, ast.Name) \
                and node.value.id in spacy_names and isinstance(node.ctx, ast.Load):
            attributes.add(node.attr)  # spacy.load: the sandbox's pipeline of read-only parses, not a file
        elif isinstance(node, ast.Attribute):
            why = blocked_reason(node.attr)
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
            bound_plain.add(node.arg)
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
                bound_plain.add(node.name)
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
                if DUNDER_STRING.search(text):
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

    _check_module_values(nodes, _module_bindings(nodes, bound_plain))
    _check_globals(tree, nodes)
    _check_spacy_bindings(nodes, spacy_names)

    if unlisted is not None:
        raise _fail(unlisted, f"attribute access '.{unlisted.attr}'", forbidden_attribute_reason(unlisted.attr) or "")

    try:  # surface compile-time errors ('return' outside function, ...) now; bounded constant folding only
        compile(tree, "<program>", "exec", dont_inherit=True)
    except SyntaxError as e:
        raise ProgramValidationError(f"line {e.lineno}: syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        raise ProgramValidationError(f"program could not be compiled ({type(e).__name__}: {e}); simplify it") from None
    return ProgramInfo(name=fn.name, attributes=frozenset(attributes), strings=frozenset(strings), params=params,
                       uses_spacy=bool(spacy_names))


def validate_source(source: str) -> str:
    """Validate an untrusted program against the allowlist and return its function name.

    Raises :class:`~headsurgeon.synth.errors.ProgramValidationError` naming the line, the construct and why.
    """
    return analyze_source(source).name
