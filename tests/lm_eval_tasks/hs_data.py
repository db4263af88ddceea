"""Datasets of the local lm-eval tasks, read from the JSONL files next to this file (no download)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

HERE = Path(__file__).resolve().parent


def _load(name: str) -> dict[str, datasets.Dataset]:
    rows = [json.loads(line) for line in (HERE / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}


def cloze(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("cloze.jsonl")


def rolling(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("rolling.jsonl")


def generate(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("generate.jsonl")
