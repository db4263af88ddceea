"""The hybrid's program patterns per batch: computed at its first hooked layer, shared by heads running the same
program, and kept in a least-recently-used cache bounded in bytes, so a repeated batch costs a dictionary lookup."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import SurgeryError
from .headpatterns import LayerPatterns
from .ids import SequenceRegistry
from .program_head import ProgramHead
from .providers import ProgramPatterns

#: default cap on the hybrid's per-batch pattern cache (placed copies included): a dense program at 1 x 2,048
#: tokens holds 16 MiB per head per batch, so a cap in batches alone let a long-context run grow to gigabytes
BATCH_CACHE_BYTES = 256 << 20


class BatchPatterns:
    """HybridModel's part that turns a batch's token ids into each layer's :class:`LayerPatterns`
    (headsurgeon/surgery/swap/hybrid.py sets these attributes)."""

    handle: Any  # the ModelHandle
    program_heads: nn.ModuleDict
    registry: SequenceRegistry
    _batch_cache: OrderedDict[str, dict[int, LayerPatterns]]
    _batch_cache_bytes: int
    _ids: torch.Tensor | None  # this forward's token ids
    _batch: dict[int, LayerPatterns] | None  # this forward's patterns, once computed
    _lengths: torch.Tensor | None  # per row, the tokens before padding
    _need_text: bool

    def _by_layer(self) -> dict[int, list[ProgramHead]]:
        """The program heads of each layer that has any."""
        out: dict[int, list[ProgramHead]] = {}
        for ph in self.program_heads.values():
            out.setdefault(ph.layer, []).append(ph)
        return out

    def _batch_patterns(self, query_len: int, key_len: int) -> dict[int, LayerPatterns]:
        """Per layer: the attention-level program heads and their patterns for this batch (sparse or dense)."""
        ids = self._ids
        if ids is None or ids.ndim != 2:
            raise SurgeryError("program heads need token ids (embed.hook_in did not fire with [batch, pos] ids)")
        if query_len != key_len or key_len != ids.shape[1]:
            raise SurgeryError(
                f"program heads saw {query_len} queries over {key_len} keys for {ids.shape[1]} input tokens: "
                "KV-cache decoding is not supported; use hybrid.generate (full recompute per step)"
            )
        if self._batch is not None:
            return self._batch
        ids_np = ids.cpu().numpy()
        lengths = (self._lengths.numpy() if self._lengths is not None
                   else np.full(ids_np.shape[0], ids_np.shape[1], dtype=np.int64))
        key = hashlib.sha256(ids_np.astype("<i8").tobytes() + lengths.astype("<i8").tobytes()).hexdigest()
        found = self._batch_cache.get(key)
        if found is not None:
            self._batch_cache.move_to_end(key)
            self._batch = found
            return found
        seqs = [self.registry.get(ids_np[b, : int(lengths[b])], self._need_text) for b in range(ids_np.shape[0])]
        width = ids_np.shape[1]
        found = {}
        shared: dict[Any, Any] = {}  # heads running the same program share its patterns for this batch

        def rows_of(ph: ProgramHead) -> Any:
            key = ph.provider.program.hash if isinstance(ph.provider, ProgramPatterns) else id(ph)
            if key not in shared:
                shared[key] = ph.pattern_rows(seqs, self.handle.causal)
            return shared[key]

        for layer, heads in self._by_layer().items():
            heads = [ph for ph in heads if not getattr(ph.provider, "output_level", False)]
            if not heads:
                continue
            found[layer] = LayerPatterns(heads, [rows_of(ph) for ph in heads], width)
        self._batch_cache[key] = found
        self._evict()
        self._batch = found
        return found

    def _evict(self) -> None:
        """Drop the least recently used batches until the cache holds at most ``batch_cache_bytes`` (the batch
        being run stays referenced by this forward even when it alone is larger)."""
        sizes = {k: sum(lp.nbytes for lp in batch.values()) for k, batch in self._batch_cache.items()}
        total = sum(sizes.values())
        while self._batch_cache and total > self._batch_cache_bytes:
            key, _ = self._batch_cache.popitem(last=False)
            total -= sizes[key]
