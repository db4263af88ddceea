"""Per-head report views a person can read: several test windows per head, a table of the head's
leading candidates, and glosses in words (no "the all token", no Python lists of ids, no nested percentages)."""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

from headsurgeon.report import write_report
from headsurgeon.report import heads as hv
from headsurgeon.report.candidates import rows
from headsurgeon.report import windows
from headsurgeon.report.windows import add_windows, decode, encode
from headsurgeon.synth import dsl
from headsurgeon.synth.program import READABLE_CHARS, Program
from headsurgeon.synth.program_store import ProgramStore
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.select import score_programs
from headsurgeon.synth.sequence import Sequence
from headsurgeon.synth.vocab import Vocabulary
from headsurgeon.core import Head
from headsurgeon.synth.splits import StoreSplits
from support.browser import chromium

WORDS = ["the", "cat", "sat", "on", "a", "mat", ".", "Lily", "saw", "dog", "and", "ran"]
VOCAB = Vocabulary(["<s>"] + [f"▁{w}" for w in WORDS])
TRUTH = {(0, 0): "0.6*prev(1) + 0.4*first()", (0, 1): "fallback(same_token_recent(), first())"}
EXPLAINED = {(0, 0): "prev(1)", (0, 1): "first()"}
SPLIT = {"synth": list(range(0, 6)), "select": list(range(6, 12)), "test": list(range(12, 24))}


def sequences(count: int = 24, seed: int = 0) -> list[Sequence]:
    """Windows of random words of varied lengths (BOS first)."""
    rng = np.random.default_rng(seed)
    out = []
    for doc in range(count):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(8, 30)))]
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        offsets = [(0, 0)] + [(int(s), int(s) + len(w)) for s, w in zip(starts, words)]
        out.append(Sequence(ids=np.array([0] + [1 + WORDS.index(w) for w in words]),
                            tokens=["<s>"] + [f"▁{w}" for w in words], text=" ".join(words),
                            offsets=np.array(offsets), doc=doc, has_bos=True))
    return out


