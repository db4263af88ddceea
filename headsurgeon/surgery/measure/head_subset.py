"""Which heads a run explains (``HeadsConfig``): named heads, whole layers, or the top K of a head finder."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from ...core import Head, InputError
from ..configs import HeadsConfig

if TYPE_CHECKING:  # surgery/models/handle.py imports torch, which this module does without
    from ..models.handle import ModelHandle

__all__ = ["parse_heads", "parse_layers", "choose_heads", "check_subset"]

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_heads(items: Iterable[Any]) -> list[Head]:
    """Heads from items like ``"L17H3,L18H6"``, ``"L2H0"`` or ``(2, 0)``, in order, each once."""
    out: list[Head] = []
    for item in items:
        for key in (item.split(",") if isinstance(item, str) else [item]):
            if isinstance(key, str) and not key.strip():
                continue
            head = Head.parse(key.strip() if isinstance(key, str) else key)
            if head not in out:
                out.append(head)
    return out


def parse_layers(text: str) -> list[int]:
    """Layers from ``"16-20"`` (inclusive) or ``"0,3,5-7"``, sorted, each once."""
    layers: set[int] = set()
    for part in str(text).split(","):
        m = _RANGE.fullmatch(part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise InputError(f"cannot read layers {text!r}: write a range like 16-20 or a list like 0,3,5-7")
        layers.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return sorted(layers)


def check_subset(config: HeadsConfig) -> None:
    """What can be checked before a model loads: the heads and layers are written readably."""
    parse_heads(config.heads or ())
    if config.layers is not None:
        parse_layers(config.layers)


def choose_heads(handle: ModelHandle, config: HeadsConfig) -> list[Head] | None:
    """The heads ``config`` names on ``handle``, sorted; None (every head) when it names none."""
    if not (config.heads or config.layers is not None or config.top):
        return None
    pool: list[Head] = []
    for head in parse_heads(config.heads or ()):
        handle.check_head(*head)
        pool.append(head)
    if config.layers is not None:
        for layer in parse_layers(config.layers):
            handle.check_head(layer, 0)
            pool += [Head(layer, h) for h in range(handle.n_heads) if Head(layer, h) not in pool]
    if not pool:
        pool = [Head(layer, h) for layer in range(handle.n_layers) for h in range(handle.n_heads)]
    if config.top:
        from .head_finders import head_scores

        scores = head_scores(handle, config.by).scores
        pool = sorted(pool, key=lambda h: -float(scores[h]))[: config.top]
    return sorted(pool)
