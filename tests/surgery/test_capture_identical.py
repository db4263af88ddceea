"""capture's in-hook torch conversion stores exactly what the numpy round trip stored before (bit for bit).

The reference below is the previous capture path spelled out (headsurgeon/surgery/patterns/capture.py and headsurgeon/surgery/patterns/store.py before the
in-hook conversion): float32 patterns copied to the CPU per layer, each sequence's n×n block stacked into a numpy
array, then cast with torch to float16 or reduced with torch.topk over [L, H, n·n]. Ties in topk are where a different
call shape or order could pick other indices, so one model here has exactly uniform attention (all ties).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from headsurgeon.surgery.patterns.capture import capture, forward_entries, forward_patterns
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.patterns.pattern_entries import EntryBuilder
from headsurgeon.surgery.patterns.store import AttentionStore, stored_entries


def reference_patterns(handle, seqs) -> list[np.ndarray]:
    """The old forward: per layer a float32 CPU copy of the padded pattern, per sequence its n×n blocks stacked."""
    ids = torch.zeros((len(seqs), max(s.n for s in seqs)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, : s.n], mask[b, : s.n] = torch.from_numpy(s.ids), 1
    captured = {}
    hooks = [(f"blocks.{layer}.attn.hook_pattern",
              lambda p, hook, layer=layer: captured.__setitem__(layer, p.detach().to("cpu", torch.float32)))
             for layer in range(handle.n_layers)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle.model.run_with_hooks(ids, fwd_hooks=hooks, **({} if handle.causal else {"attention_mask": mask}))
    return [torch.stack([captured[layer][b, :, : s.n, : s.n] for layer in range(handle.n_layers)]).numpy()
            for b, s in enumerate(seqs)]


def reference_entry(i: int, pattern: np.ndarray, mode: str, q_frac: float) -> dict[str, np.ndarray]:
    """The old AttentionStore.put: torch float16 cast, or torch.topk over the whole [L, H, n·n] array."""
    t = torch.from_numpy(np.ascontiguousarray(pattern))
    if mode == "dense":
        return {f"s{i}": t.to(torch.float16).numpy()}
    L, H, n, _ = pattern.shape
    val, idx = torch.topk(t.reshape(L, H, n * n).float(), stored_entries(n, q_frac), dim=-1, sorted=True)
    return {f"s{i}.index": idx.to(torch.int32).numpy(), f"s{i}.value": val.to(torch.float16).numpy()}


def reference_store(handle, seqs, mode, q_frac, batch_size, shard_size) -> dict[str, np.ndarray]:
    """Every entry the old capture loop made: per shard, sequences sorted by length, cut into batches."""
    out: dict[str, np.ndarray] = {}
    for lo in range(0, len(seqs), shard_size):
        order = sorted(range(lo, min(lo + shard_size, len(seqs))), key=lambda i: seqs[i].n)
        for start in range(0, len(order), batch_size):
            idx = order[start: start + batch_size]
            for i, p in zip(idx, reference_patterns(handle, [seqs[i] for i in idx])):
                out.update(reference_entry(i, p, mode, q_frac))
    return out


def assert_bits_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Same names, dtypes, shapes and bytes (float16 compared as raw bits, so -0.0 and NaN payloads count). Capture
    also keeps value norms (``s{i}.vnorm``), which the old path did not: tests/synth/test_value_weighted.py checks them."""
    got = {k: v for k, v in got.items() if not k.endswith(".vnorm")}
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert g.tobytes() == w.tobytes(), f"{name}: {np.count_nonzero(g != w)} of {w.size} entries differ"


def disk_entries(directory) -> dict[str, np.ndarray]:
    store = AttentionStore.load(directory)
    out: dict[str, np.ndarray] = {}
    for shard in range(store.n_shards):
        out.update(store.read_shard(shard))
    return out


def memory_entries(store: AttentionStore) -> dict[str, np.ndarray]:
    return {name: a for i in range(len(store)) for name, a in store._entries(i).items()}


@pytest.fixture(scope="module")
def mixed_seqs(stories, documents):
    """Windows of many lengths (so batches are padded) from real text."""
    seqs = make_sequences(stories, documents[:40], max_len=64)[:30]
    lengths = [s.n for s in seqs]
    assert len(set(lengths)) > 5 and max(lengths.count(n) for n in lengths) > 3  # padding, and runs of equal length
    return seqs


