"""Per-head causal cost (headsurgeon/surgery/measure/head_costs.py) and ``build`` (headsurgeon/build/) on the embedded model: resumed
swaps give the numbers of whole hybrid forwards, the build grows under its budget with joint re-measurement, and its
checkpoint carries build.json and loads back exactly (seconds)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import headsurgeon as hs
from headsurgeon.build import BUILD_FILE, build_hybrid, within
from headsurgeon.core import InputError
from headsurgeon.surgery.measure.ablate import ablate
from headsurgeon.surgery.measure.divergence import BaseDistributions, window_costs
from headsurgeon.surgery.measure.head_costs import head_costs
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.core import Head

EXPLANATIONS = ["prev(1)", "first()", "self()", "prev(2)", "0.9*first() + 0.1*prev(1)", "first()", "prev(1)",
                "0.5*self() + 0.5*prev(1)"]


@pytest.fixture(scope="module")
def splits(handle):
    return hs.load_corpus(handle, hs.demo_corpus_path(), max_len=40, max_sequences=50)


@pytest.fixture(scope="module")
def programs(handle) -> ProgramSet:
    """Every head: a mixture as replacement, a one-primitive explanation with a made-up select IoU, and a frontier
    point of 60 characters holding another readable program."""
    ps = ProgramSet(model=handle.name)
    for k, (layer, head) in enumerate(handle.heads):
        explanation = ScoredProgram.of(Program.parse(EXPLANATIONS[k % len(EXPLANATIONS)]), "hand",
                                       {"select": {"iou": (k * 37 % 100) / 100}}, budget=200)
        other = ScoredProgram.of(Program.parse(EXPLANATIONS[(k + 3) % len(EXPLANATIONS)]), "hand",
                                 {"select": {"iou": 0.1}}, budget=60)
        ps.add((layer, head), Program.parse("0.5*prev(1) + 0.5*first()"), "hand", {"select": {"iou": 0.5}},
               explanation=explanation, frontier=[other, explanation])
    return ps


@pytest.fixture(scope="module")
def costs(handle, splits, programs):
    return head_costs(handle, programs, splits.select, which=("explanation", "replacement"),
                      heads=["L0H1", "L1H2", "L2H0", "L3H3"], reference=splits.synth, progress=False)


def test_resumed_swaps_equal_whole_hybrid_forwards(handle, splits, programs, costs):
    """The layers below are not re-run, yet each swap's KL and NLL per window are those of a whole hybrid forward,
    for programs of both kinds and for the mean ablation over the reference windows."""
    assert costs.resumed
    base = BaseDistributions(handle, splits.select)
    for head in ["L0H1", "L2H0", "L3H3"]:
        key = Head.parse(head)
        for kind in ("explanation", "replacement"):
            with hs.replace_heads(handle, {head: programs.programs(kind)[key]}) as hybrid:
                whole = window_costs(base, hybrid, hybrid.register_sequences)
            got = costs.costs[key][kind]
            np.testing.assert_allclose(got.kl, whole.kl, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(got.nll_other, whole.nll_other, rtol=1e-6)
            np.testing.assert_array_equal(got.tokens, whole.tokens)
        with ablate(handle, [head], "mean", reference=splits.synth) as ablated:
            whole = window_costs(base, ablated, ablated.register_sequences)
        np.testing.assert_allclose(costs.costs[key]["mean"].kl, whole.kl, rtol=1e-4, atol=1e-6)


def test_costs_order_ratio_and_json(costs):
    order = costs.order("explanation")
    kls = [costs.kl(h, "explanation") for h in order]
    assert kls == sorted(kls) and len(order) == 4 and all(k > 0 for k in kls)
    h = order[0]
    assert costs.ratio(h, "explanation") == pytest.approx(costs.kl(h, "explanation") / costs.kl(h, "mean"))
    s = costs.summary(h, "explanation")
    assert s.kl_ci95[0] <= s.kl <= s.kl_ci95[1] and s.tokens == costs.tokens
    row = costs.to_json()["heads"][f"L{h[0]}H{h[1]}"]
    assert set(row) >= {"explanation", "replacement", "mean", "explanation_over_mean", "programs"}
    assert "ratio" in costs.format("explanation").splitlines()[0]


def test_head_costs_refuses_bad_input(handle, splits, programs):
    with pytest.raises(InputError, match="which"):
        head_costs(handle, programs, splits.select, which=("both",), progress=False)
    with pytest.raises(InputError, match="windows"):
        head_costs(handle, programs, [], progress=False)
    with pytest.raises(InputError, match="L9H0"):
        head_costs(handle, {"L9H0": "prev(1)"}, splits.select, which=("replacement",), progress=False)


THREAD_FITS: list[int] = []  # the thread count build asked for, once per stage of forwards (the built fixture)


@pytest.fixture(scope="module")
def built(handle, programs, tmp_path_factory):
    import headsurgeon.build as build_module

    out = tmp_path_factory.mktemp("build") / "hybrid"
    with pytest.MonkeyPatch.context() as mp:
        fit = build_module.fit_threads
        mp.setattr(build_module, "fit_threads", lambda: THREAD_FITS.append(fit()) or THREAD_FITS[-1])
        result = build_hybrid(handle, hs.demo_corpus_path(), programs, out, fraction=0.25, max_len=40,
                              max_sequences=50, control=True, chunk=2, heal=True, heal_steps=6, progress=False)
    return result, out


@pytest.mark.e2e
def test_build_sizes_its_threads_before_each_stage(built):
    """Each stage of forwards gets the cores free when it starts (a long build started beside a busy process
    must not keep one thread to its end)."""
    result, _ = built
    stages = [k for k in result.seconds if k not in ("load", "total")]
    assert stages == ["refit", "head costs", "growth", "test", "heal"]
    assert len(THREAD_FITS) == len(stages) and all(t >= 1 for t in THREAD_FITS)


@pytest.mark.e2e
def test_fraction_build_swaps_the_share_cheapest_first_and_saves(built, handle, splits):
    result, out = built
    assert len(result.heads) == round(0.25 * 16)
    first = result.order[: len(result.heads)]
    assert result.heads[0] == first[0]  # the cheapest single swap goes in first
    kept = [s for s in result.steps if s["kept"]]
    assert kept[-1]["heads"] == len(result.heads) and kept[-1]["kl"] == pytest.approx(result.select["kl"])
    assert result.test["tokens"] == sum(s.n - 1 for s in splits.test)
    assert result.control["heads"] and len(result.control["heads"]) == len(result.heads)
    record = json.loads((out / BUILD_FILE).read_text())
    assert record["heads"] == result.heads and record["test"] == result.test
    again = hs.load_hybrid(out)
    assert sorted(f"L{l}H{h}" for l, h in again.replaced) == sorted(result.heads)
    ids = torch.from_numpy(splits.test[0].ids)[None]
    assert torch.equal(again(ids), result.hybrid(ids))  # the healed hybrid, bit for bit
    assert again.healing == result.hybrid.healing and again.healing[0]["steps"] == 6
    with hs.replace_heads(handle, again.replaced) as untuned:  # healing changed the weights; the base is untouched
        assert not torch.equal(again(ids), untuned(ids))


@pytest.mark.e2e
def test_healed_build_distils_from_the_base_by_default(built):
    """The default heal distils the hybrid from the base, so the base is its own control; KL falls."""
    result, _ = built
    healed = result.healed
    assert healed["objective"] == "kl" and healed["heal"]["objective"] == "kl" and "base_heal" not in healed
    assert healed["heal"]["steps"] == 6
    assert healed["test"]["tokens"] == result.test["tokens"] and healed["test"]["kl"] < result.test["kl"]
    assert "healed" in result.control and "distilling from it leaves the base itself unchanged" in result.format()
    checks = healed["heal"]["validation"]  # early stopping on the select windows: the best check's step is kept
    assert healed["heal"]["validation_windows"] == result.windows["select"] and checks[0][0] == 0
    assert healed["heal"]["best_step"] == min(checks, key=lambda row: row[1])[0]
    ratios = [row[result.costs["chosen"][h]]["kl"] / row["mean"]["kl"] for h, row in result.costs["heads"].items()]
    assert f"below 1 for {sum(r < 1 for r in ratios)} of 16 heads" in result.format()


@pytest.mark.e2e
def test_lm_healing_is_judged_against_the_equally_tuned_base(handle, programs):
    result = build_hybrid(handle, hs.demo_corpus_path(), programs, fraction=0.125, max_len=40, max_sequences=50,
                          heal=True, heal_steps=4, heal_objective="lm", heal_more=5, progress=False)
    healed = result.healed
    assert healed["heal"]["steps"] == healed["base_heal"]["steps"] == 4
    assert result.windows["heal_more"] == 5  # the hybrid and the control both train on synth + the fresh windows
    assert healed["heal"]["windows"] == healed["base_heal"]["windows"] == result.windows["synth"] + 5
    assert healed["heal"]["model"] == "hybrid" and healed["base_heal"]["model"] == "base"
    assert healed["tuned_base_vs_base"]["kl"] > 0  # tuning moved the base too: the untuned base is the wrong control
    assert "against the base tuned the same way" in result.format()


def test_extra_checkpoint_files_must_be_plain_new_names(handle, tmp_path):
    with hs.replace_heads(handle, {"L0H0": "prev(1)"}) as hybrid:
        for bad in ("manifest.json", "../build.json", "programs", ".hidden"):
            with pytest.raises(hs.hub.checkpoint.CheckpointError, match="plain file name"):
                hs.save_hybrid(hybrid, tmp_path / "h", extra_files={bad: b"{}"})


@pytest.mark.e2e
def test_each_head_gets_its_cheapest_readable_candidate(built, programs):
    """Build measures the frontier point beside the explanation and swaps in whichever costs less (single-swap KL)."""
    result, out = built
    heads = result.costs["heads"]
    for name in result.heads:
        label = result.costs["chosen"][name]
        kls = {v: row["kl"] for v, row in heads[name].items() if isinstance(row, dict) and "kl" in row and v != "mean"}
        assert {"explanation", "frontier:60"} <= set(kls) and label == min(kls, key=kls.get)
        swapped = hs.load_hybrid(out).replaced[Head.parse(name)]
        assert swapped.text == heads[name]["programs"][label]
    assert len({result.costs["chosen"][h] for h in result.heads}) >= 2, "the embedded model prefers either somewhere"
    refitted = [h for h, row in heads.items() if "refit" in row]
    assert refitted, "mixture explanations get a refitted candidate"
    for h in refitted:  # same components, weights chosen on the synth windows
        assert row_components(heads[h]["programs"]["refit"]) <= row_components(heads[h]["programs"]["explanation"])


def row_components(text: str) -> set[str]:
    return {part.split("*")[-1].strip() for part in text.split(" + ")}


def test_a_set_fits_a_budget_by_its_intervals_upper_end():
    from headsurgeon.surgery.measure.divergence import CostSummary

    def summary(point: float, high: float) -> CostSummary:
        return CostSummary(kl=0.01, kl_ci95=(0.005, 0.02), delta_nll=point, delta_nll_ci95=(0.0, high),
                           delta_ppl=point, delta_ppl_ci95=(point / 2, high), tokens=100, windows=10)

    assert within(summary(0.03, 0.049), 0.05)
    assert not within(summary(0.03, 0.07), 0.05)  # the estimate fits, its interval does not
    assert within(summary(0.03, 0.07), None)


@pytest.mark.e2e
def test_budget_build_stays_under_budget(handle, programs):
    result = build_hybrid(handle, hs.demo_corpus_path(), programs, budget_ppl=3.0, max_len=40, max_sequences=50,
                          chunk=2, progress=False)
    assert result.heads, "the cheapest heads fit a 3% budget on the embedded model"
    assert result.select["delta_ppl_ci95_pct"][1] <= 3.0  # the interval's upper end, not only the estimate
    assert all(s["delta_ppl_ci95_pct"][1] <= 3.0 for s in result.steps if s["kept"])
    rejected = [s for s in result.steps if not s["kept"]]
    assert rejected and all(s["delta_ppl_ci95_pct"][1] > 3.0 or len(s["tried"]) > 1 for s in rejected)


@pytest.mark.e2e
def test_healed_budget_bounds_the_healed_hybrid(handle, programs, splits):
    """With --heal, --budget-ppl bounds what is shipped: prefixes longer than the untuned growth are healed and
    measured, and the longest that fits (to within a chunk of the shortest that does not) is kept, healed once."""
    budget = 3.0
    result = build_hybrid(handle, hs.demo_corpus_path(), programs, budget_ppl=budget, max_len=40, max_sequences=50,
                          chunk=1, heal=True, heal_steps=4, progress=False)
    kept = [h for s in result.steps if s["kept"] for h in s["tried"]]
    untuned = len(kept)
    tries = result.healed["budget_tries"]
    assert tries and tries[0]["heads"] > untuned
    fits = [t["heads"] for t in tries if t["fits"]]
    misses = [t["heads"] for t in tries if not t["fits"]]
    assert all(t["delta_ppl_ci95_pct"][1] <= budget for t in tries if t["fits"])
    assert all(t["delta_ppl_ci95_pct"][1] > budget for t in tries if not t["fits"])
    assert len(result.heads) == max([untuned, *fits])
    assert result.heads[:untuned] == kept  # then the heads after them in the order, untuned growth aside
    if misses:
        assert min(misses) - len(result.heads) <= 1 and min(misses) > len(result.heads)
    assert result.healed["heal"]["steps"] == 4 and "the budget held after healing" in result.format()
    if fits:  # the shipped hybrid is the healed one that was measured, not a second heal
        from headsurgeon.surgery.measure.divergence import summarize

        again = summarize(window_costs(BaseDistributions(handle, splits.select), result.hybrid,
                                       result.hybrid.register_sequences))
        assert 100 * again.delta_ppl == pytest.approx([t for t in tries if t["heads"] == len(result.heads)][0]
                                                      ["delta_ppl_pct"], rel=1e-9, abs=1e-12)


@pytest.mark.e2e
def test_select_more_chooses_on_fresh_documents_too(handle, programs, tmp_path):
    """--select-more adds windows of documents after explain's windows (none of them in any split) to the costs and
    the growth; their per-head costs are kept beside --costs."""
    from dataclasses import replace

    from headsurgeon.build import fresh_windows, more_windows
    from headsurgeon.configs import BuildConfig, CorpusConfig

    cfg = BuildConfig(corpus=CorpusConfig(max_len=40, max_sequences=50), select_more=6)
    more = more_windows(handle, hs.demo_corpus_path(), cfg, 6)
    first = hs.surgery.corpus.make_sequences(handle, hs.surgery.corpus.read_documents(hs.demo_corpus_path()),
                                             max_len=40, max_sequences=50)
    assert len(more) == 6 and not {s.doc for s in more} & {s.doc for s in first}
    chosen, healing = fresh_windows(handle, hs.demo_corpus_path(), replace(cfg, heal=True, heal_more=4))
    def key(s):
        return s.doc, tuple(s.ids.tolist())

    assert [key(s) for s in chosen] == [key(s) for s in more]  # healing trains after the select-more windows
    assert len(healing) == 4 and not {key(s) for s in healing} & {key(s) for s in chosen}
    assert healing[0].doc >= more[-1].doc
    assert fresh_windows(handle, hs.demo_corpus_path(), replace(cfg, heal_more=4))[1] == []  # no --heal, no windows
    costs = tmp_path / "costs.json"
    result = build_hybrid(handle, hs.demo_corpus_path(), programs, fraction=0.125, max_len=40, max_sequences=50,
                          select_more=6, costs=costs, progress=False)
    splits = hs.load_corpus(handle, hs.demo_corpus_path(), max_len=40, max_sequences=50)
    assert result.windows["select_more"] == 6 and (tmp_path / "costs.more.json").is_file()
    assert result.select["tokens"] == sum(s.n - 1 for s in splits.select + more)  # grown on both
    pooled = result.costs["pooled_kl"]  # the shortlist: twice the heads asked for, reordered by the pooled KL
    assert len(pooled) == 2 * len(result.heads)
    assert result.order[: len(pooled)] == sorted(pooled, key=lambda h: (pooled[h], Head.parse(h)))
    with pytest.raises(InputError, match="no limit was set"):
        more_windows(handle, hs.demo_corpus_path(), BuildConfig(corpus=CorpusConfig(max_sequences=None)), 4)
    with pytest.raises(InputError, match="nothing to add"):
        more_windows(handle, hs.demo_corpus_path(), BuildConfig(corpus=CorpusConfig(max_len=40, max_sequences=10**6)), 4)


def test_build_needs_exactly_one_target(handle, programs):
    with pytest.raises(InputError, match="exactly one"):
        build_hybrid(handle, hs.demo_corpus_path(), programs, progress=False)
    with pytest.raises(InputError, match="exactly one"):
        build_hybrid(handle, hs.demo_corpus_path(), programs, fraction=0.1, budget_ppl=1.0, progress=False)
    with pytest.raises(InputError, match="healing, which is off: add heal=True"):
        build_hybrid(handle, hs.demo_corpus_path(), programs, fraction=0.1, heal_more=8, progress=False)


def test_head_costs_progress_file_resumes_and_rebinds(handle, splits, programs, tmp_path):
    """Batches a swap recorded as done are taken from the file, the rest measured; new swaps join the file; a file of
    other windows is replaced."""
    path = tmp_path / "costs.json"
    heads = ["L1H2", "L2H0"]
    first = head_costs(handle, programs, splits.select, heads=heads, batch_size=4, reference=splits.synth,
                       progress=False, path=path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "headsurgeon.head_costs" and len(doc["swaps"]) == 4  # 2 heads × (explanation, mean)
    assert all(len(r["done"]) > 1 for r in doc["swaps"].values())
    for record in doc["swaps"].values():
        record["done"] = [0]
        record["kl"] = [-1.0] * len(record["kl"])
    path.write_text(json.dumps(doc))
    again = head_costs(handle, programs, splits.select, heads=heads, batch_size=4, reference=splits.synth,
                       progress=False, path=path)
    for h in first.costs:
        for v, c in first.costs[h].items():
            got = again.costs[h][v].kl
            from_file = got == -1.0
            # batch 0 (the shortest windows, at most 4) came from the file; every other window was measured
            assert 1 <= from_file.sum() <= 4 and from_file.sum() < len(got)
            np.testing.assert_allclose(got[~from_file], c.kl[~from_file], rtol=1e-6)
    more = head_costs(handle, programs, splits.select, heads=["L0H0"], batch_size=4, reference=splits.synth,
                      progress=False, path=path)
    assert len(json.loads(path.read_text())["swaps"]) == 6 and more.kl("L0H0", "explanation") > 0
    doc = json.loads(path.read_text())
    key = next(k for k in doc["swaps"] if k.startswith("L0H0:explanation"))
    doc["swaps"][key]["kl"] = [float("nan")] * 3
    path.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="damaged"):
        mended = head_costs(handle, programs, splits.select, heads=["L0H0"], batch_size=4, reference=splits.synth,
                            progress=False, path=path)
    np.testing.assert_allclose(mended.costs[(0, 0)]["explanation"].kl, more.costs[(0, 0)]["explanation"].kl,
                               rtol=1e-4)  # float32 rows batched with other swaps than before
    with pytest.warns(UserWarning, match="other windows"):
        head_costs(handle, programs, splits.test, heads=["L0H0"], batch_size=4, reference=splits.synth,
                   progress=False, path=path)
    assert len(json.loads(path.read_text())["swaps"]) == 2
