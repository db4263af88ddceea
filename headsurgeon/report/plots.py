"""Compact pictures for report.html: heatmaps as native-resolution PNGs with HTML token labels, CSS colour
bars, and the frontier as inline SVG (a few kilobytes per head)."""
from __future__ import annotations

import base64
import html
import io
import math
from functools import lru_cache
from typing import Sequence

import numpy as np

CELL = 10  # CSS pixels per attention cell (the PNG holds one pixel per cell and is scaled up, pixelated)
SEQUENTIAL = "viridis"
DIVERGING = "RdBu_r"


def png_uri(matrix: np.ndarray, cmap: str, vmin: float, vmax: float) -> str:
    """A PNG with one pixel per cell as a data URI (scaled up by the browser)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    buf = io.BytesIO()
    mpimg.imsave(buf, np.asarray(matrix, dtype=np.float32), cmap=cmap, vmin=vmin, vmax=vmax, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@lru_cache(maxsize=4)
def gradient(cmap: str, stops: int = 11) -> str:
    """A CSS linear-gradient that reproduces a matplotlib colormap (for colour bars)."""
    import matplotlib

    cm = matplotlib.colormaps[cmap]
    cols = []
    for i in range(stops):
        r, g, b, _ = cm(i / (stops - 1))
        cols.append(f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}")
    return "linear-gradient(to right, " + ", ".join(cols) + ")"


def token_label(token: str, width: int = 8) -> str:
    """A token as a short axis label: word-start marks as "_", newlines as "↵", long tokens ended with "…"."""
    t = token.replace("\u2581", "_").replace("\u0120", "_").replace("\u010a", "↵").replace("\n", "↵")
    t = t.replace("\t", "→") or "∅"
    return t if len(t) <= width else t[: width - 1] + "…"


def labels(tokens: Sequence[str]) -> str:
    """One span per token; a shortened token carries the full one as a tooltip."""
    out = []
    for t in tokens:
        shown = token_label(t)
        tip = f" title='{html.escape(t, quote=True)}'" if shown.endswith("…") else ""
        out.append(f"<span{tip}>{html.escape(shown)}</span>")
    return "".join(out)


def heatmap(matrix: np.ndarray, tokens: Sequence[str], caption: str, *, cmap: str = SEQUENTIAL,
            vmin: float = 0.0, vmax: float = 1.0) -> str:
    """One labelled heatmap: query tokens down the left, key tokens along the bottom, colour bar beneath."""
    n = len(tokens)
    side = n * CELL
    low = f"{vmin:+.2f}" if vmin < 0 else f"{vmin:.2f}"
    high = f"{vmax:+.2f}" if vmin < 0 else f"{vmax:.2f}"
    lab = labels(tokens)
    return (f"<figure class='map'><figcaption>{html.escape(caption)}</figcaption><div class='grid'>"
            f"<div class='ylab'>{lab}</div>"
            f"<img class='heatmap' width='{side}' height='{side}' alt='{html.escape(caption, quote=True)}' "
            f"src='{png_uri(matrix, cmap, vmin, vmax)}'>"
            f"<div class='corner'>query ↓ key →</div><div class='xlab'>{lab}</div></div>"
            f"<div class='cbar' style='width:{side}px'><span>{low}</span>"
            f"<i class='cb-{'div' if vmin < 0 else 'seq'}'></i><span>{high}</span></div></figure>")


def colour_css() -> str:
    """CSS classes for the two colour bars (sequential attention, diverging difference)."""
    return (f".cb-seq {{ background: {gradient(SEQUENTIAL)}; }}\n"
            f".cb-div {{ background: {gradient(DIVERGING)}; }}\n")


def short(n: int) -> str:
    """1000 → "1k", 100000 → "100k", 10**6 → "1M"."""
    for unit, div in (("M", 10 ** 6), ("k", 1000)):
        if n >= div:
            return f"{n // div}{unit}"
    return str(n)


def frontier_svg(points: list[tuple[int, float, str, bool]], baseline: float | None = None,
                 width: int = 230, height: int = 140) -> str:
    """Test IoU against size (log scale), one point per budget: (size, iou, label, is_explanation)."""
    pts = [(s, y, lab, ex) for s, y, lab, ex in points if s and y is not None and not math.isnan(y)]
    if not pts:
        return "<p class='small'>no frontier scores</p>"
    left, right, top, bottom = 34, 10, 10, 28
    lo = math.log10(max(1, min(s for s, *_ in pts)))
    hi = math.log10(max(s for s, *_ in pts))
    lo, hi = math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)

    def x(size: float) -> float:
        return left + (math.log10(max(size, 1)) - lo) / (hi - lo) * (width - left - right)

    def y(iou: float) -> float:
        return top + (1 - min(max(iou, 0.0), 1.0)) * (height - top - bottom)

    parts = [f"<svg class='frontier' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' role='img' aria-label='test IoU against program size'>",
             f"<rect x='{left}' y='{top}' width='{width - left - right}' height='{height - top - bottom}' "
             "fill='none' stroke='#bbb'/>"]
    for v in (0.0, 0.5, 1.0):
        parts.append(f"<text x='{left - 4}' y='{y(v) + 3:.1f}' text-anchor='end'>{v:.1f}</text>")
    for e in range(lo, hi + 1):
        parts.append(f"<text x='{x(10 ** e):.1f}' y='{height - bottom + 11}' text-anchor='middle'>"
                     f"{short(10 ** e)}</text>")
    parts.append(f"<text x='{(left + width - right) / 2:.0f}' y='{height - 3}' text-anchor='middle'>"
                 "size (AST nodes + literals)</text>")
    parts.append(f"<text transform='translate(9 {(top + height - bottom) / 2:.0f}) rotate(-90)' "
                 "text-anchor='middle'>test IoU</text>")
    if baseline is not None and not math.isnan(baseline):
        parts.append(f"<line x1='{left}' x2='{width - right}' y1='{y(baseline):.1f}' y2='{y(baseline):.1f}' "
                     "stroke='#999' stroke-dasharray='3 3'/>"
                     f"<text x='{width - right - 2}' y='{y(baseline) + 10:.1f}' text-anchor='end' fill='#777'>"
                     "best template</text>")
    ordered = sorted(pts)
    if len(ordered) > 1:
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v, *_ in ordered)
        parts.append(f"<polyline points='{path}' fill='none' stroke='#4a78b5'/>")
    for k, (s, v, lab, ex) in enumerate(ordered):
        colour = "#e07b00" if ex else "#4a78b5"
        dy = 11 if k % 2 == 0 else -5  # neighbouring labels alternate below and above their points
        parts.append(f"<circle cx='{x(s):.1f}' cy='{y(v):.1f}' r='{4 if ex else 3}' fill='{colour}'>"
                     f"<title>{html.escape(lab)}: size {s}, test IoU {v:.3f}</title></circle>"
                     f"<text x='{x(s) + 5:.1f}' y='{y(v) + dy:.1f}' fill='{colour}'>{html.escape(lab)}</text>")
    parts.append("</svg>")
    return "".join(parts)
