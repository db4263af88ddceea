"""``StoreSplits`` (headsurgeon/synth/splits.py): the synth / select / test store indices as one value, made from a
mapping or a corpus ``Splits``, refusing what no stage could use."""
from __future__ import annotations

import pytest

from headsurgeon.core import InputError, NotFoundError
from headsurgeon.surgery.corpus import Splits
from headsurgeon.synth.splits import StoreSplits


def test_made_from_a_mapping_or_a_corpus_splits_and_read_by_name():
    s = StoreSplits.of({"synth": [0, 1], "select": range(2, 4), "test": (4,)})
    assert (s.synth, s.select, s.test) == ((0, 1), (2, 3), (4,)) and s["select"] == [2, 3]
    assert StoreSplits.of(s) is s and StoreSplits.of({"synth": [0], "select": [1]}).test == ()
    corpus = Splits(synth=["a", "b"], select=["c"], test=["d", "e"])  # only the lengths matter to indices
    assert StoreSplits.of(corpus) == corpus.indices == StoreSplits([0, 1], [2], [3, 4])
    assert corpus.indices.to_json() == {"synth": [0, 1], "select": [2], "test": [3, 4]}


def test_bad_splits_are_refused_by_name():
    with pytest.raises(InputError, match="whole numbers"):
        StoreSplits(["a"], [1])
    with pytest.raises(InputError, match="'synth' and 'select'"):
        StoreSplits.of([0, 1, 2])
    with pytest.raises(NotFoundError, match="unknown split"):
        StoreSplits([0], [1])["train"]  # type: ignore[index]
    with pytest.raises(InputError, match="non-empty"):
        StoreSplits([], [1]).checked("mine")
    with pytest.raises(InputError, match="mine: synth and select share sequences"):
        StoreSplits([0, 1], [1, 2]).checked("mine")
    assert StoreSplits([0, 1], [2]).checked("mine") == ([0, 1], [2])
