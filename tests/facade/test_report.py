"""report.html for a person: glosses, full program texts, token-labelled heatmaps, the metric paragraph, a summary
in words (no Python reprs), trust order, a note for heads without a readable explanation, and a size bound."""
from __future__ import annotations

import re
import subprocess
from html import escape

import pytest

from headsurgeon.report import METRICS_PARAGRAPH, write_report
from headsurgeon.report import heads as hv
from headsurgeon.report import words
from headsurgeon.report.plots import token_label
from headsurgeon.surgery.patterns.capture import capture
from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import READABLE_CHARS, Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.select import score_programs, select_programs
from headsurgeon.synth.vocab import Vocabulary
from headsurgeon.core import Head
from headsurgeon.synth.splits import StoreSplits
from support.browser import chromium

LONG_READABLE = ("0.25*prev(1) + 0.15*prev(2) + 0.15*first() + 0.1*self() + 0.1*prev(3) + 0.1*same_token_recent()"
                 " + 0.1*prev(4) + 0.05*uniform()")  # longer than the old report's 120-character cut
TOO_LONG = " + ".join(f"0.05*prev({k})" for k in range(1, 21))  # > READABLE_CHARS: no readable explanation
SWEEP = [{"fraction": 0.0, "n_heads": 0, "delta": 0.0, "delta_random_order": 0.0, "delta_random_program": 0.0},
         {"fraction": 1.0, "n_heads": 40, "delta": 0.165, "delta_random_order": 0.17, "delta_random_program": 2.66}]
TIMINGS = {"load": 0.41, "capture": 1.23, "enumerative": 40.2, "select": 75.0}
SPLIT = {"synth": list(range(0, 10)), "select": list(range(10, 20)), "test": list(range(20, 30))}


@pytest.fixture(scope="module")
def setup(stories, documents):
    """A real stories260K store over 30 windows, its vocabulary and a selected ProgramSet (40 heads)."""
    seqs = make_sequences(stories, documents[:60], max_len=24)[:30]
    store = capture(stories, seqs, progress=False)
    vocab = Vocabulary.from_tokenizer(stories.tokenizer)
    ps = select_programs(store, {}, SPLIT,
                         library=[LONG_READABLE, "0.5*prev(1) + 0.5*first()"], progress=False,
                         model=stories.name, vocab=vocab)
    return store, vocab, ps


def edited(ps: ProgramSet, vocab: Vocabulary, store) -> ProgramSet:
    """Two heads rewritten: L0H0 explained by LONG_READABLE, L0H1 with only a replacement too long to read."""
    out = ProgramSet(dict(ps.entries), ps.model, ps.meta, ps.vocab_fingerprint)
    for head, text, readable in (((0, 0), LONG_READABLE, True), ((0, 1), TOO_LONG, False)):
        p = Program.parse(text)
        scores = {s: {m: float(v[0, 0]) for m, v in score_programs(store, [head], [p], idx).items()}
                  for s, idx in SPLIT.items()}
        rep = ScoredProgram.of(p, "library", scores, vocab)
        ex = ScoredProgram.of(p, "library", scores, vocab, budget=READABLE_CHARS) if readable else None
        out.add(head, p, "library", scores, explanation=ex, frontier=[c for c in (ex, rep) if c], vocab=vocab)
    return out


@pytest.fixture(scope="module")
def report(setup, tmp_path_factory):
    store, vocab, ps = setup
    ps = edited(ps, vocab, store)
    out = tmp_path_factory.mktemp("report") / "report.html"
    write_report(out, ps, store, SPLIT, sweep_rows=SWEEP, title="stories260K",
                 summary={"timings_s": TIMINGS, "notes": ["learned: not installed here"]}, vocab=vocab)
    return out, out.read_text(encoding="utf-8"), ps, store


def test_each_head_shows_its_gloss_full_program_and_numbers(report):
    _, html, ps, _ = report
    for h, e in ps.entries.items():
        assert f"id='{Head.label(h)}'" in html
        if e.explanation is not None:
            assert escape(e.explanation.gloss) in html and escape(e.explanation.text) in html  # never cut
    assert escape(Program.parse(LONG_READABLE).render()) in html and len(LONG_READABLE) > 120
    assert "class='frontier'" in html and html.count("<svg") == len(ps)
    assert "best single template" in html and "size (AST nodes + literals)" in html


def test_heads_without_a_readable_explanation_are_noted_and_come_last(report):
    _, html, ps, _ = report
    assert "No readable explanation" in html and html.count("class='noexp'") == 1
    order = re.findall(r"<section class='head' id='(L\d+H\d+)'>", html)
    assert order[-1] == "L0H1" and len(order) == len(ps)
    ious = [ps.entries[Head.parse(lab)].explanation.iou("test") for lab in order[:-1]]
    assert ious == sorted(ious, reverse=True)
    assert escape(Program.parse(TOO_LONG).render()) in html  # the replacement's full text, short enough to show


