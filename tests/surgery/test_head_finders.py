"""Head finders (headsurgeon/surgery/measure/head_finders.py): the detection patterns by their definitions, and scores that find heads
whose attention is known because programs set it (a hybrid), on any loaded model."""
from __future__ import annotations

import numpy as np
import pytest

import headsurgeon as hs
from headsurgeon.surgery.measure.head_finders import HEAD_KINDS, detection_pattern, probe_sequences

PLANTED = {"L0H1": ("previous", "prev(1)"), "L1H2": ("induction", "induction()"), "L2H3": ("first", "first()"),
           "L3H4": ("self", "self()")}


def test_detection_patterns_follow_their_definitions():
    ids = np.array([0, 5, 6, 7, 5, 6, 7])  # BOS, then "5 6 7" twice
    prev, first, own = (detection_pattern(ids, k) for k in ("previous", "first", "self"))
    assert prev[4].nonzero()[0].tolist() == [3] and first[4].nonzero()[0].tolist() == [0]
    assert own[4].nonzero()[0].tolist() == [4] and not prev[0].any()  # the first query is never scored
    dup, ind = detection_pattern(ids, "duplicate"), detection_pattern(ids, "induction")
    assert dup[4].nonzero()[0].tolist() == [1] and ind[4].nonzero()[0].tolist() == [2]  # 5 -> earlier 5 / its next
    assert ind[6].nonzero()[0].tolist() == [4] and not ind[3].any()  # 7 -> the 5 after the earlier 7; none yet
    with pytest.raises(Exception, match="kind must be one of"):
        detection_pattern(ids, "copying")


