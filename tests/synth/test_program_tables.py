"""programs.json's tables side file (headsurgeon/synth/programtables.py): big numeric lists leave the JSON as
references and come back exactly, ints as ints and floats as floats; what cannot be stored exactly stays inline. The
row-at-once paths of a table's size and JSON form (headsurgeon/synth/dsl/size.py, jsonform.py) agree with the
item-by-item rule."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headsurgeon.synth import programtables
from headsurgeon.synth.dsl.jsonform import _json_value
from headsurgeon.synth.dsl.size import _literals
from headsurgeon.synth.errors import ProgramError

LEAVES = st.one_of(st.integers(-(2 ** 60), 2 ** 60), st.floats(allow_nan=False, allow_infinity=True),
                    st.sampled_from([True, False, None, 2 ** 53, -(2 ** 53), 2 ** 53 - 1, -0.0, "x"]))
ROWS = st.integers(0, 20).flatmap(lambda width: st.lists(st.lists(LEAVES, min_size=width, max_size=width),
                                                         min_size=1, max_size=6))
VALUES = st.one_of(ROWS, st.lists(LEAVES, max_size=40), st.lists(ROWS, min_size=1, max_size=3))


def same(a, b) -> bool:
    """Equal with the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    return math.copysign(1, a) == math.copysign(1, b) and a == b if type(a) is float else a == b


def slow_storable(value) -> bool:
    """Whether ``value`` goes to the side file, by the rule: an even nest of lists of at least MIN_TABLE numbers,
    each a plain int under 2**53 in magnitude or a float (bools and None stay inline)."""
    def depths(v, d):
        if isinstance(v, list):
            found = {x for item in v for x in depths(item, d + 1)}
            return found if v else {None}
        ok = type(v) is float or (type(v) is int and abs(v) < 2 ** 53)
        return {d} if ok else {None}
    leaves = []

    def flat(v):
        if isinstance(v, list):
            for item in v:
                flat(item)
        else:
            leaves.append(v)
    flat(value)
    found = depths(value, 0)
    return len(found) == 1 and None not in found and len(leaves) >= programtables.MIN_TABLE


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_a_numeric_list_comes_back_exactly_and_only_exact_ones_leave_the_json(value):
    tables: dict = {}
    packed = programtables.pack(value, tables)
    stored = isinstance(packed, dict) and set(packed) == {programtables.REF}
    assert stored == slow_storable(value)
    assert same(programtables.unpack(json.loads(json.dumps(packed)), tables), value)


PARAMETERS = st.recursive(st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=2), st.booleans(),
                                   st.none()), lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner),
                          max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(PARAMETERS)
def test_a_parameters_json_form_turns_every_tuple_into_a_list_and_keeps_every_scalar(value):
    def slow(v):
        return [slow(x) for x in v] if isinstance(v, tuple) else v
    assert same(_json_value(value), slow(value))


@settings(max_examples=300, deadline=None)
@given(PARAMETERS)
def test_size_counts_each_scalar_once_and_none_not_at_all(value):
    def slow(v):
        if isinstance(v, (list, tuple)):
            return sum(slow(x) for x in v)
        return 0 if v is None else 1
    assert _literals(value) == slow(value)


def test_a_side_file_whose_flags_do_not_match_its_values_is_refused():
    arrays = programtables._table([[0.5] * 8, [1, 2, 3, 4, 5, 6, 7, 8]])
    assert arrays is not None
    bad = {f"k.{name}": arr for name, arr in arrays.items()}
    bad["k.ints"] = bad["k.ints"][:-1]
    with pytest.raises(ProgramError, match="malformed"):
        programtables.unpack({programtables.REF: "k"}, bad)
    bad = {f"k.{name}": arr for name, arr in arrays.items()}
    bad["k.lens1"] = np.asarray([17, -1], dtype=np.int64)
    with pytest.raises(ProgramError, match="malformed"):
        programtables.unpack({programtables.REF: "k"}, bad)
