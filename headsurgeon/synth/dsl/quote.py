"""Quoting hostile input in error messages: a small, cheap and safe stand-in for any value."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import excerpt


class _Raw(str):
    """A string that ``repr`` shows as is (placeholders inside clipped values)."""

    def __repr__(self) -> str:
        return str(self)


_CLIP_ITEMS = 6


def _clip(value: Any, depth: int = 0) -> Any:
    """A small stand-in for ``value`` (few items, shallow, short strings) that is cheap and safe to ``repr``."""
    if value is None or isinstance(value, (bool, float, np.floating)):
        return value
    if isinstance(value, (int, np.integer)):
        v = int(value)
        return v if v.bit_length() <= 64 else _Raw(f"<an integer of {v.bit_length()} bits>")
    if isinstance(value, str):
        return value if len(value) <= 60 else _Raw(repr(value[:60]) + f"... ({len(value)} characters)")
    if isinstance(value, (list, tuple)):
        if depth >= 2:
            return _Raw("[...]")
        items = [_clip(v, depth + 1) for v in value[:_CLIP_ITEMS]]
        return items + [_Raw(f"... ({len(value)} items)")] if len(value) > _CLIP_ITEMS else items
    if isinstance(value, dict):
        if depth >= 2:
            return _Raw("{...}")
        out = {_Raw(repr(_clip(k, 2))): _clip(v, depth + 1) for k, v in list(value.items())[:_CLIP_ITEMS]}
        if len(value) > _CLIP_ITEMS:
            out[_Raw("...")] = _Raw(f"({len(value)} keys)")
        return out
    return _Raw(f"<{type(value).__name__}>")


def _show(value: Any) -> str:
    """Quote an input value in an error message: at most about 200 characters, whatever its size or depth."""
    clipped = _clip(value)
    return str(clipped) if isinstance(clipped, _Raw) else excerpt(clipped)
