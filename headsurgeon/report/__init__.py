"""report.html for a person: per head what it does (gloss, readable program) and how far to trust it (test IoU
against the best template, a size frontier, heatmaps on one window), and a summary in words.

Modules: page.py (the document), heads.py (what is shown per head), plots.py (heatmaps, colour bars,
frontier SVG), words.py (numbers, timings, sweep, notes, the metric paragraph), cost.py (what swapping each
kind of program in costs, from an EvalReport), downstream.py (lm-eval task scores of base and hybrid).
"""
from __future__ import annotations

from .page import write_report
from .plots import heatmap
from .words import METRICS_PARAGRAPH

__all__ = ["write_report", "heatmap", "METRICS_PARAGRAPH"]
