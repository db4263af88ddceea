"""The sparse program-tensor form: every sparse-capable primitive and combinator equals the dense path bit for bit.

headsurgeon/kernels/sparse.py (the form), headsurgeon/kernels/primitives/sparse_*.py (kernels), headsurgeon/kernels/normalize.py
(``normalize_rows``), headsurgeon/synth/dsl/sparse.py (which trees, and their evaluation).
"""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.kernels.normalize import normalize_rows, normalize_scores
from headsurgeon.kernels.sparse import RowsBuffer, SparseRows, from_dense, from_packed, is_packed, pack_sequence
from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import Pred, Prim
from headsurgeon.synth.features import batch_feature_arrays
from headsurgeon.synth.sequence import pad_ids

from support.dsl_trees import grow_trees, random_primitive, random_sequences

FEATURES = ("punct", "cap", "word_start", "word", "sent")
DENSE_PRIMITIVES = {"decay", "uniform", "profile", "key_weight", "class_weight"}


def _arrays(rng: np.random.Generator, count: int = 9):
    seqs = random_sequences(rng, count)
    ids, lengths = pad_ids(seqs)
    feats = batch_feature_arrays(seqs, list(FEATURES))
    feats["lemma"] = rng.integers(-1, 4, ids.shape)  # spaCy-free stand-ins: values < 0 mean "none"
    feats["dep_head"] = rng.integers(-1, ids.shape[1], ids.shape)
    return seqs, ids, lengths, feats


def _usable() -> list[str]:
    return [n for n, s in dsl.PRIMITIVE_SPECS.items() if set(s.features) <= set(FEATURES) | {"lemma", "dep_head"}]


def test_the_spec_declares_which_primitives_are_sparse() -> None:
    sparse = {n for n, s in dsl.PRIMITIVE_SPECS.items() if s.support is not None}
    assert DENSE_PRIMITIVES.isdisjoint(sparse)
    assert {"prev", "self", "first", "window", "key_in_set", "match", "same_token", "recent"} <= sparse
    assert dsl.row_support(dsl.parse("prev(1)")) == 1
    assert dsl.row_support(dsl.parse("window(1, 3)")) == 3
    assert dsl.row_support(dsl.parse("0.7*prev(1) + 0.3*first()")) == 2
    assert dsl.row_support(dsl.parse("fallback(same_token(), first())")) == float("inf")
    assert dsl.row_support(dsl.parse("mul(window(0, 4), prev(2))")) == 1
    assert dsl.row_support(dsl.parse("0.5*prev(1) + 0.5*decay(0.5)")) is None
    assert not dsl.is_sparse(dsl.parse("uniform()"))
    with pytest.raises(ValueError, match="dense support"):
        dsl.evaluate_sparse(dsl.parse("decay(0.5)"), np.zeros((1, 3), np.int64), np.array([3]))


@pytest.mark.parametrize("causal", [True, False])
def test_every_sparse_primitive_and_combinator_equals_the_dense_path_bit_for_bit(causal: bool) -> None:
    rng = np.random.default_rng(11 + causal)
    seqs, ids, lengths, feats = _arrays(rng)
    sparse_names = [n for n in _usable() if dsl.PRIMITIVE_SPECS[n].support is not None]
    pool = [random_primitive(name, rng, ("word", "sent")) for name in sparse_names for _ in range(3)]
    cases = [(p.name, p) for p in pool]
    preds = [Pred("flag", f) for f in ("punct", "cap", "word_start")]
    cases += grow_trees(rng, pool, preds, depth=2, per=5)
    covered = set()
    for name, node in cases:
        assert dsl.is_sparse(node), dsl.to_text(node)
        scores = dsl.evaluate_scores(node, ids, lengths, feats, causal)
        rows = dsl.evaluate_sparse_scores(node, ids, lengths, feats, causal)
        text = dsl.to_text(node)
        assert np.array_equal(rows.to_dense(), scores), f"scores of {text}"
        want = dsl.evaluate(node, ids, lengths, feats, causal)
        got = dsl.evaluate_sparse(node, ids, lengths, feats, causal)
        assert np.array_equal(got.to_dense(), want), f"pattern of {text}"
        counts = got.row_counts()
        assert (counts[np.arange(ids.shape[1])[None, :] >= lengths[:, None]] == 0).all()  # padded rows empty
        for r in range(got.rowptr.shape[0] - 1):  # keys strictly ascending in every row
            assert (np.diff(got.cols[got.rowptr[r]: got.rowptr[r + 1]]) > 0).all(), text
        covered.add(name)
    assert covered == set(sparse_names) | set(dsl.COMBINATORS)


def test_sparse_normalization_follows_the_dense_rules() -> None:
    rng = np.random.default_rng(3)
    B, n = 4, 7
    lengths = np.array([7, 5, 1, 3])
    dense = rng.uniform(-1, 2, (B, n, n)).astype(np.float32) * (rng.random((B, n, n)) < 0.4)
    dense[0, 3] = 0.0  # an empty row: goes to position 0
    rows = _from_dense(dense)
    for causal in (True, False):
        want = normalize_scores(dense.copy(), lengths, causal)
        got = normalize_rows(SparseRows(rows.rowptr, rows.cols, rows.vals, lengths, n), causal)
        assert np.array_equal(got.to_dense(), want)
    bad = dense.copy()
    bad[1, 2, 1] = np.nan
    with pytest.raises(ValueError, match="sequence 1, query 2, key 1"):
        normalize_rows(_from_dense(bad, lengths), True)


