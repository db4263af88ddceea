"""Where a checkpoint's base model files are found again, without following a path a stranger wrote.

A manifest names a base file inside the checkpoint's folder by its relative path, and any other by its file name
and sha256 (headsurgeon/hub/checkpoint/base_models.py ``portable``). Loading looks for that name inside the folder, in the
folders of ``$HEADSURGEON_BASE_PATH``, and in the index of bases checkpoints were saved on by this user (one small
file per base under the user cache); an absolute or ``..`` path in an old or forged manifest is reduced to its file
name. Whatever is found must still be a regular file with the recorded sha256 (files) or the recorded weights
(folders), so the search decides only where to look, never what is accepted.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from headsurgeon.core.fileio import (SYSTEM_FOLDERS, UnsafeFileError, atomic_write_json, named_file, read_bounded,
                                       sha256_file)
from headsurgeon.surgery.models.gguf import cache_root

__all__ = ["BASE_PATH_ENV", "search_folders", "remember_base", "find_base", "file_digest", "stored_name",
           "reference_fields"]

#: folders, separated by os.pathsep, where load_hybrid looks for base models a manifest names
BASE_PATH_ENV = "HEADSURGEON_BASE_PATH"
_INDEX_ENTRY_BYTES = 4096
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def search_folders() -> list[Path]:
    """The folders of ``$HEADSURGEON_BASE_PATH``, in order (empty entries skipped)."""
    return [Path(p).expanduser() for p in os.environ.get(BASE_PATH_ENV, "").split(os.pathsep) if p]


def file_digest(path: Path) -> str:
    """sha256 of a file, remembered for this process while its size, mtime and inode stay the same."""
    st = os.stat(path)
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def _index_file(key: str) -> Path:
    return cache_root() / "bases" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _index_key(sha256: str | None, name: str, folder: bool) -> str:
    return f"dir:{name}" if folder else f"file:{sha256}"


def remember_base(path: Path, sha256: str | None, folder: bool = False) -> None:
    """Record where a base this user saved a checkpoint on lives, so loading the checkpoint here finds it again."""
    entry = _index_file(_index_key(sha256, path.name, folder))
    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(entry, {"path": str(path.resolve()), "sha256": sha256})
    except OSError:
        pass  # an unwritable cache costs only the convenience: base_model= or the search path still work


def _indexed(sha256: str | None, name: str, folder: bool) -> Path | None:
    """The path the index holds for this base, if any (a damaged or oversized entry is ignored)."""
    try:
        got = json.loads(read_bounded(_index_file(_index_key(sha256, name, folder)), _INDEX_ENTRY_BYTES, "an index entry"))
    except (OSError, UnsafeFileError, ValueError):
        return None
    path = got.get("path") if isinstance(got, dict) else None
    return Path(path) if isinstance(path, str) and Path(path).is_absolute() else None


def _inside(folder: Path, stored: str) -> Path | None:
    """``folder / stored`` when ``stored`` is a clean relative path that stays inside ``folder`` once resolved."""
    parts = PurePosixPath(stored).parts
    if not stored or PurePosixPath(stored).is_absolute() or Path(stored).is_absolute() or ".." in parts:
        return None
    candidate = (folder / stored).resolve()
    root = folder.resolve()
    return candidate if candidate == root or root in candidate.parents else None


def _usable(path: Path, sha256: str | None, folder: bool) -> bool:
    """A candidate is taken when it is a folder (checked later by its weights) or a named file with the sha256."""
    if folder:
        resolved = path.resolve()
        return resolved.is_dir() and not any(top == resolved or top in resolved.parents for top in SYSTEM_FOLDERS)
    try:
        named_file(path, "a base model file")
    except (OSError, UnsafeFileError):
        return False
    return sha256 is None or file_digest(path.resolve()) == sha256


def find_base(folder: Path, stored: str, sha256: str | None, is_folder: bool = False) -> Path:
    """Where the base file (or folder) a manifest names as ``stored`` is: the first usable candidate inside the
    checkpoint ``folder``, on the search path, or in this user's index; when none is, a file of that name that
    exists (whose sha256 the caller then refuses) or the path inside the folder it would have."""
    name = PurePosixPath(stored.replace("\\", "/")).name
    inside = _inside(folder, stored)
    candidates = [inside] if inside is not None else []
    candidates += [d / name for d in search_folders() if name]
    indexed = _indexed(sha256, name, is_folder)
    if indexed is not None:
        candidates.append(indexed)
    for candidate in candidates:
        if _usable(candidate, sha256, is_folder):
            return candidate
    for candidate in candidates:  # none has the recorded sha256: name one that exists, so the error says so
        if candidate.exists():
            return candidate
    return inside if inside is not None else folder / (name or "base-model")


def stored_name(path: Path, folder: Path) -> str:
    """How a manifest names a base at ``path``: relative when inside the checkpoint ``folder``, else its file name."""
    resolved, root = path.resolve(), folder.resolve()
    if root in resolved.parents:
        return resolved.relative_to(root).as_posix()
    return resolved.name


def reference_fields(ref: Mapping[str, Any]) -> list[tuple[str, str | None, bool]]:
    """The fields of a reference that name local files or folders: (field, its sha256 field's value, is a folder)."""
    kind = ref.get("kind")
    if kind == "llama2c":
        return [(f, ref.get(s), False) for f, s in (("path", "sha256"), ("tokenizer", "tokenizer_sha256"))
                if ref.get(f)]
    if kind == "gguf":
        return [("path", ref.get("sha256"), False)]
    if kind == "hf" and ref.get("local"):
        return [("name_or_path", None, True)]
    return []
