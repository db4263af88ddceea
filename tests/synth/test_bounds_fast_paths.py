"""The C-speed checks of fitted tables' weights and ids (headsurgeon/synth/dsl/bounds.py ``_plain_weights``,
``_plain_ids``) accept exactly what the per-item checks accept, with the same values, and pass everything else to
them, so an error still names the bad item."""
from __future__ import annotations

import math

import numpy as np
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
