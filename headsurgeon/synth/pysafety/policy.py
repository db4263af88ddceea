"""What a Python program may name, import and read: the builtins, modules and attribute allowlist.

The allowlist (:func:`allowed_attributes`) is the public API of the objects programs are given or can
make; within it, explicit refusals (file I/O, raw memory, frames, ``str.format``, module-valued
attributes) still apply. The worker's import hook (headsurgeon/synth/sandbox/worker.py) consults the same tables.
"""
from __future__ import annotations

import math
import re
import types
from functools import lru_cache

import numpy as np

from ..features import BASIC_VIEWS, NER_VIEWS, SPACY_VIEWS, WORDNET_VIEWS

ALLOWED_IMPORTS: frozenset[str] = frozenset({"numpy", "numpy.linalg", "numpy.fft", "numpy.random", "math", "re",
                                             "spacy"})
#: ``import spacy`` gives the sandbox's read-only parses (headsurgeon/synth/sandbox/spacy_shim.py), never the real package
SHIMMED_IMPORTS: frozenset[str] = frozenset({"spacy"})
ALLOWED_NUMPY_SUBMODULES: frozenset[str] = frozenset({"linalg", "fft", "random", "emath", "char", "strings"})
MODULE_NAMES: dict[str, str] = {"np": "numpy", "numpy": "numpy", "math": "math", "re": "re"}

# The tokenizer facade EAPS-style programs get (headsurgeon/synth/sandbox/facade.py): its methods and its encodings' fields.
FACADE_ATTRIBUTES: tuple[str, ...] = (
    "tokenize", "convert_ids_to_tokens", "convert_tokens_to_ids", "decode", "batch_decode", "encode",
    "input_ids", "attention_mask", "offset_mapping", "word_ids", "all_special_tokens", "all_special_ids",
    "bos_token", "cls_token", "eos_token", "sep_token", "pad_token", "unk_token", "bos_token_id",
    "cls_token_id", "eos_token_id", "sep_token_id", "pad_token_id", "unk_token_id",
)

# What EAPS's files read of spaCy's Doc/Token/Span (headsurgeon/synth/sandbox/spacy_shim.py offers exactly these).
SPACY_ATTRIBUTES: tuple[str, ...] = (
    "text", "i", "idx", "pos_", "tag_", "dep_", "lemma_", "ent_type_", "head", "children", "lefts", "rights",
    "ancestors", "sent", "sents", "ents", "is_sent_start", "is_sent_end", "sent_start", "is_stop", "is_punct",
    "is_space", "is_title", "whitespace_", "start", "end", "label_",
)

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
_WHY_MODULE = "only numpy, math, re and spacy (read-only parses) are available to programs"
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
_WHY_HOST = ("it reveals the host (install paths, environment, versions), which could travel to an LLM endpoint "
             "in feedback or a label")
FORBIDDEN_ATTRIBUTES: dict[str, str] = {
    **{a: _WHY_FILE for a in (
        "load", "loads", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt", "fromfile",
        "tofile", "fromregex", "dump", "dumps", "memmap", "open_memmap", "DataSource",
    )},
    **{a: _WHY_MEMORY for a in ("ctypes", "ctypeslib", "as_strided", "byte_bounds")},
    **{a: "it runs external tools or test suites" for a in ("test", "show_config", "show_runtime", "f2py")},
    "get_include": _WHY_HOST,
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
DUNDER_STRING = re.compile(r"__\w+__")
MODULE_VALUE_REASON = ("a module may only be used to reach its functions (e.g. np.zeros): its text names the "
                       "install path of your environment; call the function you need instead")


@lru_cache(maxsize=1)
def _module_attribute_bans() -> dict[str, str]:
    """Names of module-valued attributes of numpy/re/math (other than the allowed ones): reaching them escapes."""
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
    roots: list[object] = [np, math, re, np.ndarray, np.generic, np.dtype, np.ufunc, np.random.Generator,
                           np.flatiter, np.finfo, np.iinfo, np.errstate, re.Pattern, re.Match]
    roots += [getattr(np, s) for s in sorted(ALLOWED_NUMPY_SUBMODULES) if hasattr(np, s)]
    roots += [str, bytes, list, dict, set, frozenset, tuple, int, float, complex, bool, range, slice,
              type({}.keys()), type({}.values()), type({}.items())]
    names = {n for obj in roots for n in dir(obj) if not n.startswith("_")}
    names |= {"ids", "tokens", "text", "offsets", "n", "features", "keys", "to_dict"}  # the Sequence API
    names |= set(BASIC_VIEWS) | set(SPACY_VIEWS) | set(WORDNET_VIEWS) | set(NER_VIEWS)
    names |= set(FACADE_ATTRIBUTES) | set(SPACY_ATTRIBUTES)
    return frozenset(n for n in names if blocked_reason(n) is None)


def forbidden_attribute_reason(attr: str) -> str | None:
    """Why a program may not read attribute ``attr`` (None when it may); shared with the worker's import hook."""
    why = blocked_reason(attr)
    if why is None and attr not in allowed_attributes():
        why = ("it is not on the allowlist of attributes programs may read (the Sequence API, numpy, math, "
               "re and plain container methods); compute the value another way")
    return why


def blocked_reason(attr: str) -> str | None:
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
