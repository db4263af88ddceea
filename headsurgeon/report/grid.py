"""The layer x head overview that report.html opens on: one cell per head, coloured by its test IoU's rank among the
heads (so the spread shows even when every IoU is between 0.4 and 1), named by its program's family (induction,
previous token, duplicate, sink, ...) with the share of the program on the first token in its tooltip, linked to the
head's section, with filters by family and by IoU, so a report of hundreds of heads (SmolLM2: 30 x 9) is read from
one screen."""
from __future__ import annotations

import html
from typing import Any

from headsurgeon.synth import dsl

from . import heads as hv
from . import words
from ..kernels.core import Head

#: family → the cell's short label
FAMILIES = {"induction": "ind", "previous token": "prev", "duplicate": "dup", "sink": "sink", "self": "self",
            "positional": "pos", "content": "cont", "syntax": "syn", "uniform": "unif", "python": "py", "other": "?"}
_PRIMS = {"induction": "induction", "first": "sink", "self": "self", "same_token": "duplicate",
          "same_token_recent": "duplicate", "window": "positional", "recent": "positional", "decay": "positional",
          "profile": "positional", "next": "positional", "uniform": "uniform", "key_in_set": "content",
          "key_weight": "content", "class_weight": "content", "match": "content",
          "same_word": "content", "same_lemma": "content", "dep_head": "syntax", "dep_children": "syntax"}


def _leaf_family(node: Any) -> str:
    """The family of one primitive: prev(1) and a distance profile peaked at offset 1 are the previous token."""
    if node.name == "prev":
        return "previous token" if node.param("k") == 1 else "positional"
    if node.name == "profile":
        w = list(node.param("w") or [])
        if len(w) > 1 and max(range(len(w)), key=lambda i: w[i]) == 1:
            return "previous token"
    return _PRIMS.get(node.name, "other")


def _is_sink(node: Any) -> bool:
    return isinstance(node, dsl.Prim) and node.name == "first"


def sink_share(program: Any) -> float:
    """The weight a program puts on the first token (the attention sink) at its top level: 1 for ``first()``, a
    mixture's ``first()`` weights over its total, else 0."""
    node = getattr(program, "node", None) if program is not None and program.has_tree else None
    if _is_sink(node):
        return 1.0
    if isinstance(node, (dsl.Mix, dsl.Sum)):
        total = sum(w for w, _ in node.terms)
        return sum(w for w, t in node.terms if _is_sink(t)) / total if total else 0.0
    return 0.0


def family(program: Any) -> str:
    """What a program does besides parking attention on the first token: a mixture's heaviest term other than the
    sink (a head that is 98% sink and 2% induction is an induction head; its sink share is shown beside it), a
    gate's ``then`` branch, a product's first factor, the argument of ``sharpen``; only-sink programs are "sink"."""
    if program is None:
        return "other"
    if not program.has_tree:
        return "python"
    node = program.node
    while not isinstance(node, dsl.Prim):
        if isinstance(node, (dsl.Mix, dsl.Sum)):
            terms = [t for t in node.terms if not _is_sink(t[1])] or node.terms
            node = max(terms, key=lambda t: t[0])[1]
        elif isinstance(node, dsl.Gate):
            node = node.then
        elif isinstance(node, dsl.Sharpen):
            node = node.arg
        elif isinstance(node, (dsl.Mul, dsl.Fallback)):
            node = node.args[0]
        else:
            return "other"
    return _leaf_family(node)


def _ranks(values: list[float | None]) -> list[float | None]:
    """Each value's rank among the known ones, 0 (lowest) to 1 (highest); None stays None."""
    known = sorted(v for v in values if v is not None and v == v)
    if not known:
        return [None] * len(values)
    span = max(len(known) - 1, 1)
    return [None if v is None or v != v else known.index(v) / span for v in values]


