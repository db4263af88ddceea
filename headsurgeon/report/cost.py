"""The report's cost section: what swapping each kind of program in costs, from an EvalReport
(surgery/eval_report.py): both kinds' headline side by side, a sweep table per kind naming the cheaper order,
Spearman(IoU, ΔPPL) with its interval and the per-head ΔPPL table when measured, lm-eval tasks per kind."""
from __future__ import annotations

import html
from typing import Any

from headsurgeon.surgery.eval_format import KIND_LABELS
from headsurgeon.surgery.sweep_order import ORDER_LABELS

from . import words
from .downstream import downstream_table

__all__ = ["cost_html"]


def _metric(evaluation: Any) -> str:
    return "ΔPPL" if evaluation.lm_head else "embedding distance"


def headline_table(evaluation: Any) -> str:
    """One row per kind: heads swapped, heads left neural, and the cost of swapping them all at once."""
    lm = evaluation.lm_head
    head = ("<tr><th>programs swapped in</th><th>heads</th><th>left neural</th>"
            + ("<th>perplexity</th><th>ΔPPL</th><th>95% bootstrap interval over windows</th>" if lm
               else "<th>embedding distance (1 − cos)</th>") + "</tr>")
    rows = [f"<tr><td>none (the base model)</td><td class='num'>0</td><td class='num'>–</td><td class='num'>"
            f"{words.number(evaluation.ppl, 3)}</td><td class='num'>–</td><td class='num'>–</td></tr>"] if lm else []
    for kind, kr in evaluation.kinds.items():
        cells = f"<td>{KIND_LABELS[kind]}</td><td class='num'>{kr.heads}</td><td class='num'>{len(kr.neural)}</td>"
        if lm:
            low, high = kr.hybrid_delta_ci95_pct or (None, None)
            ci = (f"{words.percent(low / 100)} … {words.percent(high / 100)}" if low is not None else "–")
            cells += (f"<td class='num'>{words.number(kr.hybrid_ppl, 3)}</td><td class='num'>"
                      f"{words.percent(None if kr.hybrid_delta_pct is None else kr.hybrid_delta_pct / 100)}</td>"
                      f"<td class='num'>{ci}</td>")
        else:
            cells += f"<td class='num'>{words.number(kr.embedding_distance, 5)}</td>"
        rows.append(f"<tr>{cells}</tr>")
    return f"<table id='cost'>{head}{''.join(rows)}</table>"


def _arms(kr: Any) -> list[tuple[str, str]]:
    """(row key, column label) of the kind's sweep arms: its orders, then the two baselines."""
    first, *rest = kr.sweep_orders or ["iou"]
    return ([("delta", ORDER_LABELS[first])] + [(f"delta_by_{o}", ORDER_LABELS[o]) for o in rest]
            + [("delta_random_order", ORDER_LABELS["random"]), ("delta_random_program", "random programs")])


def cheaper_sentence(kr: Any) -> str:
    """Which order was cheaper over the steps that swap some but not all heads (at 0% and 100% all orders agree)."""
    middle = [r for r in kr.sweep or [] if 0 < r.get("n_heads", 0) < kr.heads]
    if not middle:
        return "every step swaps no head or every head, so all orders cost the same"
    counts: dict[str, int] = {}
    for r in middle:
        counts[r["cheapest"]] = counts.get(r["cheapest"], 0) + 1
    best = max(counts, key=counts.get)  # type: ignore[arg-type]
    steps = ", ".join(f"{words.percent(r['fraction'], signed=False, digits=0)}: {html.escape(r['cheapest'])}"
                      for r in middle)
    return (f"cheaper order: <b>{html.escape(best)}</b> at {counts[best]} of {len(middle)} partial steps "
            f"({steps})")


