"""A head's leading candidates in report.html: every program programs.json keeps for it (the replacement, the
explanation, each frontier point) and the best single template, ranked by test IoU, so a reader sees what else
nearly won and at what size."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from . import words

#: a candidate's text is shown up to this many characters in the table (the full text is in its section or file)
TEXT_CHARS = 90
WINNER = " class='winner'"
CANDIDATES_STYLE = "details.cands { margin: .3em 0; } table.cands tr.winner td { background: #fff4e0; }\n"


@dataclass
class Row:
    """One candidate: what it was kept as, its text, characters, source and IoU on select and test."""

    roles: list[str]
    text: str
    chars: int | None
    source: str
    select_iou: float | None
    test_iou: float | None


def rows(v: Any) -> list[Row]:
    """The candidates of head ``v`` (a ``heads.HeadView``), one row per distinct program, best test IoU first."""
    kept = [("explanation", v.explanation), ("replacement", v.replacement)]
    kept += [(f"frontier ≤{s.budget}" if s.budget else "frontier", s) for s in v.frontier]
    merged: dict[str, Row] = {}
    for role, s in kept:
        if s is None:
            continue
        row = merged.setdefault(s.program.hash, Row([], s.text, s.chars, s.source, s.iou("select"), s.iou("test")))
        if role not in row.roles:
            row.roles.append(role)
    out = list(merged.values())
    same = [r for r in out if r.text == v.template]
    if same:
        same[0].roles.append("best template")
    elif v.template:
        out.append(Row(["best template"], v.template, len(v.template), "template", v.template_select_iou,
                       v.template_iou))
    return sorted(out, key=lambda r: (r.test_iou is None, -(r.test_iou or 0.0), r.chars or 0))


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


def candidates_html(v: Any, top: int = 8) -> str:
    """The table of a head's leading ``top`` candidates (test IoU, select IoU, characters, source, role)."""
    got = rows(v)[:top]
    if len(got) < 2:
        return ""
    body = "".join(
        f"<tr{WINNER if 'explanation' in r.roles else ''}><td class='num'>{words.number(r.test_iou)}</td>"
        f"<td class='num'>{words.number(r.select_iou)}</td>"
        f"<td class='num'>{f'{r.chars:,}' if r.chars is not None else '–'}</td>"
        f"<td>{html.escape(r.source or '–')}</td>"
        f"<td>{html.escape(', '.join(r.roles))}</td><td><code>{html.escape(_cut(r.text))}</code></td></tr>"
        for r in got)
    return ("<details class='cands'><summary class='small'>top candidates for this head "
            f"({len(got)})</summary><table class='cands'><tr><th>test IoU</th><th>select IoU</th><th>characters</th>"
            f"<th>source</th><th>kept as</th><th>program</th></tr>{body}</table></details>")
