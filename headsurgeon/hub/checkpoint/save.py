"""save_hybrid: write a HybridModel as a checkpoint folder, referencing its base or embedding changed weights."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import re
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from headsurgeon import __version__
from headsurgeon.core.fileio import fsync_dir, sha256_file
from headsurgeon.surgery.models.handle import EmbeddedSource, SourceRecord
from headsurgeon.surgery.swap.heal import healing_records
from headsurgeon.surgery.swap.hybrid import HybridModel
from headsurgeon.synth.programset import ProgramSet

from ..card import render_card
from .base_models import base_reference, base_weights, portable
from .embedded import write_embedded
from .errors import CheckpointError
from .folder import carry_user_files, checked_target, clean_stale, previous_files, swap_into_place
from .layout import CARD, CHECKPOINT, MANIFEST, PROGRAM_DIR, WEIGHTS, json_file, write_file
from .lock import folder_lock
from .programs import programs_of
from .weights import check_savable, differing_tensors, hf_state_dict, weights_fingerprint

__all__ = ["save_hybrid"]


def library_versions() -> dict[str, str]:
    """Versions of headsurgeon and the libraries that shape a checkpoint, for the manifest."""
    out = {"headsurgeon": __version__, "torch": torch.__version__}
    for dist in ("transformers", "transformer-lens", "safetensors"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def save_hybrid(hybrid: HybridModel, directory: str | Path, metrics: Mapping[str, Any] | None = None,
                programs: ProgramSet | None = None, *, card_location: str | None = None, overwrite: bool = False,
                extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Save a HybridModel as a checkpoint directory (atomically); weights are embedded only if they changed.

    ``metrics``: any JSON-able dict shown in the model card (e.g. ``{"delta_ppl": 0.04}``). ``programs``: the
    ProgramSet the heads came from (default: the one given to ``replace_heads``), whose per-head scores,
    glosses and provenance go into the manifest and card.
    ``extra_files``: name → bytes of records kept beside the checkpoint (``build.json``), listed and hashed in the
    manifest like every other file. ``card_location``: what the card's loading snippet points at (``hf://org/name``; default: the directory).
    Re-saving replaces only the files the earlier save wrote; other files in the folder are kept. A non-empty
    folder that save_hybrid did not write is refused unless ``overwrite=True`` (which replaces the files with the
    checkpoint's names and still keeps all others).
    Concurrent saves into one folder take turns at the final swap (headsurgeon/hub/checkpoint/lock.py): the last one wins, and
    the folder always holds one complete checkpoint; a concurrent load_hybrid waits for the swap.
    """
    if not isinstance(hybrid, HybridModel):
        raise CheckpointError(f"save_hybrid needs a HybridModel (from replace_heads), got {type(hybrid).__name__}")
    target = checked_target(directory)
    with folder_lock(target, exclusive=False):
        previous_files(target, overwrite)  # refuse a foreign folder before the work; checked again at the swap
    try:
        json_file(dict(metrics or {}))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"metrics must be a JSON-serializable dict: {e}") from e
    healing = healing_records(hybrid)  # hs.heal's records of these weights (headsurgeon/surgery/swap/heal.py)
    try:
        json_file(healing)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"hybrid.healing must be a list of JSON-serializable records (HealReport.to_json()): "
                              f"{e}") from e
    handle = hybrid.handle
    hf = handle.hf_model
    if hf is None:
        raise CheckpointError(
            f"{handle.name} has no Hugging Face model inside (a legacy HookedTransformer?); hybrid checkpoints need "
            "a model loaded with load_model from a hub id, a local directory or a llama2.c file"
        )
    check_savable(handle.model)  # processed (compatibility-mode) weights cannot be saved exactly
    heads = programs_of(hybrid)
    programs = programs if programs is not None else getattr(hybrid, "program_set", None)
    state = hf_state_dict(hf)
    fingerprint = weights_fingerprint(state)

    # reference the base when the weights are untouched, otherwise embed them
    source = handle.source
    ref = base_reference(source, hf)
    changed: list[str] | None = None
    if ref is not None:
        try:
            changed = differing_tensors(state, base_weights(ref, next(iter(state.values())).dtype))
        except Exception as e:  # base unreachable (moved file, offline hub id): embedding is always correct
            warnings.warn(f"cannot re-load the base model to compare weights ({type(e).__name__}: {e}); "
                          "embedding the weights instead")
            changed = None
    embed = ref is None or changed is None or bool(changed)
    if ref is None:
        base: dict[str, Any] = {"kind": "embedded", "original": original_of(source)}
    else:
        base = {"kind": "embedded", "original": portable(ref, target)} if embed else portable(ref, target)

    manifest: dict[str, Any] = {
        **CHECKPOINT.header(),
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "library": library_versions(),
        "base": base,
        "weights": {
            "stored": "embedded" if embed else "reference",
            "file": WEIGHTS if embed else None,
            "sha256": fingerprint,
            "dtype": str(next(iter(state.values())).dtype).replace("torch.", ""),
            "n_tensors": len(state),
            "changed_tensors": (len(changed) if changed is not None else None),
        },
        "config": config_facts(hybrid),
        "heads": {},
        "metrics": dict(metrics or {}),
        **({"healing": healing} if healing else {}),  # an optional key: format version 1 readers ignore it
        "files": {},
    }
    entries = getattr(programs, "entries", None) or {}
    if programs is not None and "program_summary" not in manifest["metrics"] and hasattr(programs, "summary"):
        manifest["metrics"]["program_summary"] = programs.summary("test")

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        written: set[str] = set()
        for head, program, alpha in heads:
            pid = program.hash[:16]
            rel = f"{PROGRAM_DIR}/{pid}{program.suffix}"  # the backend's suffix: ".json" DSL, ".py" Python
            if rel not in written:
                write_file(tmp / rel, program.to_file())
                written.add(rel)
            item: dict[str, Any] = {"layer": head[0], "head": head[1], "alpha": alpha, "program": rel,
                                    "kind": program.kind, "hash": program.hash}
            if program.backend.readable_text:  # DSL: the text beside its file; Python: only the file
                item["text"] = program.text
            item.update(described(program, entries.get(head)))
            manifest["heads"][f"L{head[0]}H{head[1]}"] = item
        if embed:
            write_embedded(tmp, hf, handle.tokenizer, state)
        for name, data in _extra_files(extra_files, tmp).items():
            write_file(tmp / name, data)
        location = card_location or str(target)
        manifest["files"] = file_table(tmp)  # the card lists files; recomputed below with the card
        write_file(tmp / CARD, render_card(manifest, location).encode("utf-8"))
        manifest["files"] = file_table(tmp)
        write_file(tmp / MANIFEST, json_file(manifest))
        with folder_lock(target, exclusive=True):  # another save may have swapped its folder in meanwhile
            clean_stale(target)
            ours = previous_files(target, overwrite)
            carry_user_files(target, tmp, ours, overwrite)
            for folder, _dirs, _names in os.walk(tmp, topdown=False):
                fsync_dir(Path(folder))
            swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def described(program: Any, entry: Any) -> dict[str, Any]:
    """Size, chars and gloss of a head's program, with scores and provenance when the ProgramSet entry chose it
    (as its replacement, explanation or a frontier point; headsurgeon/synth/programset.py)."""
    found = None
    if entry is not None:
        choices = [entry.replacement] if getattr(entry, "program", None) == program else []
        choices += [c for c in [getattr(entry, "explanation", None)] + list(getattr(entry, "frontier", []))
                    if c is not None and c.program == program]
        found = choices[0] if choices else None
    if found is None:
        return {"size": program.size, "chars": len(program.text), "gloss": program.gloss()}
    return {"size": found.size, "chars": found.chars, "gloss": found.gloss, "source": found.source,
            "scores": found.scores.to_json(), "hypothesis": found.hypothesis}


