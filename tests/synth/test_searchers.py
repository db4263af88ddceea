"""The searcher interface: a third-party searcher plugs in through the registry and runs in explain's search stage
(and in explain itself) without editing the library; the built-ins keep the same conventions."""
from __future__ import annotations

import threading

import pytest

from conftest import CORPUS, need
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import Program
from headsurgeon.synth.program_store import ProgramStore
from headsurgeon.synth.search import (
    Searcher, SearcherUnavailable, SearchSettings, make_searcher, register_searcher, run_searchers, searchers,
    unregister_searcher,
)
from headsurgeon.synth.search.library import LibrarySearcher
from headsurgeon.synth.select import score_programs, select_programs
from headsurgeon.synth.splits import StoreSplits
from support.searcher_store import LLM_ENV, SELECT, SYNTH, TEST, TRUTH, tiny_sequences


class OffsetSearcher:
    """A third-party searcher: proposes prev(k) for k in 1..max_k, scored on synth and select like the built-ins."""

    name = "offsets"

    def __init__(self, max_k: int = 3) -> None:
        self.max_k = max_k
        self.runs = 0

    def search(self, store, splits, *, heads=None, progress=True, budget=None, cancel=None):
        self.runs += 1
        heads = list(store.heads if heads is None else heads)
        programs = [Program.parse(f"prev({k})") for k in range(1, self.max_k + 1)]
        got = {split: score_programs(store, heads, programs, splits[split]) for split in ("synth", "select")}
        return {h: [ScoredProgram(p, self.name, {s: {m: float(v[r, k]) for m, v in g.items()} for s, g in got.items()},
                                  f"attends {k + 1} back")
                    for k, p in enumerate(programs)]
                for r, h in enumerate(heads)}

    def report(self) -> str:
        return f"offsets: {self.runs} run(s)"


@pytest.fixture
def offsets():
    made: list[OffsetSearcher] = []

    def factory(settings: SearchSettings) -> OffsetSearcher:
        made.append(OffsetSearcher(**settings.option("offsets", {})))
        return made[-1]

    register_searcher("offsets", factory)
    yield made
    unregister_searcher("offsets")


@pytest.fixture(scope="module")
def store():
    return ProgramStore(tiny_sequences(), TRUTH)


def test_builtins_are_registered_and_satisfy_the_protocol(monkeypatch):
    assert {"enumerative", "learned", "llm", "library"} <= set(searchers())
    for name in ("enumerative", "learned", "library"):
        s = make_searcher(name, SearchSettings())
        assert isinstance(s, Searcher) and s.name == name
    for var in LLM_ENV:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SearcherUnavailable, match="LLM agent skipped"):
        make_searcher("llm", SearchSettings())


@pytest.mark.smoke
def test_a_registered_searcher_runs_beside_the_builtins_and_wins_selection(offsets, store, monkeypatch):
    for var in LLM_ENV:
        monkeypatch.delenv(var, raising=False)
    assert "offsets" in searchers()
    notes: list[str] = []
    timings: dict[str, float] = {}
    settings = SearchSettings(progress=False, options={"offsets": {"max_k": 2}, "library": ["first()", "self()"],
                                                       "llm": None})
    pool = run_searchers(store, ["offsets", "llm", "library"], StoreSplits(SYNTH, SELECT),
                         settings=settings, notes=notes, timings=timings)
    assert offsets[0].max_k == 2 and set(timings) == {"offsets", "library"}
    assert notes[0] == "offsets: 1 run(s)" and any(n.startswith("LLM agent skipped") for n in notes)
    assert set(pool) == set(TRUTH)
    for h, cands in pool.items():
        assert [c.source for c in cands] == ["offsets", "offsets", "library", "library"]
        assert all({"synth", "select"} <= set(c.scores) for c in cands)
    ps = select_programs(store, pool, StoreSplits(SYNTH, SELECT, TEST), baselines=False, progress=False)
    assert ps.entries[(0, 0)].source == "offsets" and ps[(0, 0)] == Program.parse("prev(1)")
    assert ps.entries[(0, 0)].hypothesis == "attends 1 back" and ps.entries[(0, 0)].scores["test"]["iou"] > 0.999
    assert ps.entries[(1, 0)].source == "library" and ps[(1, 0)] == Program.parse("self()")


def test_library_searcher_matches_select_programs_library(store):
    lib = ["prev(1)", "0.7*prev(1) + 0.3*first()", "prev(1)"]
    pool = LibrarySearcher(lib).search(store, StoreSplits(SYNTH, SELECT), progress=False)
    via_searcher = select_programs(store, pool, StoreSplits(SYNTH, SELECT, TEST), progress=False)
    via_select = select_programs(store, {}, StoreSplits(SYNTH, SELECT, TEST), library=lib, progress=False)
    assert via_searcher.keys() == via_select.keys()
    for h in via_select:
        a, b = via_searcher.entries[h], via_select.entries[h]
        assert (a.program, a.source, a.scores) == (b.program, b.source, b.scores)


