"""Ablations (zero / mean / mean_output / uniform / resample / program), perplexity, ΔPPL, sweeps, Spearman; the
ablate command's ΔPPL and KL against the base with their intervals (headsurgeon/cli/measure.py, headsurgeon/surgery/measure/divergence.py)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from headsurgeon.surgery.measure.ablate import ablate, reference_patterns
from headsurgeon.surgery.patterns.capture import padded_batch
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.measure.evaluate import per_head_delta_ppl, perplexity, spearman_ci
from headsurgeon.surgery.measure.sweep import sweep_programs
from headsurgeon.surgery.swap.replace import SurgeryError, replace_heads


@pytest.fixture(scope="module")
def seqs(stories, documents):
    return make_sequences(stories, documents[:40], max_len=32)


def observed_pattern(handle, hybrid, ids, layer, head):
    got = {}
    hp = handle.model.hook_dict[f"blocks.{layer}.attn.hook_pattern"]
    obs = hp.register_forward_hook(lambda m, i, o: got.__setitem__("p", o[:, head].detach().clone()))
    with torch.no_grad():
        hybrid(ids)
    obs.remove()
    return got["p"].numpy()


def test_pattern_ablations_install_the_right_patterns(stories, seqs):
    batch = [s for s in seqs if s.n == 32][:3]
    ids, _ = padded_batch(batch)
    ref = seqs[5:25]
    n = 32
    causal = np.tril(np.ones((n, n)))
    with ablate(stories, ["L2H1"], "zero") as hy:
        assert np.abs(observed_pattern(stories, hy, ids, 2, 1)).max() == 0.0
    with ablate(stories, ["L2H1"], "uniform") as hy:
        assert np.allclose(observed_pattern(stories, hy, ids, 2, 1), causal / causal.sum(-1, keepdims=True), atol=1e-6)
    with ablate(stories, ["L2H1"], "mean", reference=ref) as hy:
        got = observed_pattern(stories, hy, ids, 2, 1)
    pats = reference_patterns(stories, ref, [(2, 1)])[(2, 1)]
    total, count = np.zeros((n, n)), np.zeros((n, 1))
    for p in pats:  # independent transcription of "mean per position, renormalized"
        m = min(n, p.shape[0])
        total[:m, :m] += p[:m, :m]
        count[:m] += 1
    mean = np.where(causal > 0, total / np.maximum(count, 1), 0)
    mean = mean / mean.sum(-1, keepdims=True)
    assert np.allclose(got, mean[None], atol=1e-5)
    with ablate(stories, ["L2H1"], "resample", reference=ref, seed=1) as hy:
        got = observed_pattern(stories, hy, ids, 2, 1)
    longs = [p for p in pats if p.shape[0] >= n]
    for b in range(3):  # each row came from one of the long-enough reference patterns (cropped)
        assert any(np.allclose(got[b], p[:n, :n] / p[:n, :n].sum(-1, keepdims=True), atol=1e-5) for p in longs)
    with pytest.raises(SurgeryError, match="needs reference"):
        ablate(stories, ["L2H1"], "mean")
    with pytest.raises(SurgeryError, match="unknown ablation"):
        ablate(stories, ["L2H1"], "gaussian")


def test_mean_output_ablation_sets_z_to_the_reference_mean(stories, seqs):
    batch = [s for s in seqs if s.n == 32][:2]
    ids, _ = padded_batch(batch)
    ref = [s for s in seqs if s.n == 32][2:12]
    layer, head = 3, 6
    zs = []
    hz = stories.model.hook_dict[f"blocks.{layer}.attn.hook_z"]
    h = hz.register_forward_hook(lambda m, i, o: zs.append(o.detach().clone()))
    with torch.no_grad():
        stories.forward(padded_batch(ref)[0])
    h.remove()
    want = zs[0].reshape(len(ref), 32, -1, stories.d_head)[:, :, head].mean(0)
    with ablate(stories, [(layer, head)], "mean_output", reference=ref) as hy:
        got = []
        h = hz.register_forward_hook(lambda m, i, o: got.append(o.detach().clone()))
        with torch.no_grad():
            hy(ids)
        h.remove()
    z = got[0].reshape(2, 32, -1, stories.d_head)
    assert torch.allclose(z[:, :, head], want.expand(2, -1, -1), atol=1e-5)


def test_program_ablation_equals_replace_heads(stories, seqs):
    ids, _ = padded_batch(seqs[:2])
    with torch.no_grad():
        with ablate(stories, ["L1H1"], "program", programs={"L1H1": "prev(1)"}) as a:
            x = a(ids)
        with replace_heads(stories, {(1, 1): "prev(1)"}) as r:
            y = r(ids)
    assert torch.equal(x, y)


def test_perplexity_is_token_weighted_cross_entropy(stories, seqs):
    sub = seqs[:10]
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in sub:  # one at a time, no padding: the definition
            logits = stories.forward(torch.from_numpy(s.ids)[None])[0]
            nll += torch.nn.functional.cross_entropy(logits[:-1], torch.from_numpy(s.ids[1:]), reduction="sum").item()
            count += s.n - 1
    assert math.isclose(perplexity(stories, sub, batch_size=4, progress=False), math.exp(nll / count), rel_tol=1e-4)


def test_zero_ablating_many_heads_hurts_and_hybrid_perplexity_runs(stories, seqs):
    base = perplexity(stories, seqs[:12], progress=False)
    heads = [(layer, h) for layer in range(5) for h in range(8)][:20]
    with ablate(stories, heads, "zero") as hy:
        hurt = perplexity(hy, seqs[:12], progress=False)
    assert hurt > base * 1.05
    assert math.isclose(perplexity(stories, seqs[:12], progress=False), base, rel_tol=1e-6)  # restored


def test_masked_lm_pseudo_perplexity(random_models, documents):
    h = random_models["bert"]
    seqs = make_sequences(h, documents[:2], max_len=12)[:2]
    ppl = perplexity(h, seqs, progress=False)
    # independent: mask each position and score it with the HF head directly
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in seqs:
            for pos in range(1, s.n):
                ids = torch.from_numpy(s.ids.copy())[None]
                ids[0, pos] = h.tokenizer.mask_token_id
                logits = h.forward(ids, attention_mask=torch.ones_like(ids))[0, pos]
                nll -= torch.log_softmax(logits, -1)[int(s.ids[pos])].item()
                count += 1
    assert math.isclose(ppl, math.exp(nll / count), rel_tol=1e-4)


def test_per_head_delta_and_sweep(stories, seqs, tmp_path):
    sub = seqs[:8]
    programs = {"L0H0": "first()", "L1H3": "prev(1)", "L4H7": "uniform()"}
    deltas = per_head_delta_ppl(stories, programs, sub, progress=False)
    base = perplexity(stories, sub, progress=False)
    with replace_heads(stories, {"L1H3": "prev(1)"}) as hy:
        assert math.isclose(deltas[(1, 3)], perplexity(hy, sub, progress=False) / base - 1, rel_tol=1e-6)
    rows = sweep_programs(stories, programs, sub, order=["L4H7", "L0H0", "L1H3"], steps=(0, 1 / 3, 1.0),
                           out_png=tmp_path / "sweep.png", progress=False)
    assert [r["n_heads"] for r in rows] == [0, 1, 3]
    assert rows[0]["delta"] == 0.0 and math.isclose(rows[1]["delta"], deltas[(4, 7)], rel_tol=1e-6)
    assert math.isclose(rows[2]["ppl"], rows[2]["ppl_random_order"], rel_tol=1e-6)  # same set of heads
    assert rows[2]["ppl_random_program"] != rows[2]["ppl"]
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spearman_with_bootstrap_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    rho, lo, hi = spearman_ci(x, -2 * x + 0.1 * rng.normal(size=40), n_boot=300)
    assert rho < -0.9 and lo <= rho <= hi and hi < 0
    rho, lo, hi = spearman_ci(x, rng.normal(size=40), n_boot=300)
    assert lo < 0 < hi


@pytest.mark.e2e
def test_the_ablate_command_reports_delta_ppl_and_kl_against_the_base_with_intervals(capsys):
    import headsurgeon as hs
    from headsurgeon.cli import main
    from headsurgeon.surgery.measure.divergence import BaseDistributions, summarize, window_costs

    corpus = str(hs.demo_corpus_path())
    argv = ["ablate", "tiny-stories", corpus, "--max-sequences", "40", "--max-len", "32", "--heads", "L0H1",
            "L1H2", "--kind", "zero", "--each"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    handle = hs.load_model("tiny-stories")
    test = hs.load_corpus(handle, corpus, max_len=32, max_sequences=40).test  # the command's own test windows
    assert doc["test_sequences"] == len(test) and doc["test_tokens"] == sum(s.n - 1 for s in test)
    base_row, *rows = doc["rows"]
    base_ppl = perplexity(handle, test, progress=False)
    assert base_row["ppl"] == pytest.approx(base_ppl, rel=1e-12) and base_row["kl"] == base_row["delta_pct"] == 0.0
    dists = BaseDistributions(handle, test)
    for row, head in zip(rows, ("L0H1", "L1H2")):
        with ablate(handle, [head], "zero") as hybrid:
            ppl = perplexity(hybrid, test, progress=False)  # the perplexity the command printed before KL joined it
            want = summarize(window_costs(dists, hybrid, hybrid.register_sequences))
        assert row["heads"] == head and row["ppl"] == pytest.approx(ppl, rel=1e-12)
        assert row["delta_pct"] == pytest.approx(100 * (ppl / base_ppl - 1), rel=1e-9)
        assert (row["kl"], row["kl_ci95"], row["delta_wide"], row["kl_wide"]) == (want.kl, list(want.kl_ci95),
                                                                                  want.delta_wide, want.kl_wide)
        assert row["kl_ci95"][0] <= row["kl"] <= row["kl_ci95"][1] and row["kl"] > 0
        assert row["delta_ci95_pct"][0] <= row["delta_pct"] <= row["delta_ci95_pct"][1]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"({doc['test_tokens']} predicted tokens)" in text and "KL(base ‖ ablated)" in text
    assert "95% interval" in text and f"{rows[0]['kl']:.4g}" in text
    assert rows[0]["delta_wide"] and not rows[0]["kl_wide"]  # L0H1 costs little: ΔPPL's interval reaches 0, KL's not
    for row in rows:  # the rows whose interval is wider than the effect say so, and only those
        said = f"{row['heads']}: ΔPPL interval wider than the effect: more test windows needed" in text
        assert said == (row["delta_wide"] and not row["kl_wide"])
