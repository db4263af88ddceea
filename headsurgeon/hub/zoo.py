"""The embedded default model: where the shipped tiny GPT-2 and its demo corpus live, and how to load them.

The files under ``zoo_data/`` are package data, built by the recipe at ``recipes/tiny_stories/`` in the
repository (not installed): ``train.py`` writes ``zoo_data/tiny-stories/``, ``sample.py`` writes
``zoo_data/demo_corpus.txt``. The library only locates and loads them, offline.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headsurgeon.core.fileio import split_documents
from ..core import HeadsurgeonError

DEFAULT_NAME = "tiny-stories"
ZOO_DATA = Path(__file__).resolve().parent / "zoo_data"
DEMO_CORPUS_NAME = "demo_corpus.txt"
TRAIN_HINT = "python recipes/tiny_stories/train.py"
SAMPLE_HINT = "python recipes/tiny_stories/sample.py"
# Files that make a shipped model directory loadable offline by transformers.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

__all__ = [
    "DEFAULT_NAME", "DEMO_CORPUS_NAME", "REQUIRED_FILES", "ZOO_DATA", "ZooFilesMissingError", "default_model_dir",
    "demo_corpus_path", "load", "model_dir", "read_demo_corpus",
]


class ZooFilesMissingError(HeadsurgeonError, FileNotFoundError):
    """Raised when the embedded model or demo corpus is not on disk (e.g. a checkout before training)."""


def model_dir(name: str = DEFAULT_NAME, *, check: bool = True) -> Path:
    """Directory of a shipped zoo model by name; with ``check`` raise a clear error when its files are missing."""
    path = ZOO_DATA / name
    if check:
        missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
        if missing:
            known = sorted(p.name for p in ZOO_DATA.iterdir() if p.is_dir()) if ZOO_DATA.is_dir() else []
            raise ZooFilesMissingError(
                f"zoo model {name!r} is incomplete at {path}: missing {', '.join(missing)} "
                f"(shipped models: {known or 'none'}). Build it from a checkout with `{TRAIN_HINT}`"
                + ("" if name == DEFAULT_NAME else f" --out {path}")
                + ", or reinstall headsurgeon."
            )
    return path


def default_model_dir() -> Path:
    """Directory of the embedded default model (``zoo_data/tiny-stories``), loadable offline by transformers."""
    return model_dir(DEFAULT_NAME)


def demo_corpus_path() -> Path:
    """Path of the shipped demo corpus (stories sampled from the default model, blank-line separated)."""
    path = ZOO_DATA / DEMO_CORPUS_NAME
    if not path.is_file():
        raise ZooFilesMissingError(
            f"demo corpus missing at {path}. Build it from a checkout with `{SAMPLE_HINT}` "
            f"(after `{TRAIN_HINT}`), or reinstall headsurgeon."
        )
    return path


def read_demo_corpus() -> list[str]:
    """The shipped demo stories as a list of strings."""
    return split_documents(demo_corpus_path().read_text(encoding="utf-8"))


def load(name: str = DEFAULT_NAME, *, dtype: Any = None) -> tuple[Any, Any]:
    """Load a zoo model and its tokenizer with transformers, offline: ``(GPT2LMHeadModel (eval), tokenizer)``."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    path = model_dir(name)
    model = GPT2LMHeadModel.from_pretrained(path, dtype=dtype or torch.float32, local_files_only=True)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer
