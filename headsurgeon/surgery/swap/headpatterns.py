"""One layer's program patterns for one batch, as the hybrid's hooks apply them (headsurgeon/surgery/swap/hooked_path.py).

Sparse programs (``synth.tensors.program_rows``: compressed rows) are kept as their stored keys (sequence,
head, query, key, weight; all sparse heads of the layer concatenated) and scattered into the heads' slices
of the attention pattern: the slices are zeroed (or scaled by ``1 - alpha``) and the keys written with one
``index_put`` per layer, O(nnz) instead of a dense [B, N, N] copy per head. Dense
programs keep one stacked [B, k, N, N] tensor per layer, copied in with ``index_copy``. In z mode (a backend
that ignores pattern edits) a sparse head's ``z`` is ``Σ_k w_k v[key_k]`` accumulated with ``index_add``.

Device and dtype come from the tensors the hooks see: the CPU tensors built here are placed once per
(device, dtype) and reused by every later forward on the same batch. On CUDA they are copied from pinned
memory with ``non_blocking=True``, so the copy overlaps the forward's kernels; this path is not exercised by
the test suite (no GPU there) and is kept deliberately simple: one pin and one asynchronous copy per tensor.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...kernels.sparse import SparseRows

__all__ = ["LayerPatterns"]


def _to(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` on ``device`` (and ``dtype``): through pinned memory, asynchronously, when it goes to a GPU."""
    if device.type == "cuda":
        t = t.pin_memory().to(device, non_blocking=True)
    else:
        t = t.to(device)
    return t if dtype is None else t.to(dtype)


