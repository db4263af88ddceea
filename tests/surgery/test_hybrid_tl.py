"""TransformerLens habits on a hybrid: run_with_cache, run_with_hooks and hooks() run the programs, not the base."""
from __future__ import annotations

import warnings

import pytest
import torch

import headsurgeon as hs
from headsurgeon.surgery.swap.replace import SurgeryError

PROGRAMS = {"L0H1": "prev(1)", "L1H2": "first()"}
CLEAN, CORRUPT = "Lily had a cat. The cat loved", "Tom had a cat. The cat loved"


@pytest.fixture(scope="module")
def tiny():
    model = hs.load_model("tiny-stories")
    hybrid = hs.replace_heads(model, PROGRAMS)
    return model, hybrid, hybrid.to_tokens(CLEAN)


def program_pattern(text: str, model, ids) -> torch.Tensor:
    seq = hs.make_sequences(model, [CLEAN], max_len=64)[0]
    assert seq.ids.tolist() == ids[0].tolist()
    return torch.from_numpy(hs.Program.parse(text).evaluate([seq], causal=True)[0])


def test_run_with_cache_holds_the_program_patterns_for_replaced_heads_and_the_base_ones_elsewhere(tiny):
    model, hybrid, ids = tiny
    logits, cache = hybrid.run_with_cache(ids)
    _, base = model.model.run_with_cache(ids)
    assert torch.equal(logits, hybrid(ids))
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"][0, 1], program_pattern("prev(1)", model, ids))
    assert torch.allclose(cache["blocks.1.attn.hook_pattern"][0, 2], program_pattern("first()", model, ids))
    assert not torch.allclose(base["blocks.0.attn.hook_pattern"][0, 1], cache["blocks.0.attn.hook_pattern"][0, 1])
    for head in (0, 2, 3):  # layer 0 runs before any program: its other heads are the base's
        assert torch.equal(cache["blocks.0.attn.hook_pattern"][0, head], base["blocks.0.attn.hook_pattern"][0, head])
    assert not model.model.hook_dict["blocks.0.attn.hook_pattern"]._forward_hooks  # nothing left behind


def test_run_with_cache_honours_names_filter_and_return_cache_object(tiny):
    model, hybrid, ids = tiny
    _, cache = hybrid.run_with_cache(ids, names_filter=lambda name: name.endswith("hook_pattern"),
                                     return_cache_object=False)
    assert isinstance(cache, dict) and sorted(cache) == [f"blocks.{i}.attn.hook_pattern" for i in range(4)]
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"][0, 1], program_pattern("prev(1)", model, ids))


def test_user_hooks_see_the_program_pattern_and_their_edits_of_other_heads_take_effect(tiny):
    model, hybrid, ids = tiny
    seen = {}

    def look(pattern, hook):
        seen["p"] = pattern[0, 1].clone()

    def flatten_head0(pattern, hook):  # a non-replaced head: uniform over the visible keys
        n = pattern.shape[-1]
        pattern[:, 0] = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
        return pattern

    plain = hybrid(ids)
    edited = hybrid.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", look),
                                                   ("blocks.0.attn.hook_pattern", flatten_head0)])
    assert torch.allclose(seen["p"], program_pattern("prev(1)", model, ids))
    assert not torch.allclose(edited, plain)
    with hybrid.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", flatten_head0)]) as h:
        assert h is hybrid
        assert torch.equal(hybrid(ids), edited)
    assert torch.equal(hybrid(ids), plain)
    assert not torch.allclose(model.model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern",
                                                                          flatten_head0)]), edited)


def test_reset_hooks_end_and_backward_hooks_are_honoured(tiny):
    model, hybrid, ids = tiny
    grads = []
    logits = hybrid.run_with_hooks(ids, bwd_hooks=[("blocks.1.attn.hook_pattern", lambda g, hook: grads.append(g))],
                                   reset_hooks_end=False)
    try:
        logits[0, -1].sum().backward()
        assert grads and grads[0].shape[1] == model.n_heads
        assert model.model.hook_dict["blocks.1.attn.hook_pattern"]._backward_hooks  # kept, as asked
    finally:
        model.model.reset_hooks(including_permanent=False)
        model.model.zero_grad(set_to_none=True)
    assert not model.model.hook_dict["blocks.1.attn.hook_pattern"]._backward_hooks


