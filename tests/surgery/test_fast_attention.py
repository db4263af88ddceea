"""The hybrid's fused path (headsurgeon/surgery/swap/fast_attention.py, headsurgeon/surgery/swap/plain_model.py): an unwatched call gives the hooked
path's logits and gradients within float tolerance (MHA, GQA, a fused-qkv GPT-2; sparse, dense, blended and whole
layers replaced; padding), computes Q·Kᵀ only for heads that keep a neural part, and any watcher (run_with_cache,
TransformerLens hooks, a module hook, ``fused=False``) gets the hooked path."""
from __future__ import annotations

import warnings

import pytest
import torch

from headsurgeon.surgery.models.loading import load_model
from headsurgeon.surgery.swap.replace import replace_heads

#: layer 0: sparse, sparse mix and a dense program; layer 1: every head (no neural head left)
PROGRAMS = {"L0H0": "prev(1)", "L0H1": "0.9*first() + 0.1*prev(1)", "L0H4": "decay(0.7)",
            "L1H0": "first()", "L1H1": "prev(1)", "L1H2": "fallback(same_token(), first())", "L1H3": "self()",
            "L1H4": "prev(2)", "L1H5": "decay(0.5)"}
ALPHA = {"L0H1": 0.5, "L0H4": 0.25, "L1H2": 0.75}


def _tiny(tokenizer_dir, kv_heads: int):
    """A 3-layer Llama with 6 query heads over ``kv_heads`` key/value heads, random weights (seed 0)."""
    from transformers import GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = GPT2TokenizerFast.from_pretrained(tokenizer_dir)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=kv_heads,
                                         hidden_size=48, intermediate_size=64, vocab_size=len(tok),
                                         max_position_embeddings=128))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(model.eval(), tokenizer=tok)


@pytest.fixture(scope="module")
def models(gpt2_tokenizer_dir, random_models):
    return {"llama-gqa": _tiny(gpt2_tokenizer_dir, 2), "llama-mha": _tiny(gpt2_tokenizer_dir, 6),
            "gpt2": random_models["gpt2"]}


def _programs(h):
    return {k: v for k, v in PROGRAMS.items() if int(k[3]) < h.n_heads}


def _ids(h, n=2, length=33, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, min(h.vocab_size, 1000), (n, length), generator=g)
    ids[:, 5:9] = ids[:, 20:24]  # repeats, so same_token finds keys
    return ids


def _run(hybrid, ids, fused: bool, grad: bool, **kw):
    hybrid.fused = fused
    hybrid.base.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        out = hybrid(ids, **kw)
    # GPT-2's bridge trains q/k/v views of the fused c_attn: training through it keeps to the hooked path
    aliased = grad and hybrid._aliased_parameters()
    assert hybrid.last_path == ("fused" if fused and not aliased else "hooked")
    grads = {}
    if grad:
        out.float().pow(2).mean().backward()
        grads = _by_storage(hybrid.base)
    return out.detach(), grads


