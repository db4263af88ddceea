"""The four must-have replacement tests (docs/architecture.md) on GPT-2, Llama (GQA), BERT and stories260K, plus errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headsurgeon.core import HeadError
from headsurgeon.kernels.normalize import normalize_scores
from headsurgeon.surgery.patterns.capture import forward_patterns
from headsurgeon.surgery.swap.providers import StoredPatterns
from headsurgeon.surgery.swap.replace import HybridModel, SurgeryError, replace_heads
from headsurgeon.synth.program import Program
from support.surgery_models import batch_of, get_model

MODELS = ["gpt2", "llama", "bert", "stories260K"]


def all_hooks(model):
    return {name: (len(hp._forward_hooks), len(hp._forward_pre_hooks), len(hp._backward_hooks))
            for name, hp in model.hook_dict.items()}


@pytest.mark.parametrize("kind", MODELS)
def test_identity_every_head_replaced_by_its_own_pattern(request, documents, kind):
    h = get_model(request, kind)
    seqs, ids = batch_of(h, documents)
    pats = forward_patterns(h, seqs)  # float32, [L, H, n, n] per sequence
    own = {(l, k): StoredPatterns.from_arrays(seqs, [p[l, k] for p in pats]) for l, k in h.heads}
    with torch.no_grad():
        base = h.forward(ids)
        with replace_heads(h, own) as hybrid:
            assert len(hybrid.replaced) == h.n_layers * h.n_heads
            out = hybrid(ids)
    assert (out - base).abs().max().item() < 1e-5
    # and a real swap does change the logits (the hooks are live)
    with torch.no_grad(), replace_heads(h, {(0, 0): "first()", (h.n_layers - 1, 1): "prev(1)"}) as hybrid:
        assert (hybrid(ids) - base).abs().max().item() > 1e-4


@pytest.mark.parametrize("kind", MODELS)
def test_replaced_pattern_equals_normalized_program_output(request, documents, kind):
    h = get_model(request, kind)
    seqs, ids = batch_of(h, documents)
    program = Program.parse("0.6*prev(1) + 0.4*first()" if h.causal else "0.5*next(1) + 0.5*self()")
    want = normalize_scores(program.evaluate_scores(seqs, causal=h.causal) if hasattr(program, "evaluate_scores")
                            else program.evaluate(seqs, causal=h.causal), np.array([s.n for s in seqs]), h.causal)
    layer, head = h.n_layers - 1, h.n_heads - 1
    seen = {}
    with replace_heads(h, {f"L{layer}H{head}": program}) as hybrid, torch.no_grad():
        if hybrid.mode == "pattern":
            # observe what the attention actually used: a hook registered after ours on the same point
            hp = h.model.hook_dict[f"blocks.{layer}.attn.hook_pattern"]
            obs = hp.register_forward_hook(lambda m, i, o: seen.__setitem__("a", o[:, head].detach().clone()))
            hybrid(ids)
            obs.remove()
            got = seen["a"].numpy()
        else:
            # z mode (backend drops pattern edits): the head's z must equal program pattern @ v
            cap = {}
            hv = h.model.hook_dict[f"blocks.{layer}.attn.hook_v"].register_forward_hook(
                lambda m, i, o: cap.__setitem__("v", o.detach().clone()))
            hz = h.model.hook_dict[f"blocks.{layer}.attn.hook_z"].register_forward_hook(
                lambda m, i, o: cap.__setitem__("z", o.detach().clone()))
            hybrid(ids)
            hv.remove(), hz.remove()
            B, N = ids.shape
            v = cap["v"].reshape(B, N, -1, h.d_head)[:, :, head // (h.n_heads // h.n_kv_heads)]
            z = cap["z"].reshape(B, N, -1, h.d_head)[:, :, head]
            assert torch.allclose(z, torch.einsum("bqk,bkd->bqd", torch.from_numpy(want), v), atol=1e-5)
            got = want
    assert np.allclose(got, want, atol=1e-6)
    assert np.allclose(got.sum(-1), 1.0, atol=1e-5)


def head_grads(h, layer, name):
    """Per-head gradient blocks [heads, d_head, ...] of W_Q/W_K/W_V (output rows) or W_O (input columns)."""
    m = getattr(h.model.blocks[layer].attn, name).original_component
    g = m.weight.grad
    if g is None:
        return None
    conv = type(m).__name__ == "Conv1D"  # GPT-2's [in, out] layout
    if name == "o":
        g = g if conv else g.T  # → [heads*d, out]
    else:
        g = g.T if conv else g  # → [heads*d, in]
    return g.reshape(-1, h.d_head, g.shape[-1])


def grads_after_backward(model, ids):
    model.zero_grad(set_to_none=True)
    model(ids).float().pow(2).mean().backward()


@pytest.mark.parametrize("kind", MODELS)
def test_gradients_reach_neural_parts_but_not_replaced_qk(request, documents, kind):
    h = get_model(request, kind)
    seqs, ids = batch_of(h, documents, n=2)
    group = h.n_heads // h.n_kv_heads
    layer, kv = h.n_layers - 1, 0
    grads_after_backward(h.model, ids)
    learns = {n for n, p in h.model.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
    replaced = {(layer, q): "first()" for q in range(kv * group, (kv + 1) * group)}  # a whole kv group
    hybrid = replace_heads(h, replaced)
    try:
        grads_after_backward(hybrid, ids)
        wq, wk, wv, wo = (head_grads(h, layer, n) for n in "qkvo")
        for q in range(kv * group, (kv + 1) * group):
            assert wq[q].abs().max().item() == 0.0, "W_Q of a replaced head got gradient"
            assert wo[q].abs().max().item() > 0, "W_O of a replaced head got none"
        assert wk[kv].abs().max().item() == 0.0, "W_K of a fully replaced kv group got gradient"
        assert wv[kv].abs().max().item() > 0, "W_V of a replaced head got none"
        assert wq[h.n_heads - 1].abs().max().item() > 0, "a neural head stopped learning"
        # every parameter that learns in the unmodified model still learns, except replaced Q/K rows
        now = {n for n, p in hybrid.base.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
        lost = learns - now
        assert not lost, lost
    finally:
        hybrid.restore()
        h.model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("kind", MODELS)
def test_hooks_live_only_inside_the_hybrids_calls(request, documents, kind):
    """The base model called directly is always the base, before, during and after a hybrid's life."""
    h = get_model(request, kind)
    seqs, ids = batch_of(h, documents, n=2)
    before = all_hooks(h.model)
    with torch.no_grad():
        base = h.forward(ids)
        hybrid = replace_heads(h, {(0, 1): "uniform()", (h.n_layers - 1, 0): "first()"})
        assert all_hooks(h.model) == before  # nothing installed between calls
        assert not torch.equal(hybrid(ids), base)
        assert all_hooks(h.model) == before
        assert torch.equal(h.forward(ids), base) and torch.equal(h(ids), base)  # the base, while the hybrid lives
        restored = hybrid.restore()
        assert restored is h.model and all_hooks(h.model) == before
        assert torch.equal(h.forward(ids), base)
        with replace_heads(h, {(0, 0): "self()"}) as scoped:
            assert not torch.equal(scoped(ids), base) and torch.equal(h.forward(ids), base)
        assert all_hooks(h.model) == before
    with pytest.raises(SurgeryError, match="restored"):
        hybrid(ids)


