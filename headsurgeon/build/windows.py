"""The windows a build reads: explain's splits of the corpus, held-out text, and windows of the documents after
explain's (``--select-more``, ``--heal-more``), which no split ever held."""
from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..configs import BuildConfig
from ..core import InputError

if TYPE_CHECKING:  # the model and corpus types load torch: named for the checker only
    from ..surgery.corpus import Splits
    from ..surgery.models.handle import ModelHandle
    from ..synth.sequence import Sequence

__all__ = ["corpus_windows", "fresh_windows", "more_costs_path", "more_windows"]


def corpus_windows(handle: ModelHandle, corpus: str | Path, heldout: str | Path | None,
                   cfg: BuildConfig) -> tuple[Splits, list[Sequence]]:
    """Explain's splits of ``corpus`` (refusing one without synth, select or test windows) and the windows of the
    ``heldout`` text, if any."""
    from ..surgery.corpus import load_corpus, make_sequences, read_documents

    splits = load_corpus(handle, corpus, **asdict(cfg.corpus))
    splits.require("synth", minimum=1)
    splits.require("select", "test")  # both are judged with intervals over windows
    extra = []
    if heldout is not None:
        extra = make_sequences(handle, read_documents(heldout, cfg.corpus.separator), max_len=cfg.corpus.max_len,
                               max_sequences=cfg.corpus.max_sequences)
    return splits, extra


def more_windows(handle: ModelHandle, corpus: str | Path, cfg: BuildConfig, want: int) -> list[Sequence]:
    """``want`` windows of ``corpus`` from documents none of explain's windows came from (those read after its
    ``max_sequences`` windows, a document cut by that limit skipped), so choosing or healing on them never touches a
    test window; an InputError when explain read the whole corpus."""
    from ..surgery.corpus import make_sequences, read_documents

    limit = cfg.corpus.max_sequences
    if limit is None:
        raise InputError("--select-more and --heal-more take windows after explain's --max-sequences windows, but no "
                         "limit was set (explain read the whole corpus); give build explain's --max-sequences")
    docs = read_documents(corpus, cfg.corpus.separator)
    cap = limit + 2 * want + 64
    while True:
        windows = make_sequences(handle, docs, max_len=cfg.corpus.max_len, max_sequences=cap)
        read = {s.doc for s in windows[:limit]}
        fresh = [s for s in windows[limit:] if s.doc not in read]
        if len(fresh) >= want or len(windows) < cap:
            break
        cap *= 2
    if not fresh:
        raise InputError(f"the corpus has no document after explain's {limit} windows, so --select-more and "
                         "--heal-more have nothing to add; give a longer corpus or leave them out")
    if len(fresh) < want:
        warnings.warn(f"--select-more/--heal-more want {want} windows: the corpus holds only {len(fresh)} after "
                      "explain's", stacklevel=3)
    return fresh[:want]


def fresh_windows(handle: ModelHandle, corpus: str | Path, cfg: BuildConfig) -> tuple[list[Sequence], list[Sequence]]:
    """The windows after explain's, split: ``select_more`` for choosing and growing, the next ``heal_more`` for
    healing (so early stopping on the select windows never checks what healing trained on)."""
    want = cfg.select_more + (cfg.heal_more if cfg.heal else 0)
    fresh = more_windows(handle, corpus, cfg, want) if want else []
    return fresh[: cfg.select_more], fresh[cfg.select_more:]


def more_costs_path(costs: str | Path | None) -> Path | None:
    """Where the costs on the --select-more windows are kept: beside --costs, ``NAME.more.json``."""
    if costs is None:
        return None
    path = Path(costs)
    return path.with_name(f"{path.stem}.more{path.suffix or '.json'}")