def test_heatmaps_have_token_labels_colour_bars_and_a_difference_map(report):
    _, html, ps, store = report
    index = hv.example_window(store, SPLIT["test"], 24)
    tokens = store.sequences[index].tokens[:24]
    for t in tokens[1:6]:
        assert f">{escape(token_label(t))}</span>" in html
    n_maps = html.count("class='heatmap'")
    assert n_maps >= 3 * len(ps) and html.count("class='cbar'") == n_maps
    assert html.count("− real (red: the program attends more)</figcaption>") == len(ps)
    assert f"test window {index}" in html


def test_summary_is_in_words_with_the_metric_paragraph(report):
    _, html, _, _ = report
    assert METRICS_PARAGRAPH in html and "Σ min(p, q) / Σ max(p, q)" in html
    assert "capture 1.2 s, enumerative 40 s, select 1 min 15 s" in html
    assert "<li>learned: not installed here</li>" in html
    assert "+16.5%" in html and "100% of heads (40)" in html and "+266.0%" in html
    assert "mean test IoU" in html and "explanations (readable)" in html
    for raw in ("{'", "['", "[]", "Program(", "timings_s", "notes:", "None"):
        assert raw not in html, raw
    assert not re.search(r"\bnan\b", html)


def test_no_notes_means_no_notes_section(setup, tmp_path):
    store, vocab, ps = setup
    out = write_report(tmp_path / "r.html", ps, store, StoreSplits((), (), SPLIT["test"]), summary={"timings_s": {}, "notes": []},
                       vocab=vocab)
    html = out.read_text(encoding="utf-8")
    assert "Notes" not in html and "[]" not in html and "Time:" not in html


def test_report_stays_small(report):
    path, _, ps, _ = report
    per_head = path.stat().st_size / len(ps)
    assert per_head * 40 < 3e6, f"{path.stat().st_size} bytes for {len(ps)} heads"


def test_words():
    assert words.seconds(1.23) == "1.2 s" and words.seconds(40.2) == "40 s" and words.seconds(125) == "2 min 5 s"
    assert words.timings_sentence({"capture": 1.2, "search": 40}) == "capture 1.2 s, search 40 s (total 41 s)"
    assert words.notes_list([]) == "" and words.plain({"a_b": 0.5, "c": [1, 2]}) == "a b 0.500, c 1, 2"
    assert words.percent(0.165) == "+16.5%" and words.number(float("nan")) == "–"


def test_report_renders_in_headless_chromium(report, tmp_path):
    browser = chromium()
    path, html, _, _ = report
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", path.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert dom.count('class="heatmap"') == html.count("class='heatmap'") > 0, dom[:500]
    assert 'id="heads"' in dom and 'id="metrics"' in dom and dom.count("<svg") == html.count("<svg")


def test_grid_has_a_linked_cell_per_head_with_its_family(report):
    """The layer x head overview: one cell per head, each linking to that head's section, labelled by family."""
    from headsurgeon.report.grid import FAMILIES, family

    _, html, ps, _ = report
    grid = html[html.index("<table id='grid'"): html.index("</table>", html.index("<table id='grid'"))]
    cells = re.findall(r"<td class='cell' data-family='([^']+)' data-iou='([^']*)'.*?<a href='#(L\d+H\d+)'>", grid)
    assert sorted(h for _, _, h in cells) == sorted(Head.label(h) for h in ps)
    for fam, _, lab in cells:
        assert f"<section class='head' id='{lab}'>" in html  # the link has a target
        e = ps.entries[Head.parse(lab)]
        assert fam == family(e.explanation.program if e.explanation else e.program) and fam in FAMILIES
    assert len(re.findall(r"<tr><th>L\d+</th>", grid)) == len({h[0] for h in ps})
    assert "id='family-filter'" in html and "id='iou-filter'" in html and "classList.toggle('off'" in html


@pytest.mark.parametrize("text, expected", [
    ("prev(1)", "previous token"), ("0.7*prev(1) + 0.3*first()", "previous token"),
    ("0.98*first() + 0.02*induction()", "induction"), ("gate(pos=PROPN, induction(), first())", "induction"),
    ("first()", "sink"), ("0.9*first() + 0.1*self()", "self"),
    ("profile(w=[0.014, 1, 0.12], tail=0.0003, bos=0.24)", "previous token"), ("prev(3)", "positional"),
    ("sharpen(same_token_recent(), 2)", "duplicate"), ("key_in_set(ids=[5, 7])", "content")])
def test_families_follow_the_dominant_part(text, expected):
    from headsurgeon.report.grid import family

    assert family(Program.parse(text)) == expected


def test_the_report_opens_on_the_grid_coloured_by_rank_with_the_sink_share(report):
    from headsurgeon.report.grid import _colour, _ranks, sink_share

    _, html, _, _ = report
    assert html.index("<table id='grid'") < html.index("<h2>Summary</h2>") < html.index("<h2>Per head</h2>")
    assert "of the program on the first token" in html
    assert _ranks([0.5, None, 0.9, 0.7]) == [0.0, None, 1.0, 0.5]
    assert _colour(0.0) != _colour(0.5) != _colour(1.0) and _colour(0.5) == "rgb(255,255,255)"
    assert sink_share(Program.parse("0.98*first() + 0.02*induction()")) == pytest.approx(0.98)
    assert sink_share(Program.parse("prev(1)")) == 0.0 and sink_share(Program.parse("first()")) == 1.0
