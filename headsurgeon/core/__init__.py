"""The vocabulary every stage shares: one head type, the closed sets as Literals, and the library's error base.

It sits in the bottom layer (docs/architecture.md, Layers) so that every package names these the same way.
"""
from __future__ import annotations

import re
from typing import Any, Literal, NamedTuple, Union, get_args

__all__ = ["Head", "HeadLike", "HeadError", "HeadsurgeonError", "InputError", "JournalMismatchError", "NotFoundError", "Split", "SPLITS",
           "Which", "WHICHES", "HealObjective", "HEAL_OBJECTIVES", "AblationKind", "ABLATION_KINDS", "Metric", "METRICS", "WeightedMetric", "WEIGHTED_METRICS",
           "SelectBy", "SELECT_BY", "check_choice"]


class HeadsurgeonError(Exception):
    """Base of every error the library raises on bad input or a failed step; the CLI prints these as one line."""


class InputError(HeadsurgeonError, ValueError):
    """An argument or file the caller gave is out of range or malformed; also a ValueError, which callers may catch."""


class JournalMismatchError(HeadsurgeonError, ValueError):
    """A resumable journal (explain's heads, the LLM agent's run) was written by a run with other inputs."""


class NotFoundError(HeadsurgeonError, KeyError):
    """A name the caller asked for (a split, a stored sequence) does not exist; also a KeyError, which callers may catch."""

    def __str__(self) -> str:  # the message as written, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


Split = Literal["synth", "select", "test"]
SPLITS: tuple[Split, ...] = get_args(Split)

Which = Literal["replacement", "explanation"]
WHICHES: tuple[Which, ...] = get_args(Which)

#: what ``heal`` trains for: next-token loss, or KL from the base (headsurgeon/surgery/swap/heal.py)
HealObjective = Literal["lm", "kl"]
HEAL_OBJECTIVES: tuple[HealObjective, ...] = get_args(HealObjective)

AblationKind = Literal["zero", "mean", "mean_output", "uniform", "resample", "program"]
ABLATION_KINDS: tuple[AblationKind, ...] = get_args(AblationKind)

#: a candidate's scores per split (headsurgeon/synth/metrics.py): soft IoU, Jensen-Shannon distance, top-q set IoU
Metric = Literal["iou", "jsd", "topq"]
METRICS: tuple[Metric, ...] = get_args(Metric)
#: the value-weighted ones (headsurgeon/synth/weighted.py): IoU and JSD of rows weighed by each key's value norm through the head,
#: and ``vw_r2``, the share of the head's norm-weighted squared departure from its mean pattern that a program reproduces
WeightedMetric = Literal["vw_iou", "vw_jsd", "vw_r2"]
WEIGHTED_METRICS: tuple[WeightedMetric, ...] = get_args(WeightedMetric)
#: what selection may rank by: higher is better for the IoUs, lower for the distances (headsurgeon/synth/select.py)
SelectBy = Literal["iou", "vw_iou", "vw_jsd", "jsd", "vw_r2"]
SELECT_BY: tuple[SelectBy, ...] = get_args(SelectBy)

_HEAD = re.compile(r"\s*L(\d+)\s*H(\d+)\s*|\s*(\d+)\s*[.,:/]\s*(\d+)\s*", re.IGNORECASE)


class HeadError(HeadsurgeonError, ValueError):
    """A head written in a form the library does not read."""


def check_choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``choices``, else a HeadsurgeonError naming ``what`` and the choices."""
    if value not in choices:
        raise HeadsurgeonError(f"{what} must be one of {', '.join(choices)}, not {value!r}")
    return value


class Head(NamedTuple):
    """A query head: ``Head(3, 5)``, written ``L3H5``. A tuple, so ``(3, 5)`` keys find it in dicts."""

    layer: int
    head: int

    @classmethod
    def parse(cls, key: Any) -> "Head":
        """``"L3H5"`` (any case, spaces allowed), ``"3.5"``, ``(3, 5)`` or a Head → ``Head(3, 5)``; anything else is a
        HeadError."""
        if isinstance(key, str):
            m = _HEAD.fullmatch(key)
            if not m:
                raise HeadError(f"cannot read head {key!r}: write 'L3H5' (layer 3, query head 5) or (3, 5)")
            layer, head = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
            return cls(int(layer), int(head))
        if isinstance(key, (tuple, list)) and len(key) == 2 and all(_is_index(x) for x in key):
            return cls(int(key[0]), int(key[1]))
        raise HeadError(f"cannot read head {key!r}: write 'L3H5' or (layer, head) with non-negative integers")

    @classmethod
    def label(cls, key: Any) -> str:
        """Any form ``parse`` reads → its name, ``"L3H5"``."""
        return str(cls.parse(key))

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"


#: what every function that takes a head reads: a Head, "L3H5" or "3.5", or (layer, head)
HeadLike = Union[Head, str, tuple[int, int]]


def _is_index(x: Any) -> bool:
    """A non-negative integer (numpy integers included, bools not)."""
    return not isinstance(x, bool) and hasattr(x, "__index__") and int(x.__index__()) >= 0
