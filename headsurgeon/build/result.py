"""``BuildResult``: what a build chose and what it cost, as build.json holds it and as the CLI prints it."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["BUILD_FILE", "BuildResult", "card_metrics"]

BUILD_FILE = "build.json"


@dataclass
class BuildResult:
    """What ``build_hybrid`` chose and what it cost: heads in the order added, the joint re-measurements on the select
    windows, the test cost before healing, and (with healing) the healed cost against the equally tuned base."""

    model: str
    which: str
    target: dict[str, Any]
    heads: list[str]
    order: list[str]
    steps: list[dict[str, Any]]
    select: dict[str, Any] | None
    test: dict[str, Any] | None
    windows: dict[str, int]
    costs: dict[str, Any]
    healed: dict[str, Any] | None = None
    control: dict[str, Any] | None = None
    checkpoint: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    hybrid: Any = field(default=None, repr=False, compare=False)  # the (healed) HybridModel; not in build.json

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hybrid"}

    def format(self) -> str:
        """What a reader asks first: how many heads, what they cost on held-out windows, before and after healing."""
        total = self.target.get("model_heads", 0)
        lines = [f"{self.model}: {len(self.heads)} of {total} heads swapped for their {self.which}s "
                 f"({100 * len(self.heads) / max(total, 1):.1f}%), cheapest single-swap KL first; judged on "
                 f"{self.windows.get('measured', 0)} windows no selection or healing saw"]
        if self.test:
            lines.append(f"  untuned:  {_line(self.test)}")
        if self.healed:
            against = ("the base: distilling from it leaves the base itself unchanged"
                       if self.healed.get("objective") == "kl" else "the base tuned the same way")
            lines.append(f"  healed:   {_line(self.healed['test'])}  (against {against})")
            tries = self.healed.get("budget_tries")
            if tries:
                shown = ", ".join(f"{t['heads']} {t['delta_ppl_pct']:+.2f}% (≤ {t['delta_ppl_ci95_pct'][1]:+.2f}%)"
                                  for t in tries)
                lines.append(f"  the budget held after healing: {len(self.heads)} heads (select windows, healed: "
                             f"{shown})")
        if self.control:
            lines.append("  control, the same number of heads in select-IoU order:")
            lines.append(f"    untuned: {_line(self.control['test'])}")
            if self.control.get("healed"):
                lines.append(f"    healed:  {_line(self.control['healed'])}")
        lines.append(f"  heads: {', '.join(self.heads[:40])}{' …' if len(self.heads) > 40 else ''}")
        ratios = _ratios(self.costs, self.which)
        if ratios:
            lines.append(f"  per head, its cheapest program's single-swap KL over mean-ablating the head: median "
                         f"{sorted(ratios)[len(ratios) // 2]:.2f}; below 1 for {sum(r < 1 for r in ratios)} of "
                         f"{len(ratios)} heads, below 0.5 for {sum(r < 0.5 for r in ratios)}")
        if self.checkpoint:
            lines.append(f"  wrote {self.checkpoint} (with {BUILD_FILE})")
        return "\n".join(lines)


def card_metrics(result: BuildResult) -> dict[str, Any]:
    """The figures the model card shows (the full record is build.json)."""
    out: dict[str, Any] = {"which": result.which, "heads": len(result.heads),
                           "measured_windows": result.windows["measured"]}
    for name, summary in (("untuned", result.test), ("healed", (result.healed or {}).get("test"))):
        if summary:
            out[f"{name}_delta_ppl_pct"] = round(summary["delta_ppl_pct"], 3)
            out[f"{name}_delta_ppl_ci95_pct"] = [round(x, 3) for x in summary["delta_ppl_ci95_pct"]]
            out[f"{name}_kl"] = round(summary["kl"], 5)
    return out


def _ratios(costs: dict[str, Any], which: str) -> list[float]:
    """Per head: the KL of its cheapest candidate over the mean ablation's KL."""
    chosen = costs.get("chosen", {})
    out = []
    for name, row in costs.get("heads", {}).items():
        label = chosen.get(name, which)
        mean = row.get("mean", {}).get("kl")
        own = row.get(label, {}).get("kl")
        if mean and own is not None:
            out.append(own / mean)
    return out


def _line(summary: dict[str, Any]) -> str:
    lo, hi = summary["delta_ppl_ci95_pct"]
    klo, khi = summary["kl_ci95"]
    wide = "  [interval wider than the effect]" if summary.get("delta_wide") else ""
    return (f"ΔPPL {summary['delta_ppl_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}], KL {summary['kl']:.4f} [{klo:.4f}, "
            f"{khi:.4f}] over {summary['tokens']} tokens{wide}")
