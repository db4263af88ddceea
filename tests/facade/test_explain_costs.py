"""explain's head_costs option (headsurgeon/explain_costs.py): each explained head's causal cost on the select
windows lands in summary.json, programs.json's meta (``ProgramSet.table()``'s KL columns) and report.html's grid,
whose switch recolours it by causal cost. One small run on stories260K: three heads, a tiny corpus."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import CORPUS, need
from headsurgeon.report.grid import grid_html
from headsurgeon.report.heads import views
from headsurgeon.surgery.measure.head_costs import head_costs
from headsurgeon.synth.programset import ProgramSet

HEADS = ("L0H1", "L2H3", "L4H6")


@pytest.fixture(scope="module")
def run(tmp_path_factory, stories):
    from headsurgeon.pipeline import explain

    out = tmp_path_factory.mktemp("explain-costs")
    result = explain(stories, need(CORPUS), out, max_len=24, max_sequences=30, searchers=(), heads=HEADS,
                     library=["0.5*prev(1) + 0.5*first()", "first()", "same_token_recent()"],
                     sweep_steps=(0.0, 1.0), head_costs=True, progress=False)
    return result, json.loads((out / "summary.json").read_text()), (out / "report.html").read_text(encoding="utf-8")


def test_summary_holds_each_heads_costs_with_intervals_and_the_ablation_ratio(run, stories):
    result, summary, _ = run
    costs = summary["head_costs"]
    assert costs == result.head_costs and set(costs["heads"]) == set(HEADS)
    select = result.splits.select
    assert costs["windows"] == len(select) >= 2 and costs["tokens"] == sum(s.n - 1 for s in select)
    for row in costs["heads"].values():
        assert {"replacement", "mean"} <= set(row)
        for variant in ("replacement", "mean"):
            s = row[variant]
            assert s["kl"] >= 0 and s["kl_ci95"][0] <= s["kl"] <= s["kl_ci95"][1] and s["tokens"] == costs["tokens"]
        assert row["replacement_over_mean"] == pytest.approx(row["replacement"]["kl"] / row["mean"]["kl"])
    assert (result.out / "head_costs.json").is_file()  # the resumable progress file
    assert "head costs" in summary["timings_s"]
    # the same numbers as hs.head_costs on the select windows, with the synth windows as the ablation's reference
    again = head_costs(stories, result.programs, select, which=("replacement",), heads=["L2H3"],
                       reference=result.splits.synth, progress=False)
    assert again.kl("L2H3", "replacement") == pytest.approx(costs["heads"]["L2H3"]["replacement"]["kl"], rel=1e-6)
    assert again.kl("L2H3", "mean") == pytest.approx(costs["heads"]["L2H3"]["mean"]["kl"], rel=1e-6)
    # a head whose explanation is its replacement is swapped once (headsurgeon/surgery/measure/head_costs.py _same_programs)
    entry = result.programs.entries[(2, 3)]
    assert entry.explanation is not None and entry.explanation.program.hash == entry.program.hash
    both = head_costs(stories, result.programs, select, which=("replacement", "explanation"), heads=["L2H3"],
                      ablation=False, progress=False)
    assert both.costs[(2, 3)]["explanation"] is both.costs[(2, 3)]["replacement"]
    assert costs["heads"]["L2H3"]["explanation"] == costs["heads"]["L2H3"]["replacement"]


def test_the_table_has_kl_columns_from_programs_json(run):
    result, summary, _ = run
    loaded = ProgramSet.load(result.out / "programs.json")
    rows = {r["head"]: r for r in loaded.table()}
    assert set(rows) == set(HEADS)
    for label, row in rows.items():
        want = summary["head_costs"]["heads"][label]
        assert row["replacement_kl"] == pytest.approx(want["replacement"]["kl"])
        assert row["mean_ablation_kl"] == pytest.approx(want["mean"]["kl"])
        assert row["explanation_kl"] == (pytest.approx(want["explanation"]["kl"]) if "explanation" in want else None)
    plain = ProgramSet(loaded.entries, loaded.model, {}, loaded.vocab_fingerprint)
    assert "replacement_kl" not in plain.table()[0]  # no costs measured: no KL columns


def test_the_report_grid_switches_between_fidelity_and_causal_cost(run):
    result, summary, page = run
    assert "<select id='colour-by'>" in page and "value='kl'" in page and "value='ratio'" in page
    assert page.count("data-kl='") == len(HEADS) and page.count("data-fidelity='") == len(HEADS)
    assert "by.addEventListener('change'" in page and "http" not in page.split("<h2>Heads by layer</h2>")[1][:2000]
    kl = summary["head_costs"]["heads"]["L2H3"]
    kind = "explanation" if "explanation" in kl else "replacement"
    assert f"KL {kl[kind]['kl']:.4g} [" in page  # the tooltip states the cost with its interval
    assert f"{summary['head_costs']['tokens']} predicted tokens in {summary['head_costs']['windows']} select" in page
    # the cheapest head is green in the cost view, the costliest red (the scale ranks KL, lowest best)
    colour = {h: re.search(rf"data-kl='([^']*)'[^>]*><a href='#{h}'>", page).group(1) for h in HEADS}
    assert colour[min(HEADS, key=lambda h: kl_of(summary, h))] == "rgb(100,200,100)"
    assert colour[max(HEADS, key=lambda h: kl_of(summary, h))] == "rgb(255,135,135)"
    without = grid_html(views(result.programs), None)
    assert "colour-by" not in without and "--head-costs" in without


def kl_of(summary: dict, head: str) -> float:
    row = summary["head_costs"]["heads"][head]
    return row.get("explanation", row["replacement"])["kl"]


def test_build_splits_the_text_exactly_as_explain_did(run, stories):
    from headsurgeon.build import split_mismatch
    from headsurgeon.build.windows import corpus_windows
    from headsurgeon.configs import BuildConfig, CorpusConfig

    result, _, _ = run
    splits, _ = corpus_windows(stories, need(CORPUS), None, BuildConfig(corpus=CorpusConfig(max_len=24, max_sequences=30)))
    for name in ("synth", "select", "test"):
        assert [s.key for s in splits[name]] == [s.key for s in result.splits[name]]
    meta = ProgramSet.load(result.out / "programs.json").meta
    assert meta["split_tokens"] == splits.tokens() and split_mismatch(meta, splits) is None
    old = {k: v for k, v in meta.items() if k != "split_tokens"}  # programs.json of a split by documents
    assert "older headsurgeon" in split_mismatch(old, splits)
    other, _ = corpus_windows(stories, need(CORPUS), None, BuildConfig(corpus=CorpusConfig(max_len=24, max_sequences=40)))
    assert "--max-sequences and --seed explain had" in split_mismatch(meta, other)


def test_the_summary_table_lists_the_costs_costliest_first(run):
    result, summary, _ = run
    table = result.summary_table()
    assert f"over {summary['head_costs']['tokens']} predicted tokens in {summary['head_costs']['windows']} select" in table
    order = [line.split()[0] for line in table.splitlines() if re.match(r"L\d+H\d+ +(explanation|replacement) \d", line)]
    assert order == sorted(HEADS, key=lambda h: -kl_of(summary, h))


def test_the_switch_recolours_the_grid_in_headless_chromium(run, tmp_path):
    """Choosing "causal cost (KL)" paints each cell with its cost colour and shows that scale's legend."""
    from support.browser import chromium

    browser = chromium()
    result, _, page = run
    choose = ("<script>var by = document.getElementById('colour-by'); by.value = 'kl';"
              "by.dispatchEvent(new Event('change'));</script></body>")
    copy = tmp_path / "report.html"
    copy.write_text(page.replace("</body>", choose), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", copy.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    cells = re.findall(r'<td class="cell"[^>]*data-kl="([^"]*)"[^>]*style="background: ([^;"]*);?"', dom)
    assert len(cells) == len(HEADS), dom[:300]
    assert all(kl.replace(" ", "") == shown.replace(" ", "") for kl, shown in cells)
    legend = re.search(r'<p class="small" id="grid-legend">(.*?)</p>', dom, re.S).group(1)
    assert re.search(r'<span data-view="kl">', legend) and re.search(r'<span data-view="fidelity" hidden', legend)
