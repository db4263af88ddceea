"""explain: capture → search (every requested searcher from the registry, then the user's library) → one selection
→ sweep → report.

Writes OUT/programs.json (a ProgramSet), OUT/sweep.png and OUT/report.html, and returns a summary.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from headsurgeon.scaleout import explain_store, preflight
from headsurgeon.surgery.capture import capture
from headsurgeon.surgery.corpus import load_corpus
from headsurgeon.surgery.evaluate import replacement_sweep
from headsurgeon.surgery.loading import load_model
from headsurgeon.synth.programset import ProgramSet, head_label
from headsurgeon.synth.vocab import Vocabulary
from .kernels.core import InputError

#: the searchers explain runs by default (any registered name may be asked for; see docs/architecture.md)
SEARCHERS = ("enumerative", "learned", "llm")


@dataclass
class ExplainResult:
    """What explain produced: the program set, the sweep rows, the store and where files went."""

    programs: ProgramSet
    sweep: list[dict]
    out: Path
    store: Any
    splits: Any
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    delta_ppl: dict[tuple[int, int], float] = field(default_factory=dict)  # per head, when explain(delta_ppl=True)

    def summary_table(self) -> str:
        """Per head: the replacement's test IoU/JSD and size beside the explanation's IoU, chars and gloss."""
        nan = float("nan")
        lines = [f"{'head':<6} {'IoU test':>8} {'JSD test':>8} {'size':>6}  {'source':<11} "
                 f"{'expl IoU':>8} {'chars':>5}  explanation (gloss)"]
        for h in self.programs.ranked("test"):
            e = self.programs.entries[h]
            t = e.scores.get("test", {})
            x = e.explanation
            shown = ((x.gloss or x.text) if x is not None else "(no program fits "
                     f"{self.programs.meta.get('readable_chars', 200)} characters)")
            lines.append(f"{head_label(h):<6} {t.get('iou', nan):>8.3f} {t.get('jsd', nan):>8.3f} {e.size:>6}  "
                         f"{e.source:<11} {(x.iou('test') if x and x.iou('test') is not None else nan):>8.3f} "
                         f"{(x.chars if x else 0):>5}  {shown}")
        s = self.programs.summary("test")
        if "mean_iou" in s:
            lines.append(f"mean test IoU {s['mean_iou']:.3f}, median {s['median_iou']:.3f}, "
                         f"IoU>=0.9: {s['share_iou_ge_0.9']:.0%}, IoU>=0.7: {s['share_iou_ge_0.7']:.0%}")
        readable = [x.iou("test") for x in (e.explanation for e in self.programs.entries.values())
                    if x is not None and x.iou("test") is not None]
        if readable:
            lines.append(f"readable explanations: {len(readable)} of {len(self.programs)} heads, mean test IoU "
                         f"{sum(readable) / len(readable):.3f}")
        for r in self.sweep:
            what = "embedding distance" if "embedding_distance" in r else "ΔPPL"  # headless: surgery/embedding.py
            lines.append(f"sweep {r['fraction']:.0%} heads replaced: {what} {100 * r['delta']:+.2f}% "
                         f"(random order {100 * r['delta_random_order']:+.2f}%, random programs "
                         f"{100 * r['delta_random_program']:+.2f}%)")
        return "\n".join(lines)


def explain(model: Any = "tiny-stories", corpus: Any = None, out: str | Path = "headsurgeon-out",
            tokenizer: Any = None, max_len: int = 64, max_sequences: int = 300,
            fractions: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0,
            searchers: Iterable[str] = SEARCHERS, library: Iterable[Any] = (),
            agent_config: Any = None, sweep_steps: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
            progress: bool = True, executor: str = "serial", address: str | None = None,
            heads_per_task: int | None = None, delta_ppl: bool = False, store_url: str | None = None,
            tasks: Iterable[str] | str | None = None, task_limit: int | float | None = None,
            include_path: Any = None, device: str = "cpu", capture_only: bool = False) -> ExplainResult:
    """Run the whole pipeline and write OUT/programs.json, OUT/sweep.png and OUT/report.html.

    ``searchers``: registered searcher names (``headsurgeon.synth.search.searchers()``), run in order;
    ``library``: programs that compete for every head (run last, as the ``library`` searcher);
    ``agent_config``: the LLM agent's ``AgentConfig``.
    Search and selection run per head, journaled in OUT/heads so a killed run resumes (headsurgeon/scaleout/):
    ``executor="ray"`` runs them on Ray (``address``: a running cluster, None: a local runtime; ``store_url``: where
    workers read OUT/store when not at the same path); ``delta_ppl``: also each head's ΔPPL on ``test``.
    ``tasks``: lm-eval tasks (``task_limit`` examples each, local task folders in ``include_path``) scored on the
    base and the hybrid of all replacements, shown in report.html (surgery/downstream.py).
    ``capture_only``: stop once OUT/store is complete (e.g. on the GPU box); the same call without it later
    (e.g. with ``executor="ray"`` on the cluster) finds the store complete and goes on from there.
    """
    from headsurgeon.report import write_report

    preflight(executor, address, heads_per_task)
    searchers = list(searchers)
    if "llm" in searchers:  # a dead endpoint fails here in seconds, not after capture (synth/search/llm/endpoint.py)
        from headsurgeon.synth.search.llm import check_endpoint

        check_endpoint(agent_config)
    if tasks:  # before minutes of capture and search: lm-eval must be installed and the model scorable
        from headsurgeon.surgery.downstream import check_tasks, downstream
        from headsurgeon.surgery.lm_eval_model import HeadsurgeonLM  # noqa: F401 - a clear ImportError without lm-eval
        from headsurgeon.surgery.scorable import require_lm_head

        tasks = [t.strip() for t in tasks.split(",") if t.strip()] if isinstance(tasks, str) else list(tasks)
        check_tasks(tasks, include_path)  # the task names too, not only after the whole search
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"the output folder {out} is a file; pass a new or existing folder as OUT")
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    notes: list[str] = []
    t0 = time.perf_counter()
    handle = load_model(model, tokenizer=tokenizer, device=device)
    if tasks:
        require_lm_head(handle)
    if corpus is None:
        from headsurgeon.hub.zoo import demo_corpus_path

        corpus = demo_corpus_path()
    splits = load_corpus(handle, corpus, max_len=max_len, max_sequences=max_sequences, fractions=fractions, seed=seed)
    if not (splits.synth and splits.select and splits.test):
        raise InputError(f"the corpus split is too small ({splits.sizes()}): give more documents")
    sequences, idx = splits.all, splits.indices
    timings["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store = capture(handle, sequences, out=out / "store", progress=progress)
    timings["capture"] = time.perf_counter() - t0
    if capture_only:
        return ExplainResult(ProgramSet(model=handle.name), [], out, store, splits, timings, notes)
    library, searchers = list(library), list(searchers)
    names = searchers + (["library"] if library and "library" not in searchers else [])
    vocab = None
    try:  # programs are rendered (and budgets counted) in the tokenizer's token strings
        vocab = Vocabulary.from_tokenizer(handle.tokenizer)
    except Exception as e:  # a tokenizer without an id → token table: programs show ids instead
        notes.append(f"no vocabulary from the tokenizer ({type(e).__name__}: {e}); programs are shown with token ids")
    heads = explain_store(store, handle, idx, names, options={"llm": agent_config, "library": library}, seed=seed,
                          vocab=vocab, out=out, executor=executor, address=address, heads_per_task=heads_per_task,
                          delta_ppl=delta_ppl, model_spec=model, tokenizer=tokenizer, store_url=store_url,
                          progress=progress)
    programs = heads.programs
    timings.update(heads.timings)
    notes.extend(heads.notes)
    t0 = time.perf_counter()
    programs.meta.update({"corpus": str(corpus) if not isinstance(corpus, list) else "<list>", "max_len": max_len,
                          "splits": splits.sizes(), "seed": seed})
    programs.save(out / "programs.json")
    timings["save"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sweep = replacement_sweep(handle, programs, splits.test, order=programs.ranked("select"), steps=sweep_steps,
                              seed=seed, out_png=out / "sweep.png", progress=progress,
                              title=f"{handle.name}: heads replaced in order of select IoU")
    timings["sweep"] = time.perf_counter() - t0
    tasks_result = None
    if tasks:
        t0 = time.perf_counter()
        tasks_result = downstream(handle, tasks, programs, limit=task_limit, include_path=include_path, seed=seed)
        timings["downstream"] = time.perf_counter() - t0
    write_report(out / "report.html", programs, store, idx["test"], out / "sweep.png", sweep,
                 title=f"headsurgeon: {handle.name}", timings=timings, notes=notes, vocab=vocab,
                 select_idx=idx["select"], downstream=tasks_result)
    summary = {"summary": programs.summary("test"), "sweep": sweep, "timings_s": timings, "notes": notes}
    if tasks_result is not None:
        summary["downstream"] = tasks_result
    if delta_ppl:
        summary["delta_ppl"] = {head_label(h): d for h, d in heads.delta_ppl.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return ExplainResult(programs, sweep, out, store, splits, timings, notes, heads.delta_ppl)
