"""A loaded test model by kind and a batch of equal-length windows from it, for the replacement tests
(tests/surgery/test_surgery.py, tests/surgery/test_sparse_hybrid.py)."""
from __future__ import annotations

from headsurgeon.surgery.patterns.capture import padded_batch
from headsurgeon.surgery.corpus import make_sequences


def get_model(request, kind):
    return request.getfixturevalue("stories") if kind == "stories260K" else request.getfixturevalue("random_models")[kind]


def batch_of(handle, documents, n=3, length=24):
    seqs = [s for s in make_sequences(handle, documents[:30], max_len=length) if s.n == length][:n]
    assert len(seqs) == n
    ids, _ = padded_batch(seqs)
    return seqs, ids
