"""heal (headsurgeon/surgery/swap/heal.py): only the chosen parameters train, the loss falls, program heads stay applied, the plain
model is the deterministic control, "kl" distils from the base, and a healed hybrid saves and loads bit for bit with
its healing record in the manifest and card (headsurgeon/hub/checkpoint/save.py, load.py, headsurgeon/hub/card.py)."""
from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import headsurgeon as hs
from headsurgeon.hub.card import render_card
from headsurgeon.hub.checkpoint import IntegrityError, hf_state_dict, load_hybrid, save_hybrid
from headsurgeon.core import InputError
from headsurgeon.surgery.batches import padded_batch
from headsurgeon.surgery.swap.heal import HealReport, heal
from headsurgeon.surgery.swap.weights import element_count, select_weights
from headsurgeon.surgery.models.loading import zoo_dir
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program

from support.hostile_card import PAYLOADS, assert_inert, hostile_manifest

PROGRAMS = {"L0H1": "prev(1)", "L1H2": "first()", "L2H0": "0.5*prev(1) + 0.5*first()", "L3H3": "uniform()"}
STEPS = 12
#: tiny-stories' normalization layers: LayerNorm gain and bias before attention and MLP in 4 blocks, and the final one
NORM_NAMES = [f"transformer.h.{i}.{ln}.{p}" for i in range(4) for ln in ("ln_1", "ln_2") for p in ("weight", "bias")] \
    + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def tiny_stories():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hs.load_model("tiny-stories")


def state(handle) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in hf_state_dict(handle.hf_model).items()}


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


@pytest.fixture(scope="module")
def windows():
    """Training windows of the demo corpus: 8 (one batch), so every step sees the same tokens."""
    return hs.load_corpus(tiny_stories(), hs.demo_corpus_path(), max_len=32, max_sequences=40)["synth"][:8]


@pytest.fixture(scope="module")
def healed(windows):
    """One healed hybrid (norms, "lm") with the base's weights and logits before and after, shared by the tests."""
    handle = tiny_stories()
    ids = padded_batch(windows[:1])[0]
    before, base_before = state(handle), logits(handle, ids)
    hybrid = replace_heads(handle, PROGRAMS)
    grads = {n: p.requires_grad for n, p in handle.model.named_parameters()}
    report = heal(hybrid, windows, steps=STEPS, lr=5e-3, progress=False)  # one batch, seen each step: a lr to see it fall
    return SimpleNamespace(handle=handle, hybrid=hybrid, report=report, before=before, after=state(handle),
                           ids=ids, base_before=base_before, grads=grads)


def test_only_the_norm_gains_change(healed):
    changed = sorted(k for k in healed.before if not torch.equal(healed.before[k], healed.after[k]))
    assert changed == sorted(NORM_NAMES) == sorted(healed.report.params)
    assert healed.report.n_tensors == 18 and healed.report.n_elements == 18 * 128
    assert {n: p.requires_grad for n, p in healed.handle.model.named_parameters()} == healed.grads
    assert not healed.handle.model.training  # eval mode, as loaded


def test_program_heads_are_still_applied(healed, windows):
    assert {f"L{l}H{h}": p.text for (l, h), p in healed.hybrid.replaced.items()} == \
        {k: Program.parse(v).text for k, v in PROGRAMS.items()}
    got = {}
    hook = healed.handle.model.hook_dict["blocks.2.attn.hook_pattern"]
    obs = hook.register_forward_hook(lambda m, i, o: got.__setitem__("p", o[:, 0].detach().clone()))
    try:
        logits(healed.hybrid, healed.ids)
    finally:
        obs.remove()
    want = Program.parse(PROGRAMS["L2H0"]).evaluate(windows[:1], causal=True)
    assert np.allclose(got["p"].numpy(), want, atol=1e-6)


def test_loss_falls_on_the_training_windows(healed):
    r = healed.report
    assert len(r.losses) == STEPS and r.loss_first == r.losses[0] and r.loss_last == r.losses[-1]
    assert r.loss_last < r.loss_first - 0.05, r.losses
    assert r.tokens_seen == STEPS * r.tokens  # one batch holds every window


def test_report_and_record(healed, windows):
    r = healed.report
    assert r.tokens == sum(w.n - 1 for w in windows) and r.windows == len(windows)
    assert (r.model, r.heads, r.objective, r.teacher, r.selection) == ("hybrid", list(PROGRAMS), "lm", None, ["norms"])
    assert (r.steps, r.seed, r.batch_size, r.optimizer) == (STEPS, 0, 8, "Adam") and r.seconds > 0
    assert healed.hybrid.healing == healed.handle.healing == [r.to_json()]
    assert json.loads(json.dumps(r.to_json())) == r.to_json()  # JSON types only


