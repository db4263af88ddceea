"""refit_mixtures (headsurgeon/surgery/swap/refit.py): the simplex solver is the exact constrained minimum, a planted head's weights come
back exactly, the reported errors are Σ‖(P − A)U‖² / Σ‖AU‖² computed here independently (GQA included), a refit never
raises the error, degenerate mixtures stay finite, and rounded programs print and parse back to the same hash."""
from __future__ import annotations

import itertools
import json
import re
import warnings
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import headsurgeon as hs
from headsurgeon.core import InputError
from headsurgeon.surgery.batches import padded_batch
from headsurgeon.surgery.models.loading import zoo_dir
from headsurgeon.surgery.swap.refit import RefitResult, refit_mixtures
from headsurgeon.surgery.swap.simplex import solve_simplex
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.scored import ScoredProgram

#: real heads of tiny-stories with mixtures of sparse, counted (empty rows) and dense components
PROGRAMS = {"L1H2": "0.5*prev(1) + 0.5*first()", "L2H0": "0.4*prev(1) + 0.3*induction() + 0.3*first()",
            "L3H3": "0.2*self() + 0.3*uniform() + 0.5*first()", "L0H1": "0.9*prev(1) + 0.1*same_token()"}


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny():
    return quiet(hs.load_model, "tiny-stories")


@pytest.fixture(scope="module")
def windows(tiny):
    return hs.load_corpus(tiny, hs.demo_corpus_path(), max_len=40, max_sequences=50)["synth"]


@pytest.fixture(scope="module")
def refits(tiny, windows):
    return refit_mixtures(tiny, PROGRAMS, windows, batch_size=8, progress=False)


def values_through_output(handle, layer: int, head: int, v: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    """U = v_kv(head) · W_O^head [B, N, d_model], float64; the KV head by repeating each KV head over its group."""
    repeated = v.repeat_interleave(handle.n_heads // v.shape[2], dim=2)
    return torch.einsum("bjd,dm->bjm", repeated[:, :, head].double(), w_o.double())


def independent_error(handle, head, program: Program, windows, w_o: torch.Tensor | None = None,
                      target: Program | None = None) -> float:
    """Σ‖(P − A)U‖² / Σ‖AU‖² over the windows' real rows: one run_with_cache, the program's own pattern, einsum.
    ``target``: A is this program's pattern instead of the model's (a planted head)."""
    layer, h = head
    ids, _ = padded_batch(windows)
    names = (f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_v")
    with torch.no_grad():
        _, cache = quiet(handle.model.run_with_cache, ids, names_filter=lambda n: n in names)
    a = cache[names[0]][:, h].double()
    if target is not None:
        a = torch.from_numpy(target.evaluate(windows, handle.causal)).double()
    w_o = handle.model.blocks[layer].attn.W_O[h].detach() if w_o is None else w_o
    u = values_through_output(handle, layer, h, cache[names[1]], w_o)
    p = torch.from_numpy(program.evaluate(windows, handle.causal)).double()
    error = torch.einsum("bij,bjm->bim", p - a, u)
    wanted = torch.einsum("bij,bjm->bim", a, u)
    real = torch.arange(ids.shape[1])[None, :] < torch.tensor([s.n for s in windows])[:, None]
    return float((error[real] ** 2).sum() / (wanted[real] ** 2).sum())


# ------------------------------------------------------------------------------------------------ the solver


def faces_minimum(q: np.ndarray) -> float:
    """min wᵀQw on the simplex by brute force: the KKT point of every face, the feasible ones compared."""
    k = q.shape[0]
    best = np.inf
    for size in range(1, k + 1):
        for face in itertools.combinations(range(k), size):
            idx = list(face)
            kkt = np.block([[q[np.ix_(idx, idx)], np.ones((size, 1))], [np.ones((1, size)), np.zeros((1, 1))]])
            w = np.linalg.lstsq(kkt, np.r_[np.zeros(size), 1.0], rcond=None)[0][:size]
            if w.min() >= -1e-12:
                full = np.zeros(k)
                full[idx] = np.clip(w, 0, None) / np.clip(w, 0, None).sum()
                best = min(best, float(full @ q @ full))
    return best


def scipy_minimum(q: np.ndarray) -> float:
    """min wᵀQw on the simplex by SLSQP from every vertex and the centre."""
    k = q.shape[0]
    starts = [np.eye(k)[i] for i in range(k)] + [np.full(k, 1 / k)]
    found = [minimize(lambda w: w @ q @ w, s, jac=lambda w: 2 * q @ w, method="SLSQP", bounds=[(0, 1)] * k,
                      constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}], options={"ftol": 1e-15})
             for s in starts]
    feasible = [np.clip(r.x, 0, None) / np.clip(r.x, 0, None).sum() for r in found]  # SLSQP's sum is only near 1
    return min(float(w @ q @ w) for w in feasible)


@pytest.mark.parametrize("k, rank, seed", [(2, 2, 0), (3, 3, 1), (3, 1, 2), (4, 2, 3), (5, 5, 4), (6, 3, 5),
                                           (8, 8, 6), (8, 4, 7)])
def test_the_solver_is_the_true_constrained_minimum(k, rank, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rank + 2, k)) + rng.normal(size=(rank + 2, 1)) * 3  # correlated, like pattern products
    x[rank:] = 0.0
    q = x.T @ x
    w = solve_simplex(q)
    assert w.min() >= 0 and abs(w.sum() - 1) < 1e-12
    value, exact = float(w @ q @ w), faces_minimum(q)
    scale = float(np.trace(q)) / k
    assert value <= exact + 1e-9 * scale
    assert value <= scipy_minimum(q) + 1e-9 * scale
    if rank == k:  # strictly convex: the minimizer is unique, so the weights themselves must agree
        ref = minimize(lambda v: v @ q @ v, np.full(k, 1 / k), method="SLSQP", bounds=[(0, 1)] * k,
                       constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1}], options={"ftol": 1e-16})
        assert np.abs(w - ref.x).max() < 1e-5


