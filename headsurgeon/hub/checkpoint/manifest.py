"""manifest.json: read and check a checkpoint's manifest (format, version, sections) like any checkpoint file."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headsurgeon.synth.errors import excerpt

from headsurgeon.core.formats import check_versioned

from .errors import IntegrityError, NotACheckpointError
from .files import read_whole
from .layout import CHECKPOINT, FORMAT, MANIFEST, MAX_MANIFEST_BYTES
from .location import snapshot_blobs

__all__ = ["read_manifest", "read_manifest_at", "hub_links"]


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Read and check a checkpoint's manifest.json (format and version), without verifying files."""
    root = Path(directory).expanduser()
    return read_manifest_at(root, hub_links(root))


def hub_links(root: Path) -> Path | None:
    """Where a Hub cache snapshot's file links may point (its blobs folder); None for any other folder."""
    return snapshot_blobs(root)


def read_manifest_at(root: Path, links_into: Path | None = None) -> dict[str, Any]:
    """read_manifest, reading manifest.json like every checkpoint file: no symlink, regular, bounded in size."""
    if not root.exists():
        leftovers = sorted(root.parent.glob(f".{root.name}.old-*")) if root.parent.is_dir() else []
        hint = (f"; a save was interrupted while replacing it: the previous checkpoint is at {leftovers[0]}"
                if leftovers else "")
        raise NotACheckpointError(f"{root} does not exist{hint}")
    if not root.is_dir():
        raise NotACheckpointError(f"{root} is a file, not a hybrid checkpoint directory (written by save_hybrid)")
    path = root / MANIFEST
    if not os.path.lexists(path):
        raise NotACheckpointError(
            f"{root} is not a headsurgeon hybrid checkpoint: it has no {MANIFEST}. Save one with "
            "headsurgeon.save_hybrid(hybrid, dir), or load a plain model with load_model"
        )
    raw = read_whole(root, MANIFEST, MAX_MANIFEST_BYTES, links_into)
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise IntegrityError(f"{path} is not valid JSON ({excerpt(str(e))}); the checkpoint is damaged: save it "
                             "again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise NotACheckpointError(
            f"{path} is not a headsurgeon hybrid manifest (format {excerpt(found)}, expected {FORMAT!r})"
        )
    check_versioned(manifest, CHECKPOINT, str(path))  # FormatVersionError for a newer version (headsurgeon/core/formats.py)
    for key in ("heads", "files", "weights", "base"):
        if not isinstance(manifest.get(key), dict):
            raise IntegrityError(f"{path} lacks the {key!r} section; the checkpoint is damaged: save it again")
    return manifest
