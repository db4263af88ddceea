"""Scores: what a program measured against one head, split → metric → value (headsurgeon/synth/metrics.py computes them).

A ``dict`` underneath, so JSON, ``==`` and ``scores["test"]["iou"]`` read it exactly as the plain dicts it
replaces; ``get(split, metric)`` is the one lookup that answers None when a split or metric was not measured.
"""
from __future__ import annotations

from typing import Any, Mapping

from . import METRICS, WEIGHTED_METRICS, InputError, Metric, Split, WeightedMetric

__all__ = ["Scores"]


class Scores(dict):  # dict[Split, dict[Metric, float]]
    """split ("synth", "select", "test") → {"iou", "jsd", "topq"} → value, in the order they were measured."""

    @classmethod
    def of(cls, scores: Mapping[str, Mapping[str, float]] | None = None) -> "Scores":
        """A copy of ``scores`` (a Scores or a dict of dicts, e.g. programs.json's ``"scores"``); None: empty."""
        if scores is None:
            return cls()
        if not isinstance(scores, Mapping) or not all(isinstance(v, Mapping) for v in scores.values()):
            raise InputError(f"scores must map a split to {{metric: value}}, e.g. {{'test': {{'iou': 0.9}}}}; "
                             f"got {type(scores).__name__}")
        return cls({split: dict(v) for split, v in scores.items()})

    def get(self, split: Split, metric: Metric | WeightedMetric | None = None) -> Any:  # type: ignore[override]  # get(split, metric) narrows dict.get on purpose
        """``metric`` on ``split`` (None when not measured); without a metric, the split's dict (or None)."""
        got = super().get(split)
        if metric is None:
            return got
        if metric not in METRICS + WEIGHTED_METRICS:
            raise InputError(f"Scores.get(split, metric) takes a metric ({', '.join(METRICS + WEIGHTED_METRICS)}), "
                             f"not {metric!r}; "
                             "for a split's dict use scores.get(split)")
        return None if got is None else got.get(metric)

    def iou(self, split: Split = "test") -> float | None:
        """Soft IoU on ``split`` (None when not measured)."""
        return self.get(split, "iou")

    def jsd(self, split: Split = "test") -> float | None:
        """Jensen-Shannon distance on ``split`` (None when not measured)."""
        return self.get(split, "jsd")

    def merge(self, split: Split, values: Mapping[str, float]) -> None:
        """Add (or overwrite) ``values`` measured on ``split``, keeping the order of those already there."""
        self.setdefault(split, {}).update(values)

    def by_metric(self) -> dict[str, dict[str, float]]:
        """metric → split → value: the layout of a programs.json explanation or frontier point (value-weighted
        metrics only where measured)."""
        out = {m: {split: s[m] for split, s in self.items() if m in s} for m in METRICS + WEIGHTED_METRICS}
        return {m: v for m, v in out.items() if v or m in METRICS}

    @classmethod
    def from_by_metric(cls, item: Mapping[str, Any]) -> "Scores":
        """Read :meth:`by_metric`'s layout back from a record (metrics absent from it are skipped)."""
        out = cls()
        for m in METRICS + WEIGHTED_METRICS:
            got = item.get(m) or {}
            if not isinstance(got, Mapping):
                raise InputError(f"a record's {m!r} must map a split to a value, not {type(got).__name__}")
            for split, v in got.items():
                out.setdefault(split, {})[m] = v
        return out

    def to_json(self) -> dict[str, dict[str, float]]:
        """A plain dict of dicts (what programs.json writes under ``"scores"``)."""
        return {split: dict(v) for split, v in self.items()}

    def __repr__(self) -> str:
        return f"Scores({dict.__repr__(self)})"
