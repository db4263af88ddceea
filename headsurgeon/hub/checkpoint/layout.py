"""The names, limits and file writing of a checkpoint folder (see the package docstring for the layout).

Files are written straight into the save's private temporary folder and fsynced; the save is atomic as a
whole because that folder is renamed into place (``folder.swap_into_place``), so no file needs its own swap.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headsurgeon.core.fileio import fsync_file, json_bytes
from headsurgeon.core.formats import FileFormat

from .errors import FormatVersionError, IntegrityError

#: manifest.json's format (headsurgeon/core/formats.py); its version lives in ``format_version``
CHECKPOINT = FileFormat("headsurgeon.hybrid", 1, (1,), "a headsurgeon hybrid checkpoint manifest",
                        "the checkpoint is damaged: save it again", version_key="format_version",
                        error=IntegrityError, future=FormatVersionError, writer=("library", "headsurgeon"))
FORMAT, FORMAT_VERSION = CHECKPOINT.name, CHECKPOINT.version
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
PROGRAM_DIR = "programs"
CARD = "README.md"
MAX_MANIFEST_BYTES = 64 << 20
MAX_PROGRAM_BYTES = 8 << 20


def json_file(obj: Any) -> bytes:
    """A checkpoint JSON file: indent 1, keys in insertion order, NaN/inf as null, final newline."""
    return json_bytes(obj, indent=1, sort_keys=False) + b"\n"


def write_file(path: Path, data: bytes) -> None:
    """Write one file of the save's temporary folder and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    fsync_file(path)
