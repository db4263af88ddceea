"""``StoreSplits``: the synth, select and test windows of a store as one value, by store index. Searchers fit on
synth and score on select, selection chooses on select and reports on test; every stage takes this value whole
(headsurgeon/surgery/corpus.py ``Splits.indices`` makes it from the windows a store captured)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Union

from ..core import SPLITS, InputError, NotFoundError, Split

__all__ = ["StoreSplits", "SplitsLike", "HasIndices"]


def _ints(values: Iterable[Any], name: str) -> tuple[int, ...]:
    try:
        return tuple(int(i) for i in values)
    except (TypeError, ValueError):
        raise InputError(f"the {name} split must be store indices (whole numbers); got {values!r}") from None


class HasIndices(Protocol):
    """A corpus ``Splits`` (headsurgeon/surgery/corpus.py), read here by its ``indices`` alone."""

    @property
    def indices(self) -> "StoreSplits": ...


@dataclass(frozen=True, init=False)
class StoreSplits:
    """Store indices of the synth (fit), select (choose) and test (report) windows; ``splits["select"]`` gives a
    split as a list."""

    synth: tuple[int, ...]
    select: tuple[int, ...]
    test: tuple[int, ...]

    def __init__(self, synth: Iterable[int], select: Iterable[int], test: Iterable[int] = ()) -> None:
        for name, values in zip(SPLITS, (synth, select, test)):
            object.__setattr__(self, name, _ints(values, name))

    def __getitem__(self, name: Split) -> list[int]:
        if name not in SPLITS:
            raise NotFoundError(f"unknown split {name!r}; use one of {SPLITS}")
        return list(getattr(self, name))

    @classmethod
    def of(cls, value: "SplitsLike") -> "StoreSplits":
        """``value`` as StoreSplits: itself, a mapping {"synth": [...], "select": [...], "test": [...]} ("test"
        optional), or a corpus ``Splits`` (its ``indices``)."""
        if isinstance(value, cls):
            return value
        indices = getattr(value, "indices", value)
        if isinstance(indices, cls):
            return indices
        if isinstance(indices, Mapping) and "synth" in indices and "select" in indices:
            return cls(indices["synth"], indices["select"], indices.get("test", ()))
        raise InputError(f"splits must be a StoreSplits, a corpus Splits or a mapping with 'synth' and 'select' store "
                         f"indices; got {type(value).__name__}")

    def checked(self, who: str) -> tuple[list[int], list[int]]:
        """(synth, select) as lists; an InputError when either is empty or they share windows."""
        synth, select = list(self.synth), list(self.select)
        if not synth or not select:
            raise InputError(f"{who} needs non-empty synth and select splits; got {len(synth)} and {len(select)} "
                             "windows")
        if set(synth) & set(select):
            raise InputError(f"{who}: synth and select share sequences; select must be held out from synth")
        return synth, select

    def to_json(self) -> dict[str, list[int]]:
        """{"synth": [...], "select": [...], "test": [...]}."""
        return {name: list(getattr(self, name)) for name in SPLITS}


#: what every stage that takes the splits reads (``StoreSplits.of``): StoreSplits, a corpus Splits, or a mapping
SplitsLike = Union[StoreSplits, HasIndices, Mapping[str, Iterable[int]]]
