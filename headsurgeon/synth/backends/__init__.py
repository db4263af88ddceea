"""Program backends: one per program kind (DSL, sandboxed Python), behind one interface and a registry.

``Program`` dispatches every kind-specific operation to the backend registered for its kind; a new kind
is a ``ProgramBackend`` subclass passed to ``register_backend`` (recipe in docs/architecture.md).
"""
from __future__ import annotations

from .base import (DEFAULT_TIMEOUT, ProgramBackend, backend_for_document, backend_kinds, get_backend, json_document,
                   register_backend, unregister_backend)
from .dsl import DSLBackend
from .python import PythonBackend, normalize_source

__all__ = ["ProgramBackend", "register_backend", "unregister_backend", "get_backend", "backend_kinds", "backend_for_document",
           "json_document", "DSLBackend", "PythonBackend", "normalize_source", "DEFAULT_TIMEOUT"]

register_backend(DSLBackend())  # first: the default kind, tried last for untyped records
register_backend(PythonBackend())
