"""A bounded reader of a GGUF file's header, run before transformers or the gguf package parse the file.

A GGUF from a stranger may be truncated, damaged or hostile; parsers that trust its counts and lengths fail with
errors that say nothing about the file (headsurgeon/surgery/models/gguf.py called every such file an unsupported architecture). This
reader reads only the header (magic, version, counts, key/values, tensor infos), bounds every count and length by
the bytes left in the file before reading them, and checks each tensor's type, dimensions, alignment and byte range
against the file's size. Its errors name the byte offset and the problem, and end with advice to compare the
file's size and sha256 with the publisher's.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any, BinaryIO

from ...core.fileio import sha256_file
from .handle import ModelLoadError

__all__ = ["GGUFFileError", "GGUFHeader", "GGUFTensorInfo", "read_gguf_header", "MAX_DIMS", "MAX_ARRAY_DEPTH"]

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 (32-bit counts) has not been written since 2023; transformers reads 2 and 3
MAX_DIMS = 4  # GGML_MAX_DIMS in ggml.h: a tensor has at most four dimensions
MAX_ARRAY_DEPTH = 8  # arrays of arrays: real files nest at most once
MAX_KEY_BYTES = 65535  # the GGUF spec bounds key lengths to 2^16 - 1 bytes
PLAUSIBLE_BYTES = 1 << 40  # a count or length past the end by less was cut short; by more, it is damaged
DEFAULT_ALIGNMENT = 32
# value type -> (struct format, size); 8 = string and 9 = array are read apart
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
               8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}
_MIN_KV = 8 + 4 + 1  # an empty key, its type, the smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # an empty name, n_dims = 0, type, offset


class GGUFFileError(ModelLoadError):
    """A file that is not a well-formed GGUF file: damaged, truncated, or not GGUF at all."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor's entry in the header: name, dimensions (GGUF order), ggml type, byte range in the file."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    start: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """What the header of a GGUF file declares, every part of it checked against the file's size."""

    version: int
    metadata: dict[str, Any]  # key -> value; arrays of numbers are summarized as their length
    tensors: tuple[GGUFTensorInfo, ...]
    alignment: int
    data_start: int
    size: int

    @property
    def architecture(self) -> str | None:
        """``general.architecture``, or None when the file does not declare one."""
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


def _pow2(n: int) -> str:
    """A count as written in errors: exact powers of two from 2^16 up also as 2^k (hostile counts usually are)."""
    if n >= 1 << 16 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return str(n)


class _Reader:
    """Sequential reads of a file that refuse to go past its end, each naming what it was reading."""

    def __init__(self, f: BinaryIO, size: int, fail: Any) -> None:
        self.f, self.size, self.pos, self.fail = f, size, 0, fail

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            self.fail(f"truncated at byte {self.size} of {self.pos + n}: {what} at byte {self.pos} needs {n} bytes, "
                      f"{self.left()} are left")
        data = self.f.read(n)
        if len(data) != n:
            self.fail(f"the file shrank while it was read (at byte {self.pos})")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n > self.left():
            self.take(n, what)  # fails with the truncation message
        self.f.seek(n, 1)
        self.pos += n

    def scalar(self, vtype: int, what: str) -> Any:
        fmt, n = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(n, what))[0]

    def count(self, what: str, min_each: int) -> int:
        """A uint64 count of things of ``min_each`` bytes or more, refused when the rest of the file cannot hold it."""
        at = self.pos
        n = self.scalar(10, what)
        room = self.left() // max(min_each, 1)
        if n > room:
            self._beyond(n * max(min_each, 1), f"{what} {_pow2(n)} at byte {at}",
                         f"{what} {_pow2(n)} at byte {at} exceeds what the {self.left()} bytes left in the file can "
                         f"hold (at most {room})")
        return n

    def _beyond(self, need: int, what: str, damaged: str) -> None:
        """A count or length running past the end: a plausible one means the file was cut short, else it is damaged."""
        if need < PLAUSIBLE_BYTES:
            self.fail(f"truncated at byte {self.size} of at least {self.pos + need}: {what} needs {need} bytes from "
                      f"byte {self.pos}, {self.left()} are left")
        self.fail(damaged)

    def string(self, what: str, limit: int | None = None) -> str:
        at = self.pos
        n = self.scalar(10, f"the length of {what}")
        if limit is not None and n > limit:
            self.fail(f"{what} at byte {at} claims a length of {_pow2(n)} bytes, more than the limit of {limit}")
        if n > self.left():
            self._beyond(n, f"{what} (its length at byte {at})",
                         f"{what} at byte {at} claims a length of {_pow2(n)} bytes, more than the {self.left()} bytes "
                         "left in the file")
        return self.take(n, what).decode("utf-8", "replace")  # the parsers decide about bytes that are not UTF-8


