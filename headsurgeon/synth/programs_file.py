"""Reading a programs.json: bounded in size, parsed JSON, and its layout checked before ProgramSet builds anything.

A programs file may come from anyone (a colleague, a download): every failure is a one-line ProgramError that
names the file, and Python programs inside are only parsed and AST-validated later, never run (SECURITY.md).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from headsurgeon.core.fileio import UnsafeFileError, read_bounded
from headsurgeon.core.formats import FileFormat, check_versioned

from .errors import ProgramError, excerpt

__all__ = ["MAX_PROGRAMS_BYTES", "PROGRAMS", "clip", "read_programs_file"]

#: the largest programs.json read (tables live in a side file, so real sets stay far below)
MAX_PROGRAMS_BYTES = 64 << 20
HEAD = re.compile(r"\s*L\d{1,6}H\d{1,6}\s*", re.IGNORECASE)
FIX = "pass a programs.json written by ProgramSet.save or `headsurgeon explain`"
#: programs.json's format (headsurgeon/core/formats.py): 2 keeps big tables in a side file, sets without one are written as 1;
#: files of version 0 left the field out
PROGRAMS = FileFormat("headsurgeon.programset", 2, (0, 1, 2), "a headsurgeon program set", FIX, default=0,
                      error=ProgramError)


def clip(text: str, limit: int = 500) -> str:
    """``text`` cut to ``limit`` characters: messages from parsing hostile files may quote huge values."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _parse(path: Path) -> Any:
    try:  # no symlinks or devices, the size checked before a byte is read (headsurgeon/core/fileio.py)
        data = read_bounded(path, MAX_PROGRAMS_BYTES, "a programs file")
    except FileNotFoundError:
        raise ProgramError(f"programs file not found: {path}; check the path (--programs on the command line)") from None
    except UnsafeFileError as e:
        raise ProgramError(f"{e}; {FIX}") from None
    except OSError as e:
        raise ProgramError(f"cannot read {path} ({e.strerror or e}); check its permissions") from None
    try:
        return json.loads(data)
    except RecursionError:
        raise ProgramError(f"{path} is nested too deeply to be a programs file; {FIX}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ProgramError(f"{path} is not valid JSON ({clip(str(e), 200)}); {FIX}") from None


def _check_entry(path: Path, n: int, item: Any) -> None:
    if not isinstance(item, dict):
        raise ProgramError(f"{path}: entry {n} of \"programs\" must be an object, got {excerpt(item)}; {FIX}")
    head = item.get("head")
    if not isinstance(head, str) or not HEAD.fullmatch(head):
        raise ProgramError(f"{path}: entry {n} needs a \"head\" like \"L3H5\", got {excerpt(head)}; {FIX}")
    if "program" not in item:
        raise ProgramError(f"{path}: entry {n} ({head.strip()}) has no \"program\"; {FIX}")
    scores = item.get("scores", {})
    if not isinstance(scores, dict) or not all(isinstance(v, dict) for v in scores.values()):
        raise ProgramError(f"{path}: entry {n} ({head.strip()}): \"scores\" must map each split to an object "
                           f"of numbers, got {excerpt(scores)}; {FIX}")
    for key in ("source", "hypothesis"):
        if not isinstance(item.get(key, ""), str):
            raise ProgramError(f"{path}: entry {n} ({head.strip()}): \"{key}\" must be text; {FIX}")


def read_programs_file(path: str | Path) -> dict[str, Any]:
    """The parsed document of a programs file whose layout is a program set's, or a ProgramError saying why not."""
    path = Path(path)
    obj = _parse(path)
    check_versioned(obj, PROGRAMS, str(path))  # the format, then its version: a newer one says to upgrade
    items = obj.get("programs", [])
    if not isinstance(items, list):
        raise ProgramError(f"{path}: \"programs\" must be a list of entries, got {excerpt(items)}; {FIX}")
    for n, item in enumerate(items):
        _check_entry(path, n, item)
    if not isinstance(obj.get("meta", {}), dict) or not isinstance(obj.get("model", ""), str):
        raise ProgramError(f"{path}: \"meta\" must be an object and \"model\" text; {FIX}")
    return obj
