"""capture: batched forward passes with pattern hooks only, streamed into an :class:`AttentionStore`.

The hooks build each sequence's float16 or top-q entry in torch (headsurgeon/surgery/patterns/pattern_entries.py) and a background thread
writes each finished shard while the next one is built (headsurgeon/surgery/patterns/shard_writer.py), so memory is bounded by two shards
(``shard_size`` sequences each: one being built, one being written), not by the corpus. A capture into a
directory that was interrupted resumes at the first unfinished shard; finished shards that are missing or damaged (size
or sha256 differs from the manifest's record) are recomputed.
"""
from __future__ import annotations

import contextlib
import numbers
import warnings
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ...synth.errors import excerpt
from ...synth.sequence import Sequence
from ..batches import padded_batch
from ..configs import CaptureConfig
from ..models.loading import ModelHandle, load_model
from .pattern_entries import EntryBuilder
from ..swap.hybrid import HybridModel
from .shard_writer import ShardWriter
from .store import SEQUENCES_FILE, AttentionStore, StoreError, read_manifest, read_sequences, sequences_key
from .store_reader import norm_name
from .value_norms import output_matrices, v_hook, value_norms as norms_of
from ...core import HeadsurgeonError

RESUME_KEYS = ("model", "n_layers", "n_heads", "mode", "q_frac", "shard_size", "n_sequences", "sequences_key",
               "value_norms")


class CaptureError(HeadsurgeonError, ValueError):
    """capture() was given inputs or settings it cannot use; the message says what to change."""


def _check_batch_size(batch_size: Any) -> None:
    """Refuse a batch size that is not a whole number >= 1 (it would loop forever or fail deep inside)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise CaptureError(f"batch_size must be a whole number of sequences >= 1 (e.g. 16), got {excerpt(batch_size)}")


def _check_sequences(handle: ModelHandle, sequences: list[Sequence]) -> None:
    """Refuse sequences the model cannot take: none, longer than its context, or ids outside its vocabulary."""
    if not sequences:
        raise CaptureError("capture needs at least one sequence; build them with make_sequences / load_corpus")
    too_long = [s.n for s in sequences if s.n > handle.n_ctx]
    if too_long:
        raise CaptureError(f"{len(too_long)} sequences exceed the model's context ({max(too_long)} > {handle.n_ctx}); "
                           "make windows with max_len <= n_ctx")
    over = [int(s.ids.max()) for s in sequences if s.n and int(s.ids.max()) >= handle.vocab_size]
    if over:
        raise CaptureError(f"token id {max(over)} is outside the model's vocabulary ({handle.vocab_size}); "
                           "the sequences were tokenized with another tokenizer")


def _short(value: object) -> str:
    """A manifest value for a message (hashes cut to 12 characters)."""
    text = str(value)
    return text[:12] + "..." if len(text) > 16 and text.isalnum() else excerpt(value, 60)


def _on_disk(store: AttentionStore) -> Path:
    """The store's directory (resuming reads what an earlier capture wrote there)."""
    if store.directory is None:
        raise StoreError("only a store with a directory can be resumed; give the capture an output directory")
    return store.directory


def _resume(store: AttentionStore) -> set[int]:
    """Open an existing store directory for resuming: same settings, sound sequences file; returns the sound shards.

    Shards the manifest lists whose file is missing or damaged are dropped (with a warning) so they are recomputed.
    """
    directory = _on_disk(store)
    old = {"value_norms": False, **read_manifest(directory / "manifest.json")}  # before version 2: none
    fresh = store.manifest([])
    differ = [k for k in RESUME_KEYS if old.get(k) != fresh[k]]
    if differ:
        shown = "; ".join(f"{k}: stored {_short(old.get(k))}, now {_short(fresh[k])}" for k in differ)
        why = (" (other windows or another order: another corpus, window settings or split seed, or a store captured "
               "before the split fractions counted predicted tokens)" if "sequences_key" in differ
               else "")
        raise StoreError(f"{directory} already holds a different capture ({shown}){why}; use the same settings "
                         "to resume, or choose another output directory")
    store.adopt_records(old)
    _remove_stale_temporaries(directory)
    damaged = store.damaged_shards()
    for shard, problem in damaged.items():
        warnings.warn(f"{store.shard_path(shard)} is damaged or missing ({problem}); recomputing it", stacklevel=3)
        store.shard_records.pop(shard, None)
    if not _sequences_file_ok(store):
        store.save_sequences()
    return store.done_shards() - set(damaged)


