"""The report's downstream table: lm-eval task scores of the base and the hybrid on the same examples."""
from __future__ import annotations

import html
from typing import Any

from . import words

__all__ = ["downstream_table"]


def _score(value: Any, stderr: Any) -> str:
    return words.number(value, 3) + (f" ± {words.number(stderr, 3)}" if stderr is not None else "")


def downstream_table(result: dict[str, Any], label: str = "hybrid", table_id: str = "downstream") -> str:
    """``hs.downstream``'s result as a table: per task and metric, base and hybrid (± lm-eval's standard error),
    and the difference with its 95% paired bootstrap interval; ``label`` names the hybrid (e.g. "explanations")."""
    rows = []
    for r in result["rows"]:
        low_high = r.get("delta_ci95")
        interval = f" [{low_high[0]:+.3f}, {low_high[1]:+.3f}]" if low_high else ""
        delta = f"{r['delta']:+.3f}{interval}" if "delta" in r else "–"
        rows.append(f"<tr><td>{html.escape(r['task'])}</td><td>{html.escape(r['metric'])}</td>"
                    f"<td class='num'>{r['n']}</td><td class='num'>{_score(r['base'], r.get('base_stderr'))}</td>"
                    f"<td class='num'>{_score(r.get('hybrid'), r.get('hybrid_stderr'))}</td>"
                    f"<td class='num'>{delta}</td></tr>")
    limit = result.get("limit")
    caption = (f"lm-evaluation-harness, {'all' if limit is None else limit} examples per task, seed "
               f"{result.get('seed', 0)}; base and {label} ({result.get('hybrid_heads') or 0} heads replaced) answer "
               "the same examples; ± is lm-eval's standard error, the interval a 95% paired bootstrap.")
    name = html.escape(label)
    return (f"<p class='small'>{html.escape(caption)}</p><table id='{html.escape(table_id)}'><tr><th>task</th>"
            f"<th>metric</th><th>n</th><th>base</th><th>{name}</th><th>{name} − base [95% CI]</th></tr>"
            f"{''.join(rows)}</table>")
