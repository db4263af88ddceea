"""``score``: how well one program reproduces one head, in one call (IoU, JSD and top-q IoU)."""
from __future__ import annotations

import re
from typing import Any, Iterable

from ...core import InputError, HeadLike
from ...synth.program import Program
from ...synth.select import score_programs
from ...synth.sequence import Sequence
from ..patterns.capture import capture
from ..models.loading import ModelHandle, load_model
from ..patterns.store import AttentionStore
from ...core import Head

__all__ = ["score"]

_PYTHON_SOURCE = re.compile(r"^\s*(def|import|from)\s+\w", re.MULTILINE)  # DSL has no such line


def score(program: Program | str, source: Any, head: HeadLike, sequences: Iterable[Sequence] | None = None,
          indices: Iterable[int] | None = None) -> dict[str, float]:
    """Soft IoU, JSD and top-q IoU of ``program`` against head ``head`` (``"L0H1"`` or ``(0, 1)``).

    ``source`` is an AttentionStore (scored on its sequences ``indices``, default all) or a model (any
    ``load_model`` spec or handle), whose patterns are captured on ``sequences`` first. Returns the
    means over sequences and their count ``n``.
    """
    if isinstance(program, str) and _PYTHON_SOURCE.search(program):
        raise InputError("score got Python source, not a DSL program: pass hs.Program.python(source) (Python "
                         "programs run in the sandbox, SECURITY.md); DSL text looks like 'prev(1)'")
    program = program if isinstance(program, Program) else Program.parse(program)
    layer, head_index = Head.parse(head)
    if isinstance(source, AttentionStore):
        store = source
        if sequences is not None:
            raise InputError("score(program, store, ...) scores the store's own sequences: pass indices=, "
                             "or pass the model instead of the store to score other sequences")
    else:
        if sequences is None:
            raise InputError("score(program, model, ...) needs sequences=: the windows to capture the head on "
                             "(e.g. hs.load_corpus(model, path).test)")
        handle = source if isinstance(source, ModelHandle) else load_model(source)
        handle.check_head(layer, head_index)
        store = capture(handle, list(sequences), progress=False)
    if (layer, head_index) not in set(store.heads):
        raise IndexError(f"head L{layer}H{head_index} is not in this store (it holds {store.n_layers} layers x "
                         f"{store.n_heads} heads)")
    chosen = list(range(len(store.sequences))) if indices is None else [int(i) for i in indices]
    got = score_programs(store, [(layer, head_index)], [program], chosen)
    return {**{metric: float(values[0, 0]) for metric, values in got.items()}, "n": len(chosen)}
