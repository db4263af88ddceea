"""One parse of a GGUF file per conversion: transformers reads the file three times and rebuilds a name map per module.

``AutoTokenizer`` and ``AutoModelForCausalLM`` (config, then weights) each construct a ``gguf.GGUFReader`` of the same
file, and mapping the model's tensor names builds ``gguf.get_tensor_name_map(arch, layers)`` once for every module of
the model (hundreds of times for SmolLM2-135M). Both read nothing but the file and their arguments, so inside
:func:`parsed_once` the readers of a path and the name maps of an (architecture, layer count) are made once and shared.
transformers imports both names from ``gguf`` when it needs them, so they are replaced on the ``gguf`` module for the
block and restored after it. Timings: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["parsed_once"]

_LOCK = threading.RLock()


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path)`` returns one reader per (file, mode) and ``gguf.get_tensor_name_map``
    one map per arguments; a file replaced during the block (another inode, size or mtime) gets a reader of its own."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, Any] = {}
    maps: dict[tuple, Any] = {}

    def shared_reader(path: Any, mode: str = "r") -> Any:
        stat = os.stat(path)
        key = (os.path.realpath(path), mode, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    def shared_name_map(*args: Any) -> Any:
        if args not in maps:
            maps[args] = name_map(*args)
        return maps[args]

    with _LOCK:  # one thread patches the module at a time; a nested block restores the names of the one around it
        gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, shared_name_map
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