def test_activation_patching_between_clean_and_corrupted_runs_of_the_hybrid(tiny):
    model, hybrid, clean = tiny
    corrupt = hybrid.to_tokens(CORRUPT)
    lily, tom = hybrid.to_single_token(" Lily"), hybrid.to_single_token(" Tom")

    def diff(logits):
        return (logits[0, -1, lily] - logits[0, -1, tom]).item()

    logits, cache = hybrid.run_with_cache(clean)

    def patch(resid, hook):  # the clean name's residual at position 1, into the corrupted run
        resid[:, 1] = cache[hook.name][:, 1]
        return resid

    moved = [diff(hybrid.run_with_hooks(corrupt, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", patch)]))
             for layer in range(model.n_layers)]
    clean_diff, corrupt_diff = diff(logits), diff(hybrid(corrupt))
    assert abs(clean_diff - corrupt_diff) > 0.1
    assert moved[0] == pytest.approx(clean_diff, abs=1e-4)  # everything downstream of the swapped token is clean
    assert all(min(clean_diff, corrupt_diff) - 1e-4 <= m <= max(clean_diff, corrupt_diff) + 1e-4 for m in moved)
    base_cache = model.model.run_with_cache(clean)[1]
    base_moved = diff(model.model.run_with_hooks(corrupt, fwd_hooks=[(
        "blocks.2.hook_resid_pre", lambda r, hook: r.index_copy(1, torch.tensor([1]), base_cache[hook.name][:, 1:2]))]))
    assert base_moved != pytest.approx(moved[2], abs=1e-4)  # the hybrid's run is not the base's


def test_z_mode_cache_shows_the_program_pattern(random_models):
    """With autograd on, the program's pattern reaches observers out of place (the consumed one is saved for
    backward), and the bridge calls that returned edit discarded: z carries the program, so for a hybrid the warning
    is wrong, and it is left to the bridge, which is right about a user's own pattern edits."""
    handle = random_models["bert"]
    hybrid = hs.replace_heads(handle, {"L0H1": "first()"})
    assert hybrid.mode == "z"
    ids = torch.tensor([[5, 17, 33, 8, 2]])
    with pytest.warns(UserWarning, match="edit is discarded"):
        logits, cache = hybrid.run_with_cache(ids, names_filter="blocks.0.attn.hook_pattern")
    assert torch.equal(logits, hybrid(ids))
    want = torch.zeros(5, 5)
    want[:, 0] = 1
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"][0, 1], want)


def test_z_mode_inference_shows_the_program_pattern_without_a_discarded_edit_warning(random_models):
    """Without autograd the program's pattern is written into the consumed one in place: observers see it, and the
    bridge has no returned edit to call discarded (z carries the program)."""
    handle = random_models["bert"]
    hybrid = hs.replace_heads(handle, {"L0H1": "first()"})
    ids = torch.tensor([[5, 17, 33, 8, 2]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        logits, cache = hybrid.run_with_cache(ids, names_filter="blocks.0.attn.hook_pattern")
    assert torch.equal(logits, hybrid(ids))
    want = torch.zeros(5, 5)
    want[:, 0] = 1
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"][0, 1], want)
    assert not torch.allclose(cache["blocks.0.attn.hook_pattern"][0, 0], want)  # the neural head is untouched


def test_generate_takes_text_and_refuses_what_would_run_the_base(tiny):
    model, hybrid, ids = tiny
    text = hybrid.generate("Lily had", max_new_tokens=3)
    assert isinstance(text, str) and "Lily had" in text
    got = hybrid.generate(hybrid.to_tokens("Lily had"), max_new_tokens=3)
    assert hybrid.to_string(got[0]) == text
    with pytest.raises(SurgeryError, match="use_past_kv_cache"):
        hybrid.generate("Lily had", use_past_kv_cache=True)
    with pytest.raises(SurgeryError, match=r"hybrid.generate"):
        hybrid.generate_stream("Lily had")
    with pytest.raises(SurgeryError, match=r"hybrid.base.original_model"):
        hybrid.original_model
    assert not hasattr(hybrid, "hf_generate")
