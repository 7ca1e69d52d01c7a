"""``llog.coordination.oxia_key_order`` sorts keys as Oxia does (segment by segment), checked
against the ``oxia`` package's own comparison."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
from oxia.internal.compare import compare_with_slash

from llog.coordination import oxia_key_order

KEYS = st.text(alphabet="ab/~\x00", max_size=8)


@settings(max_examples=500, deadline=None)
@given(st.lists(KEYS, max_size=12))
def test_sorts_as_the_oxia_package_compares(keys):
    assert sorted(keys, key=oxia_key_order) == sorted(keys, key=functools.cmp_to_key(compare_with_slash))


def test_a_last_segment_sorts_before_deeper_keys():
    keys = ["a/b/c", "a/z", "a/", "a", "b", "/a", "a/b"]
    assert sorted(keys, key=oxia_key_order) == ["a", "b", "/a", "a/", "a/b", "a/z", "a/b/c"]
