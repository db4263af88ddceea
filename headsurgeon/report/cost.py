"""The report's cost section: what swapping each kind of program in costs, from an EvalReport
(headsurgeon/surgery/measure/eval_report.py): both kinds' headline side by side (ΔPPL and KL(base ‖ hybrid) with their intervals, and a
note where an interval is wider than the effect), a sweep table per kind naming the cheaper order, Spearman(IoU,
ΔPPL) and Spearman(fidelity, KL) with their intervals and the per-head table when measured, lm-eval tasks per
kind."""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from headsurgeon.surgery.measure.eval_format import FIDELITY_LABELS, KIND_LABELS, wide_note
from headsurgeon.surgery.measure.sweep_order import ORDER_LABELS

from . import words
from .downstream import downstream_table

if TYPE_CHECKING:  # the report reads the records; it never runs a measurement
    from headsurgeon.surgery.measure.eval_report import EvalReport, KindReport

__all__ = ["cost_html"]


def _metric(evaluation: EvalReport) -> str:
    return "ΔPPL" if evaluation.lm_head else "embedding distance"


def _kl(x: Any) -> str:
    """A KL in nats/token to 3 significant digits (KLs span orders of magnitude), or an en dash when missing."""
    return "–" if x is None else f"{float(x):.3g}"


def _interval(ci: Any, show: Any) -> str:
    """The interval as low … high in ``show``'s words, or an en dash when there is none."""
    return f"{show(ci[0])} … {show(ci[1])}" if ci else "–"


def _pct(x: Any) -> str:
    """A percentage already ×100 (the report's ``*_pct`` fields) in words."""
    return words.percent(None if x is None else x / 100, digits=2)


def headline_table(evaluation: EvalReport) -> str:
    """One row per kind: heads swapped, heads left neural, and the cost of swapping them all at once."""
    lm = evaluation.lm_head
    head = ("<tr><th>programs swapped in</th><th>heads</th><th>left neural</th>"
            + ("<th>perplexity</th><th>ΔPPL</th><th>95% bootstrap interval over windows</th>"
               "<th>KL(base ‖ hybrid), nats/token</th><th>95% bootstrap interval over windows</th>" if lm
               else "<th>embedding distance (1 − cos)</th>") + "</tr>")
    rows = [f"<tr><td>none (the base model)</td><td class='num'>0</td><td class='num'>–</td><td class='num'>"
            f"{words.number(evaluation.ppl, 3)}</td>" + "<td class='num'>–</td>" * 4 + "</tr>"] if lm else []
    for kind, kr in evaluation.kinds.items():
        cells = f"<td>{KIND_LABELS[kind]}</td><td class='num'>{kr.heads}</td><td class='num'>{len(kr.neural)}</td>"
        if lm:
            cells += (f"<td class='num'>{words.number(kr.hybrid_ppl, 3)}</td>"
                      f"<td class='num'>{_pct(kr.hybrid_delta_pct)}</td>"
                      f"<td class='num'>{_interval(kr.hybrid_delta_ci95_pct, _pct)}</td>"
                      f"<td class='num'>{_kl(kr.kl)}</td><td class='num'>{_interval(kr.kl_ci95, _kl)}</td>")
        else:
            cells += f"<td class='num'>{words.number(kr.embedding_distance, 5)}</td>"
        rows.append(f"<tr>{cells}</tr>")
    return f"<table id='cost'>{head}{''.join(rows)}</table>" + wide_notes(evaluation)


def wide_notes(evaluation: EvalReport) -> str:
    """A line per kind whose headline interval is wider than its effect; nothing when none is."""
    notes = [f"{KIND_LABELS[kind]}: {html.escape(note)}." for kind, kr in evaluation.kinds.items()
             if (note := wide_note(kr.delta_wide, kr.kl_wide))]
    return "".join(f"<p class='wide'>{note}</p>" for note in notes)


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
    best = max(counts, key=counts.get)  # type: ignore[arg-type]  # dict.get as a key function: typeshed's overloads reject it
    steps = ", ".join(f"{words.percent(r['fraction'], signed=False, digits=0)}: {html.escape(r['cheapest'])}"
                      for r in middle)
    return (f"cheaper order: <b>{html.escape(best)}</b> at {counts[best]} of {len(middle)} partial steps "
            f"({steps})")


def sweep_table(evaluation: EvalReport, kind: str, kr: KindReport) -> str:
    """The kind's sweep: per step the cost (ΔPPL, then KL) in each order and with random programs, and the cheapest
    order."""
    metric = _metric(evaluation)
    arms = _arms(kr)
    kls = [("kl" + key[len("delta"):], label) for key, label in arms] if evaluation.lm_head else []
    head = "".join(f"<th>{metric} · {html.escape(label)}</th>" for _, label in arms)
    head += "".join(f"<th>KL · {html.escape(label)}</th>" for _, label in kls)
    body = []
    for r in kr.sweep or []:
        cells = "".join(f"<td class='num'>{words.percent(r.get(key))}</td>" for key, _ in arms)
        cells += "".join(f"<td class='num'>{_kl(r.get(key))}</td>" for key, _ in kls)
        body.append(f"<tr><td>{words.percent(r['fraction'], signed=False, digits=0)} ({r['n_heads']})</td>{cells}"
                    f"<td>{html.escape(str(r.get('cheapest', '–')))}</td></tr>")
    return (f"<h3>{KIND_LABELS[kind]}: {kr.heads} heads swapped step by step</h3><p>{cheaper_sentence(kr)}.</p>"
            f"<table class='sweep' id='sweep-{kind}'><tr><th>heads swapped</th>{head}<th>cheapest order</th></tr>"
            f"{''.join(body)}</table>")


