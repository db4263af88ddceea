"""A program backend plugs in through the registry alone, as docs/architecture.md's recipe says.

The toy kind ``window_sum`` holds one integer w: each query attends uniformly to its last w keys. It is
registered at test time and then travels through Program, programs.json and a hybrid checkpoint
without any library edit.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headsurgeon.hub.checkpoint import UntrustedProgramError, load_hybrid, save_hybrid
from headsurgeon.kernels.normalize import normalize_scores
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.backends import ProgramBackend, backend_kinds, register_backend, unregister_backend
from headsurgeon.synth.errors import ProgramExecutionError, ProgramValidationError
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.trust import UntrustedProgramError, require_trusted
from headsurgeon.synth.splits import StoreSplits


class WindowSum(ProgramBackend):
    """Attend uniformly to the last w keys (the query included)."""

    kind, label, suffix, needs_trust = "window_sum", "window-sum", ".ws.json", False

    def from_json(self, obj):
        obj = json.loads(obj) if isinstance(obj, str) else obj
        if not (isinstance(obj, dict) and isinstance(obj.get("window_sum"), int) and 1 <= obj["window_sum"] <= 64):
            raise ProgramValidationError("a window_sum program is {'window_sum': w} with 1 <= w <= 64")
        return obj["window_sum"]

    def claims(self, obj):
        return isinstance(obj, dict) and set(obj) == {"window_sum"}

    def to_json(self, payload):
        return {"window_sum": payload}

    def text(self, payload):
        return f"window_sum({payload})"

    def size(self, payload):
        return 2

    def canonical(self, payload):
        return f"window_sum:{payload}"

    def to_file(self, payload):
        return json.dumps(self.to_json(payload)).encode()

    def from_file(self, data):
        return self.from_json(data.decode() if isinstance(data, bytes) else data)

    def evaluate_scores(self, payload, sequences, causal, features, timeout, pos_tags, out):
        width = max(s.n for s in sequences)
        scores = np.zeros((len(sequences), width, width), np.float32)
        for b, s in enumerate(sequences):
            for i in range(s.n):
                scores[b, i, max(0, i - payload + 1): i + 1] = 1.0
        return scores

    def evaluate(self, payload, sequences, causal, features, timeout, pos_tags, out):
        lengths = np.array([s.n for s in sequences])
        return normalize_scores(self.evaluate_scores(payload, sequences, causal, features, timeout, pos_tags, out),
                                lengths, causal)

    def needs_text(self, payload):
        return False


@pytest.fixture()
def window_sum():
    backend = register_backend(WindowSum())
    yield backend
    unregister_backend("window_sum")
    assert "window_sum" not in backend_kinds()


def test_program_and_program_set_round_trip(window_sum, tmp_path):
    program = Program.of("window_sum", 3)
    assert (program.kind, program.suffix, program.needs_trust) == ("window_sum", ".ws.json", False)
    assert Program.from_json(program.to_json()) == program  # an untyped record finds its backend by claims()
    ps = ProgramSet()
    ps.add((0, 1), program, source="hand")
    again = ProgramSet.load(ps.save(tmp_path / "programs.json"))
    assert again[(0, 1)] == program
    with pytest.raises(ProgramValidationError, match="1 <= w <= 64"):
        Program.from_json({"window_sum": 1000}, kind="window_sum")


def test_checkpoint_round_trip_of_a_new_kind(window_sum, tmp_path):
    from headsurgeon.surgery.models.loading import load_model

    handle = load_model("tiny-stories")
    ids = torch.tensor([handle.tokenizer.encode("Once upon a time there was a cat.")])
    hybrid = replace_heads(handle, {(0, 0): Program.of("window_sum", 2)})
    try:
        want = hybrid(ids)
        path = save_hybrid(hybrid, tmp_path / "ck")
    finally:
        hybrid.restore()
    assert (path / "programs").is_dir() and any(p.name.endswith(".ws.json") for p in (path / "programs").iterdir())
    loaded = load_hybrid(path)  # needs_trust=False: no trust asked
    try:
        assert torch.equal(loaded(ids), want)
        assert loaded.replaced[(0, 0)] == Program.of("window_sum", 2)
    finally:
        loaded.restore()
    manifest = json.loads((path / "manifest.json").read_text())
    assert "text" not in manifest["heads"]["L0H0"]  # readable_text False: its file is what a reader opens
    WindowSum.needs_trust = True
    try:
        with pytest.raises(UntrustedProgramError):
            load_hybrid(path)
        with pytest.raises(UntrustedProgramError, match="holds window-sum code"):  # the backend's label
            require_trusted([("L0H0", "replacement", Program.of("window_sum", 2))], False, origin="programs.json")
    finally:
        WindowSum.needs_trust = False


def test_programs_answer_for_their_backend():
    """What callers ask a program (headsurgeon/synth/tensors.py, select, the searchers) comes from its backend, not its kind."""
    dsl_sparse, dsl_dense = Program.parse("prev(1)"), Program.parse("decay(0.5)")
    python = Program.python("def f(seq):\n    return np.ones((seq.n, seq.n))\n")
    got = [(p.sandboxed, p.has_tree, p.sparse_rows, p.backend.readable_text) for p in (dsl_sparse, dsl_dense, python)]
    assert got == [(False, True, True, True), (False, True, False, True), (True, False, False, False)]
    assert dsl_sparse.labels([]) is None


def test_a_card_shows_the_text_of_kinds_whose_backend_says_it_is_readable(window_sum):
    from headsurgeon.hub.card import render_card

    item = {"layer": 0, "head": 0, "alpha": 1.0, "kind": "window_sum", "program": "programs/abc.ws.json",
            "text": "window_sum(3)", "hash": "ab" * 32}
    manifest = {"heads": {"L0H0": item}, "metrics": {}}
    assert "programs/abc.ws.json" in render_card(manifest, "ck") and "window_sum(3)" not in render_card(manifest, "ck")
    WindowSum.readable_text = True
    try:
        assert "window_sum(3)" in render_card(manifest, "ck")
    finally:
        WindowSum.readable_text = False


class FlakyWindowSum(WindowSum):
    """A kind evaluated in sandbox workers whose w=13 programs always fail there."""

    sandboxed = True

    def evaluate(self, payload, sequences, causal, features, timeout, pos_tags, out):
        if payload == 13:
            raise ProgramExecutionError("window_sum(13) crashed in its worker")
        return super().evaluate(payload, sequences, causal, features, timeout, pos_tags, out)


def test_a_failing_program_of_a_sandboxed_kind_drops_only_itself():
    """The library searcher scores each sandboxed program alone (headsurgeon/synth/search/library.py): a failure is a note."""
    from headsurgeon.synth.program_store import ProgramStore
    from support.searcher_store import SELECT, SYNTH, TRUTH, tiny_sequences

    from headsurgeon.synth.search.library import LibrarySearcher

    register_backend(FlakyWindowSum())
    try:
        programs = [Program.parse("prev(1)"), Program.of("window_sum", 13), Program.of("window_sum", 2)]
        searcher = LibrarySearcher(programs)
        found = searcher.search(ProgramStore(tiny_sequences(), TRUTH), StoreSplits(SYNTH, SELECT), progress=False)
    finally:
        unregister_backend("window_sum")
    assert {c.program.text for c in found[(0, 0)]} == {"prev(1)", "window_sum(2)"}
    assert any("window_sum(13)" in note and "dropped" in note for note in searcher.notes)
