"""The faithful-hybrid table from ``headsurgeon build --json`` records (or checkpoints' build.json): per build, the
share of heads swapped, and the test-window ΔPPL and KL with their intervals for the causal order and the select-IoU
control, before and after healing (healed figures are against the base tuned the same way).

    python benchmarks/faithful_table.py run10.json run25.json budget5.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def cell(summary: dict[str, Any] | None) -> str:
    """ΔPPL [interval] / KL [interval], or a dash."""
    if not summary:
        return "–"
    lo, hi = summary["delta_ppl_ci95_pct"]
    klo, khi = summary["kl_ci95"]
    return (f"{summary['delta_ppl_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}]; KL {summary['kl']:.4f} "
            f"[{klo:.4f}, {khi:.4f}]")


def row(record: dict[str, Any]) -> str:
    target = record["target"]
    share = len(record["heads"]) / max(target["model_heads"], 1)
    asked = f"budget {target['budget_ppl']:g}%" if target.get("budget_ppl") else f"fraction {target['fraction']:g}"
    control = record.get("control") or {}
    healed = record.get("healed") or {}
    return (f"| {asked} | {len(record['heads'])} ({100 * share:.1f}%) | {cell(record.get('test'))} | "
            f"{cell(control.get('test'))} | {cell(healed.get('test'))} | {cell(control.get('healed'))} |")


def main(paths: list[str]) -> None:
    records = [json.loads(Path(p).read_text()) for p in paths]
    first = records[0]
    print(f"{first['model']}, {first['which']}s; test windows: {first['windows']['measured']} "
          f"({first['windows']['test']} test split + {first['windows']['heldout']} held-out), "
          f"{(first.get('test') or {}).get('tokens', '?')} predicted tokens\n")
    for path, record in zip(paths, records):  # where each was chosen, and the heal step kept on the select windows
        heal = (record.get("healed") or {}).get("heal") or {}
        kept = f"; heal kept step {heal['best_step']} of {heal['steps']}" if heal.get("validation") else ""
        print(f"- {Path(path).name}: chosen on {record['windows']['select']} select + "
              f"{record['windows'].get('select_more', 0)} fresh windows{kept}")
    print()
    print("| asked | heads swapped | causal order | select-IoU order | causal order, healed | select-IoU order, "
          "healed |")
    print("|---|---|---|---|---|---|")
    for record in records:
        print(row(record))


if __name__ == "__main__":
    main(sys.argv[1:])
