"""The layer x head overview that report.html opens on: one cell per head, coloured by its test IoU's rank among the
heads (so the spread shows even when every IoU is between 0.4 and 1), named by its program's family (induction,
previous token, duplicate, sink, ...) with the share of the program on the first token in its tooltip, linked to the
head's section, with filters by family and by IoU, so a report of hundreds of heads (SmolLM2: 30 x 9) is read from
one screen. When explain measured each head's causal cost (``head_costs``), a switch recolours it by the rank of
that cost (KL when the head alone is swapped) or of its ratio to mean-ablating the head."""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

from headsurgeon.synth import dsl

from . import heads as hv
from . import words
from ..core import Head

if TYPE_CHECKING:
    from ..synth.program import Program

#: family → the cell's short label
FAMILIES = {"induction": "ind", "previous token": "prev", "duplicate": "dup", "sink": "sink", "self": "self",
            "positional": "pos", "content": "cont", "syntax": "syn", "uniform": "unif", "python": "py", "other": "?"}
_PRIMS = {"induction": "induction", "ngram_induction": "induction", "first": "sink", "self": "self",
          "same_token": "duplicate", "same_token_recent": "duplicate", "window": "positional", "recent": "positional",
          "decay": "positional",
          "profile": "positional", "next": "positional", "uniform": "uniform", "key_in_set": "content",
          "key_weight": "content", "class_weight": "content", "match": "content",
          "same_word": "content", "same_lemma": "content", "dep_head": "syntax", "dep_children": "syntax"}


def _leaf_family(node: dsl.Prim) -> str:
    """The family of one primitive: prev(1) and a distance profile peaked at offset 1 are the previous token."""
    if node.name == "prev":
        return "previous token" if node.param("k") == 1 else "positional"
    if node.name == "profile":
        w = list(node.param("w") or [])
        if len(w) > 1 and max(range(len(w)), key=lambda i: w[i]) == 1:
            return "previous token"
    return _PRIMS.get(node.name, "other")


def _is_sink(node: object) -> bool:
    return isinstance(node, dsl.Prim) and node.name == "first"


def sink_share(program: Program | None) -> float:
    """The weight a program puts on the first token (the attention sink) at its top level: 1 for ``first()``, a
    mixture's ``first()`` weights over its total, else 0."""
    node = getattr(program, "node", None) if program is not None and program.has_tree else None
    if _is_sink(node):
        return 1.0
    if isinstance(node, (dsl.Mix, dsl.Sum)):
        total = sum(w for w, _ in node.terms)
        return sum(w for w, t in node.terms if _is_sink(t)) / total if total else 0.0
    return 0.0


def family(program: Program | None) -> str:
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


#: the grid's colourings: the view's name → what its colour ranks (report/grid.py GRID_SCRIPT switches among them)
VIEWS = {"fidelity": "the rank of its test IoU among these heads (red the lowest, white the median, green the highest)",
         "kl": "the rank of its causal cost among these heads: KL(base ‖ swapped) per predicted token when the head "
               "alone is swapped for this program, on the select windows (green the cheapest, red the costliest)",
         "ratio": "the rank of its KL over the KL of mean-ablating the head (green: the program keeps the most of "
                  "what the head does; below 1 it explains more than deleting the head)"}


def _cost(costs: dict | None, head: tuple[int, int], kind: str) -> dict:
    """The compact cost record of one head's ``kind`` (headsurgeon/explain_costs.py), or {} when not measured."""
    row = costs.get(Head.label(head)) if isinstance(costs, dict) else None
    cell = row.get(kind) if isinstance(row, dict) else None
    return cell if isinstance(cell, dict) else {}


def _number(cell: dict, key: str) -> float | None:
    value = cell.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _cost_words(cell: dict, mean: dict) -> str:
    """The tooltip's causal-cost clause: KL with its interval, ΔNLL, the mean ablation's KL and the ratio."""
    kl = _number(cell, "kl")
    if kl is None:
        return ""
    ci = cell.get("kl_ci95") if isinstance(cell.get("kl_ci95"), list) and len(cell["kl_ci95"]) == 2 else None
    text = f"; swapped alone: KL {kl:.4g}"
    if ci is not None and all(isinstance(x, (int, float)) for x in ci):
        text += f" [{ci[0]:.3g}, {ci[1]:.3g}]"
    text += " nats/token"
    if _number(cell, "delta_nll") is not None:
        text += f", ΔNLL {_number(cell, 'delta_nll'):+.4g}"
    if _number(mean, "kl") is not None:
        text += f"; mean ablation KL {_number(mean, 'kl'):.4g}"
    if _number(cell, "over_mean") is not None:
        text += f" (program/ablation {_number(cell, 'over_mean'):.2f})"
    return text + " (select windows)"