def original_of(source: SourceRecord) -> dict[str, Any] | None:
    """Where embedded weights came from: a re-saved embedded checkpoint keeps its own original base."""
    if isinstance(source, EmbeddedSource):
        return dict(source.base) if source.base is not None else None
    # a note, not a reference: absolute paths of the saving machine shrink to their file names
    return {k: (Path(v).name if isinstance(v, str) and os.path.isabs(v) else v) for k, v in source.to_json().items()}


def config_facts(hybrid: HybridModel) -> dict[str, Any]:
    """The model facts the manifest and card show (layers, heads, architecture, replacement mode)."""
    handle = hybrid.handle
    facts = {k: v for k, v in handle.describe().items() if k not in ("source", "pattern_hooks")}
    hf_cfg = getattr(handle.hf_model, "config", None)
    archs = getattr(hf_cfg, "architectures", None) or [type(handle.hf_model).__name__]
    facts.update({"architecture": archs[0], "model_type": getattr(hf_cfg, "model_type", None),
                  "replacement_mode": hybrid.mode})
    return facts


def file_table(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under ``root`` but the manifest, by relative path."""
    table = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(root).as_posix()
            table[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    return table


def _extra_files(extra: Mapping[str, bytes] | None, tmp: Path) -> dict[str, bytes]:
    """Records saved beside the checkpoint: plain file names that no checkpoint file or folder uses, bytes each."""
    out: dict[str, bytes] = {}
    for name, data in (extra or {}).items():
        if (not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name)
                or name in (MANIFEST, CARD, WEIGHTS, PROGRAM_DIR) or (tmp / name).exists()):
            raise CheckpointError(f"extra file name {name!r} is not a plain file name beside the checkpoint's own "
                                  f"files ({MANIFEST}, {CARD}, {WEIGHTS}, {PROGRAM_DIR}/): use e.g. 'build.json'")
        if not isinstance(data, (bytes, bytearray)):
            raise CheckpointError(f"extra file {name!r} must be bytes, got {type(data).__name__}")
        out[name] = bytes(data)
    return out
