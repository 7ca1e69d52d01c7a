"""Oxia access through llog's own wire messages: batched gets and puts, conditions, ceilings."""

from __future__ import annotations

import subprocess
import sys
import time

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


def test_a_ceiling_over_every_shard_answers_as_the_oxia_client_does(four_shard_oxia):
    """With no partition key a ceiling asks every shard and takes the lowest answer in Oxia's
    hierarchical key order: the same answers as the ``oxia`` client's own cross-shard get. (The
    server is the session's: other tests' keys may be the answer to a probe, for both clients.)"""
    keys = ["/a", "/a/b", "/a/b/c", "/a/bb", "/a/c", "/b", "x", "x/1", "x/10", "x/2", "x/2/y", "y/a/b/c",
            *(f"t/topics/{name}/{n}" for name in ("orders", "clicks", "o") for n in range(6))]
    probes = ["", "/", "/a/", "/a/b/", "/a/ba", "w", "x/", "x/1\x00", "x/3", "y", "y/a/", "t/", "t/topics/o",
              "t/topics/o/", "t/topics/orders/5\x00", "z", *keys]
    reference = oxia.Client(four_shard_oxia.oxia_service_address)  # its get merges the shards' answers itself
    with reference, Coordination(four_shard_oxia) as coordination:
        assert len({coordination._shard(key, key) for key in keys}) > 1, "the keys should span shards"
        for key in keys:
            reference.put(key, key.encode())
        for key in keys:  # each is found on the shard the oxia client routed it to
            assert coordination.get(key, key).value == key.encode(), key
        for probe in probes:
            try:
                expected = reference.get(probe, comparison_type=oxia.ComparisonType.CEILING)[0]
            except oxia.ex.KeyNotFound:
                expected = None
            found = coordination.ceiling(probe, None, "")
            assert (found.key if found else None) == expected, probe
            assert found is None or found.key not in keys or found.value == found.key.encode()


def test_only_claims_import_the_oxia_package(config):
    """Everything but ephemeral records speaks ``wire`` on llog's own channels: importing the
    ``oxia`` package (betterproto2, pydantic) takes a tenth of a second at the start of every
    process that plans or reads (a stream's planner, a task). A claim needs its sessions."""
    code = f"""
import sys
from llog.config import Config
from llog.coordination import EXPECTED_ABSENT, Coordination
config = Config.load(env={config.to_options()!r})
root = "/" + config.root_prefix + "/imports"
with Coordination(config) as c:
    c.get(root + "/none", "pk")
    c.ceiling(root + "/", None, root + "/")
    c.put_many([(root + "/a", b"a", "pk", EXPECTED_ABSENT), (root + "/b", b"b", "pk", None)])
    assert [v.key for v in c.range_scan(root + "/", root + "/~", "pk")] == [root + "/a", root + "/b"]
    assert c.delete(root + "/a", "pk") and not c.delete(root + "/a", "pk")
    c.delete_range(root + "/", root + "/~", "pk")
    assert c.get_many([(root + "/b", "pk")]) == [None]
    print(sorted(m for m in ("oxia", "betterproto2", "pydantic") if m in sys.modules))
    c.release(root + "/claim", "pk", c.claim(root + "/claim", b"me", "pk"))
    print("oxia" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True"]


def test_a_claim_outlives_several_session_timeouts_of_the_shortest_session(config):
    """A claim lives as long as its holder's session, which heartbeats keep alive: with the
    shortest session allowed (2 s; the chaos run's), the claim is still there, at the version
    created, after three timeouts. The ``oxia`` package's default cadence (a 2 s floor) sent a
    2 s session one heartbeat every 1999 ms, and the claim vanished within a timeout or two."""
    config = config.replace(oxia_session_timeout_ms=2000)
    key = f"/{config.root_prefix}/short-session-claim"
    with Coordination(config) as holder, Coordination(config) as other:
        version = holder.claim(key, b"me", "pk")
        for _ in range(12):  # 6 s
            time.sleep(0.5)
            found = other.get(key, "pk")
            assert found is not None and found.version_id == version, "the claim expired with its session"
        holder.release(key, "pk", version)
