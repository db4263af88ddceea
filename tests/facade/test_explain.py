"""explain end to end on stories260K (reduced), and report.html rendered in headless Chromium."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import CORPUS, STORIES, TASKS, need
from headsurgeon.synth.programset import ProgramSet
from support.browser import chromium

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def explained(tmp_path_factory, stories):
    from headsurgeon.pipeline import explain

    out = tmp_path_factory.mktemp("explain")
    return explain(stories, need(CORPUS), out, max_len=24, max_sequences=40, searchers=(),
                   library=["0.5*prev(1) + 0.5*first()", "same_token_recent()"],
                   sweep_steps=(0.0, 0.5, 1.0), progress=False,
                   tasks=["hs_cloze"], task_limit=8, include_path=TASKS)


def test_explain_writes_programs_report_and_sweep(explained):
    out = explained.out
    ps = ProgramSet.load(out / "programs.json")
    assert len(ps) == 40 and ps.keys() == explained.programs.keys()
    for e in ps.entries.values():
        assert {"select", "test", "synth"} <= set(e.scores) and 0 <= e.scores["test"]["iou"] <= 1
    for kind in ("replacement", "explanation"):  # both kinds swept, each row labelled
        assert [r["n_heads"] for r in explained.sweep if r["which"] == kind] == [0, 20, 40]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["heads"] == 40
    html = (out / "report.html").read_text()
    # real, explanation and/or replacement, and a difference map per head, on one test window
    assert html.count("class='heatmap'") >= 40 * 3 and "id='sweep'" in html
    assert "L0H0" in html
    # explain --tasks: the downstream table (base and hybrid on the same 8 cloze questions)
    (row,) = summary["evaluation"]["kinds"]["explanation"]["downstream"]["rows"]
    assert row["task"] == "hs_cloze" and row["n"] == 8 and {"base", "hybrid", "delta_ci95"} <= set(row)
    table = html[html.index("id='downstream'"):]
    assert "<td>hs_cloze</td><td>acc</td><td class='num'>8</td>" in table


def test_explain_keeps_explanations_and_the_vocabulary_fingerprint(explained, stories):
    from headsurgeon.synth.program import READABLE_CHARS
    from headsurgeon.synth.vocab import Vocabulary

    ps = ProgramSet.load(explained.out / "programs.json")
    assert ps.vocab_fingerprint == Vocabulary.from_tokenizer(stories.tokenizer).fingerprint
    for e in ps.entries.values():
        assert e.explanation is not None and e.explanation.chars <= READABLE_CHARS and e.explanation.gloss
        assert e.frontier and e.frontier[-1].program == e.program
    table = explained.summary_table()
    first = ps.entries[ps.ranked("test")[0]]
    assert "expl IoU" in table and first.explanation.gloss in table and "readable explanations: 40 of 40" in table


def test_report_renders_in_headless_chromium(explained, tmp_path):
    browser = chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    page = (explained.out / "report.html").resolve().as_uri()
    dom = subprocess.run([browser, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    html = (explained.out / "report.html").read_text(encoding="utf-8")
    assert dom.count('class="heatmap"') == html.count("class='heatmap'") >= 120, dom[:500]
    assert 'id="sweep"' in dom and 'id="heads"' in dom
    shot = tmp_path / "report.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1200,2400", page],
                   capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # the screenshot is not blank: decode it and look for many distinct colours (heatmaps, plot)
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(shot)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200


def test_capture_only_then_the_same_call_goes_on_from_the_store(tmp_path, stories):
    """Capture on one machine (--capture-only), search on another: the second call reuses every shard."""
    from headsurgeon.pipeline import explain

    kwargs = dict(max_len=24, max_sequences=30, searchers=(), library=["prev(1)"], sweep_steps=(0.0, 1.0),
                  progress=False)
    first = explain(stories, need(CORPUS), tmp_path, capture_only=True, **kwargs)
    shards = {p: p.stat().st_mtime_ns for p in (tmp_path / "store").glob("*.safetensors")}
    assert shards and len(first.programs) == 0 and not (tmp_path / "programs.json").exists()
    second = explain(stories, need(CORPUS), tmp_path, **kwargs)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "store").glob("*.safetensors")} == shards
    assert len(second.programs) == 40 and (tmp_path / "report.html").exists()
