"""Where a loaded model came from (``ModelHandle.source``): one frozen record per kind of model source.

Checkpoints reference their base model from it (headsurgeon/hub/checkpoint/base_models.py ``base_reference``) and the manifest
notes it (``to_json``, the same keys in the same order the loaders always wrote), so a record's fields are exactly
what re-loading the model needs. It is a value: change it with ``dataclasses.replace``; nothing caches in it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Union

from ...core import InputError

__all__ = ["Llama2cSource", "GgufSource", "HfSource", "ZooSource", "EmbeddedSource", "ObjectSource", "SourceRecord",
           "source_from_json"]


class _Record:
    """The JSON form shared by every record: ``kind`` first, then the fields; a field whose default is None is
    left out while it is None (the loaders only wrote what they knew)."""

    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The record as manifests and ``describe()`` show it."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # every record class is a dataclass
            value = getattr(self, f.name)
            if not (value is None and f.default is None):
                out[f.name] = value
        return out


@dataclass(frozen=True)
class Llama2cSource(_Record):
    """A llama2.c checkpoint file (and its tokenizer file, when one was given by path), with their sha256."""

    kind: ClassVar[str] = "llama2c"
    path: str
    sha256: str
    tokenizer: str | None = None
    tokenizer_sha256: str | None = None


@dataclass(frozen=True)
class GgufSource(_Record):
    """A GGUF file with its sha256; ``name``: the hub id an installed copy stands for."""

    kind: ClassVar[str] = "gguf"
    path: str
    sha256: str
    name: str | None = None


@dataclass(frozen=True)
class HfSource(_Record):
    """A Hugging Face hub id or a local folder (absolute), and the revision asked for."""

    kind: ClassVar[str] = "hf"
    name_or_path: str
    revision: str | None = None


@dataclass(frozen=True)
class ZooSource(_Record):
    """The embedded default model shipped inside the package."""

    kind: ClassVar[str] = "zoo"
    name: str


@dataclass(frozen=True)
class EmbeddedSource(_Record):
    """Weights embedded in a hybrid checkpoint folder; ``base``: where those weights came from, as its manifest says."""

    kind: ClassVar[str] = "embedded"
    path: str
    weights_sha256: str | None
    base: Mapping[str, Any] | None


@dataclass(frozen=True)
class ObjectSource(_Record):
    """A live model object handed to load_model (it cannot be re-loaded); ``name_or_path`` as its config says."""

    kind: ClassVar[str] = "object"
    name_or_path: str | None = None


SourceRecord = Union[Llama2cSource, GgufSource, HfSource, ZooSource, EmbeddedSource, ObjectSource]
_KINDS: dict[str, type] = {c.kind: c for c in (Llama2cSource, GgufSource, HfSource, ZooSource, EmbeddedSource,
                                                ObjectSource)}


def source_from_json(obj: Mapping[str, Any]) -> SourceRecord:
    """The record ``to_json`` wrote, or an InputError naming the kind or field that is wrong."""
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    cls = _KINDS.get(kind)  # type: ignore[arg-type]  # an unknown kind gives None, refused below
    if cls is None:
        raise InputError(f"unknown model source kind {kind!r}; expected one of {', '.join(_KINDS)}")
    names = {f.name for f in dataclasses.fields(cls)}
    extra = sorted(set(obj) - names - {"kind"})
    if extra:
        raise InputError(f"a {kind} model source has no field {extra[0]!r}; its fields are {', '.join(sorted(names))}")
    try:
        return cls(**{k: v for k, v in obj.items() if k != "kind"})
    except TypeError as e:
        raise InputError(f"a {kind} model source is incomplete ({e})") from None
