"""Selection across sources: best IoU on `select` wins, reported on `test`; ProgramSet round trip."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.patterns.store import AttentionStore
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.select import select_programs
from headsurgeon.synth.splits import StoreSplits

TRUTH = {(0, 0): "prev(1)", (0, 1): "0.7*prev(1) + 0.3*first()", (1, 0): "same_token_recent()", (1, 1): "first()"}


@pytest.fixture(scope="module")
def synthetic_store(stories, documents):
    seqs = make_sequences(stories, documents[:30], max_len=32)[:24]
    store = AttentionStore(seqs, 2, 2)
    progs = {h: Program.parse(t) for h, t in TRUTH.items()}
    for i, s in enumerate(seqs):
        pats = np.stack([np.stack([progs[(l, h)].evaluate([s])[0] for h in range(2)]) for l in range(2)])
        store.put(i, pats)
    return store


def test_select_picks_the_true_program_and_reports_on_test(synthetic_store):
    cands = {h: [ScoredProgram(Program.parse(t), "enumerative") for t in ("prev(2)", "uniform()", "prev(1)")]
             for h in TRUTH}
    cands[(0, 1)].append(ScoredProgram(Program.parse(TRUTH[(0, 1)]), "llm", hypothesis="mostly previous token"))
    cands[(1, 0)].append(ScoredProgram(Program.parse(TRUTH[(1, 0)]), "learned"))
    ps = select_programs(synthetic_store, cands, StoreSplits(range(8), range(8, 16), range(16, 24)),
                         progress=False)
    assert {h: e.program for h, e in ps.entries.items()} == {h: Program.parse(t) for h, t in TRUTH.items()}
    assert ps.entries[(0, 1)].source == "llm" and ps.entries[(0, 1)].hypothesis == "mostly previous token"
    assert ps.entries[(1, 1)].source == "baseline"  # first() came from the baselines
    for e in ps.entries.values():
        assert e.scores["select"]["iou"] > 0.999 and e.scores["test"]["iou"] > 0.999 and e.scores["test"]["jsd"] < 1e-3
    assert ps.summary()["mean_iou"] > 0.999


def test_select_and_test_must_be_disjoint(synthetic_store):
    with pytest.raises(ValueError, match="disjoint"):
        select_programs(synthetic_store, {}, StoreSplits((), [1, 2], [2, 3]), progress=False)


def test_programset_json_round_trip(tmp_path, synthetic_store):
    ps = select_programs(synthetic_store, {}, StoreSplits((), range(8, 16), range(16, 24)),
                         library=["0.7*prev(1) + 0.3*first()"], progress=False, model="synthetic")
    path = ps.save(tmp_path / "programs.json")
    again = ProgramSet.load(path)
    assert again.model == "synthetic" and again.keys() == ps.keys()
    for h in ps:
        assert again[h] == ps[h] and again.entries[h].scores == ps.entries[h].scores
    assert again.ranked("test")[0] in ps.keys()
    path.write_text(path.read_text().replace('"version": 1', '"version": 99'))
    with pytest.raises(Exception, match="version 99; upgrade headsurgeon"):
        ProgramSet.load(path)



def test_each_program_is_scored_only_against_the_heads_that_consider_it(synthetic_store, monkeypatch):
    """Selection's metric work grows with the (head, program) pairs in the pools, not with heads x programs."""
    import headsurgeon.synth.select as select

    cands = {h: [ScoredProgram(Program.parse(f"prev({k})"), "enumerative") for k in (2, 3)] for h in TRUTH}
    cands[(0, 1)].append(ScoredProgram(Program.parse(TRUTH[(0, 1)]), "llm"))
    cands[(1, 0)].append(ScoredProgram(Program.parse("prev(5)"), "llm"))
    cands[(1, 1)].append(ScoredProgram(Program.parse("prev(5)"), "llm"))
    select_idx = list(range(8, 16))
    scored: list[tuple[list, list]] = []
    real = select.score_programs

    def recording(store, heads, programs, indices, cache=None, chunk=64):
        if indices == select_idx:  # no program here has digits to round, so these are the pass over the pools
            scored.append((list(heads), [p.hash for p in programs]))
        return real(store, heads, programs, indices, cache, chunk)

    monkeypatch.setattr(select, "score_programs", recording)
    ps = select_programs(synthetic_store, cands, StoreSplits((), select_idx, range(16, 24)), progress=False)
    base = {Program.parse(t).hash for t in select.BASELINES}
    needed = {(h, p) for h, cs in cands.items() for p in {c.program.hash for c in cs} | base}
    got = [(h, p) for heads, progs in scored for h in heads for p in progs]
    assert set(got) == needed and len(got) == len(needed)  # every pair once, no other pair
    assert ps.entries[(0, 1)].program == Program.parse(TRUTH[(0, 1)])
    for h, e in ps.entries.items():  # the same score as scoring the winner alone against its head
        alone = real(synthetic_store, [h], [e.program], select_idx)
        assert e.scores["select"]["iou"] == float(alone["iou"][0, 0])
