"""Unbounded program libraries (headsurgeon/synth/eaps.py, headsurgeon/synth/search/library.py, SECURITY.md "Program libraries").

A 2 MB ``--library`` file holds about 30,000 programs, each run in the sandbox once per run: the first
``max_programs`` (MAX_LIBRARY_PROGRAMS by default) accepted programs of a file are used and the rest reported,
and the library search stops at a time budget (total across heads) with
a note, letting the programs scored so far compete.
"""
from __future__ import annotations

import pytest

from headsurgeon.synth.eaps import (LIBRARY_BUDGET_S, MAX_LIBRARY_PROGRAMS, load_library, load_library_file,
                                    split_library_source)
from headsurgeon.core import InputError
from headsurgeon.synth.errors import ProgramValidationError
from headsurgeon.synth.search import library as library_search
from headsurgeon.synth.search.library import LibrarySearcher
from headsurgeon.synth.splits import StoreSplits

from conftest import CORPUS, need

PROG = "def prog_{i}(seq):\n    return np.tril(np.ones((seq.n, seq.n))) + {i}\n"


def library_source(n: int) -> str:
    return "import numpy as np\n" + "".join(PROG.format(i=i) for i in range(n))


def test_a_file_past_the_program_budget_keeps_the_first_programs_and_says_so(tmp_path):
    assert len(split_library_source(library_source(MAX_LIBRARY_PROGRAMS + 3))) == MAX_LIBRARY_PROGRAMS + 3
    path = tmp_path / "huge.py"
    path.write_text(library_source(MAX_LIBRARY_PROGRAMS + 3))
    notes: list[str] = []
    programs = load_library([path], notes=notes)
    assert [p.name for p in programs] == [f"prog_{i}" for i in range(MAX_LIBRARY_PROGRAMS)]  # the first ones
    text = notes[0]
    print(text)
    assert "huge.py" in text and f"{MAX_LIBRARY_PROGRAMS + 3} functions" in text
    assert f"{MAX_LIBRARY_PROGRAMS} programs accepted" in text
    assert f"3 past the budget of {MAX_LIBRARY_PROGRAMS} programs per file" in text
    assert "--library-max-programs" in text  # the fix
    assert len(load_library([path], max_programs=MAX_LIBRARY_PROGRAMS + 3)) == MAX_LIBRARY_PROGRAMS + 3
    assert [p.name for p in load_library([path], max_programs=2)] == ["prog_0", "prog_1"]
    with pytest.raises(InputError, match="whole number >= 1"):
        load_library([path], max_programs=0)


def test_budget_travels_from_the_files_to_the_searcher(tmp_path):
    path = tmp_path / "lib.py"
    path.write_text(library_source(2))
    assert LibrarySearcher(load_library([path])).budget == LIBRARY_BUDGET_S
    assert LibrarySearcher(load_library([path], budget=3.5)).budget == 3.5
    assert LibrarySearcher(["prev(1)"], budget=None).budget == LIBRARY_BUDGET_S  # plain programs: the default
    assert LibrarySearcher(load_library([path], budget=None)).budget is None  # None: no limit
    with pytest.raises(ValueError, match="budget"):
        load_library([path], budget=-1)


@pytest.fixture(scope="module")
def store(stories):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents

    docs = read_documents(need(CORPUS))[:20]
    return capture(stories, make_sequences(stories, docs, max_len=24, max_sequences=6), progress=False)


def test_a_spent_budget_stops_the_search_cleanly_with_a_note(store, tmp_path):
    path = tmp_path / "lib.py"
    path.write_text(library_source(3))
    searcher = LibrarySearcher(load_library([path], budget=0.0) + ["prev(1)"])
    out = searcher.search(store, StoreSplits([0, 1, 2], [3, 4]), heads=[(0, 0), (1, 1)], progress=False)
    assert out == {}
    assert "time budget of 0 s" in searcher.report() and "4 not tried" in searcher.report()


class _Countdown:
    """A StopCheck whose budget runs out after a fixed number of checks (no clock: the test is deterministic)."""

    checks = 0

    def __init__(self, budget=None, cancel=None):
        self.budget = budget

    def __call__(self) -> bool:
        if self.budget is None:
            return False
        _Countdown.checks += 1
        return _Countdown.checks > 6  # synth: the DSL group and 3 Python programs; select: the DSL group and one


def test_a_budget_running_out_midway_keeps_what_was_scored(store, tmp_path, monkeypatch):
    path = tmp_path / "lib.py"
    path.write_text(library_source(3))
    monkeypatch.setattr(library_search, "StopCheck", _Countdown)
    _Countdown.checks = 0
    searcher = LibrarySearcher(load_library([path], budget=10.0) + ["prev(1)", "first()"])
    out = searcher.search(store, StoreSplits([0, 1, 2], [3, 4]), heads=[(0, 0), (1, 1)], progress=False)
    assert set(out) == {(0, 0), (1, 1)}
    kept = {c.program.text if c.program.kind == "dsl" else c.program.text.split("def ")[1].split("(")[0]
            for c in out[(0, 0)]}
    assert kept == {"prev(1)", "first()", "prog_0"}
    assert all({"synth", "select"} <= set(c.scores) for cs in out.values() for c in cs)
    assert "3 of 5 programs scored, 2 not tried" in searcher.report()


def test_cli_help_states_the_cap_and_the_budget(capsys):
    from headsurgeon.cli import main

    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--library-max-programs N" in text and f"(default: {MAX_LIBRARY_PROGRAMS})" in text
    assert "--library-budget SECONDS" in text and "in total across heads" in text
