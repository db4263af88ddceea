"""capture → AttentionStore: equals a direct forward, sparse = exact top-q, GQA per query head, resumable."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headsurgeon.surgery.patterns import capture as capture_mod
from headsurgeon.surgery.patterns.capture import capture
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.patterns.store import AttentionStore, StoreError, stored_entries


def hf_attentions(hf_model, seq) -> np.ndarray:
    """Patterns straight from an unbridged transformers model (output_attentions), independent of TL hooks."""
    with torch.no_grad():
        out = hf_model(torch.from_numpy(seq.ids)[None], output_attentions=True)
    return torch.stack(out.attentions, dim=1)[0].numpy()  # [L, H, n, n]


@pytest.fixture(scope="module")
def plain_stories():
    from conftest import STORIES
    from headsurgeon.surgery.models.llama2c import load_llama2c

    return load_llama2c(STORIES / "stories260K.bin")


@pytest.fixture(scope="module")
def story_seqs(stories, documents):
    return make_sequences(stories, documents[:24], max_len=48)


def test_dense_store_equals_direct_forward(stories, story_seqs, plain_stories):
    store = capture(stories, story_seqs, batch_size=5, progress=False)
    assert store.n_heads == 8 and stories.n_kv_heads == 4  # one pattern per query head under GQA
    for i in (0, 7, len(story_seqs) - 1):
        want = hf_attentions(plain_stories, story_seqs[i])
        got = store.patterns(i)
        assert got.shape == (5, 8, story_seqs[i].n, story_seqs[i].n)
        assert np.abs(got - want).max() < 2e-3  # float16 storage
        assert np.allclose(got.sum(-1), 1.0, atol=5e-3)
        assert np.abs(np.triu(got, 1)).max() == 0.0  # causal
    # query heads sharing a kv head still differ (the store is per query head, not per kv head)
    p = store.patterns(0)
    assert not np.allclose(p[:, 0], p[:, 1])


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_random_models_capture(random_models, random_model_dirs, documents, kind):
    from transformers import AutoModelForCausalLM

    h = random_models[kind]
    seqs = make_sequences(h, documents[:4], max_len=24)
    store = capture(h, seqs, batch_size=3, progress=False)
    for i, s in enumerate(seqs):
        got = store.patterns(i)
        assert np.allclose(got.sum(-1), 1.0, atol=5e-3)
        if h.causal:
            assert np.abs(np.triu(got, 1)).max() == 0.0
            plain = AutoModelForCausalLM.from_pretrained(random_model_dirs[kind], attn_implementation="eager")
            assert np.abs(got - hf_attentions(plain.eval(), s)).max() < 2e-3
        else:
            assert (np.triu(got, 1) > 0).any()  # bidirectional: later keys visible


def test_topq_entries_are_exactly_the_top_of_the_dense_pattern(stories, story_seqs, tmp_path):
    dense = capture(stories, story_seqs[:6], progress=False)
    sparse = capture(stories, story_seqs[:6], mode="topq", q_frac=0.05, out=tmp_path / "s", progress=False)
    reopened = AttentionStore.load(tmp_path / "s")
    for i, s in enumerate(story_seqs[:6]):
        idx, val = reopened.topq(i)
        q = stored_entries(s.n, 0.05)
        assert idx.shape == (5, 8, q)
        flat = dense.patterns(i).reshape(5, 8, -1)
        kth = -np.sort(-flat, axis=-1)[..., q - 1]
        assert (val >= kth[..., None] - 2e-3).all()  # every kept value is among the top q
        assert np.allclose(np.sort(val, -1), np.sort(np.take_along_axis(flat, idx, -1), -1), atol=2e-3)
        rebuilt = reopened.patterns(i).reshape(5, 8, -1)
        assert np.count_nonzero(rebuilt, axis=-1).max() <= q


def test_streaming_store_on_disk_matches_memory(stories, story_seqs, tmp_path):
    mem = capture(stories, story_seqs, progress=False)
    disk = capture(stories, story_seqs, out=tmp_path / "d", shard_size=5, progress=False)
    assert len(list((tmp_path / "d").glob("shard_*.safetensors"))) == -(-len(story_seqs) // 5)
    again = AttentionStore.load(tmp_path / "d")
    for i in range(len(story_seqs)):
        assert np.array_equal(again.patterns(i), mem.patterns(i))
    batch, lengths = again.batch([0, 3], heads=[(4, 7), (0, 0)])
    assert batch.shape == (2, 2, lengths.max(), lengths.max())
    assert np.array_equal(batch[0, 1, : lengths[1], : lengths[1]], mem.pattern(3, 4, 7))


def test_killed_capture_resumes_to_the_same_store(stories, story_seqs, tmp_path, monkeypatch):
    reference = capture(stories, story_seqs, out=tmp_path / "ref", shard_size=4, progress=False)
    calls = {"n": 0}
    real = capture_mod.forward_entries

    def dying(handle, store, idx, call=None, executor=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(handle, store, idx, call, executor)

    monkeypatch.setattr(capture_mod, "forward_entries", dying)
    with pytest.raises(KeyboardInterrupt):
        capture(stories, story_seqs, out=tmp_path / "run", shard_size=4, batch_size=4, progress=False)
    with pytest.raises(StoreError, match="incomplete"):
        AttentionStore.load(tmp_path / "run")
    done_before = AttentionStore(story_seqs, 5, 8, directory=tmp_path / "run", shard_size=4).done_shards()
    assert done_before == {0, 1}
    calls["n"] = -100
    seen = []
    monkeypatch.setattr(capture_mod, "forward_entries",
                        lambda h, st, ix, c=None, e=None: seen.append(len(ix)) or real(h, st, ix, c, e))
    capture(stories, story_seqs, out=tmp_path / "run", shard_size=4, batch_size=4, progress=False)
    assert sum(seen) == len(story_seqs) - 8  # finished shards were not recomputed
    resumed = AttentionStore.load(tmp_path / "run")
    for i in range(len(story_seqs)):
        assert np.array_equal(resumed.patterns(i), reference.patterns(i))


def test_capture_refuses_mismatched_inputs(stories, random_models, documents, story_seqs, tmp_path):
    foreign = make_sequences(random_models["gpt2"], documents[:2], max_len=24)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        capture(stories, foreign, progress=False)
    capture(stories, story_seqs[:4], out=tmp_path / "x", progress=False)
    with pytest.raises(StoreError, match="different capture"):
        capture(stories, story_seqs[4:8], out=tmp_path / "x", progress=False)
    with pytest.raises(StoreError, match="not an attention store"):
        AttentionStore.load(tmp_path)
