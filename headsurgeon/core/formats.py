"""The versioned on-disk formats: each declares its name and version once, and one reader/writer pair checks them.

Six formats carry a version (docs/architecture.md, "Versioned files"): the attention store's manifest, programs.json,
the checkpoint manifest, the journal's run.json, a tp run's config.json and the tensor cache's shards. Each is a
:class:`FileFormat`; :func:`read_versioned` reads a file through headsurgeon/core/fileio.py ``read_bounded`` (no links, size
first) and :func:`check_versioned` refuses another format, a malformed version, and a version this library does not
read, so a file from a newer headsurgeon fails with one message naming the file, its version and the fix.
:func:`write_versioned` writes a document with its header through ``atomic_write_bytes``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import HeadsurgeonError
from .fileio import UnsafeFileError, atomic_write_bytes, json_bytes, read_bounded

__all__ = ["FileFormat", "FormatError", "FutureFormatError", "UPGRADE", "check_versioned", "parse_versioned",
           "read_versioned", "write_versioned", "metadata_version"]

#: the fix for a file written by a newer headsurgeon
UPGRADE = "upgrade headsurgeon (pip install -U headsurgeon) to read it"


class FormatError(HeadsurgeonError, ValueError):
    """A versioned file is not of its format, or its version is malformed or not read by this headsurgeon."""


class FutureFormatError(FormatError):
    """A versioned file was written by a newer headsurgeon, in a version this one does not read."""


_FUTURE_ERRORS: dict[type[Exception], type[Exception]] = {}


def _future(error: type[Exception]) -> type[Exception]:
    """The future-version error of a format whose own error class is ``error`` (caught as either), made once."""
    if issubclass(error, FutureFormatError):
        return error
    if error not in _FUTURE_ERRORS:
        _FUTURE_ERRORS[error] = type(f"Future{error.__name__}", (error, FutureFormatError), {"__module__": error.__module__})
    return _FUTURE_ERRORS[error]


@dataclass(frozen=True)
class FileFormat:
    """One versioned format: the ``format`` field's value, the version written today and the versions read.

    ``name`` is None for a file whose only header is its version (a tp run's config.json); ``version_key`` names the
    version's field; ``default`` is the version of files that have none (older writers left it out), None when the
    field is required. ``error`` is the format's own error class, so callers keep catching what they caught;
    ``future`` the class for a newer version (default: one that is both ``error`` and a FutureFormatError).
    ``writer`` is the path of keys to the headsurgeon version a document records (named when it is too new).
    """

    name: str | None
    version: int
    readable: tuple[int, ...]
    what: str
    fix: str
    version_key: str = "version"
    default: int | None = None
    error: type[Exception] = FormatError
    future: type[Exception] | None = None
    writer: tuple[str, ...] = ()

    def header(self, version: int | None = None) -> dict[str, Any]:
        """The leading fields a file of this format starts with (``version``: an older one this library writes)."""
        v = self.version if version is None else version
        return {self.version_key: v} if self.name is None else {"format": self.name, self.version_key: v}

    @property
    def tag(self) -> str:
        """``name/version``: the form a safetensors file's string metadata holds (the tensor cache's shards)."""
        return f"{self.name}/{self.version}"

    def refuse(self, where: str, message: str) -> Exception:
        """This format's error for ``where``."""
        return self.error(f"{where} {message}; {self.fix}")


def check_versioned(obj: Any, fmt: FileFormat, where: str) -> int:
    """The version of a parsed document of ``fmt`` read from ``where``, or ``fmt``'s error saying what is wrong."""
    if not isinstance(obj, dict) or (fmt.name is not None and obj.get("format") != fmt.name):
        found = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise fmt.refuse(where, f"is not {fmt.what} (format {_short(found)}, expected {fmt.name or 'a version'!r})")
    version = obj.get(fmt.version_key, fmt.default)
    if not isinstance(version, int) or isinstance(version, bool):
        raise fmt.refuse(where, f"has a malformed version ({fmt.version_key!r} is {_short(version)}, "
                                "not a whole number)")
    return _check_version(version, fmt, where, _writer(obj, fmt.writer))


def _writer(obj: Any, keys: tuple[str, ...]) -> str | None:
    """The headsurgeon version recorded under ``keys`` in a document (None when there is none)."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if keys and isinstance(obj, str) else None


def _check_version(version: int, fmt: FileFormat, where: str, writer: str | None = None) -> int:
    if version in fmt.readable:
        return version
    if version > max(fmt.readable):
        by = f", written by headsurgeon {_short(writer, 40)}" if writer else ""
        raise (fmt.future or _future(fmt.error))(f"{where} is {fmt.what} of format version {version}{by}; "
                                                 f"{UPGRADE} (this one reads version {_versions(fmt)})")
    raise fmt.refuse(where, f"is {fmt.what} of format version {version}, which this headsurgeon no longer reads "
                            f"(it reads version {_versions(fmt)})")


def metadata_version(tag: Any, fmt: FileFormat, where: str) -> int:
    """The version in a ``name/version`` metadata string (a safetensors header's), checked as check_versioned does."""
    name, _, number = str(tag).rpartition("/")
    if name != fmt.name or not number.isdigit():
        raise fmt.refuse(where, f"is not {fmt.what} (format {_short(tag)}, expected {fmt.tag!r})")
    return _check_version(int(number), fmt, where)


def parse_versioned(data: bytes, fmt: FileFormat, where: str) -> dict[str, Any]:
    """The JSON document of ``fmt`` held by ``data`` (read from ``where``: a path or URL), its version checked."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise fmt.refuse(where, f"is unreadable or corrupted ({_short(str(e))})") from None
    check_versioned(obj, fmt, where)
    return obj


def read_versioned(path: str | Path, fmt: FileFormat, limit: int) -> dict[str, Any]:
    """Read a file of ``fmt`` bounded by ``limit`` bytes (headsurgeon/core/fileio.py ``read_bounded``) and check its version.

    A missing file raises FileNotFoundError (callers name what to run), a link, device or oversized file
    read_bounded's UnsafeFileError (it names the file and the fix); other refusals are ``fmt``'s error.
    """
    try:
        data = read_bounded(path, limit, fmt.what)
    except (FileNotFoundError, UnsafeFileError):
        raise
    except OSError as e:
        raise fmt.refuse(str(path), f"is unreadable ({e.strerror or e})") from None
    return parse_versioned(data, fmt, str(path))


def write_versioned(path: str | Path, fmt: FileFormat, body: dict[str, Any], version: int | None = None,
                    encode: Callable[[dict[str, Any]], bytes] = json_bytes) -> dict[str, Any]:
    """Write ``body`` after ``fmt``'s header atomically (``encode`` gives the format's bytes); returns the document."""
    doc = {**fmt.header(version), **body}
    atomic_write_bytes(path, encode(doc))
    return doc


def _versions(fmt: FileFormat) -> str:
    vs = sorted(fmt.readable)
    return str(vs[0]) if len(vs) == 1 else f"{vs[0]} to {vs[-1]}" if vs == list(range(vs[0], vs[-1] + 1)) else \
        ", ".join(map(str, vs))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
