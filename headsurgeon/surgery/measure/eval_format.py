"""An EvalReport (headsurgeon/surgery/measure/eval_report.py) as text: the headline per kind, then per-head, sweep and task tables
with both kinds of program side by side, each labelled."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .sweep_order import ORDER_LABELS

if TYPE_CHECKING:  # eval_report.py imports this module to print its reports
    from .eval_report import EvalReport, KindReport

__all__ = ["format_report", "table", "KIND_LABELS", "wide_note", "FIDELITY_LABELS"]

KIND_LABELS = {"replacement": "replacements", "explanation": "explanations"}
#: the fidelity measures Spearman(·, KL) ranks (KindReport.spearman_kl's keys), as people read them
FIDELITY_LABELS = {"iou": "IoU", "jsd": "JSD"}


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Plain aligned text table; columns are (key, header, format)."""
    cells = [[h for _, h, _ in columns]] + [[format(r[k], f) if r.get(k) is not None else "-" for k, _, f in columns]
                                            for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _headline(kr: KindReport, total: int, test_sequences: int) -> str:
    """One line: which heads this kind swapped (and how many stay neural) and what it cost."""
    label = KIND_LABELS[kr.kind]
    if not kr.heads:
        return f"{label}: none of the {total} program heads has {'an' if kr.kind == 'explanation' else 'a'} {kr.kind}"
    what = _cost(kr, test_sequences)
    if kr.neural:
        shown = ", ".join(kr.neural[:12]) + (", …" if len(kr.neural) > 12 else "")
        n = len(kr.neural)
        scope = (f"{label}, {kr.heads} of {total} program heads ({n} without {'an' if kr.kind == 'explanation' else 'a'}"
                 f" {kr.kind} {'stays' if n == 1 else 'stay'} neural: {shown})")
    else:
        scope = f"{label}, all {kr.heads} program heads"
    return f"{scope}: {what}"


def _cost(kr: KindReport, test_sequences: int) -> str:
    if kr.embedding_distance is not None:
        return f"embedding distance {kr.embedding_distance:.5f} on {test_sequences} test windows"
    low, high = kr.hybrid_delta_ci95_pct or (float("nan"), float("nan"))
    text = (f"perplexity {kr.hybrid_ppl:.4f} (ΔPPL {kr.hybrid_delta_pct:+.2f}%, 95% bootstrap interval over windows "
            f"{low:+.2f}% .. {high:+.2f}%)")
    if kr.kl is not None:
        klo, khi = kr.kl_ci95 or (float("nan"), float("nan"))
        text += (f", KL(base ‖ hybrid) {kr.kl:.4g} nats/token ({klo:.4g} .. {khi:.4g}) over {kr.tokens} predicted "
                 "test tokens")
    note = wide_note(kr.delta_wide, kr.kl_wide)
    return f"{text}; {note}" if note else text


def wide_note(delta_wide: bool | None, kl_wide: bool | None) -> str:
    """Which of a cost's intervals is wider than its effect, in words ("" when none is; headsurgeon/surgery/measure/divergence.py)."""
    wide = [name for name, flag in (("ΔPPL", delta_wide), ("KL", kl_wide)) if flag]
    if not wide:
        return ""
    return (f"{' and '.join(wide)} interval{'s' if len(wide) > 1 else ''} wider than the effect: more test windows "
            "needed")


def _per_head(report: EvalReport) -> list[str]:
    """One row per head; per kind its IoU(test), ΔPPL % and KL, then the programs' texts; then the Spearman lines."""
    kinds = [k for k, kr in report.kinds.items() if kr.per_head]
    if not kinds:
        return []
    rows: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        short = kind[:4] + "."
        for r in report.kinds[kind].per_head or []:
            row = rows.setdefault(r["head"], {"head": r["head"]})
            row.update({f"{short}iou": r["iou"], f"{short}delta": r["delta_pct"], f"{short}kl": r.get("kl"),
                        kind: r["program"]})
    columns = [("head", "head", "")]
    for kind in kinds:
        short = kind[:4] + "."
        columns += [(f"{short}iou", f"{short} IoU(test)", ".3f"), (f"{short}delta", f"{short} ΔPPL %", "+.2f"),
                    (f"{short}kl", f"{short} KL", ".4g")]
    columns += [(kind, kind, "") for kind in kinds]
    lines = ["per-head ΔPPL and KL(base ‖ hybrid) in nats/token (one head swapped at a time):",
             table(list(rows.values()), columns)]
    for kind in kinds:
        kr = report.kinds[kind]
        if kr.spearman:
            lines.append(spearman_line(kind, "IoU", "ΔPPL", kr.spearman))
        lines += [spearman_line(kind, FIDELITY_LABELS[m], "KL", sp) for m, sp in (kr.spearman_kl or {}).items()]
    return lines


def spearman_line(kind: str, x: str, y: str, sp: dict[str, Any]) -> str:
    """Spearman(x, y) over one kind's heads (e.g. test IoU and per-head ΔPPL) with its bootstrap interval, in words."""
    rho = f"undefined (constant {x} or {y})" if sp["rho"] is None else f"{sp['rho']:+.2f}"
    low, high = sp["ci95"]
    interval = (f", 95% bootstrap interval over heads {low:+.2f} .. {high:+.2f}" if low is not None and high is not None
                else "")
    return f"Spearman({x}, {y}), {KIND_LABELS[kind]}: rho {rho}{interval} ({sp['heads']} heads)"


def _sweep(report: EvalReport) -> list[str]:
    """Per kind and step: ΔPPL % in each order and both baselines, and which order was cheaper."""
    rows, orders = [], None
    for kind, kr in report.kinds.items():
        for r in kr.sweep or []:
            orders = kr.sweep_orders
            rows.append({"kind": KIND_LABELS[kind], **r,
                         **{k: 100 * v for k, v in r.items() if k.startswith("delta") and v is not None}})
    if not rows:
        return []
    first, *rest = orders  # type: ignore[misc]  # orders is a non-empty tuple of order names
    metric = "ΔPPL %" if report.lm_head else "embedding distance %"
    columns = [("kind", "kind", ""), ("fraction", "replaced", ".0%"), ("n_heads", "heads", "d"),
               ("delta", f"{metric} ({ORDER_LABELS[first]})", "+.2f")]
    columns += [(f"delta_by_{o}", ORDER_LABELS[o], "+.2f") for o in rest]
    columns += [("delta_random_order", "random order", "+.2f"), ("delta_random_program", "random programs", "+.2f")]
    if report.lm_head:  # KL(base ‖ hybrid) of each order's arm; JSON holds the baselines' too
        columns += [("kl", f"KL ({ORDER_LABELS[first]})", ".4g")]
        columns += [(f"kl_by_{o}", f"KL ({ORDER_LABELS[o]})", ".4g") for o in rest]
    columns += [("cheapest", "cheapest order", "")]
    lines = ["replacement sweep (each kind's heads swapped 0 → 100%):", table(rows, columns)]
    if report.order_on is not None:
        where = ("select windows, disjoint from the test windows above" if report.order_on == "select"
                 else "same test windows as above (in-sample: give a Splits to measure it on select)")
        lines.append(f"ΔPPL order: heads sorted by their own per-head ΔPPL on {report.order_sequences} "
                     f"{where}")
    return lines


def _downstream(report: EvalReport, kr: KindReport | None) -> list[str]:
    """The lm-eval table (headsurgeon/surgery/measure/downstream.py) for one kind, or for the base alone."""
    result = kr.downstream if kr is not None else report.downstream
    if result is None:
        return []
    rows = [{**r, "base_se": r["base_stderr"], "hybrid_se": r.get("hybrid_stderr"),
             "ci": f"{r['delta_ci95'][0]:+.4f} .. {r['delta_ci95'][1]:+.4f}" if "delta_ci95" in r else None}
            for r in result["rows"]]
    columns = [("task", "task", ""), ("metric", "metric", ""), ("n", "n", "d"), ("base", "base", ".4f"),
               ("base_se", "± se", ".4f")]
    if kr is not None:
        columns += [("hybrid", KIND_LABELS[kr.kind], ".4f"), ("hybrid_se", "± se", ".4f"), ("delta", "Δ", "+.4f"),
                    ("ci", "95% paired bootstrap", "")]
    limit = "all" if report.tasks_limit is None else report.tasks_limit
    scope = f", {KIND_LABELS[kr.kind]} ({kr.heads} heads)" if kr is not None else ""
    return [f"downstream (lm-eval, {limit} examples per task, seed {report.seed}; se = lm-eval's standard "
            f"error){scope}:", table(rows, columns)]


def _downstream_sweep(kr: KindReport) -> list[str]:
    if not kr.downstream_sweep:
        return []
    order = ORDER_LABELS[kr.sweep_orders[0]]
    return [f"downstream sweep, {KIND_LABELS[kr.kind]} (same examples at every step):",
            table(kr.downstream_sweep, [("task", "task", ""), ("metric", "metric", ""),
                                        ("fraction", "replaced", ".0%"), ("n_heads", "heads", "d"),
                                        ("value", order, ".4f"), ("value_random_order", "random order", ".4f"),
                                        ("value_random_program", "random programs", ".4f")])]


def format_report(report: EvalReport) -> str:
    """The text ``headsurgeon eval`` prints."""
    if not report.lm_head:
        lines = [f"{report.model} has no language-model head: perplexity is undefined; the cost of a swap is the "
                 "embedding distance (1 - cosine of mean-pooled final hidden states)"]
        lines += [_headline(kr, report.program_heads, report.test_sequences) for kr in report.kinds.values()]
        return "\n".join(lines + _sweep(report))
    lines = [f"{report.model}: perplexity {report.ppl:.4f} on {report.test_sequences} test windows "
             f"({report.test_tokens} predicted tokens)"]
    lines += [_headline(kr, report.program_heads, report.test_sequences) for kr in report.kinds.values()]
    lines += _per_head(report) + _sweep(report)
    lines += _downstream(report, None)
    for kr in report.kinds.values():
        lines += _downstream(report, kr) + _downstream_sweep(kr)
    if report.sweep_png:
        lines.append(f"sweep plot: {report.sweep_png}")
    return "\n".join(lines)