def _colour(rank: float | None) -> str:
    """A diverging scale over the rank: red (the worst heads) through white (the median) to green (the best)."""
    if rank is None:
        return "#e4e4e4"
    t = 2 * min(max(float(rank), 0.0), 1.0) - 1
    if t < 0:
        return f"rgb(255,{int(255 + 120 * t)},{int(255 + 120 * t)})"
    return f"rgb({int(255 - 155 * t)},{int(255 - 55 * t)},{int(255 - 155 * t)})"


def grid_html(views: list[hv.HeadView]) -> str:
    """The overview grid (rows: layers, columns: query heads) with its family and IoU filters."""
    by_head = {v.head: v for v in views}
    layers = sorted({h[0] for h in by_head})
    cols = sorted({h[1] for h in by_head})
    seen: dict[str, int] = {}
    shown_of = {h: v.explanation or v.replacement for h, v in by_head.items()}
    rank_of = dict(zip(shown_of, _ranks([s.iou() for s in shown_of.values()])))
    rows = []
    for layer in layers:
        cells = [f"<th>L{layer}</th>"]
        for col in cols:
            v = by_head.get((layer, col))
            if v is None:
                cells.append("<td></td>")
                continue
            shown = shown_of[(layer, col)]
            fam = family(shown.program)
            seen[fam] = seen.get(fam, 0) + 1
            iou = shown.iou()
            lab = Head.label(v.head)
            sink = sink_share(shown.program)
            tip = html.escape(f"{lab}: {fam}, {sink:.0%} of the program on the first token, test IoU "
                              f"{words.number(iou)} — {shown.gloss or shown.text}"[:300], quote=True)
            cells.append(f"<td class='cell' data-family='{fam}' data-iou='{words.number(iou)}' "
                         f"style='background:{_colour(rank_of[(layer, col)])}' title='{tip}'>"
                         f"<a href='#{lab}'>{FAMILIES[fam]}</a></td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head_row = "<tr><th></th>" + "".join(f"<th>H{c}</th>" for c in cols) + "</tr>"
    options = "".join(f"<option value='{html.escape(f)}'>{html.escape(f)} ({n})</option>"
                      for f, n in sorted(seen.items(), key=lambda kv: -kv[1]))
    legend = ", ".join(f"<b>{FAMILIES[f]}</b> {html.escape(f)}" for f in seen)
    return (f"<div id='grid-filters' class='small'>family <select id='family-filter'><option value=''>all</option>"
            f"{options}</select> test IoU at least <input id='iou-filter' type='number' min='0' max='1' step='0.05' "
            f"value='0'> <span id='grid-count'></span></div>"
            f"<table id='grid' class='grid-table'>{head_row}{''.join(rows)}</table>"
            f"<p class='small'>Cells: the explanation (else the replacement), coloured by the rank of its test IoU among "
            f"these heads (red the lowest, white the median, green the highest), labelled by what it does besides the "
            f"first-token sink: {legend}. Hover for the sink's share, click for the head's section.</p>")


GRID_STYLE = """
table.grid-table td.cell { padding: 0 3px; font-size: 11px; text-align: center; min-width: 2.6em; }
table.grid-table td.cell a { color: #222; text-decoration: none; display: block; }
table.grid-table td.cell.off { opacity: .15; } section.head.off { display: none; }
"""

#: hides cells and sections that do not pass the filters (the page works without it: everything is shown)
GRID_SCRIPT = """<script>
(function () {
  var fam = document.getElementById('family-filter'), low = document.getElementById('iou-filter');
  function apply() {
    var f = fam.value, m = parseFloat(low.value) || 0, shown = 0;
    document.querySelectorAll('td.cell').forEach(function (c) {
      var ok = (!f || c.dataset.family === f) && (parseFloat(c.dataset.iou) || 0) >= m;
      c.classList.toggle('off', !ok);
      var s = document.getElementById(c.querySelector('a').getAttribute('href').slice(1));
      if (s) { s.classList.toggle('off', !ok); }
      if (ok) { shown++; }
    });
    document.getElementById('grid-count').textContent = shown + ' heads shown';
  }
  fam.addEventListener('change', apply); low.addEventListener('input', apply); apply();
})();
</script>"""