def test_the_solver_finds_a_face_a_vertex_and_the_grid_minimum():
    outputs = np.array([[1.0, -1.0, 0.0], [0.2, 0.2, 5.0]])  # the closest point to 0 is halfway between the first two
    q = outputs.T @ outputs
    w = solve_simplex(q)
    assert w[2] == 0 and np.abs(w - [0.5, 0.5, 0.0]).max() < 1e-12 and abs(w @ q @ w - 0.04) < 1e-12
    assert np.array_equal(solve_simplex(np.array([[0.5, 1, 1], [1, 6, 1], [1, 1, 8]])), [1, 0, 0])  # a vertex
    x = np.random.default_rng(9).normal(size=(3, 3))
    q = x.T @ x
    grid = min(float(v @ q @ v) for a, b in itertools.product(np.linspace(0, 1, 301), repeat=2) if a + b <= 1
               for v in [np.array([a, b, 1 - a - b])])
    w = solve_simplex(q)
    assert float(w @ q @ w) <= grid + 1e-12
    assert np.array_equal(solve_simplex(np.zeros((3, 3))), np.full(3, 1 / 3))  # nothing to fit: finite


# ------------------------------------------------------------------------------------------------ on a model


def test_a_planted_head_comes_back_exactly(tiny, windows):
    planted = Program.parse("0.3*prev(1) + 0.7*first()")
    hybrid = replace_heads(tiny, {"L1H2": planted})
    got = refit_mixtures(hybrid, {"L1H2": "0.5*prev(1) + 0.5*first() + 0.2*self()"}, windows, progress=False)
    r = got[(1, 2)]
    assert r.changed and r.after.text == "0.3*prev(1) + 0.7*first()"  # self() got 0: dropped
    assert r.components == ["prev(1)", "first()", "self()"] and r.weights_after == [0.3, 0.7, 0.0]
    assert r.error_after < 1e-10 < r.error_before
    assert r.error_before == pytest.approx(independent_error(tiny, (1, 2), r.before, windows, target=planted),
                                           rel=1e-5)
    alone = refit_mixtures(replace_heads(tiny, {"L2H1": "prev(1)"}), {"L2H1": "0.5*prev(1) + 0.5*self()"}, windows,
                           progress=False)[(2, 1)]
    assert alone.after.text == "prev(1)" and alone.weights_after == [1.0, 0.0] and alone.error_after < 1e-10


def test_a_planted_gate_comes_back_branch_by_branch(tiny, windows):
    """A root gate's mixtures are refitted on their own rows (nested gates too); a branch that is no mixture stays."""
    planted = Program.parse("gate(cap, 0.3*prev(1) + 0.7*first(), gate(punct, prev(2), 0.6*self() + 0.4*first()))")
    start = "gate(cap, 0.5*prev(1) + 0.5*first() + 0.2*self(), gate(punct, prev(2), 0.5*self() + 0.5*first()))"
    r = refit_mixtures(replace_heads(tiny, {"L1H2": planted}), {"L1H2": start}, windows, progress=False)[(1, 2)]
    assert r.changed and r.after == planted, r.after.text
    assert r.components == ["prev(1)", "first()", "self()", "prev(2)", "self()", "first()"]
    assert r.weights_after == [0.3, 0.7, 0.0, 1.0, 0.6, 0.4]
    assert r.error_after < 1e-10 < r.error_before
    assert r.error_before == pytest.approx(independent_error(tiny, (1, 2), r.before, windows, target=planted),
                                           rel=1e-5)
    real = refit_mixtures(tiny, {"L2H0": start}, windows, progress=False)[(2, 0)]  # the model's own head
    assert real.changed and real.error_after < real.error_before
    assert real.error_after == pytest.approx(independent_error(tiny, (2, 0), real.after, windows), rel=1e-5)
    assert real.error_before == pytest.approx(independent_error(tiny, (2, 0), real.before, windows), rel=1e-5)
    plain = refit_mixtures(tiny, {"L2H0": "gate(cap, prev(1), first())"}, windows, progress=False)[(2, 0)]
    assert not plain.changed and plain.error_before is None  # no mixture under the gate: nothing to refit


