"""Sandboxed execution of untrusted Python programs in a reusable pool of hardened worker processes.

Python programs are untrusted text: validated by the AST allowlist in :mod:`headsurgeon.synth.pysafety`,
then run only here, in forked job processes of sandbox workers, never in the caller. SECURITY.md lists
the layers; docs/architecture.md shows where this package sits.

    pool = SandboxPool(workers=2, memory_mb=1024)
    results = pool.run(source, sequences, timeout=5.0)   # list[np.ndarray | ProgramExecutionError]
    results, labels = pool.run_labeled(source, sequences) # and each (label, matrix) program's label
    get_pool().run(...)                                  # shared, lazily started, closed at exit
"""
from __future__ import annotations

from ..pysafety import validate_source
from .pool import SandboxPool
from .facade import TokenizerFacade
from .protocol import REASONS
from .shared import get_pool, shutdown_pool
from .views import FeatureNamespace, SequenceView, sequence_view

__all__ = [
    "SandboxPool", "get_pool", "shutdown_pool", "sequence_view", "validate_source", "SequenceView",
    "FeatureNamespace", "REASONS", "TokenizerFacade",
]
