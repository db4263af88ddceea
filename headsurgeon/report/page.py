"""report.html itself: the summary in words, the metric paragraph, a trust-ordered table and one section per head."""
from __future__ import annotations

import base64
import html
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from headsurgeon.synth.program import READABLE_CHARS
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.splits import SplitsLike, StoreSplits

from . import heads as hv
from .candidates import CANDIDATES_STYLE, candidates_html
from .windows import WINDOWS_STYLE, add_windows, windows_html, windows_script
from .cost import cost_html
from .downstream import downstream_table
from .grid import GRID_SCRIPT, GRID_STYLE, grid_html
from . import words
from .plots import CELL, DIVERGING, colour_css, frontier_svg, heatmap
from ..core import Head
from ..core.vocabulary import TokenVocabulary

if TYPE_CHECKING:  # named for the checker: importing the searchers registers them all, the measurement loads torch
    from headsurgeon.synth.search.base import PatternReader
    from headsurgeon.surgery.measure.eval_report import EvalReport

#: a replacement's text is shown in full up to this many characters (fitted tables stay in programs.json)
SHOW_REPLACEMENT_CHARS = 1000
#: a replacement's gloss is quoted up to this many characters (a fitted table's gloss is a page long)
GLOSS_CHARS = 300

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: .6em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; font-size: 13px; }
th { background: #f0f0f0; text-align: left; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
p.metrics { max-width: 60em; line-height: 1.45; } .small { font-size: 12px; color: #555; }
section.head { border-top: 1px solid #ddd; margin-top: 1.4em; padding-top: .3em; }
section.head h3 { margin: .3em 0; } .gloss { font-size: 15px; margin: .2em 0 .4em; }
pre.program { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f6f6; padding: 6px; font-size: 12.5px;
  max-width: 62em; margin: .2em 0; }
.top { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
.top > div:first-child { flex: 1 1 30em; }
.badge { white-space: nowrap; font-size: 12px; padding: 1px 6px; border-radius: 8px; font-weight: normal; }
.high { background: #d8f0d8; } .mid { background: #f6ecc8; }
.low { background: #f6d8d0; } .none { background: #e4e4e4; }
.noexp { background: #fff4e0; border-left: 3px solid #e0a000; padding: 4px 8px; max-width: 62em; }
.maps { display: flex; gap: 18px; flex-wrap: wrap; } figure.map { margin: 4px 0; }
figcaption { font-size: 12px; color: #444; }
.grid { display: grid; grid-template-columns: auto auto; align-items: start; }
.ylab { display: flex; flex-direction: column; text-align: right; padding-right: 3px; }
.ylab span { height: %(cell)dpx; line-height: %(cell)dpx; font-size: 9px; font-family: monospace; white-space: pre; }
.xlab { display: flex; flex-direction: row; }
.xlab span { width: %(cell)dpx; line-height: %(cell)dpx; writing-mode: vertical-rl; font-size: 9px;
  font-family: monospace; white-space: pre; }
.corner { font-size: 8px; color: #888; text-align: right; padding-right: 3px; }
.heatmap { image-rendering: pixelated; display: block; }
.cbar { display: flex; align-items: center; gap: 3px; font-size: 9px; margin-left: auto; }
.cbar i { flex: 1; height: 7px; display: block; }
svg.frontier text { font-size: 9px; font-family: system-ui, sans-serif; }
""" % {"cell": CELL}


def _mean_median(values: list[float | None]) -> tuple[str, str, int]:
    got = [float(v) for v in values if v is not None]
    if not got:
        return "–", "–", 0
    return words.number(statistics.fmean(got)), words.number(statistics.median(got)), len(got)


def summary_html(views: list[hv.HeadView], programs: ProgramSet, timings: dict, notes: list, extra: dict,
                 sweep_rows: list[dict] | None) -> str:
    """The summary: heads, IoU of explanations / replacements / templates, sweep, timings, notes."""
    n = len(views)
    readable = sum(v.explanation is not None for v in views)
    model = f" of {html.escape(programs.model)}" if programs.model else ""
    windows = words.splits_sentence(programs.meta.get("splits"), programs.meta.get("split_tokens"))
    lines = [f"<p>{n} heads{model}; {readable} have a readable explanation (≤ {READABLE_CHARS} characters)"
             f"{'; ' + windows if windows else ''}.</p>"]
    rows = [("explanations (readable)", [v.explanation.iou() if v.explanation else None for v in views]),
            ("replacements (any size)", [v.replacement.iou() for v in views]),
            ("best single template", [v.template_iou for v in views])]
    body = "".join(f"<tr><td>{label}</td>" + "".join(f"<td class='num'>{c}</td>" for c in _mean_median(vals)) + "</tr>"
                   for label, vals in rows if any(x is not None for x in vals))
    lines.append("<table id='summary'><tr><th>programs</th><th>mean test IoU</th><th>median test IoU</th>"
                 f"<th>heads</th></tr>{body}</table>")
    if sweep_rows:
        title = ("Embedding distance" if sweep_rows and "embedding_distance" in sweep_rows[0] else "Perplexity")
        lines.append(f"<h3>{title} with heads replaced (test windows)</h3>" + words.sweep_table(sweep_rows))
    if timings:
        lines.append(f"<p class='timings'>Time: {words.timings_sentence(timings)}.</p>")
    for key, value in extra.items():
        lines.append(f"<p>{html.escape(str(key).replace('_', ' '))}: {html.escape(words.plain(value))}.</p>")
    if notes:
        lines.append("<h3>Notes</h3>" + words.notes_list(notes))
    return "".join(lines)


def overview_table(views: list[hv.HeadView]) -> str:
    """One row per head in trust order: gloss, explanation IoU, best template, replacement size and IoU."""
    rows = []
    for rank, v in enumerate(views, 1):
        lab = Head.label(v.head)
        ex = v.explanation
        verdict, cls = words.trust_words(ex.iou() if ex else None)
        gloss = html.escape(ex.gloss if ex and ex.gloss else (ex.text if ex else "—"))
        tmpl = f"{words.number(v.template_iou)} {html.escape(v.template or '')}" if v.template else "–"
        rows.append(f"<tr><td class='num'>{rank}</td><td><a href='#{lab}'>{lab}</a></td><td>{gloss}</td>"
                    f"<td class='num'>{words.number(ex.iou() if ex else None)}</td><td class='num'>{tmpl}</td>"
                    f"<td class='num'>{words.gain(ex.iou() if ex else None, v.template_iou)}</td>"
                    f"<td class='num'>{words.number(v.replacement.iou())}</td>"
                    f"<td class='num'>{v.replacement.size if v.replacement.size is not None else '–'}</td>"
                    f"<td><span class='badge {cls}'>{html.escape(verdict)}</span></td></tr>")
    return ("<table id='heads'><tr><th>#</th><th>head</th><th>what it does (explanation's gloss)</th>"
            "<th>explanation IoU</th><th>best template IoU</th><th>gain</th><th>replacement IoU</th>"
            "<th>replacement size</th>"
            f"<th>trust</th></tr>{''.join(rows)}</table>")


def program_block(label: str, s: ScoredProgram) -> str:
    """A program's facts in one line and its full text, wrapped."""
    facts = (f"size {s.size if s.size is not None else '–'}, {s.chars if s.chars is not None else '–'} characters, "
             f"test IoU {words.number(s.iou())}, JSD {words.number(s.jsd())}"
             + (f", from {html.escape(s.source)}" if s.source else ""))
    return f"<p class='small'><b>{label}</b>: {facts}</p><pre class='program'>{html.escape(s.text)}</pre>"


def head_section(v: hv.HeadView, rank: int, maps: dict[str, np.ndarray] | None, tokens: list[str], window: str) -> str:
    """One head: verdict, gloss, explanation text, replacement facts, frontier plot and heatmaps."""
    lab = Head.label(v.head)
    ex, rep = v.explanation, v.replacement
    verdict, cls = words.trust_words(ex.iou() if ex else None)
    parts = [f"<section class='head' id='{lab}'><h3>{rank}. {lab} <span class='badge {cls}'>{html.escape(verdict)}"
             "</span></h3>"]
    left = []
    if ex is not None:
        left.append(f"<p class='gloss'>{html.escape(ex.gloss or 'no gloss for this program')}</p>")
        left.append(program_block("explanation", ex))
    else:
        left.append(f"<p class='noexp'>No readable explanation: no program of ≤ {READABLE_CHARS} characters "
                    "was chosen for this head, so only the replacement below describes it. "
                    + (f"Its gloss: {html.escape(rep.gloss)}" if rep.gloss and len(rep.gloss) <= GLOSS_CHARS else "")
                    + "</p>")
    if v.template:
        left.append(f"<p class='small'>best single template: <code>{html.escape(v.template)}</code>, "
                    f"test IoU {words.number(v.template_iou)}</p>")
    if v.same():
        left.append("<p class='small'><b>replacement</b>: the explanation itself (no larger program fits better)</p>")
    elif rep.chars is not None and rep.chars <= SHOW_REPLACEMENT_CHARS:
        left.append(program_block("replacement", rep))
    else:
        left.append(f"<p class='small'><b>replacement</b>: size {rep.size}, {rep.chars:,} characters (in "
                    f"programs.json), test IoU {words.number(rep.iou())}, JSD {words.number(rep.jsd())}"
                    + (f", from {html.escape(rep.source)}" if rep.source else "")
                    + (f"; it {html.escape(rep.gloss[0].lower() + rep.gloss[1:])}"
                       if rep.gloss and len(rep.gloss) <= GLOSS_CHARS else "") + "</p>")
    if v.hypothesis:
        left.append(f"<p class='small'>searcher's hypothesis: {html.escape(v.hypothesis)}</p>")
    plot = frontier_svg(hv.frontier_points(v), v.template_iou)
    parts.append(f"<div class='top'><div>{''.join(left)}</div><div><div class='small'>frontier: test IoU by size "
                 f"budget</div>{plot}</div></div>")
    parts.append(candidates_html(v))
    if maps:
        parts.append(heatmaps(maps, tokens, window, v.same()))
    parts.append(windows_html(v.windows))
    parts.append("</section>")
    return "".join(parts)


def heatmaps(maps: dict[str, np.ndarray], tokens: list[str], window: str, same: bool = False) -> str:
    """Real, explanation and replacement on one colour scale, and a difference map on a diverging scale."""
    top = max(float(m.max()) for m in maps.values() if m.size) or 1.0
    names = {"real": "real attention", "explanation": "explanation = replacement" if same else "explanation",
             "replacement": "replacement"}
    figs = [heatmap(m, tokens, f"{names.get(name, name)} · {window}", vmax=top) for name, m in maps.items()]
    other = "explanation" if "explanation" in maps else "replacement" if "replacement" in maps else None
    if other is not None:
        diff = maps[other] - maps["real"]
        lim = max(float(np.abs(diff).max()), 1e-3)
        figs.append(heatmap(diff, tokens, f"{other} − real (red: the program attends more)", cmap=DIVERGING,
                            vmin=-lim, vmax=lim))
    return f"<div class='maps'>{''.join(figs)}</div>"


def write_report(out: str | Path, programs: ProgramSet, store: PatternReader, splits: SplitsLike,
                 sweep_png: str | Path | None = None, sweep_rows: list[dict] | None = None,
                 title: str = "headsurgeon report", examples: int = 1, max_tokens: int = 24,
                 summary: dict | None = None, *, timings: dict[str, float] | None = None,
                 notes: list[str] | None = None, vocab: TokenVocabulary | None = None, downstream: dict | None = None,
                 evaluation: EvalReport | None = None) -> Path:
    """Write the self-contained HTML report (images inlined) and return its path.

    ``splits``: the store's windows by split (a StoreSplits, headsurgeon/synth/splits.py, a corpus Splits or a mapping
    of split name → store indices): windows are shown from test, templates are chosen on select (on test when
    select is empty) and reported on test.
    ``summary``: extra facts shown in words (its "timings_s"/"timings" and "notes" keys are read as
    ``timings`` and ``notes``); ``vocab``: the tokenizer's ``Vocabulary`` (headsurgeon/synth/vocab.py), to render token ids
    as strings where a stored text is missing or cut (ignored, with a note, when its fingerprint is not the set's);
    ``downstream``: ``hs.downstream``'s
    result, shown as a table of task scores; ``evaluation``: an EvalReport (headsurgeon/surgery/measure/eval_report.py) of both kinds,
    shown as the cost section (report/cost.py) in place of ``sweep_rows`` and ``downstream``.
    ``examples`` is kept for callers; one example window is shown.
    """
    out = Path(out)
    extra = dict(summary or {})
    given = [extra.pop(k, None) for k in ("timings_s", "timings")]
    timings = dict(timings or given[0] or given[1] or {})
    notes = list(notes or extra.pop("notes", None) or [])
    extra.pop("notes", None)
    fingerprint = getattr(programs, "vocab_fingerprint", None)
    if vocab is not None and fingerprint and getattr(vocab, "fingerprint", fingerprint) != fingerprint:
        notes.append("The vocabulary given to the report is not the programs' tokenizer; programs are shown as "
                     "they were stored.")
        vocab = None
    splits = StoreSplits.of(splits)
    test_idx = splits["test"]
    views = hv.views(programs, vocab)
    hv.add_templates(views, store, splits)
    views.sort(key=hv.HeadView.trust_key)
    add_windows(views, store, test_idx, max_tokens)
    index = hv.example_window(store, test_idx, max_tokens) if examples else None
    tokens: list[str] = []
    window = ""
    if index is not None:
        seq = store.sequences[index]
        n = min(seq.n, max_tokens)
        tokens = list(seq.tokens[:n])
        window = f"test window {index}" + (f", first {n} of {seq.n} tokens" if n < seq.n else "")
    cache: dict[str, np.ndarray] = {}
    sections = [head_section(v, r, hv.patterns(v, store, index, len(tokens), cache) if index is not None else None,
                             tokens, window) for r, v in enumerate(views, 1)]
    sweep_img = ""
    if sweep_png is not None and Path(sweep_png).exists():
        uri = "data:image/png;base64," + base64.b64encode(Path(sweep_png).read_bytes()).decode()
        sweep_img = f"<img id='sweep' alt='the cost as heads are replaced' src='{uri}' style='max-width:640px'>"
    doc = (f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{STYLE}{GRID_STYLE}{WINDOWS_STYLE}{CANDIDATES_STYLE}{colour_css()}</style></head><body>\n"
           f"<h1>{html.escape(title)}</h1>\n<h2>Heads by layer</h2>\n{grid_html(views, programs.meta.get('head_costs'))}\n"
           f"<p class='metrics' id='metrics'>{words.METRICS_PARAGRAPH}</p>\n<h2>Summary</h2>\n"
           f"{summary_html(views, programs, timings, notes, extra, sweep_rows)}"
           + (f"\n<h2>What swapping the programs in costs</h2>\n{cost_html(evaluation, sweep_img)}\n"
              if evaluation is not None else f"{sweep_img}\n"
              + (f"<h2>Downstream tasks</h2>\n{downstream_table(downstream)}\n" if downstream else "")) +
           "<h2>Heads, most trustworthy first</h2>\n<p class='small'>Ordered by the explanation's test IoU; heads "
           "without a readable explanation come last.</p>\n"
           f"{overview_table(views)}\n<h2>Per head</h2>\n{''.join(sections)}\n{GRID_SCRIPT}\n"
           f"{windows_script([v.windows for v in views], store)}\n</body></html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc, encoding="utf-8")
    return out
