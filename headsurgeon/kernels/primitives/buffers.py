"""Output buffers and offset clipping shared by every kernel family."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit
from ...core import InputError

__all__ = ["out_buffer", "clip_offset", "per_token_kernel", "pad_rows"]

# ``out`` may pass a reusable float32 [B,N,N] buffer (every cell is overwritten); otherwise numpy
# allocates it, not the kernel: numpy puts large arrays on transparent huge pages, whose first-touch
# page faults are several times cheaper than numba-allocated memory. Fresh memory is the dominant
# cost of a simple primitive, so callers evaluating trees recycle buffers.

def out_buffer(out: np.ndarray | None, shape: tuple[int, int, int]) -> np.ndarray:
    """Return ``out`` after checking it fits, or a new float32 array of ``shape``."""
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise InputError(f"out must be a C-contiguous float32 array of shape {shape}; got {out.dtype} {out.shape}")
    return out


def clip_offset(offset: int, n: int) -> int:
    """``offset`` clipped to [-(n+1), n+1]: offsets past the sequence select nothing either way, and the
    kernels then never see a value outside int64."""
    return max(-(n + 1), min(int(offset), n + 1))


def per_token_kernel(kernel: Callable[..., None], name: str, doc: str) -> Callable[..., np.ndarray]:
    """The allocating wrapper ``name(values, lengths, causal, out=None)`` of a kernel over one per-token array."""

    def wrapper(values: np.ndarray, lengths: np.ndarray, causal: bool, out: np.ndarray | None = None) -> np.ndarray:
        out = out_buffer(out, (values.shape[0], values.shape[1], values.shape[1]))
        kernel(values, lengths, causal, out)
        return out

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = doc
    return wrapper


@njit(cache=True)
def _pad_rows(flat, starts, out):  # pragma: no cover - compiled
    for b in range(out.shape[0]):
        L = starts[b + 1] - starts[b]
        for j in range(L):  # an element loop: a slice copy compiles numpy's shape-error path (seconds)
            out[b, j] = flat[starts[b] + j]
        out[b, L:] = 0


def pad_rows(flat: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Consecutive rows of ``flat`` (int64, ``lengths[b]`` each) as a zero-padded int64 ``[B, width]`` array: the
    padded token ids the kernels take, in one compiled copy instead of a boolean-mask scatter."""
    if lengths.size and int(lengths.max()) > width:
        raise InputError(f"a row of length {int(lengths.max())} does not fit width {width}")
    starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    if flat.shape[0] != starts[-1]:
        raise InputError(f"flat holds {flat.shape[0]} values; the lengths sum to {int(starts[-1])}")
    out = np.empty((lengths.shape[0], width), dtype=np.int64)
    _pad_rows(np.ascontiguousarray(flat, dtype=np.int64), starts, out)
    return out
