"""`deeper_than` against the depth of a JSON value counted the plain recursive way, on
values hypothesis draws (objects and arrays mixed, empty ones, scalars between them) and
at the limits either side of each value's own depth."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from sluice_common.depth import deeper_than

SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=3)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4)
    ),
    max_leaves=40,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@given(VALUES)
def test_deeper_than_is_the_depth_compared_with_the_limit(value: Any) -> None:
    depth = _depth(value)
    parsed = orjson.loads(orjson.dumps(value))  # as the edge and the worker get it
    got = {limit: deeper_than(parsed, limit) for limit in range(max(0, depth - 2), depth + 3)}
    assert got == {limit: depth > limit for limit in got}


def test_a_deep_spot_beside_wide_shallow_ones() -> None:
    wide = [{"a": [1, {"b": 2}]} for _ in range(1_000)]
    deep: Any = 1
    for _ in range(70):
        deep = {"x": deep}
    assert (deeper_than([*wide, deep], 70), deeper_than([*wide, deep], 71)) == (True, False)
    assert (deeper_than(wide, 3), deeper_than(wide, 4)) == (True, False)
