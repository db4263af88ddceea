"""The C-speed checks of fitted tables' weights and ids (headsurgeon/synth/dsl/bounds.py ``_plain_weights``,
``_plain_ids``, ``_plain_matrix``, ``_plain_classes``) accept exactly what the per-item checks accept, with the same values, and pass everything else to
them, so an error still names the bad item."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headsurgeon.synth.dsl import bounds
from headsurgeon.synth.errors import ProgramError

ITEMS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([True, False, None, "3", np.int64(4), np.float32(0.5), -0.0, bounds.MAX_WEIGHT,
                     bounds.MAX_VALUE, bounds.MAX_VALUE + 1, 1e300, 2**53 + 1]),
)


def per_item(check, values):
    try:
        return tuple(check(x) for x in values)
    except ProgramError:
        return None


@settings(max_examples=400, deadline=None)
@given(st.lists(ITEMS, max_size=12))
def test_plain_weights_agree_with_the_per_item_check(values):
    fast = bounds._plain_weights(values)
    slow = per_item(lambda x: bounds._as_weight(x, "w"), values)
    if fast is not None:  # taken only when every item passes, and to the same floats (signs of zero included)
        assert slow is not None and fast == slow
        assert [math.copysign(1, v) for v in fast] == [math.copysign(1, v) for v in slow]
        assert all(type(v) is float for v in fast)
    elif slow is not None:  # declined although valid: only for items that are not plain int/float
        assert any(type(v) not in (int, float) for v in values)


@settings(max_examples=400, deadline=None)
@given(st.lists(ITEMS, max_size=12))
def test_plain_ids_agree_with_the_per_item_check(values):
    fast = bounds._plain_ids(values)
    slow = per_item(lambda x: bounds._as_int(x, "id"), values)
    if fast is not None:
        assert slow == tuple(fast) and all(0 <= v <= bounds.MAX_VALUE for v in fast)
    elif slow is not None and values and min(slow) >= 0:
        assert any(type(v) is not int for v in values)


def test_one_bad_entry_in_a_long_table_sends_it_to_the_per_item_checks():
    good = [0.5] * 1000
    for bad in (float("nan"), float("inf"), -1.0, 2 * bounds.MAX_WEIGHT, True, np.float64(0.5)):
        assert bounds._plain_weights(good[:500] + [bad] + good[500:]) is None
    assert bounds._plain_ids(list(range(1000)) + [-3]) is None
    assert bounds._plain_ids(list(range(1000)) + [bounds.MAX_VALUE + 1]) is None
    assert bounds._plain_ids(list(range(1000))) == list(range(1000))


def per_row(rows):
    checked = [per_item(lambda x: bounds._as_weight(x, "w"), r) for r in rows]
    return None if any(r is None for r in checked) else tuple(checked)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4).flatmap(lambda width: st.lists(st.lists(ITEMS, min_size=width, max_size=width), min_size=1,
                                                       max_size=5)))
def test_plain_matrix_agrees_with_the_row_checks(rows):
    fast = bounds._plain_matrix(rows, len(rows[0]))
    slow = per_row(rows)
    if fast is not None:
        assert slow is not None and fast == slow and all(type(v) is float for r in fast for v in r)
        assert [math.copysign(1, v) for r in fast for v in r] == [math.copysign(1, v) for r in slow for v in r]
    elif slow is not None:
        assert any(type(v) not in (int, float) for r in rows for v in r)


def per_class(classes):
    seen: set[int] = set()
    try:
        return tuple(bounds._check_class_ids(c, "class", seen) for c in classes)
    except ProgramError:
        return None


CLASS_ITEMS = st.one_of(st.integers(-3, 40), st.sampled_from([True, 2.0, np.int64(5), bounds.MAX_VALUE + 1]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(CLASS_ITEMS, max_size=6), min_size=1, max_size=5))
def test_plain_classes_agree_with_the_class_checks(classes):
    fast = bounds._plain_classes(classes)
    slow = per_class(classes)
    if fast is not None:
        assert fast == slow
    elif slow is not None:  # declined although valid: an id given twice in one class, or not as a plain int
        flat = [v for c in classes for v in c]
        assert len(set(flat)) < len(flat) or any(type(v) is not int for v in flat)


def test_a_clash_or_a_bad_id_in_big_classes_is_named_by_the_class_checks():
    classes = [list(range(i * 100, i * 100 + 100)) for i in range(50)]
    assert bounds._check_idclasses(classes, "q") == tuple(tuple(c) for c in classes)
    with pytest.raises(ProgramError, match="lists token id 7 in two classes"):
        bounds._check_idclasses(classes + [[7]], "q")
    with pytest.raises(ProgramError, match="must hold token ids >= 0"):
        bounds._check_idclasses(classes + [[-1]], "q")