def scored(store: ProgramStore, head, text: str, source: str, budget: int | None = None) -> ScoredProgram:
    p = Program.parse(text)
    scores = {s: {m: float(v[0, 0]) for m, v in score_programs(store, [head], [p], idx).items()}
              for s, idx in SPLIT.items()}
    return ScoredProgram.of(p, source, scores, VOCAB, budget=budget)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A report of two heads: each explained by a simpler program than the truth, replaced by the truth."""
    store = ProgramStore(sequences(), TRUTH)
    ps = ProgramSet(model="known")
    for head, truth in TRUTH.items():
        ex = scored(store, head, EXPLAINED[head], "enumerative", READABLE_CHARS)
        near = scored(store, head, "0.5*prev(1) + 0.5*first()", "library", 40)
        rep = scored(store, head, truth, "enumerative")
        ps.add(head, rep.program, "enumerative", rep.scores, explanation=ex, frontier=[ex, near, rep], vocab=VOCAB)
    out = tmp_path_factory.mktemp("views") / "report.html"
    write_report(out, ps, store, SPLIT, vocab=VOCAB)
    return out, out.read_text(encoding="utf-8"), ps, store


def section(html: str, head) -> str:
    start = html.index(f"<section class='head' id='{Head.label(head)}'>")
    return html[start: html.index("</section>", start)]


@pytest.mark.smoke
def test_each_head_shows_three_distinct_windows_best_to_worst(built):
    _, html, ps, store = built
    for head in ps.entries:
        part = section(html, head)
        shown = re.findall(r"<div class='win' data-w='(\d+)' data-n='(\d+)'", part)
        assert len(shown) == 3 and len({w for w, _ in shown}) == 3, shown
        assert {int(w) for w, _ in shown} <= set(SPLIT["test"])
        labels = re.findall(r"class='wbtn[^']*' data-k='\d'>(\w+): window \d+, IoU ([\d.]+)<", part)
        assert [lab for lab, _ in labels] == ["best", "median", "worst"]
        ious = [float(x) for _, x in labels]
        assert ious == sorted(ious, reverse=True) and ious[0] > ious[-1]  # the windows differ in how well it fits
    # every window's tokens are on the page once, as strings
    start = html.index("id='hs-tokens'>") + len("id='hs-tokens'>")
    table = json.loads(html[start: html.index("</script>", start)])
    for w in {int(w) for w in re.findall(r"<div class='win' data-w='(\d+)'", html)}:
        assert table[str(w)] == store.sequences[w].tokens[:24]


def test_windows_read_each_window_once_for_all_heads(built):
    """A store that decodes all heads of a window at once (``patterns``) is read once per window, not per head."""
    _, _, ps, store = built

    class Counting(ProgramStore):
        reads = 0

        def patterns(self, index: int) -> np.ndarray:
            Counting.reads += 1
            return np.stack([np.stack([self.pattern(index, 0, h) for h in range(2)])])

    views = hv.views(ps, VOCAB)
    counting = Counting(store.sequences, TRUTH)
    add_windows(views, counting, SPLIT["test"])
    assert Counting.reads == len(SPLIT["test"]) and all(len(v.windows) == 3 for v in views)
    assert [w.index for w in views[0].windows] == [w.index for w in windows.choose(views[0], store, SPLIT["test"])]


def test_window_maps_round_trip_through_the_compact_encoding():
    rng = np.random.default_rng(1)
    m = np.tril(rng.random((7, 7)))
    top = float(m.max())
    for causal in (True, False):
        back = decode(encode(m, top, causal), 7, causal, top)
        assert np.abs(back - m).max() <= top / 255 / 2 + 1e-12
    assert len(encode(m, top, True)) < len(encode(m, top, False))  # causal maps carry only the lower triangle


def test_windows_draw_in_headless_chromium(built, tmp_path):
    browser = chromium()
    path, _, ps, _ = built
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", path.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    # the first window of each head is drawn: real, explanation, replacement and the difference, with its tokens
    assert dom.count("<canvas") == 4 * len(ps), dom[:300]
    assert dom.count('class="wtoks"') == len(ps) and "<span>_the</span>" in dom


def test_candidates_table_ranks_what_else_nearly_won(built):
    _, html, ps, store = built
    views = hv.views(ps, VOCAB)
    hv.add_templates(views, store, StoreSplits.of(SPLIT))
    for v in views:
        got = rows(v)
        tests = [r.test_iou for r in got]
        assert tests == sorted(tests, reverse=True)
        roles = [role for r in got for role in r.roles]
        assert {"explanation", "replacement", "frontier ≤40"} <= set(roles)
        assert any("best template" in r.roles for r in got) and all(r.select_iou is not None for r in got)
        part = section(html, v.head)
        table = part[part.index("<table class='cands'>"): part.index("</table>", part.index("<table class='cands'>"))]
        assert table.count("<tr") == len(got) + 1 and "select IoU" in table and "library" in table
        assert table.index(got[0].text.replace('"', "&quot;")) < table.index(got[-1].text.replace('"', "&quot;"))


@pytest.mark.parametrize("text, vocab, must, never", [
    # match(select=all) read "attends to the all token whose ..."
    ('match(q=token, k=token, pairs=[[1, 2], [3, 4]], select=all)', None, "every token whose token",
     ("the all", "[", "#")),
    # token ids: strings with a vocabulary, "token with id ..." without; never a Python list
    ("match(q=token, k=token, pairs=[[1, 9]])", VOCAB, "'the' → 'saw'", ("[", "closest token token")),
    ("key_in_set(ids=[0, 265])", None, "token with id 0 or 265", ("[", "#")),
    ("recent(ids=[3])", None, "the most recent token with id 3", ("#",)),
    ("gate(ids=[2, 3], first(), prev(1))", None, "when the query is a token with id 2 or 3,", ("[", "#")),
    ("gate(ids=[2, 3], first(), prev(1))", VOCAB, "when the query is 'cat' or 'sat',", ("[",)),
    ("mul(profile(w=[0.2, 1, 0.5], tail=0.05), key_weight(w=[[1, 4], [7, 0.2]], default=1))", VOCAB,
     "'the' ×4 and '.' ×0.2", ("[", "]")),
    ("mul(profile(w=[1, 0.8], tail=0.2), class_weight(q=[[1, 5]], k=[[8, 10]], w=[[30]], default=1))", None,
     "query token with id 1 or 5 with key token with id 8 or 10 ×30", ("[", "]")),
    ("match(q=pos, k=pos, pairs=[[\"NOUN\", \"DET\"]])", None, "noun → determiner", ("[",)),
    # nested mixtures: each term once, as its share of the row
    ("0.6*prev(1) + 0.4*(0.5*first() + 0.5*self())", None,
     "attends to the previous token (60%), to the first token (20%) and to itself (20%)", ("(50%)", "(40%)")),
    ("0.6*prev(1) + 0.4*gate(punct, 0.5*first() + 0.5*self(), prev(2))", None,
     "to the first token (20%) and to itself (20%); otherwise to the token 2 positions back (40%)", ("(50%)",)),
    ("0.5*sharpen(0.7*prev(1) + 0.3*first(), 2) + 0.5*self()", None, "sharpened to the power 2 (50%)",
     ("(70%)", "(35%)")),
    # a profile's first-token weight is named first, where a sink head's mass is (it was left out)
    ("profile(w=[0.0068, 0.004], tail=0.001, bos=0.95)", None, "weighing the first token 0.95, itself 0.0068",
     ("None",)),
    ("profile(w=[0.5, 0.3])", None, "weighing itself 0.5 and 1 back 0.3", ("first token", "None")),
])
def test_glosses_are_words(text, vocab, must, never):
    got = Program.parse(text, vocab=vocab).gloss(vocab) if vocab is not None else dsl.gloss(dsl.parse(text))
    assert must in got, got
    for bad in never:
        assert bad not in got, (bad, got)
