"""Ephemeral claims (docs/protocol.md section 6): exclusive, released by version, freed with the session."""

from __future__ import annotations

import pytest

from llog.coordination import Coordination
from llog.errors import ClaimHeld


def test_claim_is_exclusive_and_released_only_by_its_version(config):
    key, pk = f"{config.root_prefix}/t/partitions/0/meta/compactor-claim", "t:0"
    with Coordination(config) as a, Coordination(config) as b:
        version = a.claim(key, b'{"compactor_id": "a"}', pk)
        with pytest.raises(ClaimHeld, match='held by {"compactor_id": "a"}'):
            b.claim(key, b'{"compactor_id": "b"}', pk)
        assert b.release(key, pk, version + 1000) is False  # not the version a created: untouched
        assert b.get(key, pk) is not None
        assert a.release(key, pk, version) is True
        assert b.claim(key, b'{"compactor_id": "b"}', pk) > version


def test_claim_disappears_with_its_session(config):
    key, pk = f"{config.root_prefix}/t/partitions/1/meta/compactor-claim", "t:1"
    with Coordination(config) as b:
        holder = Coordination(config)
        holder.claim(key, b"holder", pk)
        holder.close()  # ends the session, as its expiry would after a crash
        assert b.get(key, pk) is None
        b.claim(key, b"next", pk)
