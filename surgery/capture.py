"""capture: batched forward passes with pattern hooks only, streamed into an :class:`AttentionStore`.

Memory is bounded by one shard (``shard_size`` sequences), not by the corpus. A capture into a
directory that was interrupted resumes at the first unfinished shard.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..synth.sequence import Sequence
from .loading import ModelHandle, load_model
from .store import AttentionStore, StoreError


def padded_batch(sequences: list[Sequence], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, N] and attention mask [B, N] for a list of sequences."""
    width = max(s.n for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, s in enumerate(sequences):
        ids[b, : s.n] = torch.from_numpy(s.ids)
        mask[b, : s.n] = 1
    return ids, mask


def forward_patterns(handle: ModelHandle, sequences: list[Sequence]) -> list[np.ndarray]:
    """One batched forward; returns per sequence the float32 patterns [L, H, n, n] (pattern hooks only)."""
    ids, mask = padded_batch(sequences)
    captured: dict[int, torch.Tensor] = {}

    def make_hook(layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
            captured[layer] = pattern.detach().to("cpu", torch.float32)
            return pattern
        return hook

    hooks = [(handle.pattern_hook(layer), make_hook(layer)) for layer in range(handle.n_layers)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {} if handle.causal else {"attention_mask": mask.to(handle.device)}  # right padding is causal-safe
        handle.model.run_with_hooks(ids.to(handle.device), fwd_hooks=hooks, **kwargs)
    if len(captured) != handle.n_layers:
        raise RuntimeError(f"pattern hooks fired for layers {sorted(captured)} only; expected all "
                           f"{handle.n_layers}. Load the model with eager attention")
    # stack only each sequence's real n×n block, never the whole padded batch
    return [torch.stack([captured[layer][b, :, : s.n, : s.n] for layer in range(handle.n_layers)]).numpy()
            for b, s in enumerate(sequences)]


def capture(
    model: Any,
    sequences: list[Sequence],
    out: str | Path | None = None,
    mode: str = "dense",
    q_frac: float = 0.025,
    batch_size: int = 16,
    shard_size: int = 64,
    progress: bool = True,
) -> AttentionStore:
    """Capture every head's attention pattern over ``sequences``.

    ``mode="dense"`` keeps float16 patterns; ``mode="topq"`` keeps the top ``q_frac`` of each n×n
    grid per head and sequence. With ``out`` the store streams to safetensors shards in that
    directory (resumable); without it the store lives in memory.
    """
    handle = load_model(model)
    if not sequences:
        raise ValueError("capture needs at least one sequence; build them with make_sequences / load_corpus")
    too_long = [s.n for s in sequences if s.n > handle.n_ctx]
    if too_long:
        raise ValueError(f"{len(too_long)} sequences exceed the model's context ({max(too_long)} > {handle.n_ctx}); "
                         "make windows with max_len <= n_ctx")
    over = [int(s.ids.max()) for s in sequences if s.n and int(s.ids.max()) >= handle.vocab_size]
    if over:
        raise ValueError(f"token id {max(over)} is outside the model's vocabulary ({handle.vocab_size}); "
                         "the sequences were tokenized with another tokenizer")
    store = AttentionStore(sequences, handle.n_layers, handle.n_heads, mode, q_frac, handle.causal, handle.name,
                           Path(out) if out is not None else None, shard_size)
    done: set[int] = set()
    if store.directory is not None:
        store.directory.mkdir(parents=True, exist_ok=True)
        manifest_path = store.directory / "manifest.json"
        if manifest_path.is_file():
            old = json.loads(manifest_path.read_text())
            fresh = store.manifest([])
            same = all(old.get(k) == fresh[k] for k in ("model", "n_layers", "n_heads", "mode", "q_frac", "shard_size",
                                                         "n_sequences", "sequences_key"))
            if not same:
                raise StoreError(f"{store.directory} already holds a different capture (other model, corpus or "
                                 "settings); choose another output directory or delete it")
            done = store.done_shards()
        else:
            store.save_sequences()
        store.save_manifest(done)
    todo = [shard for shard in range(store.n_shards) if shard not in done]
    total = sum(min(store.shard_size, len(sequences) - shard * store.shard_size) for shard in todo)
    bar = tqdm(total=total, desc=f"capture {handle.name}", unit="seq", disable=not progress)
    for shard in todo:
        lo, hi = shard * store.shard_size, min((shard + 1) * store.shard_size, len(sequences))
        order = sorted(range(lo, hi), key=lambda i: sequences[i].n)  # similar lengths → little padding
        entries: dict[str, np.ndarray] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start: start + batch_size]
            for i, pattern in zip(idx, forward_patterns(handle, [sequences[i] for i in idx])):
                entries.update(store.put(i, pattern))
            bar.update(len(idx))
        if store.directory is not None:
            store.write_shard(shard, entries)
            done.add(shard)
            store.save_manifest(done)
    bar.close()
    return store