def test_the_probe_repeats_a_random_block_after_bos(stories):
    seqs = probe_sequences(stories, length=12, count=3, seed=1)
    assert len(seqs) == 3 and all(s.n == 25 and s.ids[0] == stories.bos_id for s in seqs)
    assert all(np.array_equal(s.ids[1:13], s.ids[13:]) and len(set(s.ids[1:13])) == 12 for s in seqs)
    assert not np.array_equal(seqs[0].ids, seqs[1].ids)
    with pytest.raises(Exception, match="exceeds the context"):
        probe_sequences(stories, length=stories.n_ctx // 2)


@pytest.mark.smoke
def test_the_finders_find_the_heads_programs_planted(stories, tmp_path):
    with hs.replace_heads(stories, {head: program for head, (_, program) in PLANTED.items()}) as hybrid:
        found = {kind: hs.head_scores(hybrid, kind) for kind in HEAD_KINDS}
    for head, (kind, _) in PLANTED.items():
        best, score = found[kind].top(1)[0]
        assert str(best) == head and score > 0.99, (kind, found[kind])
    assert found["duplicate"].scores.max() < 0.99  # no planted duplicate head: none scores as one
    table = found["induction"].table()
    assert table.splitlines()[0].startswith("induction scores of") and len(table.splitlines()) == stories.n_layers + 2
    fig = found["previous"].plot(tmp_path / "previous.png")
    assert (tmp_path / "previous.png").stat().st_size > 1000 and fig.axes
    base = hs.head_scores(stories, "previous")  # the base model's own heads, not the planted program
    assert base.scores.shape == (stories.n_layers, stories.n_heads) and base.scores[0, 1] < 0.99
    assert "HeadScores(previous on" in repr(base) and base.found(2.0) == []


def test_subsets_parse_and_refuse_before_loading():
    from headsurgeon.surgery.measure.head_subset import parse_heads, parse_layers

    assert parse_heads(["L17H3,L18H6", "L2H0", (17, 3)]) == [(17, 3), (18, 6), (2, 0)]
    assert parse_layers("16-18") == [16, 17, 18] and parse_layers("0, 3,5-6") == [0, 3, 5, 6]
    for bad in ("16-", "3-1", "x", ""):
        with pytest.raises(Exception, match="cannot read layers"):
            parse_layers(bad)


@pytest.mark.e2e
def test_explain_on_a_subset_explains_and_measures_only_those_heads(stories, tmp_path):
    from conftest import CORPUS, need

    previous = hs.head_scores(stories, "previous").top(2)
    result = hs.explain(stories, need(CORPUS), tmp_path / "top", max_len=16, max_sequences=24, top=2, by="previous",
                        searchers=("enumerative",), enumerative={"spacy": False}, sweep_steps=(0.0, 1.0),
                        progress=False)
    assert sorted(result.programs.keys()) == sorted(h for h, _ in previous)
    assert any(n.startswith("explained 2 of 40 heads") for n in result.notes)
    named = hs.explain(stories, need(CORPUS), tmp_path / "named", max_len=16, max_sequences=24, heads=["L0H1,L4H7"],
                       layers="2", searchers=("enumerative",), enumerative={"spacy": False}, sweep_steps=(0.0, 1.0),
                       progress=False)
    assert sorted(named.programs.keys()) == [(0, 1), *((2, h) for h in range(8)), (4, 7)]
    assert max(row["n_heads"] for row in named.sweep) == 10  # the sweep swaps the subset, not the model
    with pytest.raises(Exception, match="layer 7 does not exist"):
        hs.explain(stories, need(CORPUS), tmp_path / "bad", layers="7", progress=False)


@pytest.mark.e2e
def test_the_heads_command_lists_plots_and_prints_json(capsys, tmp_path):
    import json

    from conftest import STORIES, need
    from headsurgeon.cli import main

    model = [f"llama2c:{need(STORIES / 'stories260K.bin')}", "--tokenizer", str(STORIES / "tok512.model")]
    assert main(["heads", *model, "--kind", "previous", "first", "--top", "3", "--plot", str(tmp_path / "KIND.png")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in out] == ["previous", "first"] and out[0].count(", ") == 2
    assert (tmp_path / "previous.png").is_file() and (tmp_path / "first.png").is_file()
    assert main(["heads", *model, "--kind", "self", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["self"]
    assert len(got["scores"]) == 5 and len(got["scores"][0]) == 8 and len(got["top"]) == 5


@pytest.mark.e2e
def test_a_program_set_reads_as_a_table_of_explanations(stories, tmp_path):
    from conftest import CORPUS, need

    result = hs.explain(stories, need(CORPUS), tmp_path, max_len=16, max_sequences=24, heads=["L3H6"],
                        searchers=("enumerative",), enumerative={"spacy": False}, sweep_steps=(0.0, 1.0), progress=False)
    (row,) = result.programs.table(width=20)
    entry = result.programs.entries[(3, 6)]
    assert row["head"] == "L3H6" and row["replacement_iou"] == entry.iou("test") and row["source"] == entry.source
    if entry.explanation is not None:
        assert result.programs.explanation("L3H6") == entry.explanation.program and len(row["explanation"]) <= 20
    else:
        assert result.programs.explanation("L3H6") is None and row["explanation"] is None


def test_a_store_reads_a_pattern_by_head_name_and_long_programs_print_short(stories):
    from headsurgeon.synth.program import Program

    seqs = probe_sequences(stories, length=6, count=2)
    store = hs.capture(stories, seqs, progress=False)
    assert np.array_equal(store.pattern("L2H3", 1), store.pattern(1, 2, 3))
    assert np.array_equal(store.pattern((2, 3), 1), store.pattern(1, 2, 3))
    with pytest.raises(Exception, match="takes \\(index, layer, head\\) or \\(head, index\\)"):
        store.pattern(1, 2)
    long = Program.parse(" + ".join(f"0.1*prev({k})" for k in range(1, 11)))
    assert len(repr(long)) < 140 and f"({len(long.text)} characters)" in repr(long)
    assert repr(Program.parse("prev(1)")) == "Program(dsl: prev(1))"
