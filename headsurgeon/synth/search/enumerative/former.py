"""``enumerative_search``'s former form, ``(store, heads, synth_idx, select_idx, beam, max_terms, seed, progress,
cache, *, top_k=..., spacy=..., ...)``, read into the current one (headsurgeon/synth/search/enumerative/search.py)
for one release, with a DeprecationWarning naming the new call."""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ...splits import StoreSplits
from .config import EnumerativeConfig
from .util import default_splits

#: the former form's positional parameters, in order (after the store)
POSITIONAL = ("heads", "synth_idx", "select_idx", "beam", "max_terms", "seed", "progress", "cache")
#: the run's plumbing: keywords of the current form too
PLUMBING = ("heads", "progress", "cache", "stats", "budget", "cancel")


def is_current(splits: object, config: Any) -> bool:
    """True when the two arguments after the store read as the current form's splits and config."""
    whole = splits is None or isinstance(splits, (StoreSplits, Mapping)) or hasattr(splits, "indices")
    return whole and (config is None or isinstance(config, EnumerativeConfig))


def read_former(store: Any, positional: tuple[Any, ...], keywords: dict[str, Any]
                ) -> tuple[StoreSplits, EnumerativeConfig, dict[str, Any]]:
    """(splits, config, plumbing given positionally) of a former-form call; warns once per call site."""
    if len(positional) > len(POSITIONAL):
        raise TypeError(f"enumerative_search takes at most {len(POSITIONAL) + 1} positional arguments in its former "
                        f"form; got {len(positional) + 1}")
    given = {name: value for name, value in zip(POSITIONAL, positional) if value is not None}
    twice = sorted(set(given) & set(keywords))
    if twice:
        raise TypeError(f"enumerative_search got multiple values for {', '.join(twice)}")
    given |= keywords
    plumbing = {name: given.pop(name) for name in PLUMBING if name in given}
    synth, select = given.pop("synth_idx", None), given.pop("select_idx", None)
    config = EnumerativeConfig.of(given)
    if synth is None or select is None:
        d_synth, d_select = default_splits(store, config.seed)
        synth, select = (d_synth if synth is None else synth), (d_select if select is None else select)
    warnings.warn("enumerative_search(store, heads, synth_idx, select_idx, beam=..., ...) is deprecated: pass the "
                  "splits whole and the settings as one config, enumerative_search(store, StoreSplits(synth, select), "
                  "EnumerativeConfig(beam=...), heads=..., progress=...)", DeprecationWarning, stacklevel=3)
    return StoreSplits(synth, select), config, plumbing
