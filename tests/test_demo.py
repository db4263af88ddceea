"""The one-command demo on the embedded default (reduced setting): report, checkpoint, identical reload."""
from __future__ import annotations

import json

from headsurgeon.cli import main


def test_demo_runs_end_to_end_on_the_embedded_model(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--max-sequences", "30", "--max-len", "24", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["logits_identical_after_reload"] is True
    assert summary["heads_replaced"] and summary["summary"]["heads"] == 16  # tiny-stories: 4 layers x 4 heads
    for name in ("report.html", "programs.json", "sweep.png", "hybrid/manifest.json", "hybrid/README.md"):
        assert (out / name).exists(), name
    from headsurgeon.hub.checkpoint import load_hybrid

    again = load_hybrid(out / "hybrid")
    assert sorted(f"L{l}H{h}" for l, h in again.replaced) == sorted(summary["heads_replaced"])
    again.restore()
