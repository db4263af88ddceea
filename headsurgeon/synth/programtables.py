"""Large numeric tables of program JSON kept out of programs.json, in a safetensors side file (no pickle).

A fitted table program (profile × key weights × class table) is ~88,000 characters of numbers; 40 of them
made programs.json 22 MB. ``pack`` swaps every big list of numbers in a program's JSON for a reference
``{"$table": key}``, keyed by the content hash so repeated tables are stored once; ``unpack`` restores the
exact JSON (ints stay ints, floats are float64 bit for bit), so a program's canonical form and hash survive
the round trip. Lists with uneven nesting, booleans or huge ints stay inline.
"""
from __future__ import annotations

import hashlib
import json
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from ..core.fileio import UnsafeFileError, atomic_file, read_bounded
from .dsl.nodes import NUMBERS
from .errors import ProgramError

#: lists with at least this many numbers go to the side file
MIN_TABLE = 16
REF = "$table"
_EXACT = 2 ** 53


def _leaves(value: Any, depth: int, out: list, lens: list[list[int]]) -> int | None:
    """Flatten ``value``; returns the depth of its numbers (None: uneven, non-numeric or not exact as float64)."""
    if isinstance(value, list):
        if len(lens) <= depth:
            lens.append([])
        lens[depth].append(len(value))
        if value and set(map(type, value)) <= NUMBERS and -_EXACT < min(value) and max(value) < _EXACT:
            out.extend(value)  # a row of plain numbers, exact as float64 (a fitted table holds thousands)
            return depth + 1
        found = None
        for v in value:
            d = _leaves(v, depth + 1, out, lens)
            if d is None or (found is not None and d != found):
                return None
            found = d
        return found if found is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) >= _EXACT:
        return None
    out.append(value)
    return depth


def _table(value: list) -> dict[str, np.ndarray] | None:
    """The arrays that store ``value`` exactly, or None when it should stay inline."""
    leaves: list = []
    lens: list[list[int]] = []
    depth = _leaves(value, 0, leaves, lens)
    if depth is None or len(leaves) < MIN_TABLE:
        return None
    arrays: dict[str, np.ndarray] = {"values": np.asarray(leaves, dtype=np.float64),
                                  "ints": np.asarray([isinstance(v, int) for v in leaves], dtype=np.uint8)}
    for level in range(1, depth):
        arrays[f"lens{level}"] = np.asarray(lens[level], dtype=np.int64)
    arrays["shape"] = np.asarray([depth, len(value)], dtype=np.int64)
    return arrays


def pack(obj: Any, tables: dict[str, np.ndarray]) -> Any:
    """``obj`` with each big numeric list replaced by ``{"$table": key}``; its arrays are added to ``tables``."""
    if isinstance(obj, dict):
        return {k: pack(v, tables) for k, v in obj.items()}
    if isinstance(obj, list):
        arrays = _table(obj)
        if arrays is None:
            return [pack(v, tables) for v in obj]
        key = hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:24]
        for name, arr in arrays.items():
            tables[f"{key}.{name}"] = arr
        return {REF: key}
    return obj


def _rebuild(arrays: dict[str, np.ndarray], key: str) -> list:
    try:
        depth, top = (int(x) for x in arrays[f"{key}.shape"])
        values, ints = arrays[f"{key}.values"], arrays[f"{key}.ints"]
        if values.ndim != 1 or ints.shape != values.shape:
            raise ValueError(f"values {values.shape} and int flags {ints.shape} differ")
        leaves = values.astype(np.float64).tolist()  # floats; the leaves stored as ints become ints again
        for i in np.flatnonzero(ints).tolist():
            leaves[i] = int(leaves[i])
        levels = [arrays[f"{key}.lens{level}"].tolist() for level in range(1, depth)]
    except (KeyError, ValueError, TypeError, OverflowError) as e:
        raise ProgramError(f"table {key!r} is missing or malformed in the tables file ({e})") from None
    items: list = leaves
    for counts in reversed(levels):  # group the flat leaves level by level, innermost first
        if sum(counts) != len(items) or min(counts, default=0) < 0:
            raise ProgramError(f"table {key!r} is malformed in the tables file (lengths do not add up)")
        ends = list(accumulate(counts))
        items = [items[end - c: end] for c, end in zip(counts, ends)]
    if len(items) != top:
        raise ProgramError(f"table {key!r} is malformed in the tables file (length {len(items)}, expected {top})")
    return items


def unpack(obj: Any, tables: dict[str, np.ndarray] | None) -> Any:
    """Undo :func:`pack`; a reference with no tables given is a clear error."""
    if isinstance(obj, dict):
        if set(obj) == {REF}:
            if tables is None:
                raise ProgramError("this program set keeps its tables in a side file (programs.tables.safetensors); "
                                   "load it with ProgramSet.load(path) from the folder that holds both")
            return _rebuild(tables, str(obj[REF]))
        return {k: unpack(v, tables) for k, v in obj.items()}
    if isinstance(obj, list):
        if not _CONTAINERS.intersection(map(type, obj)):
            return list(obj)  # a row of numbers or strings: nothing inside to undo (tables hold thousands)
        return [unpack(v, tables) for v in obj]
    return obj


_CONTAINERS = frozenset((dict, list))


def has_refs(obj: Any) -> bool:
    """Whether ``obj`` holds any table reference."""
    if isinstance(obj, dict):
        return set(obj) == {REF} or any(has_refs(v) for v in obj.values())
    if isinstance(obj, list):
        return any(has_refs(v) for v in obj)
    return False


#: the largest tables side file read (tables of many heads; far more than any selection writes)
MAX_TABLES_BYTES = 1 << 30


def tables_path(json_path: Path) -> Path:
    """The side file beside ``json_path``: programs.json → programs.tables.safetensors."""
    return json_path.with_name(json_path.stem + ".tables.safetensors")


def save_tables(path: Path, tables: dict[str, np.ndarray]) -> str:
    """Write the tables (safetensors) and return the file's sha256."""
    from safetensors.numpy import save

    data = save({k: np.ascontiguousarray(v) for k, v in sorted(tables.items())})
    with atomic_file(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def load_tables(json_path: Path, record: Any) -> dict[str, np.ndarray]:
    """The tables a programs.json names in ``record`` ({"file", "sha256"}), checked against its sha256."""
    from safetensors.numpy import load

    name = record.get("file") if isinstance(record, dict) else None
    if not isinstance(name, str) or not name or Path(name).name != name or name.startswith("."):
        raise ProgramError(f"{json_path}: its tables record must name a file beside it, got {record!r}")
    path = json_path.with_name(name)
    try:  # no symlinks or devices, the size checked before a byte is read (headsurgeon/core/fileio.py)
        data = read_bounded(path, MAX_TABLES_BYTES, "a programs tables file")
    except FileNotFoundError:
        raise ProgramError(f"{json_path} keeps its tables in {name}, which is missing; copy both files") from None
    except UnsafeFileError as e:
        raise ProgramError(f"{e}; copy the tables file written beside {json_path.name}") from None
    except OSError as e:
        raise ProgramError(f"cannot read {path} ({e.strerror or e}); check its permissions") from None
    if record.get("sha256") and hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise ProgramError(f"{path} does not match the sha256 recorded in {json_path.name}; the files belong to "
                           "different saves")
    try:
        return load(data)
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise ProgramError(f"{path} is not a valid safetensors file ({e})") from e