def test_errors_are_the_output_space_errors_computed_independently(tiny, windows, refits):
    for head, r in refits.items():
        assert isinstance(r, RefitResult) and r.windows == len(windows) and r.tokens == sum(s.n for s in windows)
        assert r.error_after <= r.error_before
        assert r.error_after == pytest.approx(independent_error(tiny, head, r.after, windows), rel=1e-5)
        assert r.error_before == pytest.approx(independent_error(tiny, head, r.before, windows), rel=1e-5)
    assert sum(r.changed for r in refits.values()) >= 3
    json.dumps([r.to_json() for r in refits.values()])


def test_the_fit_beats_every_grid_point_of_the_exact_error(tiny, windows, refits):
    r = refits[(1, 2)]
    for w in np.linspace(0, 1, 11):  # a coarser grid than the result's
        trial = Program.parse(f"{w:.1f}*prev(1) + {1 - w:.1f}*first()") if 0 < w < 1 else None
        if trial is not None:
            assert r.error_after <= independent_error(tiny, (1, 2), trial, windows) * (1 + 1e-9)


def test_batching_does_not_change_the_result(tiny, windows, refits):
    again = refit_mixtures(tiny, {"L2H0": PROGRAMS["L2H0"]}, windows, batch_size=3, progress=False)[(2, 0)]
    assert again.after == refits[(2, 0)].after
    assert again.error_after == pytest.approx(refits[(2, 0)].error_after, rel=1e-6)  # float32 forwards


def test_degenerate_mixtures_stay_finite_and_unchanged_or_merged(tiny, windows):
    programs = {"L3H1": "0.5*first() + 0.5*first()", "L3H2": "0.5*self()", "L2H3": "0.5*first() + 0.5*none()",
                "L0H0": "prev(1)"}
    got = refit_mixtures(tiny, programs, windows, progress=False)
    for r in got.values():
        numbers = [*r.weights_before, *r.weights_after] + ([r.error_before, r.error_after] if r.components else [])
        assert all(np.isfinite(numbers))
        assert not r.changed and r.after == r.before
    assert got[(3, 1)].components == ["first()"] and got[(3, 1)].weights_before == [1.0]  # merged duplicates
    assert got[(0, 0)].components == [] and got[(0, 0)].error_before is None  # not a mixture: not measured
    assert got[(2, 3)].error_before == pytest.approx(independent_error(tiny, (2, 3), Program.parse("first()"),
                                                                       windows), rel=1e-5)


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_rounded_programs_print_digits_sum_to_one_and_parse_back(tiny, windows, digits):
    got = refit_mixtures(tiny, PROGRAMS, windows, digits=digits, progress=False)
    assert any(r.changed for r in got.values())
    for r in got.values():
        assert Program.parse(r.after.text).hash == r.after.hash
        if not r.changed:
            continue
        printed = re.findall(r"(?:^| \+ )([0-9.]+)\*", r.after.text)  # a single component prints no weight
        assert all(len(x.partition(".")[2]) <= digits for x in printed)
        units = [round(float(x) * 10 ** digits) for x in printed] or [10 ** digits]
        assert sum(units) == 10 ** digits and all(u > 0 for u in units)
        assert [round(w * 10 ** digits) for w in r.weights_after if w > 0] == units
        assert sum(r.weights_after) == pytest.approx(1.0, abs=1e-12)


