"""Model cards for hybrid checkpoints: README.md with the metrics tables and the three lines that load it.

The card is rendered from the manifest alone (so it always matches what is saved) and has Hugging Face
front matter, so the same file serves a local directory and a Hub repo.
"""
from __future__ import annotations

from pathlib import Path

import math
from typing import Any, Mapping

from headsurgeon.synth.backends import backend_kinds, get_backend

__all__ = ["render_card", "load_snippet"]


def _fmt(value: Any, limit: int = 80) -> str:
    """A table cell: floats with 4 significant digits, None as an em dash, '|' escaped, text cut at ``limit``."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(_flatten(value, name + "."))
        elif isinstance(value, (list, tuple)) and len(value) > 8:
            rows.append((name, f"[{len(value)} values]"))
        else:
            rows.append((name, value))
    return rows


def load_snippet(location: str, python_hashes: list[str] | None = None) -> str:
    """The three lines that load the checkpoint at ``location`` and run it on a prompt."""
    trust = ""
    if python_hashes:
        trust = ", trust_programs={" + ", ".join(f'"{h}"' for h in python_hashes) + "}"
    return (
        "import headsurgeon as hs\n"
        f'hybrid = hs.load_hybrid("{location}"{trust})\n'
        'logits = hybrid(hybrid.tokenizer("Once upon a time", return_tensors="pt").input_ids)\n'
    )


def _base_line(base: Mapping[str, Any]) -> str:
    kind = base.get("kind")
    if kind == "hf" and base.get("local"):
        return (f"a local Hugging Face folder `{Path(str(base.get('name_or_path'))).name}` (found beside this "
                "checkpoint; elsewhere pass `base_model=\"path/to/it\"` to `load_hybrid`)")
    if kind == "hf":
        rev = base.get("commit") or base.get("revision")
        return f"`{base.get('name_or_path')}`" + (f" at revision `{rev}`" if rev else "") + " (Hugging Face)"
    if kind == "llama2c":
        return (f"llama2.c checkpoint `{Path(str(base.get('path'))).name}` (sha256 `{str(base.get('sha256'))[:16]}…`; "
                "pass `base_model=\"llama2c:path/to/it.bin\"` to `load_hybrid` where it is not beside this checkpoint)")
    if kind == "zoo":
        return f"headsurgeon's embedded model `{base.get('name')}`"
    if kind == "embedded":
        original = base.get("original") or {}
        orig = _base_line(original) if original.get("kind") in ("hf", "llama2c", "zoo") else "an in-memory model"
        return f"weights embedded in this checkpoint (`model.safetensors`, changed from {orig})"
    return f"`{base}`"


def _needs_trust(kind: Any) -> bool:
    """Whether programs of this kind load only when trusted (their backend says so)."""
    return kind in backend_kinds() and get_backend(kind).needs_trust


def render_card(manifest: Mapping[str, Any], location: str) -> str:
    """README.md text for a checkpoint manifest; ``location`` is what the loading snippet points at."""
    heads = manifest.get("heads", {})
    config = manifest.get("config", {})
    base = manifest.get("base", {})
    metrics = manifest.get("metrics", {}) or {}
    python = sorted({h["hash"] for h in heads.values() if _needs_trust(h.get("kind"))})
    n_total = (config.get("n_layers") or 0) * (config.get("n_heads") or 0)

    front = ["---", "library_name: headsurgeon", "tags:", "- headsurgeon", "- hybrid-model",
             "- mechanistic-interpretability", "- attention-heads"]
    if base.get("kind") == "hf" and not base.get("local"):
        front.append(f"base_model: {base.get('name_or_path')}")
    front.append("---")

    lines = front + [
        "",
        f"# Hybrid model: {config.get('name', 'model')} with {len(heads)} program heads",
        "",
        f"{len(heads)} of {n_total or '?'} attention heads of this model are replaced by programs "
        "(DSL expressions over attention primitives, or sandboxed Python) that compute their attention pattern; "
        "the rest of the network is unchanged. Made with headsurgeon "
        f"{manifest.get('library', {}).get('headsurgeon', '')}.",
        "",
        "## Load it",
        "",
        "```python",
        load_snippet(location, python).rstrip("\n"),
        "```",
        "",
    ]
    if python:
        lines += [
            f"This checkpoint holds {len(python)} Python program(s). They load only when trusted "
            "(`trust_programs=True`, or their hashes as above); read them in `programs/` first. They never run "
            "at load time and only ever run in headsurgeon's sandbox (no network, no file writes, CPU/memory limits).",
            "",
        ]
    lines += ["## Metrics", ""]
    rows = _flatten(metrics)
    if rows:
        lines += ["| metric | value |", "|---|---|"] + [f"| {_fmt(k)} | {_fmt(v)} |" for k, v in rows]
    else:
        lines.append("No metrics were recorded when this checkpoint was saved.")
    lines += ["", "## Replaced heads", "",
              "Each head's program in words (a deterministic gloss), how faithful it is on held-out text (soft IoU "
              "with the real pattern, 1 = identical; Jensen-Shannon distance, 0 = identical) and its size "
              "(description length: syntax nodes plus literals).", "",
              "| head | kind | alpha | program | IoU (test) | JSD (test) | source | size | what it attends to |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, item in heads.items():
        test = (item.get("scores") or {}).get("test", {})
        shown = item.get("text") if item.get("kind") == "dsl" else f"`{item.get('program')}`"
        lines.append(f"| {name} | {item.get('kind')} | {_fmt(item.get('alpha'))} | {_fmt(shown)} | "
                     f"{_fmt(test.get('iou'))} | {_fmt(test.get('jsd'))} | {_fmt(item.get('source'))} | "
                     f"{_fmt(item.get('size'))} | {_fmt(item.get('gloss') or None, 300)} |")
    lines += [
        "",
        "## Base model",
        "",
        f"- base: {_base_line(base)}",
        f"- architecture: {config.get('architecture')} ({config.get('n_layers')} layers × {config.get('n_heads')} "
        f"heads, d_model {config.get('d_model')}, {config.get('attention')} attention)",
        f"- weights sha256 (fingerprint of the state dict): `{manifest.get('weights', {}).get('sha256')}`",
        "",
        "## Files",
        "",
        f"`manifest.json` (format `{manifest.get('format')}` version {manifest.get('format_version')}) lists every "
        "file with its sha256; loading verifies all of them and refuses a modified checkpoint.",
        "",
    ]
    for rel, info in sorted((manifest.get("files") or {}).items()):
        if rel != "README.md":
            lines.append(f"- `{rel}` ({info.get('size')} bytes)")
    return "\n".join(lines).rstrip("\n") + "\n"