def test_registry_rejects_duplicates_and_unknown_names(offsets, store):
    with pytest.raises(ValueError, match="already registered"):
        register_searcher("offsets", lambda settings: OffsetSearcher())
    register_searcher("offsets", lambda settings: OffsetSearcher(max_k=1), replace=True)
    assert [c.program.text for c in make_searcher("offsets").search(
        store, StoreSplits(SYNTH, SELECT))[(0, 0)]] == ["prev(1)"]
    with pytest.raises(ValueError, match="unknown searcher"):
        run_searchers(store, ["offsets", "no-such-searcher"], StoreSplits(SYNTH, SELECT))


def test_cancel_and_budget_stop_before_new_heads(store):
    cancel = threading.Event()
    cancel.set()
    assert LibrarySearcher(["prev(1)"]).search(store, StoreSplits(SYNTH, SELECT), cancel=cancel) == {}
    got = make_searcher("enumerative", SearchSettings(options={"enumerative": {"spacy": False}})).search(
        store, StoreSplits(SYNTH, SELECT), progress=False, budget=0.0)
    assert got == {}
    with pytest.raises(ValueError, match="share sequences"):
        LibrarySearcher(["prev(1)"]).search(store, StoreSplits([0, 1], [1, 2]))


@pytest.mark.e2e
def test_explain_runs_a_registered_searcher(offsets, stories, tmp_path):
    from headsurgeon.pipeline import explain

    result = explain(stories, need(CORPUS), tmp_path, max_len=16, max_sequences=24, searchers=("offsets",),
                     sweep_steps=(0.0, 1.0), progress=False)
    from headsurgeon.scaleout.chunks import balanced

    tasks = balanced([(layer, head) for layer in range(stories.n_layers) for head in range(stories.n_heads)], 1)
    assert len(offsets) == len(tasks) > 1, "each task builds its searchers (as a worker process or Ray task would)"
    assert "offsets: 1 run(s)" in result.notes and "offsets" in result.timings["search"]
    sources = {e.source for e in result.programs.entries.values()}
    assert sources <= {"offsets", "baseline"} and "offsets" in sources


class OldStyleOffsets(OffsetSearcher):
    """A searcher written before the splits travelled whole: separate synth_idx / select_idx keywords."""

    def search(self, store, *, synth_idx, select_idx, heads=None, progress=True, budget=None, cancel=None):
        return super().search(store, StoreSplits(synth_idx, select_idx), heads=heads)


def test_a_searcher_taking_separate_indices_still_runs_with_a_deprecation_warning(store):
    factories = {"old": lambda settings: OldStyleOffsets(max_k=2), "new": lambda settings: OffsetSearcher(max_k=2)}
    with pytest.warns(DeprecationWarning, match="take the splits whole"):
        old = run_searchers(store, ["old"], StoreSplits(SYNTH, SELECT), factories=factories)
    new = run_searchers(store, ["new"], {"synth": SYNTH, "select": SELECT, "test": TEST}, factories=factories)
    assert {h: [(c.program, c.scores) for c in cs] for h, cs in old.items()} == \
        {h: [(c.program, c.scores) for c in cs] for h, cs in new.items()}


def test_select_programs_takes_the_splits_whole_and_its_former_form_warns(store):
    whole = select_programs(store, {}, StoreSplits(SYNTH, SELECT, TEST), library=["prev(1)"], progress=False)
    with pytest.warns(DeprecationWarning, match="pass the splits whole"):
        former = select_programs(store, {}, SELECT, TEST, synth_idx=SYNTH, library=["prev(1)"], progress=False)
    with pytest.warns(DeprecationWarning):
        keywords = select_programs(store, {}, select_idx=SELECT, test_idx=TEST, synth_idx=SYNTH, library=["prev(1)"],
                                   progress=False)
    for other in (former, keywords):
        assert {h: (e.program, e.scores) for h, e in other.entries.items()} == \
            {h: (e.program, e.scores) for h, e in whole.entries.items()}
    assert whole.entries[(0, 0)].scores["synth"]  # the synth split is scored when it has windows
    with pytest.raises(ValueError, match="beside them"):
        select_programs(store, {}, StoreSplits(SYNTH, SELECT, TEST), test_idx=TEST)
    with pytest.raises(ValueError, match="needs the splits"):
        select_programs(store, {})