def _from_dense(dense: np.ndarray, lengths=None) -> SparseRows:
    B, n, _ = dense.shape
    nz = dense != 0
    rowptr = np.zeros(B * n + 1, np.int64)
    np.cumsum(nz.reshape(-1, n).sum(1), out=rowptr[1:])
    cols = np.nonzero(nz.reshape(-1, n))[1].astype(np.int32)
    lengths = np.full(B, n) if lengths is None else np.asarray(lengths)
    return SparseRows(rowptr, cols, dense[nz].astype(np.float32), lengths.astype(np.int64), n)


def test_packing_round_trips_and_batches_take_and_widen() -> None:
    rng = np.random.default_rng(5)
    seqs, ids, lengths, feats = _arrays(rng)
    modes = set()
    for text in ("0.6*same_token() + 0.4*prev(2)", "window(0, 3)", "same_token()", "first()"):
        rows = dsl.evaluate_sparse(dsl.parse(text), ids, lengths, feats)
        packed = [pack_sequence(rows, b) for b in range(len(seqs))]
        modes |= {int(p[3]) for p in packed}
        assert np.array_equal(from_packed(packed, ids.shape[1]).to_dense(), rows.to_dense()), text
    assert modes == {0, 1, 2, 3}  # keys listed or as a band, weights listed or one per row
    rows = dsl.evaluate_sparse(dsl.parse("0.6*same_token() + 0.4*prev(2)"), ids, lengths, feats)
    dense = rows.to_dense()
    packed = [pack_sequence(rows, b) for b in range(len(seqs))]
    assert all(is_packed(p) for p in packed) and not is_packed(dense[0])
    wide = from_packed(packed[::-1], ids.shape[1] + 3)
    assert np.array_equal(wide.to_dense()[:, : ids.shape[1], : ids.shape[1]], dense[::-1])
    assert np.array_equal(rows.take([2, 0]).to_dense(), dense[[2, 0]])
    assert np.array_equal(rows.widen(ids.shape[1] + 2).to_dense()[:, : ids.shape[1], : ids.shape[1]], dense)
    with pytest.raises(ValueError, match="not a packed sparse sequence"):
        from_packed([packed[0][:-1]], ids.shape[1])


def test_a_rows_buffer_is_reused_across_evaluations() -> None:
    rng = np.random.default_rng(9)
    seqs, ids, lengths, feats = _arrays(rng)
    buf = RowsBuffer()
    for text in ("prev(1)", "0.5*prev(1) + 0.5*same_token()"):  # a lone primitive, and a tree normalized after
        node = dsl.parse(text)
        first = dsl.evaluate_sparse(node, ids, lengths, feats, out=buf)
        want = dsl.evaluate(node, ids, lengths, feats)
        assert np.array_equal(first.to_dense(), want)
        held = buf.nbytes
        again = dsl.evaluate_sparse(node, ids, lengths, feats, out=buf)
        assert np.shares_memory(again.rowptr, first.rowptr) and np.shares_memory(again.cols, first.cols)
        assert buf.nbytes == held and np.array_equal(again.to_dense(), want)


@pytest.mark.parametrize("causal", [True, False])
def test_every_sparse_primitive_overwrites_a_rows_buffer_full_of_other_values(causal: bool) -> None:
    """The count pass writes the whole row pointer itself (headsurgeon/kernels/primitives/sparse_prims.py ``_end``, and
    ``_close`` for padded rows): nothing left in a reused buffer leaks into the rows."""
    rng = np.random.default_rng(21 + causal)
    seqs, ids, lengths, feats = _arrays(rng)
    assert lengths.min() < ids.shape[1]  # padded rows exist
    names = [n for n in _usable() if dsl.PRIMITIVE_SPECS[n].support is not None]
    for node in [random_primitive(name, rng, ("word", "sent")) for name in names for _ in range(2)]:
        buf = RowsBuffer()
        size = 4 * (ids.size + 1)
        buf.array("rowptr", size, np.int64)[:] = 7
        buf.array("cols", size, np.int32)[:] = 99
        buf.array("vals", size, np.float32)[:] = np.nan
        got = dsl.evaluate_sparse(node, ids, lengths, feats, causal, out=buf)
        want = dsl.evaluate_sparse(node, ids, lengths, feats, causal)
        text = dsl.to_text(node)
        for a, b in ((got.rowptr, want.rowptr), (got.cols, want.cols), (got.vals, want.vals)):
            assert np.array_equal(a, b), text
        assert np.array_equal(got.to_dense(), dsl.evaluate(node, ids, lengths, feats, causal)), text


def test_same_token_without_an_id_table_takes_the_quadratic_scan() -> None:
    ids = np.array([[5, -3, 5, -3, 7, 5]])  # negative ids: no id-indexed table
    lengths = np.array([6])
    for causal in (True, False):
        got = dsl.evaluate_sparse_scores(dsl.parse("same_token()"), ids, lengths, causal=causal)
        assert np.array_equal(got.to_dense(), dsl.evaluate_scores(dsl.parse("same_token()"), ids, lengths,
                                                                  causal=causal))


def test_from_dense_keeps_the_non_zero_cells_inside_each_length() -> None:
    rng = np.random.default_rng(12)
    dense = (rng.random((3, 6, 6)) * (rng.random((3, 6, 6)) < 0.5)).astype(np.float32)
    lengths = np.array([6, 4, 1])
    rows = from_dense(dense, lengths)
    inside = np.arange(6)[None, :] < lengths[:, None]
    assert np.array_equal(rows.to_dense(), dense * (inside[:, :, None] & inside[:, None, :]))
    assert rows.nnz == int(np.count_nonzero(rows.to_dense()))
