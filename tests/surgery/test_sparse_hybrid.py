"""The hybrid's hook takes sparse programs as stored keys (headsurgeon/surgery/swap/headpatterns.py): the same logits and gradients
as the dense path, in pattern mode and in z mode, with and without alpha blending."""
from __future__ import annotations

import pytest
import torch

from headsurgeon.surgery.swap import program_head as program_head_module
from headsurgeon.surgery.swap.replace import replace_heads

from support.surgery_models import batch_of, get_model

PROGRAMS = {"L0H0": "prev(1)", "L1H1": "fallback(same_token(), first())", "L1H2": "decay(0.7)",
            "L0H3": "0.6*prev(1) + 0.4*first()"}


def _run(h, ids, alpha, grad: bool):
    h.model.zero_grad(set_to_none=True)
    with replace_heads(h, PROGRAMS, alpha=alpha, fused=False) as hybrid:  # the hooks' scatter (fused: test_fast_attention)
        if grad:
            out = hybrid(ids)
            out.float().pow(2).mean().backward()
            grads = {n: p.grad.detach().clone() for n, p in h.model.named_parameters() if p.grad is not None}
        else:
            with torch.no_grad():
                out = hybrid(ids)
            grads = {}
        layers = [lp for batch in hybrid._batch_cache.values() for lp in batch.values()]
        mode = hybrid.mode
    return out.detach(), grads, layers, mode


@pytest.mark.parametrize("kind", ["stories260K", "bert"])
@pytest.mark.parametrize("alpha", [1.0, {"L0H0": 0.5, "L1H2": 0.25}])
@pytest.mark.parametrize("grad", [False, True])
def test_sparse_scatter_equals_the_dense_path(request, documents, monkeypatch, kind, alpha, grad):
    h = get_model(request, kind)
    programs = PROGRAMS if h.causal else {k: v.replace("prev(1)", "next(1)") for k, v in PROGRAMS.items()}
    monkeypatch.setattr(__import__("test_sparse_hybrid"), "PROGRAMS", programs)
    _, ids = batch_of(h, documents)
    sparse_out, sparse_grads, layers, mode = _run(h, ids, alpha, grad)
    assert mode == ("z" if kind == "bert" else "pattern")  # both hook paths are covered
    assert sum(len(lp.sparse) for lp in layers) == 3 and sum(len(lp.dense_heads) for lp in layers) == 1
    monkeypatch.setattr(program_head_module, "is_sparse_program", lambda program: False)
    dense_out, dense_grads, layers, _ = _run(h, ids, alpha, grad)
    assert all(not lp.sparse for lp in layers)
    torch.testing.assert_close(sparse_out, dense_out, atol=1e-5, rtol=1e-5)
    assert sparse_grads.keys() == dense_grads.keys()
    for name in sparse_grads:
        torch.testing.assert_close(sparse_grads[name], dense_grads[name], atol=1e-5, rtol=1e-4)


@pytest.mark.smoke
def test_the_batch_cache_holds_at_most_its_byte_cap(request, documents):
    h = get_model(request, "stories260K")
    _, ids = batch_of(h, documents)
    batches = [ids[:, : ids.shape[1] - cut] for cut in range(4)]  # four distinct batches
    with torch.no_grad():
        with replace_heads(h, PROGRAMS) as roomy:
            want = [roomy(b) for b in batches]
            sizes = [sum(lp.nbytes for lp in batch.values()) for batch in roomy._batch_cache.values()]
        assert len(sizes) == 4 and min(sizes) > 0
        cap = sizes[-1] + sizes[-2]  # room for the last two batches, not three
        with replace_heads(h, PROGRAMS, batch_cache_bytes=cap) as capped:
            got = [capped(b) for b in batches]
            assert len(capped._batch_cache) == 2
            assert sum(lp.nbytes for batch in capped._batch_cache.values() for lp in batch.values()) <= cap
            assert replace_heads(capped, {"L2H0": "first()"})._batch_cache_bytes == cap  # a hybrid's cap is kept
        with replace_heads(h, PROGRAMS, batch_cache_bytes=0) as bare:
            again = [bare(b) for b in batches]
            assert not bare._batch_cache
    for a, b, c in zip(want, got, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    with pytest.raises(Exception, match="batch_cache_bytes must be a whole number"):
        replace_heads(h, PROGRAMS, batch_cache_bytes=-1)
