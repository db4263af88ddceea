"""Scale explain out: per-head tasks (search, select, ΔPPL) run on this machine's processes (pool.py) or on a
Ray cluster, journaled per head so a killed run resumes. Ray is imported only when ``executor="ray"`` is used
(headsurgeon/scaleout/ray_run.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_package

if TYPE_CHECKING:  # the package's names, loaded on first use (headsurgeon/core/lazy.py)
    from .headstore import HeadStore, StoreUnreachable, store_location
    from ..core import JournalMismatchError
    from .journal import HeadJournal
    from .run import EXECUTORS, chunked, run_heads
    from .stage import HeadsResult, explain_store, preflight
    from .task import DeltaJob, HeadJob, explain_heads

__all__, __getattr__, __dir__ = lazy_package(__file__, __name__)
