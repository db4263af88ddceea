"""explain's search-and-select stage over a captured store, per head, on this machine's processes or on Ray (run.py),
journaled under
``OUT/heads`` (journal.py); returns the ProgramSet and, when asked, each head's ΔPPL."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence as Seq

from ..synth.programset import ProgramSet
from ..synth.search.base import SearcherUnavailable, SearchSettings, make_searcher, searcher_factory
from ..synth.splits import StoreSplits, SplitsLike
from .config import ScaleoutConfig
from .headstore import store_location
from .run import EXECUTORS, chunked, run_heads
from .task import DeltaJob, HeadJob
from ..core import Head, InputError, SelectBy
from ..core.vocabulary import TokenVocabulary

if TYPE_CHECKING:  # surgery/models/handle.py imports torch, which this module does without
    from ..surgery.models.handle import ModelHandle
    from ..surgery.patterns.store import AttentionStore

@dataclass
class HeadsResult:
    """The selected programs, per-head ΔPPL (empty unless asked), summed per-stage seconds and the runs' notes."""

    programs: ProgramSet
    delta_ppl: dict[tuple[int, int], float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _model_spec(model: Any) -> Any:
    """A model spec a worker can load itself (a string or path); a live model cannot travel to workers."""
    if isinstance(model, (str, Path)):
        return str(model)
    raise InputError("per-head ΔPPL on Ray needs the model as a spec every worker can load (a hub id, a folder, "
                     "'llama2c:PATH.bin' or 'tiny-stories'), not a loaded model; pass the spec to explain()")


#: searchers whose candidates are DSL programs only (headsurgeon/synth/search/enumerative, headsurgeon/synth/search/learned)
DSL_SEARCHERS = frozenset({"enumerative", "learned"})


def run_trust(searchers: Seq[str], options: dict[str, Any]) -> Any:
    """The trust a run's own journal gets (headsurgeon/synth/trust.py): Python programs only where its searchers propose them —
    any (True) with the LLM agent or a searcher of your own, else exactly the ``library`` programs' hashes."""
    if any(name not in DSL_SEARCHERS and name != "library" for name in searchers):
        return True
    return frozenset(getattr(getattr(p, "program", p), "hash", "") for p in options.get("library") or ())


def preflight(config: ScaleoutConfig) -> None:
    """Check the executor before the long capture: a known name, a whole number of workers, Ray installed, the
    cluster's port answering, a store URL only where Ray workers read it."""
    executor, address, heads_per_task = config.executor, config.address, config.heads_per_task
    workers, store_url = config.workers, config.store_url
    if heads_per_task is not None:
        chunked([], heads_per_task)  # refuses anything but a whole number >= 1
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}; got {executor!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InputError(f"workers must be a whole number >= 1 (1: this process); got {workers!r}")
    if workers is not None and executor == "ray":
        raise InputError("workers sizes the local process pool; on Ray the cluster's CPUs decide (drop --workers)")
    if executor == "ray":
        from .ray_run import check_reachable, import_ray

        import_ray()
        if address:
            check_reachable(address)
    elif address:
        raise InputError("address names a Ray cluster; pass executor='ray' with it (or --ray ADDRESS)")
    if store_url and executor != "ray":
        raise InputError("store_url tells Ray workers where the store is; without executor='ray' (--ray) the heads "
                         "run here on OUT/store: drop --store-url, or add --ray")


def explain_store(store: AttentionStore, handle: ModelHandle, splits: SplitsLike, searchers: Seq[str], *,
                  options: dict[str, Any], seed: int, vocab: TokenVocabulary | None, out: Path, scaleout: ScaleoutConfig | None = None,
                  delta_ppl: bool = False, model_spec: Any = None, tokenizer: Any = None, progress: bool = True,
                  on_record: Any = None, heads: Seq[tuple[int, int]] | None = None,
                  select_by: SelectBy = "iou") -> HeadsResult:
    """Search, select and (``delta_ppl``) measure every head of ``store`` (or ``heads``); resumes from
    ``out / "heads"``.

    ``splits``: the store's windows by split (a StoreSplits, headsurgeon/synth/splits.py, or a corpus Splits);
    ``scaleout``: where the heads run (headsurgeon/scaleout/config.py). Locally the heads run on ``scaleout.workers``
    processes (None: every core this process may use), except with the LLM agent (its request caps and journal are
    per process) or per-head ΔPPL on a model given as an object (workers load the model from its spec): those run
    in this process, and a note says why.
    """
    scaleout = scaleout or ScaleoutConfig()
    executor, workers, address = scaleout.executor, scaleout.workers, scaleout.address
    splits = StoreSplits.of(splits)
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}; got {executor!r}")
    names = list(searchers)
    notes: list[str] = []
    if executor == "local" and "llm" in names:  # an agent without an endpoint is skipped here, once, so that it
        # does not keep the heads in one process (on Ray the workers' environment decides)
        try:
            make_searcher("llm", SearchSettings(seed=seed, progress=False, options=options))
        except SearcherUnavailable as e:
            notes.append(str(e))
            names.remove("llm")
    factories = tuple((n, searcher_factory(n)) for n in names)
    gate = None
    if executor == "ray" and "llm" in names:
        try:  # only an agent that can run here gets a cluster-wide gate; otherwise every worker notes why not
            make_searcher("llm", SearchSettings(seed=seed, progress=False, options=options))
            gate = f"headsurgeon-llm-gate-{uuid.uuid4().hex[:12]}"
        except SearcherUnavailable:
            pass
    if executor == "local" and workers != 1:
        why = ("the LLM agent's request caps and journal are per process (--ray shares them over a cluster)"
               if "llm" in names else "per-head ΔPPL on a model object: worker processes load the model from its "
               "spec (a path or name)" if delta_ppl and not isinstance(model_spec, (str, Path)) else None)
        if why is not None:
            notes.append(f"the heads ran in this process: {why}")
            workers = 1
    pooled = executor == "ray" or (executor == "local" and workers != 1)
    delta = None
    if delta_ppl:
        from ..surgery.measure.evaluate import perplexity

        base = perplexity(handle, [store.sequences[i] for i in splits.test], progress=False)
        param = next(handle.model.parameters())
        delta = DeltaJob(_model_spec(model_spec) if pooled else None,
                         None if tokenizer is None else str(tokenizer), base,
                         dtype=str(param.dtype).removeprefix("torch."), device=param.device.type)
    job = HeadJob(store_location(store.directory, scaleout.store_url if executor == "ray" else None), splits,
                  factories, seed, dict(options), vocab, handle.name, delta, None if pooled else str(out), gate, select_by)
    heads = [Head.parse(h) for h in heads] if heads is not None else list(store.heads)
    t0 = time.perf_counter()
    records, resumed, run_notes = run_heads(job, heads, out / "heads", fingerprint=job.fingerprint(store),
                                            executor=executor, workers=workers, address=address,
                                            heads_per_task=scaleout.heads_per_task, handle=handle, progress=progress,
                                            on_record=on_record)
    notes.extend(run_notes)
    timings: dict[str, float] = {"heads_wall": 0.0}  # set below, once the programs are read
    if resumed:
        notes.append(f"resumed {resumed} of {len(heads)} heads from the journal {out / 'heads'}")
    for rec in records.values():
        sec = rec.get("seconds") or {}
        for name, s in (sec.get("search") or {}).items():
            timings[name] = timings.get(name, 0.0) + s
        for stage in ("select", "delta_ppl"):
            timings[stage] = timings.get(stage, 0.0) + float(sec.get(stage) or 0.0)
        notes.extend(n for n in rec.get("notes") or [] if n not in notes)
    if not delta_ppl:
        timings.pop("delta_ppl", None)
    from .journal import HeadJournal

    programs = HeadJournal(out / "heads").programset(heads, model=handle.name,
                                                     vocab_fingerprint=getattr(vocab, "fingerprint", None),
                                                     trust=run_trust(names, options), records=records)
    timings["heads_wall"] = time.perf_counter() - t0  # reading the records into programs included
    deltas = {h: float(r["delta_ppl"]) for h, r in records.items() if r.get("delta_ppl") is not None}
    return HeadsResult(programs, deltas, timings, notes)
