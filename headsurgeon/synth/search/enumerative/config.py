"""The enumerative search's settings as one frozen value (headsurgeon/synth/search/enumerative/search.py reads them);
explain hands them over as ``SearchConfig.enumerative`` (headsurgeon/synth/search/config.py)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ....core import InputError

if TYPE_CHECKING:
    from ...program import Program

__all__ = ["EnumerativeConfig"]


@dataclass(frozen=True)
class EnumerativeConfig:
    """What the enumerative search fits and keeps per head (explain runs the defaults unless given others)."""

    beam: int = 6  # supports kept per mixture size
    max_terms: int = 5  # most terms in a mixture
    top_k: int = 5  # candidates kept per head: the best by JSD plus the two best by IoU on the fit set
    fit_sequences: int | None = 96  # size of the seeded synth sample the search fits and ranks on (None: all)
    gates: int = 3  # query-gated proposals per head
    # also fit mul(profile(..), key_weight(..)) programs, a softmax over offset and key-token logits with query-token
    # temperature gates, over the key_weights most frequent tokens (causal models only: a profile scores no key ahead
    # of the query; headsurgeon/synth/search/enumerative/tables.py)
    tables: bool = True
    key_weights: int = 256
    spacy: bool | None = None  # spaCy features (POS, dependencies); None: when the spaCy model loads
    # per finite size budget (headsurgeon/synth/program.py BUDGETS, characters rendered with token strings), the best
    # `small` compositions within it by JSD and `small // 2` by IoU are kept too
    # (headsurgeon/synth/search/enumerative/small.py; 0: none)
    small: int = 4
    # with value norms in the store, each head also keeps its chains of up to this many query gates over first() /
    # induction mixtures fitted to what it moves (headsurgeon/synth/search/enumerative/moved.py; 0: none)
    moved_depth: int = 3
    seed: int = 0  # the fit sample's (and the default split's) seed
    library: tuple[Program, ...] | None = None  # single DSL primitives to start from (None: primitive_library)

    def __post_init__(self) -> None:
        if self.beam < 1 or self.max_terms < 1 or self.top_k < 1 or self.small < 0:
            raise InputError(f"beam, max_terms and top_k must be >= 1 and small >= 0; got {self.beam}, "
                             f"{self.max_terms}, {self.top_k}, {self.small}")
        if self.library is not None and not isinstance(self.library, tuple):
            object.__setattr__(self, "library", tuple(self.library))  # a list given: kept hashable and unchanged

    @classmethod
    def of(cls, value: EnumerativeConfig | Mapping[str, Any] | None = None, **overrides: Any) -> EnumerativeConfig:
        """``value`` as a config: itself, or its fields as a mapping (``{"beam": 2, "spacy": False}``), or the
        defaults for None; ``overrides`` replace fields of the result."""
        if value is None or isinstance(value, cls):
            base = value or cls()
        elif isinstance(value, Mapping):
            base = cls(**_known(dict(value)))
        else:
            raise InputError(f"the enumerative settings must be an EnumerativeConfig or a mapping of its fields; "
                             f"got {type(value).__name__}")
        return dataclasses.replace(base, **_known(overrides)) if overrides else base


def _known(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` when each names a field of :class:`EnumerativeConfig`; else an InputError listing them."""
    names = [f.name for f in dataclasses.fields(EnumerativeConfig)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise InputError(f"unknown enumerative setting(s) {', '.join(unknown)}; EnumerativeConfig has "
                         f"{', '.join(names)}")
    return fields
