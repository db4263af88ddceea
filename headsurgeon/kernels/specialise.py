"""One numba build per flag combination: a kernel's flags become compile-time constants, so its branches fold away.

A kernel that branches on flags (the count/fill pass, normalized rows, the causal mask) is written as a *maker*
``make(*flags) -> function`` whose inner function reads the flags from its closure. numba freezes closure
variables as constants, so LLVM drops the branches a flag decides (a kernel taking them as runtime arguments keeps
them inside its loops). ``specialised`` compiles one build per combination on first use and keeps it in a dict;
with ``cache=True`` each build has its own entry in numba's on-disk cache, because the cache keys a closure by its
cell values as well as its bytecode (numba/core/caching.py ``_index_key``).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = ["Specialised", "specialised"]


def _flag(value: Any) -> bool | int:
    """A flag as a plain Python bool or int (numpy scalars would give a separate, equal build)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return int(value)


class Specialised:
    """A kernel maker and its builds: ``kernel(*flags)`` is the jitted function for those flag values."""

    def __init__(self, make: Callable[..., Callable], options: dict[str, Any], name: str | None = None) -> None:
        self.make = make
        self.options = dict(options)
        self.__name__ = self.__qualname__ = name or make.__name__
        self.__doc__ = make.__doc__
        self._builds: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, *flags: Any) -> Any:
        """The build for ``flags`` (in the maker's parameter order), compiled or loaded on first use."""
        build = self._builds.get(flags)
        if build is not None:
            return build
        key = tuple(_flag(f) for f in flags)
        with self._lock:
            build = self._builds.get(key)
            if build is None:
                fn = self.make(*key)
                fn.__qualname__ = self.__qualname__  # names numba's cache files: one set per Specialised
                build = self._builds[key] = njit(cache=True, **self.options)(fn)
        return build

    @property
    def builds(self) -> dict[tuple, Any]:
        """The builds made so far, by flag values."""
        return dict(self._builds)

    def __repr__(self) -> str:
        return f"Specialised({self.__name__}, builds={sorted(self.builds)})"


def specialised(name: str | None = None, **options: Any) -> Callable[[Callable[..., Callable]], Specialised]:
    """Decorator: a kernel maker -> a ``Specialised`` whose builds use ``njit(cache=True, **options)``.

    ``name`` (default: the maker's) names the builds' cache files; one maker compiled under two sets of
    options needs two names, since numba's cache key does not include the options.
    """

    def wrap(make: Callable[..., Callable]) -> Specialised:
        return Specialised(make, options, name)

    return wrap
