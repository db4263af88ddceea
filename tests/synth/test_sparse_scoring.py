"""Consumers of sparse program tensors: metrics from stored keys, the tensor cache holding packed rows, and
``program_rows`` / ``score_programs`` — the same numbers as the dense path (headsurgeon/kernels/sparse_metrics.py,
headsurgeon/synth/tensors.py, headsurgeon/synth/select.py)."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.kernels.cache import TensorCache
from headsurgeon.kernels.sparse import SparseRows, is_packed
from headsurgeon.synth import dsl
from headsurgeon.synth.metrics import RealPatterns, score_many
from headsurgeon.synth.program import Program
from headsurgeon.synth.sequence import Sequence, pad_ids
from headsurgeon.synth.tensors import is_sparse_program, program_rows, program_tensors

from support.dsl_trees import random_sequences

SPARSE = ["prev(1)", "first()", "window(1, 3)", "same_token()", "0.7*prev(1) + 0.3*first()",
          "fallback(same_token_recent(), first())", "sharpen(0.4*prev(1) + 0.6*same_token(), 3)", "self()"]


def _real(rng, H, lengths, N, causal, dtype=np.float16):
    """Row-normalized random real patterns [H, B, N, N] with about half the visible cells zero."""
    B = len(lengths)
    x = rng.random((H, B, N, N)) * (rng.random((H, B, N, N)) < 0.5)
    ar = np.arange(N)
    vis = (ar[None, :, None] < lengths[:, None, None]) & (ar[None, None, :] < lengths[:, None, None])
    if causal:
        vis &= ar[None, None, :] <= ar[None, :, None]
    x = x * vis[None]
    x[..., 0] += vis[None, :, :, 0] * 1e-3
    s = x.sum(-1, keepdims=True)
    return np.divide(x, s, out=np.zeros_like(x), where=s > 0).astype(dtype)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_sparse_candidates_score_like_their_dense_form(causal, dtype):
    rng = np.random.default_rng(1 + causal)
    seqs = random_sequences(rng, 12, max_len=20)
    ids, lengths = pad_ids(seqs)
    real = _real(rng, 3, lengths, ids.shape[1], causal, dtype)
    rows = [dsl.evaluate_sparse(dsl.parse(t), ids, lengths, causal=causal) for t in SPARSE]
    dense = np.stack([r.to_dense() for r in rows])
    want = score_many(real, dense, lengths, causal, per_sequence=True)
    got = score_many(real, rows, lengths, causal, per_sequence=True)
    mixed = score_many(real, [r if k % 2 else r.to_dense() for k, r in enumerate(rows)], lengths, causal)
    for m in ("iou", "jsd", "topq"):
        np.testing.assert_allclose(got[m], want[m], rtol=0, atol=1e-12, err_msg=m)
        np.testing.assert_allclose(mixed[m], want[m].mean(axis=2), rtol=0, atol=1e-12, err_msg=m)
    for m in ("iou", "jsd", "topq"):  # one metric alone takes the same numbers
        np.testing.assert_allclose(score_many(real, rows, lengths, causal, (m,))[m], want[m].mean(axis=2),
                                   rtol=0, atol=1e-12, err_msg=m)


def test_zero_weight_keys_and_explicit_zeros_count_as_absent():
    rng = np.random.default_rng(4)
    seqs = random_sequences(rng, 6, max_len=12)
    ids, lengths = pad_ids(seqs)
    real = _real(rng, 2, lengths, ids.shape[1], True)
    rows = dsl.evaluate_sparse(dsl.parse("0.5*prev(1) + 0.5*first()"), ids, lengths)
    vals = rows.vals.copy()
    vals[::3] = 0.0  # stored keys of weight zero: no mass, no JSD term, not a top-q cell
    zeroed = SparseRows(rows.rowptr, rows.cols, vals, rows.lengths, rows.n)
    want = score_many(real, zeroed.to_dense()[None], lengths, True, per_sequence=True)
    got = score_many(real, [zeroed], lengths, True, per_sequence=True)
    for m in want:
        assert np.isfinite(got[m]).all()
        np.testing.assert_allclose(got[m], want[m], atol=1e-12, err_msg=m)


def test_sparse_candidates_are_checked_and_sized():
    rng = np.random.default_rng(2)
    seqs = random_sequences(rng, 4)
    ids, lengths = pad_ids(seqs)
    real = _real(rng, 1, lengths, ids.shape[1], True)
    rows = dsl.evaluate_sparse(dsl.parse("prev(1)"), ids, lengths)
    bad = SparseRows(rows.rowptr, rows.cols, -rows.vals, rows.lengths, rows.n)
    with pytest.raises(ValueError, match="negative or non-finite"):
        score_many(real, [bad], lengths, True)
    with pytest.raises(ValueError, match="batch sizes disagree"):
        score_many(real[:, :2], [rows], lengths[:2], True)
    prepared = RealPatterns(real, lengths, True)
    np.testing.assert_allclose(prepared.score([rows])["iou"], prepared.score([rows])["iou"])  # row sums reused


def test_cache_holds_sparse_programs_packed_and_small(tmp_path):
    rng = np.random.default_rng(6)
    seqs = random_sequences(rng, 10, min_len=40, max_len=80)
    progs = [Program.parse(t) for t in ("prev(1)", "first()", "window(1, 3)", "same_token()", "decay(0.5)")]
    assert [is_sparse_program(p) for p in progs] == [True, True, True, True, False]
    cache = TensorCache(directory=tmp_path)
    got = program_rows(progs, seqs, True, cache)
    assert [isinstance(t, SparseRows) for t in got] == [True, True, True, True, False]
    direct = [p.evaluate(seqs, causal=True) for p in progs]
    for t, want in zip(got, direct):
        assert np.array_equal(t.to_dense() if isinstance(t, SparseRows) else t, want)
    dense_bytes = sum(s.n * s.n * 4 for s in seqs)
    for prog in progs[:4]:
        entries = [cache.get(_key(prog, s)) for s in seqs]
        assert all(is_packed(e) for e in entries)
        assert sum(e.nbytes for e in entries) <= 0.10 * dense_bytes, prog.text
    assert cache.get(_key(progs[4], seqs[0])).dtype == np.float32  # dense programs stay dense
    fresh = TensorCache(directory=tmp_path)  # from disk, packed entries load back
    again = program_rows(progs, seqs[::-1] + seqs[:2], True, fresh)
    assert fresh.stats.misses == 0
    for t, want in zip(again, program_tensors(progs, seqs[::-1] + seqs[:2], True)):
        assert np.array_equal(t.to_dense() if isinstance(t, SparseRows) else t, want)


def _key(prog, seq):
    from headsurgeon.kernels.cache import cache_key
    from headsurgeon.synth.tensors import mask_policy
    return cache_key(prog.hash, seq.key, mask_policy(True))


def test_program_rows_without_cache_handles_repeated_sequences():
    rng = np.random.default_rng(8)
    seqs = random_sequences(rng, 5)
    batch = seqs + seqs[1:3]
    for text in ("same_token()", "uniform()"):
        prog = Program.parse(text)
        got = program_rows([prog], batch, True)[0]
        dense = got.to_dense() if isinstance(got, SparseRows) else got
        assert np.array_equal(dense, program_tensors([prog], batch, True, cache=TensorCache())[0])


def test_program_rows_reuses_a_prepared_batch_only_for_the_same_sequences():
    """headsurgeon/synth/tensors.py keeps its last prepared batches by the sequences' identity: the same objects in the same order
    hit (the same rows come back), a replaced ``ids`` array (counted by headsurgeon/synth/sequence.py) or other objects miss,
    and the oldest batch is dropped."""
    from headsurgeon.synth import sequence as sequence_module, tensors

    rng = np.random.default_rng(12)
    seqs = random_sequences(rng, 6)
    prog = Program.parse("same_token()")
    def direct(batch):  # the kernels on freshly padded ids, no prepared batch
        return dsl.evaluate(prog.node, *pad_ids(batch), None, True)

    want = direct(seqs)
    first = program_rows([prog], seqs, True)[0]
    assert np.array_equal(first.to_dense(), want)
    assert tensors._PREPARED.get(list(seqs)) is tensors._PREPARED.get(list(seqs))
    assert tensors._PREPARED.get(seqs[::-1]) is not tensors._PREPARED.get(seqs)  # other order: another batch
    assert np.array_equal(program_rows([prog], tuple(seqs[::-1]), True)[0].to_dense(), direct(seqs[::-1]))
    replaced = sequence_module.IDS_REPLACED
    assert np.array_equal(program_rows([prog], seqs, True)[0].to_dense(), want)
    other = random_sequences(np.random.default_rng(13), 6)
    seqs[2].ids = other[2].ids.copy()  # same object, new tokens: a miss, the new tokens are read
    seqs[2].tokens, seqs[2].offsets = other[2].tokens, other[2].offsets
    assert sequence_module.IDS_REPLACED == replaced + 1
    changed = program_rows([prog], seqs, True)[0].to_dense()
    assert np.array_equal(changed, direct(seqs)) and not np.array_equal(changed, want)
    batches = [random_sequences(np.random.default_rng(20 + k), 3) for k in range(tensors._PREPARED.size + 1)]
    held = [tensors._PREPARED.get(b) for b in batches]
    assert tensors._PREPARED.get(batches[-1]) is held[-1] and tensors._PREPARED.get(batches[0]) is not held[0]
    small = tensors._Prepared(max_bytes=8)  # padded ids above the bound are prepared for each call, never kept
    assert small.get(batches[0]) is not small.get(batches[0])
    with pytest.raises(ValueError, match="empty sequence"):
        program_rows([prog], [seqs[0], Sequence(ids=np.zeros(0, np.int64), tokens=[], text="",
                                                offsets=np.zeros((0, 2), np.int64))], True)


def test_pad_rows_pads_consecutive_rows_and_names_bad_lengths():
    """headsurgeon/kernels/primitives/buffers.py ``pad_rows``: what ``pad_ids`` gives, and an error for a mismatch."""
    from headsurgeon.kernels.primitives.buffers import pad_rows

    seqs = random_sequences(np.random.default_rng(14), 7)
    ids, lengths = pad_ids(seqs)
    assert np.array_equal(pad_rows(np.concatenate([s.ids for s in seqs]), lengths, ids.shape[1]), ids)
    assert pad_rows(np.zeros(0, np.int64), np.zeros(0, np.int64), 0).shape == (0, 0)
    with pytest.raises(ValueError, match="does not fit width"):
        pad_rows(np.arange(5), np.array([2, 3]), 2)
    with pytest.raises(ValueError, match="lengths sum to 6"):
        pad_rows(np.arange(5), np.array([3, 3]), 3)


def test_a_fully_cached_sparse_batch_with_a_wrong_entry_is_evaluated_again():
    """Every window a hit takes the one-pass read (``from_packed`` with the batch's lengths); an entry of another
    length under a window's key (a foreign or damaged cache) sends the batch down the checked path, which
    evaluates that window again."""
    rng = np.random.default_rng(15)
    seqs = random_sequences(rng, 6, min_len=5, max_len=12)
    prog = Program.parse("same_token()")
    want = program_tensors([prog], seqs, True)[0]
    cache = TensorCache()
    program_rows([prog], seqs, True, cache)
    assert np.array_equal(program_rows([prog], seqs, True, cache)[0].to_dense(), want)
    longer = random_sequences(np.random.default_rng(16), 1, min_len=14, max_len=20)[0]
    from headsurgeon.kernels.sparse import pack_sequence
    wrong = pack_sequence(dsl.evaluate_sparse(prog.node, *pad_ids([longer]), None, True), 0)
    cache.put(_key(prog, seqs[2]), wrong)
    misses = cache.stats.misses
    got = program_rows([prog], seqs, True, cache)[0]
    assert np.array_equal(got.to_dense(), want) and cache.stats.misses == misses
    assert is_packed(cache.get(_key(prog, seqs[2]))) and cache.get(_key(prog, seqs[2])).shape != wrong.shape
