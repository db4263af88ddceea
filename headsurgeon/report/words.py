"""The report's words: numbers, timings, sweep rows, notes and the metric paragraph, never Python reprs."""
from __future__ import annotations

import html
import math
from typing import Any, Iterable

#: what the metrics mean and how selection works (docs/architecture.md, "Metrics")
METRICS_PARAGRAPH = (
    "<b>Soft IoU</b> compares two attention patterns cell by cell over the grid the model can see: "
    "Σ min(p, q) / Σ max(p, q), averaged over windows. 1 means identical, 0 means no overlap; "
    "0.5 means the shared attention mass is half of the combined mass. "
    "<b>JSD</b> is the Jensen–Shannon distance (natural log) between each query's real and program row, "
    "averaged over visible rows: 0 means identical. "
    "Every searcher proposes programs fitted on the <b>synth</b> windows; per head, the program with the best "
    "IoU on the <b>select</b> windows is chosen; the IoU shown is measured on the <b>test</b> windows. "
    "The three splits hold different documents, so no score is measured on the windows it was chosen on. "
    "The <b>explanation</b> is the most faithful program whose text (tokens as strings) fits in 200 characters; "
    "the <b>replacement</b> is the most faithful program at any size. The <b>best template</b> "
    "(first token, self, previous token or uniform) gives the scale: an explanation is worth reading when it "
    "beats it clearly."
)


def number(x: Any, digits: int = 2) -> str:
    """A float with ``digits`` decimals, or an en dash when missing or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{float(x):.{digits}f}"


def percent(x: Any, signed: bool = True, digits: int = 1) -> str:
    """0.165 → "+16.5%" (an en dash when missing)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{100 * float(x):{'+' if signed else ''}.{digits}f}%"


def seconds(s: float) -> str:
    """1.23 → "1.2 s", 125 → "2 min 5 s", 4000 → "1 h 7 min"."""
    s = float(s)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        m, r = divmod(round(s), 60)
        return f"{m} min {r} s" if r else f"{m} min"
    h, r = divmod(round(s), 3600)
    return f"{h} h {r // 60} min"


#: how timing keys read in words (the rest as they are)
TIMING_LABELS = {"delta_ppl": "per-head ΔPPL"}


def _phase(key: str, value: Any) -> tuple[str, float]:
    """One phase in words and its wall seconds; a nested phase ({"wall": s, part: s, ...}) lists its parts."""
    label = html.escape(TIMING_LABELS.get(str(key), str(key)))
    if not isinstance(value, dict):
        return f"{label} {seconds(value)}", float(value)
    parts = {k: float(v) for k, v in value.items() if k != "wall"}
    wall = float(value.get("wall", sum(parts.values())))
    inner = ", ".join(f"{html.escape(TIMING_LABELS.get(k, k))} {seconds(v)}" for k, v in parts.items())
    return f"{label} {seconds(wall)}" + (f" ({inner})" if inner else ""), wall


def timings_sentence(timings: dict[str, Any]) -> str:
    """{"capture": 1.2, "search": {"wall": 40, "enumerative": 30}} → "capture 1.2 s, search 40 s (enumerative 30 s)
    (total 41 s)": a nested phase's parts are shown inside it, never added again; ``"total"``, when given, is the
    run's wall time, else the phases' walls are summed (they run one after another)."""
    phases = [_phase(k, v) for k, v in timings.items() if k != "total"]
    if not phases:
        return f"total {seconds(timings['total'])}" if "total" in timings else ""
    text = ", ".join(said for said, _ in phases)
    total = float(timings["total"]) if "total" in timings else sum(wall for _, wall in phases)
    return f"{text} (total {seconds(total)})" if len(phases) > 1 or "total" in timings else text


def notes_list(notes: Iterable[Any]) -> str:
    """Notes as an HTML list; nothing at all when there are none."""
    items = [str(n) for n in notes or () if str(n).strip()]
    if not items:
        return ""
    return "<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in items) + "</ul>"


def plain(value: Any) -> str:
    """Any summary value in words: numbers rounded, lists joined, mappings as "key value" pairs."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value, 3)
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(plain(v) for v in value) or "none"
    return str(value)


def splits_sentence(splits: object, tokens: object = None) -> str:
    """{"synth": 120, "select": 40, "test": 40} → "120 synth, 40 select and 40 test windows, split by document",
    with each split's predicted tokens (programs.json's ``meta["split_tokens"]``) when known."""
    if not isinstance(splits, dict) or not splits:
        return ""
    tokens = tokens if isinstance(tokens, dict) else {}
    parts = [f"{v} {k}" + (f" ({tokens[k]:,} predicted tokens)" if isinstance(tokens.get(k), int) else "")
             for k, v in splits.items()]
    head = ", ".join(parts[:-1])
    how = " (shares of predicted tokens)" if tokens else ""
    return (f"{head} and {parts[-1]}" if head else parts[0]) + f" windows, split by document{how}"


SWEEP_COLUMNS = (("delta", "in order of select IoU"), ("delta_random_order", "in random order"),
                 ("delta_random_program", "with random programs"))


def sweep_table(rows: list[dict]) -> str:
    """Replacement-sweep rows as a tidy table plus one sentence about the last row."""
    if not rows:
        return ""
    cols = [(k, label) for k, label in SWEEP_COLUMNS if any(k in r for r in rows)]
    embedding = any("embedding_distance" in r for r in rows)  # a headless encoder (headsurgeon/surgery/measure/embedding.py)
    metric = "embedding distance" if embedding else "ΔPPL"
    head = "".join(f"<th>{metric} {label}</th>" for _, label in cols)
    body = []
    for r in rows:
        which = f" ({html.escape(str(r['which']))})" if r.get("which") else ""
        cells = "".join(f"<td>{percent(r.get(k))}</td>" for k, _ in cols)
        body.append(f"<tr><td>{percent(r.get('fraction'), signed=False, digits=0)} of heads ({r.get('n_heads', '–')})"
                    f"{which}</td>{cells}</tr>")
    last = rows[-1]
    sentence = ""
    if "delta" in last and last.get("n_heads"):
        extra = (f"; random programs in the same heads: {percent(last['delta_random_program'])}"
                 if "delta_random_program" in last else "")
        change = ("moves the test windows' mean-pooled sentence embeddings by a cosine distance of" if embedding
                  else "changes test perplexity by")
        sentence = (f"<p>Replacing {last['n_heads']} heads by their programs {change} "
                    f"{percent(last['delta'])}{extra}.</p>")
    return (f"{sentence}<table class='sweep'><tr><th>heads replaced</th>{head}</tr>{''.join(body)}</table>")


def trust_words(explanation_iou: float | None) -> tuple[str, str]:
    """A short verdict and its CSS class from the explanation's test IoU."""
    if explanation_iou is None:
        return "no readable explanation", "none"
    if explanation_iou >= 0.7:
        return "close match", "high"
    if explanation_iou >= 0.5:
        return "partial match", "mid"
    return "rough sketch", "low"


def gain(explanation_iou: float | None, template_iou: float | None) -> str:
    """The explanation's IoU margin over the best template, signed ("+0.12"), or an en dash."""
    if explanation_iou is None or template_iou is None:
        return "–"
    return f"{explanation_iou - template_iou:+.2f}"
