"""AST validation of untrusted Python programs (docs/architecture.md, SECURITY.md): one function over the Sequence API.

A Python program is source text whose LAST top-level function (the entry; functions before it are helpers)
takes one argument (a Sequence view ``seq``) or two (EAPS's ``prog(sentence, tokenizer)``: the window's text and
the tokenizer facade of headsurgeon/synth/sandbox/facade.py) and returns an n x n array-like of scores, or ``(label,
matrix)``. Optional top-level statements: a docstring, imports of ``numpy`` / ``math`` / ``re`` / ``spacy`` (the
sandbox's read-only parses, headsurgeon/synth/sandbox/spacy_shim.py) and plain assignments (``nlp = spacy.load(...)``).

This module is the *first* layer of defence: it rejects anything outside a small allowlist of syntax,
names and attributes before the source ever reaches a sandbox worker. It does not execute anything
(``compile`` is called on the parsed tree only to surface compile-time syntax errors). The second
layer (restricted builtins and import hook) and the third (OS limits in the worker process) live in
:mod:`headsurgeon.synth.sandbox`; they assume this validation may be bypassed.

Policy summary (every rejection names the line, the construct and the reason):

* syntax: an allowlist of AST node types; no ``class``, ``async``/``await``, ``with``, ``match``,
  ``nonlocal``, ``global`` of a name the program's top level does not assign, decorators, bare ``except:``, and no ``return``/``break``/``continue`` inside
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
* imports: only ``numpy`` (and its ``linalg``/``fft``/``random`` subpackages), ``math``, ``re`` and ``spacy``
  (whose ``load`` is the only attribute allowed on it, and whose name nothing else may bind);
* size: at most :data:`MAX_SOURCE_CHARS` characters and :data:`MAX_AST_NODES` syntax nodes.
"""
from __future__ import annotations

from .policy import (ALLOWED_IMPORTS, ALLOWED_NUMPY_SUBMODULES, AVAILABLE_NAMES, FORBIDDEN_ATTRIBUTES, FORBIDDEN_NAMES,
                     MODULE_NAMES, SAFE_BUILTINS, SHIMMED_IMPORTS, SAFE_EXCEPTIONS, allowed_attributes, check_import,
                     forbidden_attribute_reason)
from .validate import MAX_AST_NODES, MAX_SOURCE_CHARS, ProgramInfo, analyze_source, validate_source

__all__ = [
    "MAX_SOURCE_CHARS",
    "MAX_AST_NODES",
    "ALLOWED_IMPORTS",
    "ALLOWED_NUMPY_SUBMODULES",
    "MODULE_NAMES",
    "SHIMMED_IMPORTS",
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
