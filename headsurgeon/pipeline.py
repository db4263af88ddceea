"""explain: capture → search (every requested searcher from the registry, then the user's library) → one selection
→ measurement of both kinds of program, as ``headsurgeon eval`` measures them → report (headsurgeon/explain_measure.py).

Writes OUT/programs.json (a ProgramSet), OUT/sweep.png, OUT/report.html and OUT/summary.json, and returns a summary.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from headsurgeon.scaleout import explain_store, preflight
from headsurgeon.surgery.patterns.capture import capture
from headsurgeon.surgery.corpus import check_corpus_source, load_corpus
from headsurgeon.surgery.measure.head_subset import check_subset, choose_heads
from headsurgeon.surgery.models.loading import load_model
from headsurgeon.surgery.threads import fit_threads
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.vocab import Vocabulary
from headsurgeon.synth.search.base import searchers as registered_searchers
from headsurgeon.synth.search.config import SEARCHERS  # noqa: F401 - the default searchers, importable here too
from .configs import ExplainConfig
from .explain_costs import format_costs
from .explain_measure import measure_and_report, sweep_rows
from .core import InputError
from .core import Head


@dataclass
class ExplainResult:
    """What explain produced: the program set, the sweep rows, the store, the measurement and where files went.

    ``evaluation``: the EvalReport of both kinds (headsurgeon/surgery/measure/eval_report.py; OUT/summary.json holds its JSON);
    ``sweep``: its sweep rows, replacements' then explanations', each labelled by kind under ``"which"``;
    ``timings``: seconds per phase, a nested phase as a dict whose ``"wall"`` is its wall time (the rest its
    parts), and ``"total"``, the run's wall time.
    """

    programs: ProgramSet
    sweep: list[dict]
    out: Path
    store: Any
    splits: Any
    timings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    delta_ppl: dict[tuple[int, int], float] = field(default_factory=dict)  # per head, when explain(delta_ppl=True)
    evaluation: Any = None  # EvalReport; None after capture_only
    head_costs: dict[str, Any] | None = None  # HeadCosts.to_json() on the select windows, when explain(head_costs=True)

    def summary_table(self) -> str:
        """Per head: the replacement's test IoU/JSD and size beside the explanation's IoU, chars and gloss."""
        nan = float("nan")
        lines = [f"{'head':<6} {'IoU test':>8} {'JSD test':>8} {'size':>6}  {'source':<11} "
                 f"{'expl IoU':>8} {'chars':>5}  explanation (gloss)"]
        for h in self.programs.ranked("test"):
            e = self.programs.entries[h]
            t = e.scores.get("test") or {}
            x = e.explanation
            shown = ((x.gloss or x.text) if x is not None else "(no program fits "
                     f"{self.programs.meta.get('readable_chars', 200)} characters)")
            lines.append(f"{Head.label(h):<6} {t.get('iou', nan):>8.3f} {t.get('jsd', nan):>8.3f} {e.size:>6}  "
                         f"{e.source:<11} {(x.iou('test') if x and x.iou('test') is not None else nan):>8.3f} "
                         f"{(x.chars if x else 0):>5}  {shown}")
        s = self.programs.summary("test")
        if "mean_iou" in s:
            lines.append(f"mean test IoU {s['mean_iou']:.3f}, median {s['median_iou']:.3f}, "
                         f"IoU>=0.9: {s['share_iou_ge_0.9']:.0%}, IoU>=0.7: {s['share_iou_ge_0.7']:.0%}")
        if "mean_vw_iou" in s:
            lines.append(f"mean test value-weighted IoU {s['mean_vw_iou']:.3f}, JSD {s.get('mean_vw_jsd', nan):.3f} "
                         f"(selected by {self.programs.meta.get('selected_by', 'iou')})")
        readable = [iou for x in (e.explanation for e in self.programs.entries.values())
                    if x is not None and (iou := x.iou("test")) is not None]
        if readable:
            lines.append(f"readable explanations: {len(readable)} of {len(self.programs)} heads, mean test IoU "
                         f"{sum(readable) / len(readable):.3f}")
        if self.evaluation is not None:  # both kinds: headline, per-head ΔPPL and Spearman when measured, sweep
            lines.append(self.evaluation.format())
        if isinstance(self.programs.meta.get("head_costs"), dict):  # explain(head_costs=True)
            lines.append(format_costs(self.programs.meta["head_costs"]))
        return "\n".join(lines)


def explain(model: Any = "tiny-stories", corpus: Any = None, out: str | Path = "headsurgeon-out",
            config: ExplainConfig | None = None, **settings: Any) -> ExplainResult:
    """Run the whole pipeline and write OUT/programs.json, OUT/sweep.png and OUT/report.html.

    ``config``: an :class:`ExplainConfig` (headsurgeon/configs.py), one config per stage. Or give its settings as
    keywords by name instead (not both): ``tokenizer``, ``device``, ``dtype`` (the model); ``max_len``,
    ``max_sequences``, ``fractions``, ``seed`` (also the searchers' and the sweep's), ``separator`` (the corpus);
    ``mode``, ``q_frac``, ``batch_size``, ``shard_size`` (capture); ``heads``, ``layers``, ``top``, ``by`` (which heads:
    every one by default, see headsurgeon/surgery/measure/head_subset.py); ``searchers`` (registered names, run in
    order), ``library`` (programs, DSL text or EAPS-style ``Path`` files that compete for every head),
    ``library_budget``, ``enumerative`` / ``learned`` / ``agent_config`` (each searcher's options); ``executor``,
    ``workers``, ``address``, ``heads_per_task``, ``store_url`` (scale-out); ``sweep_steps``, ``order``, ``delta_ppl``,
    ``cloze``, ``tasks``, ``task_limit``, ``include_path``, ``head_costs`` (measurement); ``progress``,
    ``capture_only``.
    Each field's help says what it does; ``headsurgeon explain --help`` lists them with their defaults.
    Search and selection run per head, journaled in OUT/heads so a killed run resumes (headsurgeon/scaleout/), on
    ``workers`` processes (None: every core this process may use; 1: this process); ``executor="ray"`` runs them on Ray (``address``: a running cluster, None: a local runtime).
    ``tasks``: lm-eval tasks scored on the base and the hybrid, shown in report.html (headsurgeon/surgery/measure/downstream.py).
    ``capture_only``: stop once OUT/store is complete (e.g. on the GPU box); the same call without it later
    (e.g. with ``executor="ray"`` on the cluster) finds the store complete and goes on from there.
    """
    cfg = ExplainConfig.resolve(config, settings)
    corpus_cfg, search, measure, progress = cfg.corpus, cfg.search, cfg.measure, cfg.progress
    preflight(cfg.scaleout)
    unknown = [name for name in search.searchers if name not in registered_searchers()]
    if unknown:  # before the model loads and the capture runs, not after
        raise InputError(f"unknown searcher {unknown[0]!r}; choose from {registered_searchers()}")
    check_corpus_source(corpus, corpus_cfg.separator)
    check_subset(cfg.subset)
    if "llm" in search.searchers:  # a dead endpoint fails here in seconds, not after capture (headsurgeon/synth/search/llm/endpoint.py)
        from headsurgeon.synth.search.llm import check_endpoint

        check_endpoint(search.agent_config)
    if measure.tasks or measure.cloze:  # before minutes of capture and search: lm-eval must be installed
        from headsurgeon.surgery.measure.downstream import check_tasks
        from headsurgeon.surgery.measure.lm_eval_model import HeadsurgeonLM  # noqa: F401 - a clear ImportError without lm-eval
        from headsurgeon.surgery.measure.scorable import require_lm_head

        measure = replace(measure, tasks=measure.task_names())
        if measure.tasks:
            check_tasks(measure.tasks, measure.include_path)  # the task names too, not only after the whole search
    library_notes: list[str] = []
    library = search.programs(library_notes)  # read and validated before the model loads (headsurgeon/synth/eaps.py)
    if library_notes and progress:
        print("\n".join(library_notes), file=sys.stderr)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"the output folder {out} is a file; pass a new or existing folder as OUT")
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    notes: list[str] = list(library_notes)
    t0 = time.perf_counter()
    handle = load_model(model, **asdict(cfg.model))
    if measure.tasks or measure.cloze:
        require_lm_head(handle)
    if corpus is None:
        from headsurgeon.hub.zoo import demo_corpus_path

        corpus = demo_corpus_path()
    splits = load_corpus(handle, corpus, config=corpus_cfg)
    splits.require("synth", "select", minimum=1)
    splits.require("test", *(("select",) if measure.head_costs else ()))  # intervals over windows need two
    subset = choose_heads(handle, cfg.subset)  # None: every head
    if subset is not None:
        notes.append(f"explained {len(subset)} of {handle.n_layers * handle.n_heads} heads "
                     f"({', '.join(map(str, subset[:12]))}{', ...' if len(subset) > 12 else ''}); the measurements "
                     "swap these heads only")
    timings["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    threads = {"capture": fit_threads()}  # headsurgeon/surgery/threads.py
    store = capture(handle, splits.all, out=out / "store", progress=progress, **asdict(cfg.capture))
    timings["capture"] = time.perf_counter() - t0
    if cfg.capture_only:
        return ExplainResult(ProgramSet(model=handle.name), [], out, store, splits, timings, notes)
    names = list(search.searchers) + (["library"] if library and "library" not in search.searchers else [])
    vocab = None
    try:  # programs are rendered (and budgets counted) in the tokenizer's token strings
        vocab = Vocabulary.from_tokenizer(handle.tokenizer)
    except Exception as e:  # a tokenizer without an id → token table: programs show ids instead
        notes.append(f"no vocabulary from the tokenizer ({type(e).__name__}: {e}); programs are shown with token ids")
    heads = explain_store(store, handle, splits.indices, names, options=search.options(library), seed=corpus_cfg.seed,
                          vocab=vocab, out=out, scaleout=cfg.scaleout, delta_ppl=measure.delta_ppl, model_spec=model,
                          tokenizer=cfg.model.tokenizer, progress=progress, heads=subset, select_by=search.select_by)
    programs = heads.programs
    timings.update(heads.timings)
    notes.extend(heads.notes)
    t0 = time.perf_counter()
    programs.meta.update({"corpus": str(corpus) if not isinstance(corpus, list) else "<list>",
                          "max_len": corpus_cfg.max_len, "splits": splits.sizes(), "split_tokens": splits.tokens(),
                          "seed": corpus_cfg.seed})
    programs.save(out / "programs.json")
    timings["save"] = time.perf_counter() - t0
    threads["measure"] = fit_threads()
    notes.append("torch threads: " + ", ".join(f"{stage} {n}" for stage, n in threads.items()))
    evaluation, timings, summary = measure_and_report(
        handle, programs, splits, store, out, measure, heads=heads, vocab=vocab, timings=timings, notes=notes,
        seed=corpus_cfg.seed, progress=progress)  # headsurgeon/explain_measure.py
    return ExplainResult(programs, sweep_rows(evaluation), out, store, splits, timings, notes, heads.delta_ppl,
                         evaluation, summary.get("head_costs"))