def test_the_base_called_directly_has_the_healed_weights(healed):
    assert not torch.equal(logits(healed.handle, healed.ids), healed.base_before)  # shared weights trained


def test_a_copied_hybrid_heals_apart_from_its_base(windows):
    handle = tiny_stories()
    before = state(handle)
    hybrid = replace_heads(handle, PROGRAMS, copy=True)
    heal(hybrid, windows, steps=2, progress=False)
    assert all(torch.equal(before[k], v) for k, v in state(handle).items())
    assert any(not torch.equal(before[k], v) for k, v in state(hybrid.handle).items())
    assert handle.healing == [] and len(hybrid.healing) == 1


def test_plain_model_heal_is_deterministic(windows):
    runs = []
    for seed in (0, 0, 1):
        handle = tiny_stories()
        report = heal(handle, windows, steps=4, batch_size=3, seed=seed, progress=False)  # shuffled batches
        runs.append((state(handle), report))
        assert handle.healing == [report.to_json()] and (report.model, report.heads) == ("base", [])
    (a, ra), (b, rb), (c, _) = runs
    assert all(torch.equal(a[k], b[k]) for k in a) and ra.losses == rb.losses
    assert any(not torch.equal(a[k], c[k]) for k in a)  # the seed orders the batches


def test_kl_distils_from_a_frozen_copy_of_the_base(windows):
    hybrid = replace_heads(tiny_stories(), PROGRAMS)
    report = heal(hybrid, windows, steps=8, lr=5e-3, objective="kl", progress=False)  # one batch: a lr to see it fall
    assert report.teacher == "base (frozen copy)" and report.losses[0] > 1e-3
    assert report.loss_last < 0.8 * report.loss_first, report.losses
    plain = heal(tiny_stories(), windows, steps=1, objective="kl", base=tiny_stories(), progress=False)
    assert plain.teacher == "given" and abs(plain.loss_first) < 1e-5  # the same weights: no divergence


def test_validation_keeps_the_step_of_the_lowest_held_apart_loss(windows):
    """Checks at step 0 and every check_every steps; the kept parameters are the best check's, recomputed here."""
    held = hs.load_corpus(tiny_stories(), hs.demo_corpus_path(), max_len=32, max_sequences=40)["select"][:4]
    handle = tiny_stories()
    hybrid = replace_heads(handle, PROGRAMS)
    report = heal(hybrid, windows, steps=7, lr=0.05, objective="kl", validation=held, check_every=3, progress=False)
    steps = [step for step, _ in report.validation]
    assert steps == [0, 3, 6, 7] and report.validation_windows == 4
    best = min(report.validation, key=lambda row: row[1])
    assert report.best_step == best[0]
    again = heal(hybrid, windows, steps=1, lr=1e-12, objective="kl", base=tiny_stories(), validation=held,
                 check_every=1, progress=False)  # the teacher: the base as it was before the first heal
    assert again.validation[0][1] == pytest.approx(best[1], rel=1e-4)  # the kept weights give the best loss
    assert "kept step" in report.describe()
    plain = heal(tiny_stories(), windows, steps=2, progress=False)
    assert (plain.validation, plain.best_step, plain.validation_windows) == ([], None, 0)


def test_validation_step_zero_undoes_a_heal_that_only_hurts(windows):
    """A learning rate that wrecks the model on held-apart windows at every check leaves the weights untouched."""
    held = hs.load_corpus(tiny_stories(), hs.demo_corpus_path(), max_len=32, max_sequences=40)["select"][:4]
    handle = tiny_stories()
    before = state(handle)
    hybrid = replace_heads(handle, PROGRAMS, copy=True)
    report = heal(hybrid, windows, steps=2, lr=50.0, objective="kl", validation=held, check_every=1, progress=False)
    assert report.best_step == 0, report.validation
    assert all(torch.equal(before[k], v) for k, v in state(hybrid.handle).items())


@pytest.mark.parametrize("kwargs, message", [
    (dict(windows=[]), "non-empty list of Sequences"),
    (dict(validation=[]), "non-empty list of Sequences"),
    (dict(validation=[None], check_every=2), "must be Sequences"),
    (dict(check_every=0, validation="windows"), "check_every must be a whole number >= 1"),
    (dict(windows="text"), "non-empty list of Sequences"),
    (dict(steps=0), "steps must be a whole number >= 1"),
    (dict(lr=0.0), "lr must be a finite number > 0"),
    (dict(lr=float("nan")), "lr must be a finite number > 0"),
    (dict(batch_size=0), "batch_size must be"),
    (dict(objective="mse"), "objective must be 'lm'"),
    (dict(params=["no.such.*"]), r"no parameter matching 'no.such.\*'.*transformer\.h\.\*\.ln_1\.weight"),
    (dict(params=[]), "params must be 'norms' or a list"),
    (dict(objective="kl"), "needs base="),
    (dict(objective="lm", base="self"), "leave it out"),
    (dict(objective="kl", base="self"), "shares weights"),
])
def test_bad_inputs_are_input_errors(windows, kwargs, message):
    handle = tiny_stories()
    before = state(handle)
    args = dict(windows=windows, progress=False) | kwargs
    if args.get("base") == "self":
        args["base"] = handle
    if args.get("validation") == "windows":
        args["validation"] = windows
    with pytest.raises(InputError, match=message):
        heal(handle, **args)
    assert all(torch.equal(before[k], v) for k, v in state(handle).items())


