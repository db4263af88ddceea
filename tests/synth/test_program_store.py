"""headsurgeon/synth/program_store.py: a store of known programs answers like the programs evaluated on the windows asked for."""
from __future__ import annotations

import numpy as np
import pytest

from headsurgeon.core import InputError
from headsurgeon.synth.program import Program
from headsurgeon.synth.program_store import ProgramStore
from headsurgeon.synth.sequence import Sequence


def windows(count: int = 5) -> list[Sequence]:
    rng = np.random.default_rng(3)
    out = []
    for n in rng.integers(4, 12, count):
        ids = np.concatenate([[0], rng.integers(1, 9, int(n))])
        out.append(Sequence(ids=ids, tokens=[f"t{i}" for i in ids], text="", offsets=np.zeros((len(ids), 2), int),
                            has_bos=True))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_batch_and_pattern_equal_the_programs_evaluated_on_the_windows_asked_for(causal):
    seqs = windows()
    truth = {(0, 1): "0.6*prev(1) + 0.4*first()", (2, 0): "fallback(same_token_recent(), first())"}
    store = ProgramStore(seqs, truth, causal=causal)
    assert store.heads == [(0, 1), (2, 0)] and store.causal is causal
    pats, lengths = store.batch([3, 1], [(2, 0)])
    direct = Program.parse(truth[(2, 0)]).evaluate([seqs[3], seqs[1]], causal=causal)
    assert np.array_equal(pats[0], direct) and lengths.tolist() == [seqs[3].n, seqs[1].n]
    assert np.array_equal(store.pattern(1, 0, 1), Program.parse(truth[(0, 1)]).evaluate([seqs[1]], causal=causal)[0])
    assert store.batch()[0].shape[:2] == (2, len(seqs))


def test_an_unknown_head_and_no_windows_are_clear_errors():
    with pytest.raises(InputError, match=r"head L1H1 is not in this ProgramStore; it holds L0H0$"):
        ProgramStore(windows(), {(0, 0): "prev(1)"}).batch([0], [(1, 1)])
    with pytest.raises(InputError, match="at least one window"):
        ProgramStore([], {(0, 0): "prev(1)"})