def _remove_stale_temporaries(directory: Path) -> None:
    """Delete temporaries a killed capture left mid-write (headsurgeon/core/fileio.py names them ``.<file>.<random>.tmp``)."""
    for path in directory.glob(".*.tmp"):
        if path.name.startswith((".shard_", ".manifest.json.", f".{SEQUENCES_FILE}.")):
            path.unlink(missing_ok=True)


def _sequences_file_ok(store: AttentionStore) -> bool:
    """Whether the store's sequences.json reads back as exactly the sequences being captured."""
    try:
        return sequences_key(read_sequences(_on_disk(store))) == sequences_key(store.sequences)
    except (StoreError, KeyError, TypeError, ValueError):
        return False


def _hooked_forward(handle: ModelHandle, sequences: list[Sequence], take: Callable[[int, torch.Tensor], None],
                    call: Any = None, take_v: Callable[[int, torch.Tensor], None] | None = None) -> None:
    """One batched forward under no_grad that hands every layer's pattern [B, H, N, N] to ``take(layer, pattern)``
    (and, with ``take_v``, its value vectors to ``take_v(layer, v)``).

    ``call`` (a HybridModel) runs the forward instead of the base, so the patterns are the hybrid's.
    """
    ids, mask = padded_batch(sequences)
    seen: set[int] = set()

    def make_hook(layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
            take(layer, pattern)
            seen.add(layer)
            return pattern
        return hook

    hooks = [(handle.pattern_hook(layer), make_hook(layer)) for layer in range(handle.n_layers)]
    if take_v is not None:
        missing = [v_hook(layer) for layer in range(handle.n_layers) if v_hook(layer) not in handle.model.hook_dict]
        if missing:
            raise CaptureError(f"{handle.name} has no hook point {missing[0]}, so value norms cannot be captured; "
                               "capture with value_norms=False")
        hooks += [(v_hook(layer), lambda v, hook, layer=layer: (take_v(layer, v.detach()), v)[1])
                  for layer in range(handle.n_layers)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {} if handle.causal else {"attention_mask": mask.to(handle.device)}  # right padding is causal-safe
        if call is None:
            handle.model.run_with_hooks(ids.to(handle.device), fwd_hooks=hooks, **kwargs)
        else:  # a hybrid: its own hooks run first, so these see the patterns it actually uses
            points = handle.model.hook_dict
            removers = [points[name].register_forward_hook(lambda m, i, o, f=fn: f(o, None)) for name, fn in hooks]
            try:
                call(ids, attention_mask=mask)
            finally:
                for r in removers:
                    r.remove()
    if len(seen) != handle.n_layers:
        raise RuntimeError(f"pattern hooks fired for layers {sorted(seen)} only; expected all "
                           f"{handle.n_layers}. Load the model with eager attention")


def forward_patterns(handle: ModelHandle, sequences: list[Sequence], call: Any = None) -> list[np.ndarray]:
    """One batched forward; returns per sequence the float32 patterns [L, H, n, n] (pattern hooks only).

    ``call`` (a HybridModel) runs the forward instead of the base, so the patterns are the hybrid's.
    """
    captured: dict[int, torch.Tensor] = {}

    def keep(layer: int, pattern: torch.Tensor) -> None:
        captured[layer] = pattern.detach().to("cpu", torch.float32)

    _hooked_forward(handle, sequences, keep, call)
    # stack only each sequence's real n×n block, never the whole padded batch
    return [torch.stack([captured[layer][b, :, : s.n, : s.n] for layer in range(handle.n_layers)]).numpy()
            for b, s in enumerate(sequences)]


def forward_entries(handle: ModelHandle, store: AttentionStore, indices: list[int], call: Any = None,
                    executor: Executor | None = None) -> dict[int, dict[str, np.ndarray]]:
    """One batched forward over ``store.sequences[indices]``; returns each index's store entry, built in the hooks.

    Bit-identical to ``store.put(i, pattern)`` on :func:`forward_patterns`' output (headsurgeon/surgery/patterns/pattern_entries.py). With
    an ``executor``, top-q selections run there while the forward goes on.
    """
    sequences = [store.sequences[i] for i in indices]
    builder = EntryBuilder(store.mode, store.q_frac, store.n_layers, store.n_heads, sequences, indices, executor)
    if not store.has_value_norms:
        _hooked_forward(handle, sequences, builder.take, call)
        return builder.entries()
    w_o = output_matrices(handle)
    norms = [torch.empty((store.n_layers, store.n_heads, s.n), dtype=torch.float16) for s in sequences]

    def take_v(layer: int, v: torch.Tensor) -> None:
        got = norms_of(v, w_o[layer]).to("cpu")  # [B, H, N]
        for b, s in enumerate(sequences):
            norms[b][layer] = got[b, :, : s.n]

    _hooked_forward(handle, sequences, builder.take, call, take_v)
    entries = builder.entries()
    for b, i in enumerate(indices):
        entries[i][norm_name(i)] = norms[b].numpy()
    return entries


def capture(
    model: Any,
    sequences: list[Sequence],
    out: str | Path | None = None,
    mode: str = CaptureConfig.mode,
    q_frac: float = CaptureConfig.q_frac,
    batch_size: int = CaptureConfig.batch_size,
    shard_size: int = CaptureConfig.shard_size,
    progress: bool = True,
    value_norms: bool = CaptureConfig.value_norms,
) -> AttentionStore:
    """Capture every head's attention pattern over ``sequences``.

    ``mode="dense"`` keeps float16 patterns; ``mode="topq"`` keeps the top ``q_frac`` of each n×n
    grid per head and sequence. With ``out`` the store streams to safetensors shards in that
    directory (resumable); without it the store lives in memory. ``value_norms`` also keeps ‖v_j·W_O^h‖ per key
    (headsurgeon/surgery/patterns/value_norms.py), which value-weighted scoring reads (headsurgeon/synth/weighted.py).
    """
    _check_batch_size(batch_size)
    hybrid = model if isinstance(model, HybridModel) else None  # capture what a hybrid's heads actually use
    handle = hybrid.handle if hybrid is not None else load_model(model)
    _check_sequences(handle, sequences)
    store = AttentionStore(sequences, handle.n_layers, handle.n_heads, mode, q_frac, handle.causal, handle.name,
                           Path(out) if out is not None else None, shard_size, value_norms)
    done: set[int] = set()
    if store.directory is not None:
        store.directory.mkdir(parents=True, exist_ok=True)
        if (store.directory / "manifest.json").is_file():
            done = _resume(store)
        else:
            store.save_sequences()
        store.save_manifest(done)
    todo = [shard for shard in range(store.n_shards) if shard not in done]
    total = sum(min(store.shard_size, len(sequences) - shard * store.shard_size) for shard in todo)
    # top-q selections run in one worker thread beside the forward (torch.topk releases the GIL)
    selector = ThreadPoolExecutor(1, "headsurgeon topq") if mode == "topq" else None
    try:
        with tqdm(total=total, desc=f"capture {handle.name}", unit="seq", disable=not progress) as bar:
            _capture_shards(handle, store, todo, done, batch_size, hybrid, bar, selector)
    finally:
        if selector is not None:
            selector.shutdown(wait=True, cancel_futures=True)
    return store


def _capture_shards(handle: ModelHandle, store: AttentionStore, todo: list[int], done: set[int], batch_size: int,
                    hybrid: HybridModel | None, bar: Any, selector: Executor | None) -> None:
    """Run the shards in ``todo``: batches by length, entries kept in memory or handed to the shard writer."""
    sequences = store.sequences
    # a directory store writes each finished shard in a background thread while the next batches run
    with ShardWriter(store, done) if store.directory is not None else contextlib.nullcontext() as writer:
        for shard in todo:
            lo, hi = shard * store.shard_size, min((shard + 1) * store.shard_size, len(sequences))
            order = sorted(range(lo, hi), key=lambda i: sequences[i].n)  # similar lengths → little padding
            entries: dict[str, np.ndarray] = {}
            for start in range(0, len(order), batch_size):
                idx = order[start: start + batch_size]
                for i, entry in forward_entries(handle, store, idx, hybrid, selector).items():
                    store.keep(i, entry)
                    entries.update(entry)
                bar.update(len(idx))
            if writer is not None:
                writer.submit(shard, entries)
