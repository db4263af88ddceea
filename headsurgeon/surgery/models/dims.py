"""A model's layer and head counts from its config alone (a llama2.c header, a folder's config.json, a GGUF file's
checked header), so head arguments are checked before any weight loads."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from ...core import Head, HeadLike
from ...core.fileio import UnsafeFileError, read_bounded
from .handle import HeadIndexError
from .gguf_header import read_gguf_header
from .llama2c import read_header

__all__ = ["model_dims", "check_heads_fit"]

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_dims(spec: Any) -> tuple[int, int] | None:
    """(layers, query heads per layer) of a llama2.c file, a GGUF file or a local Hugging Face folder, read from the
    header or config.json alone; None where that is not cheap (a hub id, a loaded module) or not readable (the load
    then reports the problem)."""
    if not isinstance(spec, (str, Path)):
        return None
    text = str(spec)
    try:
        if text.startswith("llama2c:"):
            header = read_header(Path(text[len("llama2c:"):]).expanduser())
            return header["n_layers"], header["n_heads"]
        if text.lower().endswith(".gguf") and Path(text).expanduser().is_file():
            gguf = read_gguf_header(Path(text).expanduser())
            meta = gguf.metadata
            layers, heads = meta.get(f"{gguf.architecture}.block_count"), meta.get(f"{gguf.architecture}.attention.head_count")
            return (layers, heads) if isinstance(layers, int) and isinstance(heads, int) and layers > 0 and heads > 0 else None
        config_file = Path(text).expanduser() / "config.json"
        if config_file.is_file():
            config = json.loads(read_bounded(config_file, 1 << 20, "a model's config.json"))
            config = config.get("text_config", config) if isinstance(config, dict) else {}
            layers, heads = _first(config, _LAYER_KEYS), _first(config, _HEAD_KEYS)
            return (layers, heads) if layers and heads else None
    except (OSError, ValueError, UnsafeFileError):
        return None
    return None


def check_heads_fit(spec: Any, heads: Iterable[HeadLike]) -> None:
    """Raise HeadIndexError for a head that ``spec``'s config says the model lacks (nothing when it cannot say)."""
    dims = model_dims(spec)
    if dims is None:
        return
    layers, per_layer = dims
    name = Path(str(spec).removeprefix("llama2c:")).name
    for key in heads:
        head = Head.parse(key)
        if not 0 <= head.layer < layers:
            raise HeadIndexError(f"layer {head.layer} does not exist: {name} has layers 0..{layers - 1}")
        if not 0 <= head.head < per_layer:
            raise HeadIndexError(f"head {head.head} does not exist: {name} has query heads 0..{per_layer - 1} per layer")