def _by_storage(model) -> dict[int, torch.Tensor]:
    """Gradients summed per parameter storage: the bridge's GPT-2 q/k/v are views of the fused c_attn weight, which
    the hooked path trains through the views and the fused path through c_attn itself."""
    out: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        if p.grad is None:
            continue
        storage = p.untyped_storage()
        buf = out.setdefault(storage.data_ptr(), torch.zeros(storage.nbytes() // p.element_size(), dtype=p.dtype))
        buf.as_strided(p.shape, p.stride(), p.storage_offset()).add_(p.grad)
    return out


@pytest.mark.parametrize("kind", ["llama-gqa", "llama-mha", "gpt2"])
@pytest.mark.parametrize("alpha", [1.0, ALPHA])
@pytest.mark.parametrize("grad", [False, True])
def test_the_fused_path_equals_the_hooked_path(models, kind, alpha, grad):
    h = models[kind]
    ids = _ids(h)
    with replace_heads(h, _programs(h), alpha=alpha) as hybrid:
        fused, fused_grads = _run(hybrid, ids, True, grad)
        hooked, hooked_grads = _run(hybrid, ids, False, grad)
    assert not torch.allclose(fused, h.model(ids).detach(), atol=1e-3)  # the programs took effect
    torch.testing.assert_close(fused, hooked, atol=2e-5, rtol=1e-5)
    # a layer with every head replaced uses no Q or K: no gradient where the hooks give zeros
    assert fused_grads.keys() <= hooked_grads.keys()
    for key, want in hooked_grads.items():
        got = fused_grads.get(key, torch.zeros_like(want))
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_padded_batches_agree_on_their_real_tokens(models):
    h = models["llama-gqa"]
    ids = _ids(h, n=3)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    mask[2, 12:] = 0
    with replace_heads(h, _programs(h), alpha=ALPHA) as hybrid:
        fused, _ = _run(hybrid, ids, True, False, attention_mask=mask)
        hooked, _ = _run(hybrid, ids, False, False, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(fused[real], hooked[real], atol=2e-5, rtol=1e-5)


def test_replaced_heads_compute_no_qk(models, monkeypatch):
    """SDPA sees only the heads that keep a neural part; the bridge's eager attention does not run at all."""
    h = models["llama-gqa"]
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        seen.append(q.shape[1])
        return sdpa(q, k, v, *a, **kw)

    def refuse(*a, **kw):
        raise AssertionError("the bridge's eager attention ran")

    with replace_heads(h, _programs(h), alpha=ALPHA) as hybrid:
        hybrid(_ids(h))  # builds and checks the plain model (its probe runs the bridge) before the spies go in
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        monkeypatch.setattr(type(h.model.blocks[0].attn), "forward", refuse)
        with torch.no_grad():
            hybrid(_ids(h, seed=2))
        state = hybrid.last_state
    # layer 0: 6 heads, L0H0 replaced, L0H1/L0H4 blended; layer 1: all replaced but L1H2 blended; layer 2: none
    assert seen == [5, 1, 6]
    assert state.neural_heads == {0: 5, 1: 1, 2: 6} and state.layers_seen == [0, 1, 2]


def test_watchers_get_the_hooked_path(models):
    h = models["llama-gqa"]
    ids = _ids(h)
    with torch.no_grad(), replace_heads(h, _programs(h)) as hybrid:
        fused = hybrid(ids)
        assert hybrid.last_path == "fused"
        _, cache = hybrid.run_with_cache(ids)
        # the cache shows the program's pattern: prev(1) puts all of row 3 on key 2
        assert float(cache["blocks.0.attn.hook_pattern"][0, 0, 3, 2]) == pytest.approx(1.0)
        seen = []
        with hybrid.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", lambda p, hook: seen.append(p.shape))]):
            watched = hybrid(ids)
        assert hybrid.last_path == "hooked" and seen
        torch.testing.assert_close(watched, fused, atol=2e-5, rtol=1e-5)
        handle = h.model.blocks[0].register_forward_hook(lambda m, i, o: seen.append("block"))
        try:
            hybrid(ids)
            assert hybrid.last_path == "hooked" and seen[-1] == "block"
        finally:
            handle.remove()
        hybrid(ids)
        assert hybrid.last_path == "fused"
    with torch.no_grad(), replace_heads(h, _programs(h), fused=False) as hybrid:
        hybrid(ids)
        assert hybrid.last_path == "hooked"


def test_weight_decay_leaves_replaced_q_rows_fixed_through_the_fused_path(models):
    h = models["llama-mha"]
    attn = h.model.blocks[0].attn.original_component
    d = attn.head_dim
    before = attn.q_proj.weight[:d].detach().clone()  # L0H0, fully replaced
    hybrid = replace_heads(h, {"L0H0": "prev(1)"}, copy=True)
    opt = torch.optim.AdamW([p for p in hybrid.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.5)
    hybrid(_ids(h)).float().pow(2).mean().backward()
    assert hybrid.last_path == "fused"
    opt.step()
    q = hybrid.base.blocks[0].attn.original_component.q_proj.weight
    torch.testing.assert_close(q[:d], before, atol=0, rtol=0)
    assert not torch.equal(q[d:], attn.q_proj.weight[d:])  # the neural heads trained
    hybrid.restore()
