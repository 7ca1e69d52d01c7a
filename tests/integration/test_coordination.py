"""Oxia access through llog's own wire messages: batched gets and puts, conditions, ceilings."""

from __future__ import annotations

import oxia
import pytest

from llog.coordination import Coordination
from llog.errors import VersionConflict


@pytest.fixture
def coordination(config):
    with Coordination(config) as c:
        yield c


def test_get_many_mixes_exact_and_ceiling_gets_in_one_rpc(config, coordination):
    pk, root = "pk", f"/{config.root_prefix}"
    coordination.put_many([(f"{root}/a/control", b"c", pk, None), (f"{root}/a/index/005", b"i5", pk, None),
                           (f"{root}/b/index/001", b"b1", pk, None)])
    rpcs = coordination.stats["read_rpc"]
    found = coordination.get_many(
        [(f"{root}/a/control", pk), (f"{root}/a/index/003", pk), (f"{root}/a/index/006", pk), (f"{root}/zz", pk)],
        ceiling_within=[None, f"{root}/a/index/", f"{root}/a/index/", None],
    )
    assert coordination.stats["read_rpc"] == rpcs + 1
    assert [f and (f.key, f.value) for f in found] == [
        (f"{root}/a/control", b"c"), (f"{root}/a/index/005", b"i5"),
        None,  # the next key, b/index/001, lies outside a/index/
        None,
    ]
    with pytest.raises(ValueError, match="2 ceiling prefixes for 1 requests"):
        coordination.get_many([(f"{root}/a/control", pk)], ceiling_within=[None, None])


def test_put_many_reports_each_condition_on_its_own(config, coordination):
    pk, key = "pk", f"/{config.root_prefix}/k"
    (version,) = coordination.put_many([(key, b"v1", pk, oxia.EXPECTED_RECORD_DOES_NOT_EXIST)])
    results = coordination.put_many([(key, b"v2", pk, version + 1000), (key + "2", b"x", pk, None)])
    assert isinstance(results[0], VersionConflict) and not results[0].outcome_unknown
    assert isinstance(results[1], int)
    assert coordination.get(key, pk).value == b"v1"
    assert coordination.put(key, b"v3", pk, expected_version=version) > version
    assert coordination.get(key, pk).value == b"v3"
