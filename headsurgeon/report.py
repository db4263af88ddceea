"""report.html: per head the program, its IoU/JSD per split and real-vs-program heatmaps on test sequences,
the replacement-sweep plot, and a table sorted by test IoU. One self-contained file (images inlined)."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import numpy as np

from headsurgeon.synth.programset import ProgramSet, head_label


CELL = 9  # pixels per attention cell


def _png_uri(matrix: np.ndarray) -> str:
    """A viridis heatmap PNG (one CELL×CELL block per entry) as a data URI; no axes, so it is fast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    big = np.kron(np.clip(matrix, 0, 1), np.ones((CELL, CELL), dtype=np.float32))
    buf = io.BytesIO()
    mpimg.imsave(buf, big, cmap="viridis", vmin=0.0, vmax=1.0, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _clean(token: str) -> str:
    return token.replace("\u2581", "_").replace("\u0120", "_").replace("\u010a", "\\n")[:10]


def heatmap(matrix: np.ndarray, tokens: list[str], caption: str) -> str:
    """One labelled heatmap: query tokens down the left, key tokens along the bottom."""
    labels = [html.escape(_clean(t)) for t in tokens]
    rows = "".join(f"<span>{t}</span>" for t in labels)
    return (f"<figure class='map'><figcaption>{html.escape(caption)}</figcaption><div class='grid'>"
            f"<div class='ylab'>{rows}</div><img class='heatmap' alt='{html.escape(caption)}' "
            f"src='{_png_uri(matrix)}'><div></div><div class='xlab'>{rows}</div></div></figure>")


def heatmap_pair(real: np.ndarray, program: np.ndarray, tokens: list[str], title: str) -> str:
    """Real and program attention side by side, with token labels."""
    return (f"<div class='pair'>{heatmap(real, tokens, f'{title} real')}"
            f"{heatmap(program, tokens, f'{title} program')}</div>")


def _fmt(x: Any, f: str = ".3f") -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, f)


def write_report(out: str | Path, programs: ProgramSet, store: Any, test_idx: list[int],
                 sweep_png: str | Path | None = None, sweep_rows: list[dict] | None = None,
                 title: str = "headsurgeon report", examples: int = 2, max_tokens: int = 40,
                 summary: dict | None = None) -> Path:
    """Write the self-contained HTML report; returns its path."""
    out = Path(out)
    ranked = programs.ranked("test")
    rows = []
    for h in ranked:
        e = programs.entries[h]
        cells = "".join(f"<td>{_fmt(e.scores.get(s, {}).get(m))}</td>" for s in ("synth", "select", "test")
                        for m in ("iou", "jsd"))
        rows.append(f"<tr><td><a href='#{head_label(h)}'>{head_label(h)}</a></td>{cells}<td>{html.escape(e.source)}"
                    f"</td><td><code>{html.escape(e.program.text[:120])}</code></td></tr>")
    sections = []
    shown = test_idx[:examples]
    for h in ranked:
        e = programs.entries[h]
        figs = []
        if shown:
            seqs = [store.sequences[i] for i in shown]
            prog = e.program.evaluate(seqs, causal=store.causal)
            for k, i in enumerate(shown):
                s = store.sequences[i]
                n = min(s.n, max_tokens)
                real = store.pattern(i, *h)[:n, :n]
                figs.append(heatmap_pair(real, prog[k, :n, :n], s.tokens[:n], f"{head_label(h)} · test sequence {i} ·"))
        scores = " · ".join(f"{s}: IoU {_fmt(e.scores.get(s, {}).get('iou'))}, JSD {_fmt(e.scores.get(s, {}).get('jsd'))}"
                            for s in ("synth", "select", "test") if s in e.scores)
        hyp = f"<p class='hyp'>{html.escape(e.hypothesis)}</p>" if e.hypothesis else ""
        body = (e.program.text if e.program.kind == "dsl" else e.program.text)
        sections.append(f"<section class='head' id='{head_label(h)}'><h3>{head_label(h)} "
                        f"<small>({html.escape(e.source)})</small></h3><pre>{html.escape(body)}</pre>{hyp}"
                        f"<p>{scores}</p>{''.join(figs)}</section>")
    sweep_html = ""
    if sweep_png is not None and Path(sweep_png).exists():
        uri = "data:image/png;base64," + base64.b64encode(Path(sweep_png).read_bytes()).decode()
        sweep_html = f"<h2>Replacement sweep</h2><img id='sweep' alt='replacement sweep' src='{uri}'>"
    if sweep_rows:
        trs = "".join(f"<tr><td>{r['fraction']:.0%}</td><td>{r['n_heads']}</td><td>{100 * r['delta']:+.2f}%</td>"
                      f"<td>{100 * r['delta_random_order']:+.2f}%</td><td>{100 * r['delta_random_program']:+.2f}%</td></tr>"
                      for r in sweep_rows)
        sweep_html += ("<table class='sweep'><tr><th>replaced</th><th>heads</th><th>ΔPPL (IoU order)</th>"
                       f"<th>random order</th><th>random programs</th></tr>{trs}</table>")
    stats = programs.summary("test")
    summary_html = "".join(f"<li>{html.escape(str(k))}: {html.escape(_fmt(v) if isinstance(v, float) else str(v))}</li>"
                           for k, v in {**stats, **(summary or {})}.items())
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; font-size: 13px; }}
th {{ background: #f0f0f0; }} code, pre {{ font-size: 12px; }} pre {{ background: #f7f7f7; padding: 6px; overflow-x: auto; }}
section.head {{ border-top: 1px solid #ddd; margin-top: 1.5em; }} .pair {{ display: flex; gap: 24px; flex-wrap: wrap; }}
figure.map {{ margin: 4px; }} figcaption {{ font-size: 12px; color: #555; }}
.grid {{ display: grid; grid-template-columns: auto auto; align-items: start; }}
.ylab {{ display: flex; flex-direction: column; text-align: right; padding-right: 3px; }}
.ylab span {{ height: {CELL}px; line-height: {CELL}px; font-size: 7px; font-family: monospace; }}
.xlab {{ display: flex; flex-direction: row; }}
.xlab span {{ width: {CELL}px; writing-mode: vertical-rl; font-size: 7px; font-family: monospace; }}
.heatmap {{ image-rendering: pixelated; display: block; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Programs selected by soft IoU on <b>select</b>, reported on <b>test</b> (disjoint documents).</p>
<ul id="summary">{summary_html}</ul>
{sweep_html}
<h2>Heads by test IoU</h2>
<table id="heads"><tr><th>head</th><th>IoU synth</th><th>JSD synth</th><th>IoU select</th><th>JSD select</th>
<th>IoU test</th><th>JSD test</th><th>source</th><th>program</th></tr>{''.join(rows)}</table>
<h2>Per head: real vs program attention on test sequences</h2>
{''.join(sections)}
</body></html>"""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc, encoding="utf-8")
    return out
