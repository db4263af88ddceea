"""explain's search-and-select stage over a captured store, per head, serially or on Ray (run.py), journaled under
``OUT/heads`` (journal.py); returns the ProgramSet and, when asked, each head's ΔPPL."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence as Seq

from ..synth.programset import ProgramSet
from ..synth.search.base import SearcherUnavailable, SearchSettings, make_searcher, searcher_factory
from .headstore import store_location
from .run import EXECUTORS, chunked, run_heads
from .task import DeltaJob, HeadJob
from ..kernels.core import InputError

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


#: searchers whose candidates are DSL programs only (synth/search/enumerative, synth/search/learned)
DSL_SEARCHERS = frozenset({"enumerative", "learned"})


def run_trust(searchers: Seq[str], options: dict[str, Any]) -> Any:
    """The trust a run's own journal gets (synth/trust.py): Python programs only where its searchers propose them —
    any (True) with the LLM agent or a searcher of your own, else exactly the ``library`` programs' hashes."""
    if any(name not in DSL_SEARCHERS and name != "library" for name in searchers):
        return True
    return frozenset(getattr(getattr(p, "program", p), "hash", "") for p in options.get("library") or ())


def preflight(executor: str, address: str | None = None, heads_per_task: int | None = None) -> None:
    """Check the executor before the long capture: a known name, Ray installed, the cluster's port answering."""
    if heads_per_task is not None:
        chunked([], heads_per_task)  # refuses anything but a whole number >= 1
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}; got {executor!r}")
    if executor == "ray":
        from .ray_run import check_reachable, import_ray

        import_ray()
        if address:
            check_reachable(address)
    elif address:
        raise InputError("address names a Ray cluster; pass executor='ray' with it (or --ray ADDRESS)")


def explain_store(store: Any, handle: Any, indices: dict[str, list[int]], searchers: Seq[str], *,
                  options: dict[str, Any], seed: int, vocab: Any, out: Path, executor: str = "serial",
                  address: str | None = None, heads_per_task: int | None = None, delta_ppl: bool = False,
                  model_spec: Any = None, tokenizer: Any = None, store_url: str | None = None,
                  progress: bool = True, on_record: Any = None) -> HeadsResult:
    """Search, select and (``delta_ppl``) measure every head of ``store``; resumes from ``out / "heads"``."""
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}; got {executor!r}")
    names = list(searchers)
    factories = tuple((n, searcher_factory(n)) for n in names)
    notes: list[str] = []
    gate = None
    if executor == "ray" and "llm" in names:
        try:  # only an agent that can run here gets a cluster-wide gate; otherwise every worker notes why not
            make_searcher("llm", SearchSettings(seed=seed, progress=False, options=options))
            gate = f"headsurgeon-llm-gate-{uuid.uuid4().hex[:12]}"
        except SearcherUnavailable:
            pass
    delta = None
    if delta_ppl:
        from ..surgery.evaluate import perplexity

        base = perplexity(handle, [store.sequences[i] for i in indices["test"]], progress=False)
        param = next(handle.model.parameters())
        delta = DeltaJob(_model_spec(model_spec) if executor == "ray" else None,
                         None if tokenizer is None else str(tokenizer), base,
                         dtype=str(param.dtype).removeprefix("torch."), device=param.device.type)
    job = HeadJob(store_location(store.directory, store_url if executor == "ray" else None),
                  tuple(indices["synth"]), tuple(indices["select"]), tuple(indices["test"]), factories, seed,
                  dict(options), vocab, handle.name, delta, str(out) if executor == "serial" else None, gate)
    heads = list(store.heads)
    t0 = time.perf_counter()
    records, resumed = run_heads(job, heads, out / "heads", fingerprint=job.fingerprint(store), executor=executor,
                        address=address, heads_per_task=heads_per_task, handle=handle, progress=progress,
                        on_record=on_record)
    timings: dict[str, float] = {"heads_wall": time.perf_counter() - t0}
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
                                                     trust=run_trust(names, options))
    deltas = {h: float(r["delta_ppl"]) for h, r in records.items() if r.get("delta_ppl") is not None}
    return HeadsResult(programs, deltas, timings, notes)
