"""What replace_heads shares and what it does not: hooks never leak into the base, weights are shared unless copy=True."""
from __future__ import annotations

import torch

import headsurgeon as hs

TEXTS = ["Once upon a time there was a cat. The cat was happy.", "Lily saw a dog. The dog ran to the park.",
         "Tom had a red ball. He threw it high and it fell down."]
PROGRAMS = {"L0H0": "first()", "L1H1": "prev(1)", "L2H2": "uniform()", "L3H3": "self()"}


def setup():
    model = hs.load_model("tiny-stories")
    return model, hs.make_sequences(model, TEXTS, max_len=32)


def test_perplexity_of_the_model_is_the_base_while_a_hybrid_exists():
    model, seqs = setup()
    base = hs.perplexity(model, seqs, progress=False)
    hybrid = hs.replace_heads(model, PROGRAMS)
    assert hs.perplexity(model, seqs, progress=False) == base
    assert hs.perplexity(hybrid, seqs, progress=False) != base


def train_steps(module, seqs, steps=3):
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.5)
    for ids, mask in list(hs.batches(seqs, batch_size=3))[:1] * steps:
        logits = module(ids, attention_mask=mask)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_training_the_hybrid_trains_the_shared_weights():
    model, seqs = setup()
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    hybrid = hs.replace_heads(model, PROGRAMS)
    train_steps(hybrid, seqs)
    hybrid.restore()
    after = model.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # shared by design (README says so)


def test_copy_true_keeps_the_base_untouched():
    model, seqs = setup()
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    base_ppl = hs.perplexity(model, seqs, progress=False)
    hybrid = hs.replace_heads(model, PROGRAMS, copy=True)
    assert hybrid.base is not model.model
    train_steps(hybrid, seqs)
    assert all(torch.equal(before[k], v) for k, v in model.model.state_dict().items())
    assert hs.perplexity(model, seqs, progress=False) == base_ppl
    trained = hybrid.base.state_dict()
    assert any(not torch.equal(before[k], trained[k]) for k in before)