def test_alpha_blends_neural_and_program(stories, documents):
    seqs, ids = batch_of(stories, documents, n=2)
    layer, head = 2, 3
    got = {}
    for alpha in (0.0, 0.3, 1.0):
        with replace_heads(stories, {(layer, head): "first()"}, alpha=alpha) as hybrid, torch.no_grad():
            hp = stories.model.hook_dict[f"blocks.{layer}.attn.hook_pattern"]
            obs = hp.register_forward_hook(lambda m, i, o: got.__setitem__(alpha, o[:, head].clone()))
            hybrid(ids)
            obs.remove()
    neural, program = got[0.0], got[1.0]
    assert torch.allclose(program[..., 0], torch.ones_like(program[..., 0]))
    assert torch.allclose(got[0.3], 0.3 * program + 0.7 * neural, atol=1e-6)


def test_bad_heads_duplicates_and_failing_programs(stories, documents):
    seqs, ids = batch_of(stories, documents, n=2)
    with pytest.raises(SurgeryError, match="layer 9 does not exist"):
        replace_heads(stories, {"L9H0": "first()"})
    with pytest.raises(SurgeryError, match="head 8 does not exist"):
        replace_heads(stories, {(0, 8): "first()"})
    with pytest.raises(SurgeryError, match="given twice"):
        replace_heads(stories, {"L1H2": "first()", (1, 2): "self()"})
    with pytest.raises(HeadError, match="cannot read head"):
        replace_heads(stories, {"layer one": "first()"})
    with pytest.raises(SurgeryError, match="alpha"):
        replace_heads(stories, {"L1H2": "first()"}, alpha=1.5)
    hybrid = replace_heads(stories, {"L1H2": "first()"})
    with pytest.raises(SurgeryError, match="already replaced"):
        replace_heads(hybrid, {"L1H2": "self()"})
    both = replace_heads(hybrid, {"L0H0": "self()"})
    assert set(both.replaced) == {(1, 2), (0, 0)}
    both.restore()

    class Broken:
        def patterns(self, sequences, causal):
            raise RuntimeError("boom")

    with replace_heads(stories, {"L0H0": Broken()}) as bad, pytest.raises(SurgeryError, match="L0H0 failed.*boom"):
        bad(ids)


def test_hybrid_is_usable_like_the_model(stories, documents):
    seqs, ids = batch_of(stories, documents, n=2)
    with replace_heads(stories, {"L0H0": "first()"}) as hybrid:
        assert isinstance(hybrid, torch.nn.Module) and hybrid.n_layers == 5 and hybrid.tokenizer is stories.tokenizer
        assert hybrid.cfg is stories.model.cfg  # bridge attributes pass through
        assert "L0H0" in repr(hybrid)
        out = hybrid.generate(torch.tensor([[stories.bos_id]]), max_new_tokens=8)
        assert out.shape == (1, 9)
        text = stories.tokenizer.decode(out[0], skip_special_tokens=True)
        assert len(text.split()) >= 2


def test_inplace_fast_path_never_changes_what_earlier_hooks_hold(stories, documents):
    """A user's hook on the base sees what attention used in each call, and what it kept from an earlier call
    stays as it was (the hybrid's in-place path never writes into a tensor someone else holds)."""
    seqs, ids = batch_of(stories, documents, n=2)
    layer, head = 2, 4
    hp = stories.model.hook_dict[f"blocks.{layer}.attn.hook_pattern"]
    held = []
    early = hp.register_forward_hook(lambda m, i, o: held.append(o))  # no clone on purpose
    try:
        with torch.no_grad():
            stories.forward(ids)
            neural = held[0][:, head].clone()
            with replace_heads(stories, {(layer, head): "first()"}) as hybrid:
                hybrid(ids)
            stories.forward(ids)
        assert torch.equal(held[0][:, head], neural)  # the first call's pattern was not edited in place
        assert torch.allclose(held[1][:, head, :, 0], torch.ones_like(held[1][:, head, :, 0]))  # the hybrid's call
        assert torch.equal(held[2][:, head], neural)  # the base again
    finally:
        early.remove()
