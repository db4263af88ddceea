"""Training code with program heads: the hybrid fine-tunes, the loss falls, program heads keep their programs."""
from __future__ import annotations

import numpy as np
import torch

from headsurgeon.surgery.capture import padded_batch
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.replace import replace_heads
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
