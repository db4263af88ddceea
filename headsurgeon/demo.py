"""The one-command demo on the embedded default model: explain → hybrid → save → reload → same logits."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from headsurgeon.pipeline import ExplainResult, explain
from headsurgeon.surgery.patterns.capture import padded_batch
from headsurgeon.surgery.swap.replace import replace_heads
from .core import Head


def run_demo(out: str | Path = "headsurgeon-demo", model: Any = "tiny-stories", corpus: Any = None,
             max_len: int = 64, max_sequences: int = 240, searchers: tuple[str, ...] = ("enumerative", "learned"),
             fraction: float = 0.25, progress: bool = True) -> dict:
    """Run the whole pipeline offline and return what happened (paths, figures, the logits check)."""
    t0 = time.perf_counter()
    out = Path(out)
    result: ExplainResult = explain(model, corpus, out, max_len=max_len, max_sequences=max_sequences,
                                    searchers=searchers, progress=progress)
    from headsurgeon.hub.checkpoint import load_hybrid, save_hybrid
    from headsurgeon.surgery.models.loading import load_model

    handle = load_model(model)
    ranked = result.programs.ranked("select")
    chosen = ranked[: max(1, int(round(fraction * len(ranked))))]
    hybrid = replace_heads(handle, result.programs.subset(chosen))
    metrics = {Head.label(h): result.programs.entries[h].scores.to_json() for h in chosen}
    checkpoint = save_hybrid(hybrid, out / "hybrid", metrics=metrics, programs=result.programs)  # card: glosses
    batch = result.splits.test[:8]
    ids, mask = padded_batch(batch)
    with torch.no_grad():
        before = hybrid(ids, attention_mask=mask)
    hybrid.restore()
    reloaded = load_hybrid(checkpoint)
    with torch.no_grad():
        after = reloaded(ids, attention_mask=mask)
    reloaded.restore()
    identical = bool(torch.equal(before, after))
    summary = {
        "out": str(out), "report": str(out / "report.html"), "programs": str(out / "programs.json"),
        "checkpoint": str(checkpoint), "heads_replaced": [Head.label(h) for h in chosen],
        "logits_identical_after_reload": identical, "summary": result.programs.summary("test"),
        "sweep": result.sweep, "seconds": time.perf_counter() - t0, "table": result.summary_table(),
    }
    if not identical:
        raise RuntimeError("the reloaded hybrid's logits differ from the saved one's; the checkpoint is not faithful")
    return summary


def format_summary(summary: dict) -> str:
    lines = [summary["table"], "",
             f"hybrid checkpoint with {len(summary['heads_replaced'])} program heads: {summary['checkpoint']}",
             f"reloaded logits identical: {summary['logits_identical_after_reload']}",
             f"report: {summary['report']}", f"done in {summary['seconds']:.0f} s"]
    return "\n".join(lines)
