"""Training code with program heads: the hybrid fine-tunes, the loss falls, program heads keep their programs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headsurgeon.surgery.patterns.capture import padded_batch
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program


def test_fine_tune_hybrid_with_fixed_program_heads(stories, documents):
    seqs = [s for s in make_sequences(stories, documents[100:160], max_len=64) if s.n == 64][:8]
    ids, _ = padded_batch(seqs)
    programs = {(0, 0): Program.parse("first()"), (1, 2): Program.parse("prev(1)"),
                (3, 5): Program.parse("0.5*prev(1) + 0.5*first()"), (4, 7): Program.parse("uniform()")}
    before = {n: p.detach().clone() for n, p in stories.model.named_parameters()}
    hybrid = replace_heads(stories, programs)
    try:
        hybrid.train()
        opt = torch.optim.Adam([p for p in hybrid.parameters() if p.requires_grad], lr=3e-3)
        losses = []
        for _ in range(8):
            logits = hybrid(ids)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0] - 0.02, losses
        assert hybrid.replaced == programs  # the program heads are still the same programs
        # and they still produce exactly the programs' attention
        hybrid.eval()
        got = {}
        hp = stories.model.hook_dict["blocks.3.attn.hook_pattern"]
        obs = hp.register_forward_hook(lambda m, i, o: got.__setitem__("p", o[:, 5].detach().clone()))
        with torch.no_grad():
            hybrid(ids)
        obs.remove()
        want = programs[(3, 5)].evaluate(seqs, causal=True)
        assert np.allclose(got["p"].numpy(), want, atol=1e-6)
    finally:
        hybrid.restore()
        with torch.no_grad():  # put stories260K back for the other tests
            for n, p in stories.model.named_parameters():
                p.copy_(before[n])
        stories.model.eval()


def q_k_rows(handle, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s W_Q and W_K as [heads, d_head, d_model] copies (query heads, key/value heads)."""
    attn = handle.model.blocks[layer].attn
    d = handle.d_head
    q = attn.q.original_component.weight.detach().clone()
    k = attn.k.original_component.weight.detach().clone()
    return q.reshape(-1, d, q.shape[-1]), k.reshape(-1, d, k.shape[-1])


@pytest.mark.parametrize("steps", [12, pytest.param(300, marks=pytest.mark.slow)])
def test_adamw_weight_decay_leaves_program_heads_q_and_k_unchanged(stories, documents, steps):
    """stories260K: 8 query heads, 4 KV groups of 2. L0H0+L0H1 replace KV group 0 whole; L1H2 shares group 1
    with the neural L1H3, whose K must still train."""
    seqs = [s for s in make_sequences(stories, documents[200:230], max_len=12) if s.n == 12][:2]
    ids, _ = padded_batch(seqs)
    before = {n: p.detach().clone() for n, p in stories.model.named_parameters()}
    q0, k0 = q_k_rows(stories, 0)
    q1, k1 = q_k_rows(stories, 1)
    hybrid = replace_heads(stories, {"L0H0": "first()", "L0H1": "prev(1)", "L1H2": "prev(1)"})
    try:
        hybrid.train()
        opt = torch.optim.AdamW([p for p in hybrid.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.1)
        for _ in range(steps):
            logits = hybrid(ids)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        q0b, k0b = q_k_rows(stories, 0)
        q1b, k1b = q_k_rows(stories, 1)
        assert torch.equal(q0b[:2], q0[:2]) and torch.equal(q1b[2], q1[2])  # replaced query heads: bit for bit
        assert torch.equal(k0b[0], k0[0])  # KV group 0: both its query heads are programs
        assert not torch.equal(k1b[1], k1[1])  # KV group 1 also serves the neural L1H3: it trains
        assert not torch.equal(q0b[2], q0[2]) and not torch.equal(q1b[3], q1[3])
        assert not torch.equal(k0b[1], k0[1])
        moved = [n for n, p in stories.model.named_parameters() if not torch.equal(p, before[n])]
        assert len(moved) > len(before) // 2
        hybrid.restore()  # the base trained on its own afterwards is its own business: decay moves it
        opt = torch.optim.AdamW(stories.model.parameters(), lr=1e-3, weight_decay=0.1)
        stories.model(ids).sum().backward()
        opt.step()
        assert not torch.equal(q_k_rows(stories, 0)[0][:2], q0[:2])
    finally:
        hybrid.restore()
        with torch.no_grad():  # put stories260K back for the other tests
            for n, p in stories.model.named_parameters():
                p.copy_(before[n])
        stories.model.zero_grad(set_to_none=True)
        stories.model.eval()


def test_weight_decay_leaves_program_heads_fixed_in_a_fused_qkv():
    """GPT-2's c_attn holds every head's q, k and v: the split q view's rows are kept for the replaced head."""
    import headsurgeon as hs

    model = hs.load_model("tiny-stories")
    seqs = hs.make_sequences(model, ["Once upon a time there was a cat. The cat was happy and ran."], max_len=16)
    ids, _ = padded_batch(seqs)
    q_before = q_k_rows(model, 1)[0]
    hybrid = replace_heads(model, {"L1H2": "first()"})
    opt = torch.optim.AdamW(hybrid.parameters(), lr=1e-2, weight_decay=0.5)
    for _ in range(3):
        logits = hybrid(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    q_after = q_k_rows(model, 1)[0]
    assert torch.equal(q_after[2], q_before[2])
    assert not torch.equal(q_after[1], q_before[1])


def sgd_steps(hybrid, ids, steps: int = 5) -> None:
    opt = torch.optim.SGD([p for p in hybrid.parameters() if p.requires_grad], lr=0.5)
    for _ in range(steps):
        logits = hybrid(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("no_processing", [True, False])
def test_fine_tuning_after_compatibility_mode_saves_exactly_or_is_refused(tmp_path, no_processing):
    import headsurgeon as hs
    from headsurgeon.hub.checkpoint import CheckpointError

    model = hs.load_model("tiny-stories")
    model.model.enable_compatibility_mode(disable_warnings=True, no_processing=no_processing)
    ids, _ = padded_batch(hs.make_sequences(model, ["Lily saw a dog. The dog ran to the park and sat."], max_len=16))
    hybrid = replace_heads(model, {"L0H1": "prev(1)", "L2H3": "first()"})
    sgd_steps(hybrid, ids)
    if no_processing:  # only the legacy hook names: the weights are the model's own, saved bit for bit
        hs.save_hybrid(hybrid, tmp_path / "ck")
        with torch.no_grad():
            assert torch.equal(hs.load_hybrid(tmp_path / "ck")(ids), hybrid(ids))
        return
    # processing gave the forward an unembedding bias that GPT2LMHeadModel has no slot for: no checkpoint of the
    # model class can reproduce it, so saving refuses and says what to do
    hf = model.hf_model
    assert getattr(hf.lm_head, "bias", None) is not None and bool(hf.lm_head.bias.abs().max() > 0)
    with torch.device("meta"):
        assert "lm_head.bias" not in type(hf)(hf.config).state_dict()
    with pytest.raises(CheckpointError, match=r"no_processing=True"):
        hs.save_hybrid(hybrid, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