def tiny_llama():
    """A random Llama with 4 query heads over 2 KV heads, with tiny-stories' tokenizer."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(zoo_dir())
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tok), num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=128))
    return quiet(hs.load_model, model, tokenizer=tok), model


def test_gqa_errors_match_an_independent_computation_from_the_hf_weights(windows):
    handle, model = tiny_llama()
    assert handle.n_kv_heads < handle.n_heads
    programs = {"L0H1": "0.5*prev(1) + 0.5*first()", "L1H2": "0.3*self() + 0.3*prev(2) + 0.4*first()",
                "L1H3": "0.6*prev(1) + 0.4*induction()"}
    got = refit_mixtures(handle, programs, windows, progress=False)
    d = handle.d_head
    for (layer, h), r in got.items():
        o_proj = model.model.layers[layer].self_attn.o_proj.weight.detach()  # [d_model, n_heads * d_head]
        w_o = o_proj[:, h * d: (h + 1) * d].T
        assert r.error_after <= r.error_before
        assert r.error_after == pytest.approx(independent_error(handle, (layer, h), r.after, windows, w_o), rel=1e-5)
        assert r.error_before == pytest.approx(independent_error(handle, (layer, h), r.before, windows, w_o), rel=1e-5)
    wrong = got[(0, 1)]  # query head 1 reads KV head 0: reading KV head 1 would give another error
    ids, _ = padded_batch(windows)
    with torch.no_grad():
        _, cache = quiet(handle.model.run_with_cache, ids)
    v_other = cache["blocks.0.attn.hook_v"][:, :, [1, 1]]  # every query head reads KV head 1
    other = values_through_output(handle, 0, 1, v_other, handle.model.blocks[0].attn.W_O[1].detach())
    a = cache["blocks.0.attn.hook_pattern"][:, 1].double()
    p = torch.from_numpy(wrong.before.evaluate(windows, True)).double()
    real = torch.arange(ids.shape[1])[None, :] < torch.tensor([s.n for s in windows])[:, None]
    mixed = float((torch.einsum("bij,bjm->bim", p - a, other)[real] ** 2).sum()
                  / (torch.einsum("bij,bjm->bim", a, other)[real] ** 2).sum())
    assert abs(mixed - wrong.error_before) > 1e-3 * wrong.error_before


def programs_set(fingerprint: str | None = None) -> ProgramSet:
    """L1H2: replacement prev(1), explanation a mixture; L2H2: a replacement only."""
    ps = ProgramSet(model="tiny-stories", vocab_fingerprint=fingerprint)
    ps.add((1, 2), Program.parse("prev(1)"), source="hand",
           explanation=ScoredProgram.of(Program.parse(PROGRAMS["L1H2"]), "hand", {}))
    ps.add((2, 2), Program.parse("first()"), source="hand")  # no explanation: not refitted
    return ps


def test_a_program_set_refits_its_explanations(tiny, windows):
    ps = programs_set()
    assert refit_mixtures(tiny, ps, windows, heads="L1H2", progress=False)[(1, 2)].changed  # one head, as text
    got = refit_mixtures(tiny, ps, windows, progress=False)
    assert list(got) == [(1, 2)] and got[(1, 2)].before.text == PROGRAMS["L1H2"] and got[(1, 2)].changed
    replacement = refit_mixtures(tiny, ps, windows, which="replacement", progress=False)
    assert sorted(replacement) == [(1, 2), (2, 2)] and not any(r.changed for r in replacement.values())


def test_inputs_are_checked_with_the_fix(tiny, windows):
    with pytest.raises(InputError, match="synth split"):
        refit_mixtures(tiny, PROGRAMS, [], progress=False)
    with pytest.raises(InputError, match="which must be"):
        refit_mixtures(tiny, PROGRAMS, windows, which="both", progress=False)
    with pytest.raises(InputError, match="no program for L1H3"):
        refit_mixtures(tiny, PROGRAMS, windows, heads=["L1H3"], progress=False)
    with pytest.raises(InputError, match="no explanation program for L2H2"):
        refit_mixtures(tiny, programs_set(), windows, heads="L2H2", progress=False)
    with pytest.raises(InputError, match="another tokenizer"):
        refit_mixtures(tiny, programs_set("0123456789abcdef"), windows, progress=False)
    with pytest.raises(InputError, match="given twice"):
        refit_mixtures(tiny, {"L1H2": "first()", (1, 2): "prev(1)"}, windows, progress=False)
    with pytest.raises(InputError, match="L9H0"):
        refit_mixtures(tiny, {"L9H0": "0.5*prev(1) + 0.5*first()"}, windows, progress=False)
    with pytest.raises(InputError, match="cannot read head"):
        refit_mixtures(tiny, PROGRAMS, windows, heads=["head one"], progress=False)
    with pytest.raises(InputError, match="digits"):
        refit_mixtures(tiny, PROGRAMS, windows, digits=0, progress=False)
    hookless = replace(tiny, model=SimpleNamespace(hook_dict={}))
    with pytest.raises(InputError, match="hook_pattern.*hs.load_model"):
        refit_mixtures(hookless, PROGRAMS, windows, progress=False)
