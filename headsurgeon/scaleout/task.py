"""One unit of explain work, the same on the driver and on a Ray worker: for a few heads, run every requested
searcher with ``heads=`` (headsurgeon/synth/search/base.py ``run_searchers`` with the driver's registry factories), select
among their candidates (headsurgeon/synth/select.py ``select_programs`` over a store view of just those heads) and, when
asked, measure each head's ΔPPL (headsurgeon/surgery/measure/evaluate.py ``per_head_delta_ppl``). Returns one journal record per head.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence as Seq

from ..synth.search.base import CandidateMap, SearchSettings, run_searchers
from ..synth.runcache import routed_cache
from ..synth.select import select_programs
from ..synth.splits import StoreSplits
from .headstore import HeadStore
from ..core import Head, SelectBy
from ..core.vocabulary import TokenVocabulary
from .warmup import compile_clock

if TYPE_CHECKING:  # both import torch, which a task runs without until it measures ΔPPL
    from ..surgery.models.handle import ModelHandle
    from ..surgery.patterns.store import AttentionStore


@dataclass(frozen=True)
class DeltaJob:
    """How a worker measures ΔPPL: a model spec it can load itself (in the driver's dtype and on its device type,
    so its perplexities are comparable with the driver's base), and the base perplexity on ``test``."""

    model: Any
    tokenizer: Any
    base_ppl: float
    dtype: str = "float32"
    device: str = "cpu"


@dataclass(frozen=True)
class HeadJob:
    """Everything a task needs besides its heads: the store's location, the splits, searchers and settings."""

    store: str
    splits: StoreSplits  # the store's windows by split (headsurgeon/synth/splits.py)
    searchers: tuple[tuple[str, Any], ...]  # (name, factory): the driver's registry entries (base.searcher_factory)
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    vocab: TokenVocabulary | None = None
    model: str = ""
    delta: DeltaJob | None = None
    out: str | None = None  # a folder searchers may write to (SearchSettings.out; runs in the driver's process only: the LLM journal)
    llm_gate: str | None = None  # name of the cluster's LLM gate actor (llmgate.py); None: the agent's own caps
    select_by: SelectBy = "iou"  # headsurgeon/synth/select.py select_programs: what chooses on the select split

    def fingerprint(self, store: AttentionStore) -> dict[str, Any]:
        """What a journal is bound to: the store's sequences, splits, seed, searchers, options, ΔPPL on/off."""
        def digest(obj: Any) -> str:
            text = json.dumps(obj, sort_keys=True, default=lambda o: getattr(o, "hash", None) or repr(o))
            return hashlib.sha256(text.encode()).hexdigest()[:16]

        from ..synth.sequence import sequences_key

        return {"sequences": sequences_key(store.sequences), "model": getattr(store, "model_name", ""),
                "heads": [store.n_layers, store.n_heads],
                "splits": digest([self.splits.synth, self.splits.select, self.splits.test]), "seed": self.seed,
                "searchers": [name for name, _ in self.searchers], "options": digest(_public(self.options)),
                "delta_ppl": self.delta is not None, **({} if self.select_by == "iou" else {"select_by": self.select_by})}


def _public(options: dict[str, Any]) -> dict[str, Any]:
    """Searcher options as fingerprinted: programs by hash, an AgentConfig by its public fields (no API key)."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if hasattr(value, "public"):
            out[name] = value.public()
        elif isinstance(value, (list, tuple)):
            out[name] = [getattr(v, "hash", v) for v in value]
        else:
            out[name] = value
    return out


def _search(job: HeadJob, store: HeadStore, heads: list[Head], notes: list[str],
            timings: dict[str, float]) -> CandidateMap:
    """Every searcher of ``job`` on ``heads`` through headsurgeon/synth/search/base.py ``run_searchers``, with the driver's
    factories (a worker's registry may differ); the LLM agent asks the cluster's gate when there is one."""
    settings = SearchSettings(seed=job.seed, progress=False, out=None if job.out is None else Path(job.out),
                              options=dict(job.options))
    factories = dict(job.searchers)
    gate = job.llm_gate
    if gate and "llm" in factories:
        factories["llm"] = lambda _settings: _gated_llm(job, gate)
    return run_searchers(store, [name for name, _ in job.searchers], job.splits, settings=settings, heads=heads,
                         notes=notes, timings=timings, factories=factories)


def _gated_llm(job: HeadJob, gate: str) -> Any:
    """The LLM searcher whose requests take slots from the cluster's gate (llmgate.py)."""
    from ..synth.search.llm.agent import LLMSearcher
    from ..synth.search.llm.config import AgentConfig
    from .llmgate import GatedClient

    config = job.options.get("llm") or AgentConfig(progress=False)
    return LLMSearcher(config, client=GatedClient(gate, config))


def explain_heads(job: HeadJob, heads: Seq[tuple[int, int]], handle: ModelHandle | None = None) -> list[dict[str, Any]]:
    """Search, select and (with ``job.delta``) measure ΔPPL for ``heads``; one journal record per head.

    ``handle``: a loaded model for ΔPPL (the driver passes its own; a worker loads ``job.delta.model``).
    Each record's ``seconds["warmup"]`` is its share of the time numba spent compiling or loading kernels
    (warmup.py), which the run's time estimate leaves out.
    """
    with compile_clock() as clock:
        records = _explain(job, heads, handle)
    for rec in records:
        rec["seconds"]["warmup"] = clock.seconds / len(records)
    return records


def _explain(job: HeadJob, given: Seq[tuple[int, int]], handle: ModelHandle | None) -> list[dict[str, Any]]:
    """``explain_heads`` without the warm-up clock."""
    heads = [Head(int(a), int(b)) for a, b in given]
    store = HeadStore(job.store, heads)
    notes: list[str] = []
    timings: dict[str, float] = {}
    pool = _search(job, store, heads, notes, timings)
    t0 = time.perf_counter()
    chosen = select_programs(store, {h: pool.get(h, []) for h in heads}, job.splits, progress=False, model=job.model,
                             vocab=job.vocab,
                             cache=routed_cache(job.out),  # sandboxed programs' patterns: once per run
                             select_by=job.select_by)
    t_select = time.perf_counter() - t0
    deltas: dict[tuple[int, int], float] = {}
    t_delta = 0.0
    if job.delta is not None and len(chosen):
        from ..surgery.measure.evaluate import per_head_delta_ppl
        from ..surgery.models.loading import load_model

        t0 = time.perf_counter()
        model = handle if handle is not None else load_model(
            job.delta.model, tokenizer=job.delta.tokenizer, dtype=job.delta.dtype, device=job.delta.device)
        seqs = [store.sequences[i] for i in job.splits.test]
        deltas = per_head_delta_ppl(model, chosen.programs(), seqs, base_ppl=job.delta.base_ppl, progress=False)
        t_delta = time.perf_counter() - t0
    share = 1.0 / len(heads)
    records = []
    for h in heads:
        entry = chosen.entries.get(h)
        records.append({
            "head": Head.label(h), "entry": None if entry is None else entry.to_json(h), "meta": chosen.meta,
            "candidates": len(pool.get(h, [])), "delta_ppl": deltas.get(h), "notes": notes,
            "seconds": {"search": {k: v * share for k, v in timings.items()}, "select": t_select * share,
                        "delta_ppl": t_delta * share},
        })
    return records
