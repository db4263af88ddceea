"""Small helpers of the enumerative search: progress bars, default splits, spaCy detection, rounding."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..base import PatternSource
from ....core import InputError


def default_splits(store: PatternSource, seed: int) -> tuple[list[int], list[int]]:
    """Split the store's sequences by document (75% synth, 25% select), seeded, when none are given."""
    docs = sorted({s.doc for s in store.sequences})
    if len(docs) < 2:
        raise InputError(
            "enumerative_search needs synth_idx and select_idx (or a store with at least 2 documents to "
            "split by document); pass the store indices of your synth and select splits"
        )
    perm = np.random.default_rng(seed).permutation(len(docs))
    n_synth = min(len(docs) - 1, max(1, int(round(0.75 * len(docs)))))
    synth_docs = {docs[i] for i in perm[:n_synth]}
    synth = [i for i, s in enumerate(store.sequences) if s.doc in synth_docs]
    select = [i for i, s in enumerate(store.sequences) if s.doc not in synth_docs]
    return synth, select


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """A tqdm bar that disappears when done (disabled unless ``enabled``)."""
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)


def spacy_available() -> bool:
    """True when the spaCy English model loads (POS / dependency features are then usable)."""
    try:
        from ...features import load_spacy

        load_spacy()
        return True
    except Exception:  # noqa: BLE001 - any failure means: search without spaCy features
        warnings.warn("spaCy model unavailable: the enumerative search skips POS/dependency primitives",
                      RuntimeWarning, stacklevel=3)
        return False


def significant(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (program text stays short)."""
    x = float(x)
    return float(f"{x:.{digits}g}") if x > 0 else 0.0