class LayerPatterns:
    """The replaced heads of one layer with their program patterns for one batch (module docstring)."""

    def __init__(self, heads: list[Any], tensors: list[SparseRows | np.ndarray], width: int) -> None:
        self.heads = heads
        self.sparse = [ph for ph, t in zip(heads, tensors) if isinstance(t, SparseRows)]
        keys = [_keys(ph.head, t) for ph, t in zip(heads, tensors) if isinstance(t, SparseRows)]
        # every sparse head's stored keys, concatenated: one scatter per layer
        self.offsets = np.cumsum([0] + [k[0].shape[0] for k in keys])
        self.keys = tuple(torch.from_numpy(np.concatenate([k[c] for k in keys])) for c in range(5)) if keys else ()
        dense = [(ph, t) for ph, t in zip(heads, tensors) if not isinstance(t, SparseRows)]
        self.dense_heads = [ph for ph, _ in dense]
        self.dense: torch.Tensor | None = None
        if dense:
            stacked = []
            for _, pats in dense:
                if pats.shape[-1] < width:  # padded batch: programs saw only the real tokens
                    pats = np.pad(pats, ((0, 0), (0, width - pats.shape[1]), (0, width - pats.shape[2])))
                stacked.append(pats)
            self.dense = torch.from_numpy(np.stack(stacked, axis=1))
        self._placed: dict[tuple[torch.device, torch.dtype], dict[Any, Any]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes this batch holds: its keys or stacked patterns, and every copy placed on a device or dtype."""
        own = [*self.keys, *([self.dense] if self.dense is not None else [])]
        placed = [t for got in self._placed.values() for t in _tensors(got)]
        return sum(t.numel() * t.element_size() for t in own + placed)

    def _on(self, device: torch.device, dtype: torch.dtype) -> dict[Any, Any]:
        """Every tensor the hooks need, on ``device`` in ``dtype`` (built once per device and dtype)."""
        key = (device, dtype)
        got = self._placed.get(key)
        if got is not None:
            return got
        got = {}
        if self.sparse:
            b, h, i, j, w = self.keys
            got["where"] = tuple(_to(t, device) for t in (b, h, i, j))
            got["vals"] = _to(w, device, dtype)
            got["sparse_idx"] = _to(torch.tensor([ph.head for ph in self.sparse]), device)
            alphas = [ph.alpha for ph in self.sparse]
            got["keep"] = None
            got["weights"] = got["vals"]
            if any(a < 1.0 for a in alphas):  # blend: neural slice scaled by 1 - alpha, program weights by alpha
                keep = torch.ones(max(ph.head for ph in self.sparse) + 1, dtype=dtype)
                keep[[ph.head for ph in self.sparse]] = torch.tensor([1.0 - a for a in alphas], dtype=dtype)
                got["keep"] = keep
                scale = np.repeat(np.array(alphas, dtype=np.float32), np.diff(self.offsets))
                got["weights"] = _to(w * torch.from_numpy(scale), device, dtype)
        if self.dense is not None:
            got["dense_idx"] = _to(torch.tensor([ph.head for ph in self.dense_heads]), device)
            got["dense"] = _to(self.dense, device, dtype)
            alphas = [ph.alpha for ph in self.dense_heads]
            got["dense_alpha"] = (torch.tensor(alphas, dtype=dtype).view(1, -1, 1, 1).to(device)
                                  if any(a < 1.0 for a in alphas) else None)
        self._placed[key] = got
        return got

    def apply(self, pattern: torch.Tensor, in_place: bool) -> torch.Tensor:
        """``pattern`` [B, H, N, N] with the replaced heads' slices written (in place when ``in_place``)."""
        got = self._on(pattern.device, pattern.dtype)
        out = pattern
        if self.sparse:
            keep = got["keep"]
            if keep is not None:
                mult = torch.ones(pattern.shape[1], dtype=pattern.dtype, device=pattern.device)
                mult[: keep.shape[0]] = keep.to(pattern.device)
                mult = mult.view(1, -1, 1, 1)
                out = out.mul_(mult) if in_place else out * mult
            else:
                idx = got["sparse_idx"]
                out = out.index_fill_(1, idx, 0) if in_place else out.index_fill(1, idx, 0)
            blend = keep is not None  # the neural share stays in the slice: add the program's share to it
            out = (out.index_put_(got["where"], got["weights"], accumulate=blend) if in_place
                   else out.index_put(got["where"], got["weights"], accumulate=blend))
        if self.dense is not None:
            new = got["dense"]
            a = got["dense_alpha"]
            if a is not None:
                new = a * new + (1 - a) * pattern.index_select(1, got["dense_idx"])
            out = out.index_copy_(1, got["dense_idx"], new) if in_place else out.index_copy(1, got["dense_idx"], new)
        return out

    def head_z(self, v4: torch.Tensor, group: int) -> list[tuple[Any, torch.Tensor]]:
        """Per replaced head, its program ``z`` [B, N, d] = pattern · v of its key/value head (z mode)."""
        got = self._on(v4.device, v4.dtype)
        B, N, _, d = v4.shape
        out = []
        if self.sparse:
            b, _, i, j = got["where"]
            for k, ph in enumerate(self.sparse):
                lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
                rows = v4[b[lo:hi], j[lo:hi], ph.head // group] * got["vals"][lo:hi, None]
                z = torch.zeros(B * N, d, dtype=v4.dtype, device=v4.device)
                z.index_add_(0, b[lo:hi] * N + i[lo:hi], rows)
                out.append((ph, z.view(B, N, d)))
        for k, ph in enumerate(self.dense_heads):
            a = got["dense"][:, k].to(v4.dtype)
            out.append((ph, torch.einsum("bqk,bkd->bqd", a, v4[:, :, ph.head // group])))
        return out


    def add_program_z(self, out: torch.Tensor, value: torch.Tensor, group: int) -> torch.Tensor:
        """``out`` [B, N, H, d] plus each replaced head's ``alpha · pattern · v`` in its slot (the fused path,
        headsurgeon/surgery/swap/fast_attention.py); ``value`` is [B, KV, N, d] as transformers' attention functions receive it.

        Sparse heads take one gather and one ``index_add`` per layer, O(nnz · d); dense heads one batched matmul.
        In place unless autograd tracks ``out`` or ``value`` (training through the hybrid)."""
        got = self._on(value.device, value.dtype)
        B, KV, N, d = value.shape
        H = out.shape[2]
        grad = out.requires_grad or value.requires_grad
        if self.sparse:
            src, dst, weights = self._flat_keys(got, B, KV, N, H, group)
            rows = value.transpose(1, 2).reshape(B * N * KV, d).index_select(0, src).mul_(weights)
            flat = out.reshape(B * N * H, d)
            out = (flat.index_add(0, dst, rows) if grad else flat.index_add_(0, dst, rows)).view(B, N, H, d)
        if self.dense is not None:
            pats = got["dense"] if got["dense_alpha"] is None else got["dense"] * got["dense_alpha"]
            kv = got["dense_idx"] // group
            z = torch.matmul(pats, value.index_select(1, kv)).transpose(1, 2)  # [B, N, k, d]
            out = out.index_add(2, got["dense_idx"], z) if grad else out.index_add_(2, got["dense_idx"], z)
        return out

    def _flat_keys(self, got: dict[Any, Any], B: int, KV: int, N: int, H: int,
                   group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row numbers of the sparse keys' values in v as [B·N·KV, d] and of their queries in z as [B·N·H, d], and
        their (alpha-scaled) weights as a column."""
        shape = ("flat", B, KV, N, H, group)
        if shape not in got:
            b, h, i, j = got["where"]
            got[shape] = ((b * N + j) * KV + h // group, (b * N + i) * H + h, got["weights"][:, None])
        return got[shape]

    def neural_plan(self, n_heads: int, group: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        """For the fused path: ``neural`` (query heads that keep a neural part, as a list and an index tensor),
        their key/value heads ``kv``, and ``keep`` ([1, 1, n, 1]: 1 - alpha per neural head, None when none is
        blended); built once per layout."""
        got = self._on(device, dtype)
        shape = ("plan", n_heads, group)
        if shape not in got:
            replaced = {ph.head: ph.alpha for ph in self.heads}
            neural = [h for h in range(n_heads) if replaced.get(h, 0.0) < 1.0]
            idx = torch.tensor(neural, dtype=torch.int64, device=device)
            keep = [1.0 - replaced.get(h, 0.0) for h in neural]
            got[shape] = {"neural": neural, "index": idx, "kv": idx // group,
                          "keep": (torch.tensor(keep, dtype=dtype, device=device).view(1, 1, -1, 1)
                                   if any(k < 1.0 for k in keep) else None)}
        return got[shape]


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a placed entry (tensors, tuples and dicts of them; views counted like copies)."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return [t for v in items for t in _tensors(v)]


def _keys(head: int, rows: SparseRows) -> tuple[np.ndarray, ...]:
    """A sparse head's stored keys as (sequence b, head h, query i, key j) int64 and weights float32."""
    counts = np.diff(rows.rowptr)
    r = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    return r // rows.n, np.full(r.shape[0], head, dtype=np.int64), r % rows.n, rows.cols.astype(np.int64), \
        np.asarray(rows.vals, dtype=np.float32)