def grid_html(views: list[hv.HeadView], costs: dict | None = None) -> str:
    """The overview grid (rows: layers, columns: query heads) with its family and IoU filters; with per-head causal
    costs (programs.json's ``meta["head_costs"]``), a switch that colours it by fidelity or by causal cost."""
    by_head = {v.head: v for v in views}
    layers = sorted({h[0] for h in by_head})
    cols = sorted({h[1] for h in by_head})
    seen: dict[str, int] = {}
    shown_of = {h: v.explanation or v.replacement for h, v in by_head.items()}
    kind_of = {h: "explanation" if v.explanation is not None else "replacement" for h, v in by_head.items()}
    heads_costs = costs.get("heads") if isinstance(costs, dict) else None
    cell_cost = {h: _cost(heads_costs, h, kind_of[h]) for h in by_head}
    has_costs = any(_number(c, "kl") is not None for c in cell_cost.values())
    keys = list(shown_of)
    colours = {"fidelity": dict(zip(keys, _ranks([shown_of[h].iou() for h in keys])))}
    if has_costs:  # cheaper is better: green is the lowest KL / ratio
        for view, key in (("kl", "kl"), ("ratio", "over_mean")):
            ranks = _ranks([_number(cell_cost[h], key) for h in keys])
            colours[view] = dict(zip(keys, [None if r is None else 1 - r for r in ranks]))
    rows = []
    for layer in layers:
        cells = [f"<th>L{layer}</th>"]
        for col in cols:
            v = by_head.get((layer, col))
            if v is None:
                cells.append("<td></td>")
                continue
            head = (layer, col)
            shown = shown_of[head]
            fam = family(shown.program)
            seen[fam] = seen.get(fam, 0) + 1
            iou = shown.iou()
            lab = Head.label(v.head)
            sink = sink_share(shown.program)
            cost = _cost_words(cell_cost[head], _cost(heads_costs, head, "mean"))
            tip = html.escape(f"{lab}: {fam}, {sink:.0%} of the program on the first token, test IoU "
                              f"{words.number(iou)}{cost} — {shown.gloss or shown.text}"[:400], quote=True)
            data = "".join(f" data-{view}='{_colour(c[head])}'" for view, c in colours.items()) if has_costs else ""
            cells.append(f"<td class='cell' data-family='{fam}' data-iou='{words.number(iou)}'{data} "
                         f"style='background:{_colour(colours['fidelity'][head])}' title='{tip}'>"
                         f"<a href='#{lab}'>{FAMILIES[fam]}</a></td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head_row = "<tr><th></th>" + "".join(f"<th>H{c}</th>" for c in cols) + "</tr>"
    options = "".join(f"<option value='{html.escape(f)}'>{html.escape(f)} ({n})</option>"
                      for f, n in sorted(seen.items(), key=lambda kv: -kv[1]))
    legend = ", ".join(f"<b>{FAMILIES[f]}</b> {html.escape(f)}" for f in seen)
    switch, scales = "", f"<span data-view='fidelity'>{VIEWS['fidelity']}</span>"
    if has_costs:
        labels = {"fidelity": "fidelity (test IoU)", "kl": "causal cost (KL)", "ratio": "KL / mean ablation"}
        switch = (" colour by <select id='colour-by'>"
                  + "".join(f"<option value='{view}'>{labels[view]}</option>" for view in colours) + "</select>")
        scales = "".join(f"<span data-view='{view}'{'' if view == 'fidelity' else ' hidden'}>{VIEWS[view]}</span>"
                         for view in colours)
        facts = costs if isinstance(costs, dict) else {}
        measured = (f" Causal costs: each head swapped alone, over {facts.get('tokens', '?')} predicted tokens in "
                    f"{facts.get('windows', '?')} select windows.")
    else:
        measured = " (Run explain with --head-costs to colour the grid by each head's causal cost.)"
    return (f"<div id='grid-filters' class='small'>family <select id='family-filter'><option value=''>all</option>"
            f"{options}</select> test IoU at least <input id='iou-filter' type='number' min='0' max='1' step='0.05' "
            f"value='0'>{switch} <span id='grid-count'></span></div>"
            f"<table id='grid' class='grid-table'>{head_row}{''.join(rows)}</table>"
            f"<p class='small' id='grid-legend'>Cells: the explanation (else the replacement), coloured by "
            f"{scales}, labelled by what it does besides the first-token sink: {legend}. Hover for the sink's share"
            f"{' and the costs' if has_costs else ''}, click for the head's section.{html.escape(measured)}</p>")


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
  var by = document.getElementById('colour-by');
  if (by) {
    by.addEventListener('change', function () {
      document.querySelectorAll('td.cell').forEach(function (c) { c.style.background = c.dataset[by.value]; });
      document.querySelectorAll('#grid-legend span[data-view]').forEach(function (s) {
        s.hidden = s.dataset.view !== by.value;
      });
    });
  }
})();
</script>"""