#: how to read the sign of Spearman(fidelity, cost): IoU grows with faithfulness, JSD shrinks
_SIGN = {"IoU": "Negative: more faithful heads cost less.", "JSD": "Positive: more faithful heads cost less."}


def spearman_sentence(kind: str, sp: dict[str, Any], x: str = "IoU", y: str = "ΔPPL") -> str:
    """Spearman(test ``x``, per-head ``y``) of one kind with its bootstrap interval, in words."""
    if sp.get("rho") is None:
        return (f"<p class='spearman'>Spearman({x}, {y}), {KIND_LABELS[kind]}: undefined ({sp['heads']} heads with "
                f"a constant {x} or {y}).</p>")
    low, high = sp["ci95"]
    interval = (f" (95% bootstrap interval over heads {words.number(low)} … {words.number(high)})"
                if low is not None and high is not None else "")
    return (f"<p class='spearman'>Spearman({x}, {y}), {KIND_LABELS[kind]}: ρ = {words.number(sp['rho'])}"
            f"{interval}, {sp['heads']} heads. {_SIGN[x]}</p>")


def spearman_sentences(evaluation: EvalReport) -> list[str]:
    """Per kind: Spearman(IoU, ΔPPL), then Spearman(IoU, KL) and Spearman(JSD, KL), those measured."""
    out = []
    for kind, kr in evaluation.kinds.items():
        if kr.spearman:
            out.append(spearman_sentence(kind, kr.spearman))
        out += [spearman_sentence(kind, sp, FIDELITY_LABELS[m], "KL") for m, sp in (kr.spearman_kl or {}).items()]
    return out


def _per_head_cells(r: dict[str, Any]) -> str:
    """One kind's cells of a per-head row: test IoU, ΔPPL and KL each with its interval (en dashes when missing)."""
    return (f"<td class='num'>{words.number(r.get('iou'))}</td><td class='num'>{_pct(r.get('delta_pct'))}</td>"
            f"<td class='num'>{_interval(r.get('delta_ci95_pct'), _pct)}</td><td class='num'>{_kl(r.get('kl'))}</td>"
            f"<td class='num'>{_interval(r.get('kl_ci95'), _kl)}</td>")


def per_head_table(evaluation: EvalReport) -> str:
    """One row per head: each kind's test IoU, and ΔPPL and KL with that head alone swapped (folded, it is long)."""
    kinds = [k for k, kr in evaluation.kinds.items() if kr.per_head]
    rows: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        for r in evaluation.kinds[kind].per_head or []:
            rows.setdefault(r["head"], {})[kind] = r
    head = "".join(f"<th>{KIND_LABELS[k]} IoU</th><th>{KIND_LABELS[k]} ΔPPL</th><th>95% interval</th>"
                   f"<th>{KIND_LABELS[k]} KL</th><th>95% interval</th>" for k in kinds)
    body = []
    for name, by_kind in rows.items():
        cells = "".join(_per_head_cells(by_kind.get(k) or {}) for k in kinds)
        body.append(f"<tr><td><a href='#{name}'>{name}</a></td>{cells}</tr>")
    return (f"<details><summary>per-head ΔPPL and KL(base ‖ hybrid) in nats/token, one head swapped at a time "
            f"({len(rows)} heads)</summary>"
            f"<table id='per-head-cost'><tr><th>head</th>{head}</tr>{''.join(body)}</table></details>")


def cost_html(evaluation: EvalReport, sweep_img: str = "") -> str:
    """The whole cost section for ``evaluation`` (an EvalReport), with the sweep figure ``sweep_img`` (HTML)."""
    where = f"on {evaluation.test_sequences} test windows"
    if evaluation.test_tokens is not None:
        where += f" ({evaluation.test_tokens} predicted tokens)"
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
    parts += spearman_sentences(evaluation)
    if any(kr.per_head for kr in evaluation.kinds.values()):
        parts.append(per_head_table(evaluation))
    tasks = [(kind, kr) for kind, kr in evaluation.kinds.items() if kr.downstream]
    if tasks:
        parts.append("<h3>Downstream tasks</h3><div id='downstream'>" + "".join(
            f"<h4>{KIND_LABELS[kind]} ({kr.heads} heads)</h4>"
            + downstream_table(kr.downstream or {}, label=KIND_LABELS[kind], table_id=f"downstream-{kind}")
            for kind, kr in tasks) + "</div>")
    return "".join(parts)
