"""Value norms ‖v_j·W_O^h‖ kept beside the patterns, the value-weighted IoU/JSD (headsurgeon/synth/weighted.py), selection by them,
and stores written before they existed."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from headsurgeon.kernels.sparse import SparseRows
from headsurgeon.scaleout.headstore import HeadStore
from headsurgeon.surgery.patterns.capture import capture
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.patterns.store import AttentionStore, StoreError
from headsurgeon.synth.program import Program
from headsurgeon.synth.select import select_programs
from headsurgeon.synth.tensors import program_rows
from headsurgeon.synth.weighted import score_weighted, weigh_dense, weigh_rows
from headsurgeon.synth.splits import StoreSplits


@pytest.fixture(scope="module")
def story_seqs(stories, documents):
    return make_sequences(stories, documents[:6], max_len=24)


@pytest.fixture(scope="module")
def plain_stories():
    from conftest import STORIES
    from headsurgeon.surgery.models.llama2c import load_llama2c

    return load_llama2c(STORIES / "stories260K.bin")


def direct_norms(hf, ids: np.ndarray, n_heads: int) -> np.ndarray:
    """‖v_j·W_O^h‖ [L, H, n] from the unbridged model's weights: input norm, v_proj, then head h's columns of o_proj."""
    with torch.no_grad():
        out = hf(torch.from_numpy(ids)[None], output_hidden_states=True)
        rows = []
        for layer, block in enumerate(hf.model.layers):
            x = block.input_layernorm(out.hidden_states[layer])[0]
            v = block.self_attn.v_proj(x)  # [n, kv * d]
            d = block.self_attn.o_proj.weight.shape[1] // n_heads  # d_head
            kv = v.shape[-1] // d
            w = block.self_attn.o_proj.weight  # [d_model, H * d]
            rows.append(torch.stack([torch.linalg.vector_norm(
                v[:, (h // (n_heads // kv)) * d: (h // (n_heads // kv) + 1) * d] @ w[:, h * d: (h + 1) * d].T, dim=-1)
                for h in range(n_heads)]))
    return torch.stack(rows).numpy()


def test_captured_value_norms_equal_a_direct_computation(stories, story_seqs, plain_stories, tmp_path):
    store = capture(stories, story_seqs, out=tmp_path / "s", batch_size=3, shard_size=2, progress=False)
    assert store.has_value_norms and stories.n_heads != stories.model.cfg.n_key_value_heads  # GQA pairs heads
    for i in (0, len(story_seqs) - 1):
        want = direct_norms(plain_stories, story_seqs[i].ids, stories.n_heads)
        got = AttentionStore.load(tmp_path / "s").norms(i)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # float16 in the store
    view = HeadStore(tmp_path / "s", [(1, 3), (4, 0)])
    np.testing.assert_array_equal(view.norm_batch([0, 2], [(1, 3), (4, 0)]), store.norm_batch([0, 2], [(1, 3), (4, 0)]))


def test_weighted_rows_match_a_hand_computed_case_and_ignore_a_zero_norm_sink():
    real = np.array([[[1, 0, 0], [0.5, 0.5, 0], [0.8, 0.1, 0.1]]], dtype=np.float32)[None]  # [H=1, B=1, 3, 3]
    norms = np.array([[[2.0, 1.0, 3.0]]], dtype=np.float32)
    got = weigh_dense(real, norms)[0, 0]
    np.testing.assert_allclose(got[1], [1 / 1.5, 0.5 / 1.5, 0], rtol=1e-6)  # 0.5*2, 0.5*1 over 1.5
    np.testing.assert_allclose(got[2], [1.6 / 2.0, 0.1 / 2.0, 0.3 / 2.0], rtol=1e-6)
    # hand: the program attends (0, 1, 0) on row 2 only differently; per-row IoU sums over the grid
    prog = np.array([[[1, 0, 0], [0.5, 0.5, 0], [0, 1, 0]]], dtype=np.float32)
    vw = score_weighted(real, [prog], [3], True, norms)
    pw = np.array([1, 0, 0, 1 / 1.5, 0.5 / 1.5, 0, 0, 1, 0])
    rw = got.reshape(-1)
    assert vw["vw_iou"][0, 0] == pytest.approx(np.minimum(pw, rw).sum() / np.maximum(pw, rw).sum(), rel=1e-6)
    # a sink with zero norm: whatever share of the row it takes, the moved mass is the same
    sink0 = np.array([[[0.0, 1.0, 1.0]]], dtype=np.float32)
    head = np.array([[[1, 0, 0], [0.9, 0.1, 0], [0.9, 0, 0.1]]], dtype=np.float32)[None]
    only_moved = np.array([[[1, 0, 0], [0, 1, 0], [0, 0, 1]]], dtype=np.float32)
    sink_heavy = np.array([[[1, 0, 0], [0.99, 0.01, 0], [0.99, 0, 0.01]]], dtype=np.float32)
    got = score_weighted(head, [only_moved, sink_heavy], [3], True, sink0)
    assert got["vw_iou"][0, 0] == pytest.approx(1.0) and got["vw_iou"][0, 1] == pytest.approx(1.0)
    assert got["vw_jsd"][0, 0] == pytest.approx(0.0, abs=1e-4)


def test_sparse_weighing_equals_dense(stories, story_seqs):
    seqs = story_seqs[:3]
    rows = program_rows([Program.parse("fallback(induction(), prev(1))")], seqs, causal=True)[0]
    assert isinstance(rows, SparseRows)
    rng = np.random.default_rng(0)
    norms = rng.random((len(seqs), rows.n)).astype(np.float32)
    np.testing.assert_allclose(weigh_rows(rows, norms).to_dense(), weigh_dense(rows.to_dense(), norms), atol=1e-6)


def planted_store(seqs, norms: bool = True) -> AttentionStore:
    """One head (L0H0) that puts 0.8 on the first token, whose value norm is 0, and 0.2 on the previous token."""
    store = AttentionStore(seqs, 1, 1, value_norms=norms)
    for i, s in enumerate(seqs):
        p = np.zeros((s.n, s.n), dtype=np.float32)
        p[:, 0] = 0.8
        p[np.arange(1, s.n), np.arange(s.n - 1)] += 0.2
        p[0, 0] = 1.0
        w = np.ones(s.n, dtype=np.float32)
        w[0] = 0.0
        store.put(i, p[None, None], w[None, None] if norms else None)
    return store


def test_selection_by_moved_mass_prefers_the_program_that_moves_it(story_seqs):
    store = planted_store(story_seqs)
    idx = list(range(len(story_seqs)))
    library = ["first()", "prev(1)"]
    by_iou = select_programs(store, {}, StoreSplits((), idx[:3], idx[3:]), library=library, baselines=False, progress=False)
    by_vw = select_programs(store, {}, StoreSplits((), idx[:3], idx[3:]), library=library, baselines=False, progress=False,
                            select_by="vw_iou", side_terms=False)
    assert by_iou.entries[(0, 0)].replacement.program == Program.parse("first()")
    chosen = by_vw.entries[(0, 0)].replacement
    assert chosen.program == Program.parse("prev(1)") and by_vw.meta["selected_by"] == "vw_iou"
    assert chosen.scores["test"]["vw_iou"] == pytest.approx(1.0, abs=1e-3)  # reported beside IoU/JSD
    assert chosen.scores["test"]["iou"] < 0.3
    # with the sink as a side term (the default for value-weighted selection) the share is the head's as well
    side = select_programs(store, {}, StoreSplits((), idx[:3], idx[3:]), library=library, baselines=False, progress=False,
                           select_by="vw_iou")
    assert side.entries[(0, 0)].replacement.program == Program.parse("0.2*prev(1) + 0.8*first()")
    assert side.entries[(0, 0)].replacement.source == "sink-side" and side.meta["sink_side_terms"]


def test_a_store_written_before_value_norms_still_loads(stories, story_seqs, tmp_path):
    capture(stories, story_seqs, out=tmp_path / "old", shard_size=4, progress=False, value_norms=False)
    manifest = tmp_path / "old" / "manifest.json"
    meta = json.loads(manifest.read_text())
    meta.pop("value_norms")
    meta["version"] = 1  # as written before version 2
    manifest.write_text(json.dumps(meta))
    store = AttentionStore.load(tmp_path / "old")
    assert not store.has_value_norms and store.pattern(0, 1, 2).shape == (story_seqs[0].n,) * 2
    assert not HeadStore(tmp_path / "old", [(0, 0)]).has_value_norms
    with pytest.raises(StoreError, match="capture again"):
        store.norms(0)
    idx = list(range(len(story_seqs)))
    with pytest.warns(UserWarning, match="lacks"):
        chosen = select_programs(store, {}, StoreSplits((), idx[:3], idx[3:]), progress=False, select_by="vw_iou")
    assert chosen.meta["selected_by"] == "iou"
    assert not math.isnan(chosen.entries[(0, 0)].replacement.scores["test"]["iou"])
    assert "vw_iou" not in chosen.entries[(0, 0)].replacement.scores["test"]
    # resuming an old capture keeps its setting: asking for norms now names the difference
    with pytest.raises(StoreError, match="value_norms"):
        capture(stories, story_seqs, out=tmp_path / "old", shard_size=4, progress=False)