def test_only_models_and_live_hybrids_heal(windows):
    hybrid = replace_heads(tiny_stories(), PROGRAMS)
    hybrid.restore()
    with pytest.raises(InputError, match="restored"):
        heal(hybrid, windows, progress=False)
    with pytest.raises(InputError, match="ModelHandle"):
        heal(torch.nn.Linear(2, 2), windows, progress=False)


def test_patterns_select_by_any_name_and_count_shared_elements_once():
    handle = tiny_stories()
    assert [w.name for w in select_weights(handle, ["transformer.ln_f.*"])] == ["transformer.ln_f.weight",
                                                                              "transformer.ln_f.bias"]
    assert [w.name for w in select_weights(handle, "blocks.0.ln1.*")] == NORM_NAMES[:2]  # TransformerLens names
    assert [w.name for w in select_weights(handle, "lm_head.weight")] == ["transformer.wte.weight"]  # tied
    attn = select_weights(handle, ["*.attn.q.weight", "*.attn.c_attn.weight"])  # q: views of c_attn (GPT-2)
    assert len(attn) == 8 and element_count([w.param for w in attn]) == 4 * 128 * 384


def _random(kind: str):
    """A tiny random Llama (GQA) or Gemma 3 (QK-norm, sliding window) with tiny-stories' tokenizer."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(zoo_dir())
    common = dict(vocab_size=len(tok), num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **common))
    else:
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            num_key_value_heads=1, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
            **common))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hs.load_model(model, tokenizer=tok)


@pytest.mark.parametrize("kind, per_layer", [
    ("llama", ["input_layernorm", "post_attention_layernorm"]),
    ("gemma3", ["self_attn.q_norm", "self_attn.k_norm", "input_layernorm", "post_attention_layernorm",
                "pre_feedforward_layernorm", "post_feedforward_layernorm"]),
])
def test_norms_are_found_once_on_llama_and_gemma3(kind, per_layer, windows):
    handle = _random(kind)
    chosen = select_weights(handle, "norms")
    want = {f"model.layers.{i}.{n}.weight" for i in range(2) for n in per_layer} | {"model.norm.weight"}
    assert sorted(w.name for w in chosen) == sorted(want)  # the bridge's ln1/ln2/... aliases add nothing
    assert len({id(w.param) for w in chosen}) == len(chosen)
    before = state(handle)
    report = heal(replace_heads(handle, {"L1H0": "prev(1)"}), windows, steps=2, progress=False)
    changed = {k for k, v in state(handle).items() if not torch.equal(before[k], v)}
    assert changed == want and report.n_tensors == len(want)


def test_save_and_load_keep_weights_logits_and_record(healed, tmp_path):
    folder = save_hybrid(healed.hybrid, tmp_path / "healed")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["healing"] == [healed.report.to_json()] and manifest["format_version"] == 1
    assert manifest["weights"]["stored"] == "embedded" and manifest["weights"]["changed_tensors"] == 18
    card = (folder / "README.md").read_text()
    assert "## Healing" in card and "`transformer.h.*.ln_1.weight, transformer.h.*.ln_1.bias" in card
    assert f"| {STEPS} | 0.005 | 8 | {healed.report.tokens} |" in card
    loaded = load_hybrid(folder)
    assert loaded.healing == [healed.report.to_json()]
    assert torch.equal(logits(loaded, healed.ids), logits(healed.hybrid, healed.ids))


def test_a_damaged_healing_record_is_refused(healed, tmp_path):
    folder = save_hybrid(healed.hybrid, tmp_path / "damaged")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["healing"] = "all good"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="'healing'"):
        load_hybrid(folder)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_hostile_healing_records_render_inert(payload):
    record = {k: payload for k in HealReport.__dataclass_fields__} | {"params": [payload, f"a.1.{payload}"]}
    card = render_card(hostile_manifest(payload) | {"healing": [record, payload, {"steps": 3}]}, "x")
    assert "## Healing" in card
    assert_inert(card)
