"""The layer x head overview of report.html: one cell per head, coloured by test IoU, named by its program's family
(previous token, induction, first token, ...), linked to the head's section, with filters by family and by IoU, so a
report of hundreds of heads (SmolLM2: 30 x 9) is read from one screen."""
from __future__ import annotations

import html
from typing import Any

from headsurgeon.synth import dsl
from headsurgeon.synth.programset import head_label

from . import heads as hv
from . import words

#: family → the cell's short label
FAMILIES = {"previous token": "prev", "induction": "ind", "first token": "first", "same token": "same",
            "self": "self", "positional": "pos", "token-specific": "tok", "syntax": "syn", "uniform": "unif",
            "python": "py", "other": "?"}
_PRIMS = {"induction": "induction", "first": "first token", "self": "self", "same_token": "same token",
          "same_token_recent": "same token", "window": "positional", "recent": "positional", "decay": "positional",
          "profile": "positional", "next": "positional", "uniform": "uniform", "key_in_set": "token-specific",
          "key_weight": "token-specific", "class_weight": "token-specific", "match": "token-specific",
          "same_word": "token-specific", "same_lemma": "token-specific", "dep_head": "syntax", "dep_children": "syntax"}


def _leaf_family(node: Any) -> str:
    """The family of one primitive: prev(1) and a distance profile peaked at offset 1 are the previous token."""
    if node.name == "prev":
        return "previous token" if node.param("k") == 1 else "positional"
    if node.name == "profile":
        w = list(node.param("w") or [])
        if len(w) > 1 and max(range(len(w)), key=lambda i: w[i]) == 1:
            return "previous token"
    return _PRIMS.get(node.name, "other")


def family(program: Any) -> str:
    """What a program mostly does, by its dominant part: a mixture's heaviest term, a gate's ``then`` branch, a
    product's first factor, the argument of ``sharpen``."""
    if program is None:
        return "other"
    if not program.has_tree:
        return "python"
    node = program.node
    while not isinstance(node, dsl.Prim):
        if isinstance(node, (dsl.Mix, dsl.Sum)):
            node = max(node.terms, key=lambda t: t[0])[1]
        elif isinstance(node, dsl.Gate):
            node = node.then
        elif isinstance(node, dsl.Sharpen):
            node = node.arg
        elif isinstance(node, (dsl.Mul, dsl.Fallback)):
            node = node.args[0]
        else:
            return "other"
    return _leaf_family(node)


def _colour(iou: float | None) -> str:
    """White (IoU 0 or unknown) to green (IoU 1)."""
    if iou is None or iou != iou:
        return "#e4e4e4"
    t = min(max(float(iou), 0.0), 1.0)
    return f"rgb({int(255 - 155 * t)},{int(255 - 55 * t)},{int(255 - 155 * t)})"


def grid_html(views: list[hv.HeadView]) -> str:
    """The overview grid (rows: layers, columns: query heads) with its family and IoU filters."""
    by_head = {v.head: v for v in views}
    layers = sorted({h[0] for h in by_head})
    cols = sorted({h[1] for h in by_head})
    seen: dict[str, int] = {}
    rows = []
    for layer in layers:
        cells = [f"<th>L{layer}</th>"]
        for col in cols:
            v = by_head.get((layer, col))
            if v is None:
                cells.append("<td></td>")
                continue
            shown = v.explanation or v.replacement
            fam = family(shown.program)
            seen[fam] = seen.get(fam, 0) + 1
            iou = shown.iou()
            lab = head_label(v.head)
            tip = html.escape(f"{lab}: {fam}, test IoU {words.number(iou)} — {shown.gloss or shown.text}"[:300],
                              quote=True)
            cells.append(f"<td class='cell' data-family='{fam}' data-iou='{words.number(iou)}' "
                         f"style='background:{_colour(iou)}' title='{tip}'><a href='#{lab}'>{FAMILIES[fam]}</a></td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head_row = "<tr><th></th>" + "".join(f"<th>H{c}</th>" for c in cols) + "</tr>"
    options = "".join(f"<option value='{html.escape(f)}'>{html.escape(f)} ({n})</option>"
                      for f, n in sorted(seen.items(), key=lambda kv: -kv[1]))
    legend = ", ".join(f"<b>{FAMILIES[f]}</b> {html.escape(f)}" for f in seen)
    return (f"<div id='grid-filters' class='small'>family <select id='family-filter'><option value=''>all</option>"
            f"{options}</select> test IoU at least <input id='iou-filter' type='number' min='0' max='1' step='0.05' "
            f"value='0'> <span id='grid-count'></span></div>"
            f"<table id='grid' class='grid-table'>{head_row}{''.join(rows)}</table>"
            f"<p class='small'>Cells: the explanation (else the replacement), coloured by test IoU (white 0, green 1), "
            f"labelled by family: {legend}. Click a cell for its section.</p>")


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