def _value(r: _Reader, vtype: int, key: str, depth: int = 0) -> Any:
    """One metadata value; arrays of numbers are skipped over (their length is kept), arrays of strings are read."""
    at = r.pos
    if vtype in _SCALARS:
        return r.scalar(vtype, f"the value of {key!r}")
    if vtype == _STRING:
        return r.string(f"the value of {key!r}")
    if vtype != _ARRAY:
        r.fail(f"key {key!r} has value type {vtype} at byte {at - 4}; GGUF value types are 0 to 12")
    if depth >= MAX_ARRAY_DEPTH:
        r.fail(f"key {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep at byte {at}")
    etype = r.scalar(4, f"the element type of {key!r}")
    if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
        r.fail(f"key {key!r} is an array of type {etype} at byte {at}; GGUF value types are 0 to 12")
    min_each = _SCALARS[etype][1] if etype in _SCALARS else 8 if etype == _STRING else 12  # 12: type + length
    n = r.count(f"the array length of {key!r}", min_each)
    if etype in _SCALARS:
        r.skip(n * _SCALARS[etype][1], f"the {n} {_TYPE_NAMES[etype]} values of {key!r}")
        return n
    return [_value(r, etype, f"{key}[{i}]", depth + 1) for i in range(n)]


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type -> (elements per block, bytes per block), from the gguf package's table (its constants only)."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (int(b), int(s)) for t, (b, s) in GGML_QUANT_SIZES.items()}


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The checked header of a GGUF file; :class:`GGUFFileError` naming the byte and the problem where it is damaged."""
    path = Path(path)

    def fail(problem: str) -> None:
        raise GGUFFileError(f"{path}: {problem}; the file is damaged or is not GGUF. {advice(path)}")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        r = _Reader(f, size, fail)
        head = f.read(4)
        if head != MAGIC:
            kind = "the file is empty" if not head else f"it starts with {head!r}, not {MAGIC!r}"
            raise GGUFFileError(f"{path}: not a GGUF file: no magic ({kind}). {advice(path)}")
        r.pos = 4
        version = r.scalar(4, "the version")
        if version not in VERSIONS:
            fail(f"GGUF version {version} at byte 4; this reader takes versions {VERSIONS[0]} and {VERSIONS[-1]}")
        n_tensors = r.count("tensor count", _MIN_TENSOR_INFO)
        n_kv = r.count("key/value count", _MIN_KV)
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            at = r.pos
            key = r.string("a metadata key", MAX_KEY_BYTES)
            if key in metadata:
                fail(f"the key {key!r} at byte {at} appears twice")
            vtype = r.scalar(4, f"the value type of {key!r}")
            metadata[key] = _value(r, vtype, key)
            if key in ("general.architecture", "general.alignment"):
                want = str if key == "general.architecture" else int
                if vtype != (_STRING if want is str else 4):
                    fail(f"the key {key!r} at byte {at} has type {_TYPE_NAMES.get(vtype, vtype)}, "
                         f"not {'string' if want is str else 'uint32'}")
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            fail(f"general.alignment is {alignment}, not a power of two")
        sizes = _quant_sizes()
        infos, names = [], set()
        for _ in range(n_tensors):
            at = r.pos
            name = r.string("a tensor name", MAX_KEY_BYTES)
            if name in names:
                fail(f"the tensor {name!r} at byte {at} appears twice")
            names.add(name)
            n_dims = r.scalar(4, f"the dimension count of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                fail(f"tensor {name!r} at byte {at} has {n_dims} dimensions; GGUF tensors have 1 to {MAX_DIMS}")
            dims = tuple(r.scalar(10, f"the dimensions of tensor {name!r}") for _ in range(n_dims))
            ggml_type = r.scalar(4, f"the type of tensor {name!r}")
            if ggml_type not in sizes:
                fail(f"tensor {name!r} at byte {at} has type {ggml_type}, which ggml does not define (as the "
                     f"installed gguf {package_version('gguf')} knows it)")
            offset = r.scalar(10, f"the data offset of tensor {name!r}")
            block, block_bytes = sizes[ggml_type]
            elements = 1
            for d in dims:
                elements *= d
                if elements > size * block:  # no file holds that many elements; stop before the product grows
                    fail(f"tensor {name!r} at byte {at} has dimensions {'x'.join(_pow2(x) for x in dims)}, more "
                         f"elements than a {size}-byte file can hold")
            if dims[0] % block:
                fail(f"tensor {name!r} at byte {at} has a first dimension of {dims[0]}, not a multiple of its "
                     f"type's block of {block}")
            if offset % alignment:
                fail(f"tensor {name!r} at byte {at} has data offset {_pow2(offset)}, not a multiple of the "
                     f"alignment {alignment}")
            infos.append((name, dims, ggml_type, offset, elements // block * block_bytes, at))
        data_start = -(-r.pos // alignment) * alignment
        ends = [data_start + offset + nbytes for _, _, _, offset, nbytes, _ in infos]
        expected = max(ends, default=data_start)
        if expected > size:
            beyond = [info for info, end in zip(infos, ends) if end > size]
            name, _, _, offset, nbytes, at = max(beyond, key=lambda info: info[3] + info[4])
            if expected - size < PLAUSIBLE_BYTES:
                fail(f"truncated at byte {size} of {expected}: the data of {len(beyond)} of its {len(infos)} tensors "
                     f"lies past the end of the file (the last, {name!r}, ends at byte {expected})")
            fail(f"tensor {name!r} (its info at byte {at}) has data offset {_pow2(offset)} and {nbytes} bytes, "
                 f"ending at byte {data_start + offset + nbytes}, past the end of the {size}-byte file")
        tensors = tuple(GGUFTensorInfo(name, dims, ggml_type, data_start + offset, nbytes)
                        for name, dims, ggml_type, offset, nbytes, _ in infos)
        return GGUFHeader(version, metadata, tensors, alignment, data_start, size)


def advice(path: Path) -> str:
    """What to do about a damaged file: compare it with what its publisher says it is."""
    try:
        size, sha = path.stat().st_size, sha256_file(path)
    except OSError:
        return "Compare its size and sha256 with the publisher's, and download it again."
    return f"Compare its size ({size} bytes) and sha256 ({sha}) with the publisher's, and download it again."