def sweep_table(evaluation: Any, kind: str, kr: Any) -> str:
    """The kind's sweep: per step the cost in each order and with random programs, and the cheapest order."""
    metric = _metric(evaluation)
    arms = _arms(kr)
    head = "".join(f"<th>{metric} · {html.escape(label)}</th>" for _, label in arms)
    body = []
    for r in kr.sweep:
        cells = "".join(f"<td class='num'>{words.percent(r.get(key))}</td>" for key, _ in arms)
        body.append(f"<tr><td>{words.percent(r['fraction'], signed=False, digits=0)} ({r['n_heads']})</td>{cells}"
                    f"<td>{html.escape(str(r.get('cheapest', '–')))}</td></tr>")
    return (f"<h3>{KIND_LABELS[kind]}: {kr.heads} heads swapped step by step</h3><p>{cheaper_sentence(kr)}.</p>"
            f"<table class='sweep' id='sweep-{kind}'><tr><th>heads swapped</th>{head}<th>cheapest order</th></tr>"
            f"{''.join(body)}</table>")


def spearman_sentence(kind: str, sp: dict[str, Any]) -> str:
    """Spearman(test IoU, per-head ΔPPL) of one kind with its bootstrap interval, in words."""
    if sp.get("rho") is None:
        return (f"<p class='spearman'>Spearman(IoU, ΔPPL), {KIND_LABELS[kind]}: undefined ({sp['heads']} heads with "
                "a constant IoU or ΔPPL).</p>")
    low, high = sp["ci95"]
    interval = (f" (95% bootstrap interval over heads {words.number(low)} … {words.number(high)})"
                if low is not None and high is not None else "")
    return (f"<p class='spearman'>Spearman(IoU, ΔPPL), {KIND_LABELS[kind]}: ρ = {words.number(sp['rho'])}"
            f"{interval}, {sp['heads']} heads. Negative: more faithful heads cost less.</p>")


def per_head_table(evaluation: Any) -> str:
    """One row per head: each kind's test IoU and its ΔPPL with that head alone swapped (folded, it is long)."""
    kinds = [k for k, kr in evaluation.kinds.items() if kr.per_head]
    rows: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        for r in evaluation.kinds[kind].per_head:
            rows.setdefault(r["head"], {})[kind] = r
    head = "".join(f"<th>{KIND_LABELS[k]} IoU</th><th>{KIND_LABELS[k]} ΔPPL</th>" for k in kinds)
    body = []
    for name, by_kind in rows.items():
        cells = "".join(f"<td class='num'>{words.number((by_kind.get(k) or {}).get('iou'))}</td><td class='num'>"
                        f"{words.percent(None if k not in by_kind else by_kind[k]['delta_pct'] / 100, digits=2)}</td>"
                        for k in kinds)
        body.append(f"<tr><td><a href='#{name}'>{name}</a></td>{cells}</tr>")
    return (f"<details><summary>per-head ΔPPL, one head swapped at a time ({len(rows)} heads)</summary>"
            f"<table id='per-head-cost'><tr><th>head</th>{head}</tr>{''.join(body)}</table></details>")


def cost_html(evaluation: Any, sweep_img: str = "") -> str:
    """The whole cost section for ``evaluation`` (an EvalReport), with the sweep figure ``sweep_img`` (HTML)."""
    where = f"on {evaluation.test_sequences} test windows"
    parts = [f"<p>Each kind of program swapped in for every head that has one, {where}; heads without one keep "
             "their neural attention.</p>", headline_table(evaluation)]
    for kind, kr in evaluation.kinds.items():
        if kr.sweep:
            parts.append(sweep_table(evaluation, kind, kr))
    if evaluation.order_on is not None:
        parts.append(f"<p class='small'>ΔPPL order: each kind's heads sorted by their own per-head ΔPPL, measured on "
                     f"{evaluation.order_sequences} {html.escape(evaluation.order_on)} windows"
                     + (", disjoint from the test windows that judge it" if evaluation.order_on == "select" else "")
                     + ".</p>")
    parts.append(sweep_img)
    parts += [spearman_sentence(kind, kr.spearman) for kind, kr in evaluation.kinds.items() if kr.spearman]
    if any(kr.per_head for kr in evaluation.kinds.values()):
        parts.append(per_head_table(evaluation))
    tasks = [(kind, kr) for kind, kr in evaluation.kinds.items() if kr.downstream]
    if tasks:
        parts.append("<h3>Downstream tasks</h3><div id='downstream'>" + "".join(
            f"<h4>{KIND_LABELS[kind]} ({kr.heads} heads)</h4>"
            + downstream_table(kr.downstream, label=KIND_LABELS[kind], table_id=f"downstream-{kind}")
            for kind, kr in tasks) + "</div>")
    return "".join(parts)