@pytest.fixture(scope="module")
def uniform_gpt2(random_model_dirs):
    """The tiny random GPT-2 with its query projection zeroed: every visible score is 0, each row exactly uniform."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from headsurgeon.surgery.models.loading import load_model

    model = AutoModelForCausalLM.from_pretrained(random_model_dirs["gpt2"], attn_implementation="eager")
    with torch.no_grad():
        for block in model.transformer.h:
            d = model.config.n_embd
            block.attn.c_attn.weight[:, :d] = 0
            block.attn.c_attn.bias[:d] = 0
    return load_model(model.eval(), tokenizer=AutoTokenizer.from_pretrained(random_model_dirs["gpt2"]))


@pytest.mark.parametrize("mode,q_frac", [("dense", 0.025), ("topq", 0.025), ("topq", 0.2)])
def test_stories_store_is_bit_identical_to_the_old_path(stories, mixed_seqs, tmp_path, mode, q_frac):
    want = reference_store(stories, mixed_seqs, mode, q_frac, batch_size=7, shard_size=10)
    capture(stories, mixed_seqs, out=tmp_path / "d", mode=mode, q_frac=q_frac, batch_size=7, shard_size=10,
            progress=False)
    assert_bits_equal(disk_entries(tmp_path / "d"), want)
    mem = capture(stories, mixed_seqs, mode=mode, q_frac=q_frac, batch_size=7, shard_size=10, progress=False)
    assert_bits_equal(memory_entries(mem), want)


@pytest.mark.parametrize("q_frac", [0.02, 0.1, 1.0])
def test_topq_ties_pick_the_same_indices_as_the_old_path(uniform_gpt2, documents, tmp_path, q_frac):
    seqs = make_sequences(uniform_gpt2, documents[:8], max_len=24)
    pats = reference_patterns(uniform_gpt2, seqs[:1])[0]
    row = pats[0, 0, 5, :6]
    assert np.all(row == row[0]), "the zeroed query must give exactly uniform rows (ties everywhere)"
    n = seqs[0].n
    q = stored_entries(n, q_frac)
    kth = np.sort(pats[0, 0].ravel())[::-1][q - 1]
    assert np.count_nonzero(pats[0, 0] == kth) > 1, "the cut must fall inside a group of equal values"
    want = reference_store(uniform_gpt2, seqs, "topq", q_frac, batch_size=3, shard_size=4)
    capture(uniform_gpt2, seqs, out=tmp_path / "t", mode="topq", q_frac=q_frac, batch_size=3, shard_size=4,
            progress=False)
    assert_bits_equal(disk_entries(tmp_path / "t"), want)


@pytest.mark.parametrize("kind", ["llama", "bert"])
@pytest.mark.parametrize("mode", ["dense", "topq"])
def test_other_architectures_are_bit_identical(random_models, documents, kind, mode):
    h = random_models[kind]  # llama: GQA; bert: bidirectional with an attention mask over the padding
    seqs = make_sequences(h, documents[:6], max_len=24)
    want = reference_store(h, seqs, mode, 0.05, batch_size=4, shard_size=64)
    assert_bits_equal(memory_entries(capture(h, seqs, mode=mode, q_frac=0.05, batch_size=4, progress=False)), want)


def test_forward_entries_equals_put_on_forward_patterns(stories, mixed_seqs):
    """The public pieces agree too: forward_entries == AttentionStore.put(forward_patterns(...))."""
    idx = [3, 11, 4, 20]
    for mode in ("dense", "topq"):
        store = AttentionStore(mixed_seqs, stories.n_layers, stories.n_heads, mode)
        got = forward_entries(stories, store, idx)
        for i, p in zip(idx, forward_patterns(stories, [mixed_seqs[i] for i in idx])):
            assert_bits_equal(got[i], store.put(i, p))


def test_entry_builder_refuses_wrong_patterns(stories, mixed_seqs):
    builder = EntryBuilder("dense", 0.025, 5, 8, mixed_seqs[:2], [0, 1])
    with pytest.raises(ValueError, match="one pattern per query head"):
        builder.take(0, torch.zeros(2, 4, 9, 9))  # 4 kv heads instead of 8 query heads
    with pytest.raises(RuntimeError, match="eager attention"):
        builder.entries()  # no layer reported
    with pytest.raises(ValueError, match="one index per sequence"):
        EntryBuilder("dense", 0.025, 5, 8, mixed_seqs[:2], [0])
    with pytest.raises(ValueError, match="mode must be 'dense' or 'topq'"):
        EntryBuilder("sparse", 0.025, 5, 8, mixed_seqs[:2], [0, 1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_patterns_of_other_dtypes_round_like_the_old_path(mixed_seqs, dtype):
    """The old path cast a model's pattern to float32 first; the hooks must round from the same float32 values."""
    seqs = mixed_seqs[:3]
    width = max(s.n for s in seqs)
    gen = torch.Generator().manual_seed(0)
    scale = torch.logspace(-9, 0, width, dtype=torch.float64)  # many values below float16's normal range
    pattern = (torch.rand(3, 2, width, width, generator=gen, dtype=torch.float64) * scale).to(dtype)
    for mode in ("dense", "topq"):
        builder = EntryBuilder(mode, 0.1, 1, 2, seqs, [0, 1, 2])
        builder.take(0, pattern)
        got = builder.entries()
        f32 = pattern.to(torch.float32)
        for b, s in enumerate(seqs):
            assert_bits_equal(got[b], reference_entry(b, f32[b, :, : s.n, : s.n][None].numpy(), mode, 0.1))
