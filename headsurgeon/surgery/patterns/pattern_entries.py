"""pattern_entries: a batch's attention-store entries built inside the pattern hooks, in torch.

Each layer's hook writes every sequence's visible n×n block straight into that sequence's entry (a float16 cast, or
torch.topk over its float32 rows), so capture converts nothing through numpy per head. Given an executor, the hook
queues each layer's top-q selections there (torch.topk releases the GIL), so they run while the forward goes on with
the next layers; :meth:`EntryBuilder.entries` then runs the jobs not yet started itself and waits for the rest.

The result is bit-identical to ``AttentionStore.put`` on ``forward_patterns``' float32 patterns: the same casts, and
topk on the same float32 rows on the CPU (topk treats rows independently, so one call per layer and run of equal-length
sequences equals one per sequence, ties included; tests/surgery/test_capture_identical.py checks both).
"""
from __future__ import annotations

from concurrent.futures import Executor, Future

import numpy as np
import torch

from ...synth.sequence import Sequence
from .store import StoreError, check_settings, stored_entries
from ...core import InputError

__all__ = ["EntryBuilder"]


class EntryBuilder:
    """Collects one batch's store entries (``s{i}`` dense, or ``s{i}.index`` / ``s{i}.value`` top-q) layer by layer."""

    def __init__(self, mode: str, q_frac: float, n_layers: int, n_heads: int, sequences: list[Sequence],
                 indices: list[int], executor: Executor | None = None) -> None:
        check_settings(mode, q_frac, 1)
        if len(sequences) != len(indices):
            raise InputError(f"{len(sequences)} sequences but {len(indices)} indices; give one index per sequence")
        self.mode, self.n_layers, self.n_heads = mode, int(n_layers), int(n_heads)
        self.indices = [int(i) for i in indices]
        self.lengths = [s.n for s in sequences]
        self.layers_seen: set[int] = set()
        self.executor = executor
        self._jobs: list[tuple[Future, int, list[torch.Tensor]]] = []
        shape = (self.n_layers, self.n_heads)
        if mode == "dense":
            self.dense = [torch.empty((*shape, n, n), dtype=torch.float16) for n in self.lengths]
        else:
            # runs of equal length (capture sorts each shard by length) share one topk call per layer
            self.groups: list[tuple[int, int, int]] = []
            for b, n in enumerate(self.lengths):
                if self.groups and self.groups[-1][2] == n:
                    self.groups[-1] = (self.groups[-1][0], b + 1, n)
                else:
                    self.groups.append((b, b + 1, n))
            self.q_frac = q_frac
            self.picked: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # layer -> per group (values, where)

    def take(self, layer: int, pattern: torch.Tensor) -> None:
        """Convert one layer's pattern [B, H, N, N] (any device or float dtype) into each sequence's entry."""
        p = pattern.detach()
        if p.dim() != 4 or p.shape[0] != len(self.lengths) or p.shape[1] != self.n_heads:
            raise StoreError(f"layer {layer}'s pattern has shape {tuple(p.shape)}, expected "
                             f"[{len(self.lengths)}, {self.n_heads}, N, N]; capture needs one pattern per query head")
        if p.dtype != torch.float32:
            p = p.float()  # as forward_patterns does: every cast below starts from float32, so roundings match
        if p.device.type != "cpu":  # one transfer per layer (cast first where it halves the bytes)
            p = (p.to(torch.float16) if self.mode == "dense" else p).to("cpu")
        if self.mode == "dense":
            for b, n in enumerate(self.lengths):
                self.dense[b][layer].copy_(p[b, :, :n, :n])  # the float32 -> float16 cast happens in the copy
        else:
            rows = [p[lo:hi, :, :n, :n].reshape(hi - lo, self.n_heads, n * n) for lo, hi, n in self.groups]
            if self.executor is None:
                self._select(layer, rows)
            else:  # the job outlives the hook: it must not read the model's own tensor (reshape copies unless n = N)
                own = pattern.untyped_storage().data_ptr()
                rows = [r.clone() if r.untyped_storage().data_ptr() == own else r for r in rows]
                self._jobs.append((self.executor.submit(self._select, layer, rows), layer, rows))
        self.layers_seen.add(layer)

    def _select(self, layer: int, rows: list[torch.Tensor]) -> None:
        """Top-q of each group's float32 rows [g, H, n·n] for one layer, as put() computes it (sorted, descending)."""
        self.picked[layer] = [torch.topk(r, stored_entries(n, self.q_frac), dim=-1, sorted=True)
                              for r, (_, _, n) in zip(rows, self.groups)]

    def _finish_jobs(self) -> None:
        """Run queued selections the executor has not started (newest first) here, then wait for the others."""
        jobs, self._jobs = self._jobs, []
        for future, layer, rows in reversed(jobs):
            if future.cancel():
                self._select(layer, rows)
        for future, *_ in jobs:
            if not future.cancelled():
                future.result()  # re-raises a failure of the selection in the caller

    def entries(self) -> dict[int, dict[str, np.ndarray]]:
        """Per sequence index, its store entry as numpy arrays (sharing memory with the torch results)."""
        self._finish_jobs()
        missing = sorted(set(range(self.n_layers)) - self.layers_seen)
        if missing:
            raise RuntimeError(f"pattern hooks fired for layers {sorted(self.layers_seen)} only; layers {missing} "
                               "never reported a pattern. Load the model with eager attention")
        if self.mode == "dense":
            return {i: {f"s{i}": t.numpy()} for i, t in zip(self.indices, self.dense)}
        out = {}
        for g, (lo, hi, _) in enumerate(self.groups):
            for b in range(lo, hi):
                layers = [self.picked[layer][g] for layer in range(self.n_layers)]
                i = self.indices[b]
                out[i] = {f"s{i}.index": torch.stack([w[b - lo] for _, w in layers]).to(torch.int32).numpy(),
                          f"s{i}.value": torch.stack([v[b - lo] for v, _ in layers]).to(torch.float16).numpy()}
        return out
