"""No misreported outcome (issue 29, item 5), on real Oxia and S3: a write that landed is never
reported failed, and a reservation whose outcome is unknown is never reported as "nothing
written" (``StaleBlob``, a plain failure) nor as success until it is resolved.

Replies are lost at ``coordination.after_write`` (after the server applied a Write, before its
results are read: :data:`llog.failpoints.POINTS`); a request that must arrive late is held back
by a wrapper of ``Coordination._send_puts`` that sends it later, to the same server.
"""

from __future__ import annotations

import grpc
import pytest

from llog.clock import ShiftedClock
from llog.control import read_control
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.errors import AppendOutcomeUnknown, CoordinationError, StaleBlob, WriteOutcomeUnknown
from llog.reader import LogReader
from llog.writer import LogWriter
from tests.integration.test_coordination import four_shard_oxia  # noqa: F401 - a fixture

T = "outcomes"


class _LostReply(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def __str__(self):
        return "injected: the reply of a write was lost"


def _lose_replies(hooks, after: int = 0) -> list[int]:
    """From the ``after + 1``-th Write on, every reply is lost (the writes land). Returns the
    count of Writes seen, for the test to look at."""
    seen = [0]

    def lose():
        seen[0] += 1
        if seen[0] > after:
            raise _LostReply()

    hooks["coordination.after_write"] = lose
    return seen


def _on_two_shards(coordination: Coordination, root: str) -> tuple[str, str]:
    keys = [f"/{root}/k{n}" for n in range(64)]
    first = keys[0]
    second = next(k for k in keys if coordination._shard(k, k) != coordination._shard(first, first))
    return first, second


def _log(config, partition: int = 0) -> list[bytes]:
    with LogReader(config) as reader:
        return [r.value for r in reader.read_range(T, partition, 1)]


def _records(tag: str, n: int = 3) -> list[bytes]:
    return [f"{tag}/{i}".encode() for i in range(n)]


# --- put_many: each key its own outcome -------------------------------------------------------------


def test_put_many_reports_a_landed_shard_when_a_later_shard_fails_for_good(four_shard_oxia, hooks):  # noqa: F811
    with Coordination(four_shard_oxia) as coordination:
        coordination._deadline_s = 1.0  # the lost replies are retried for a second, then given up
        a, b = _on_two_shards(coordination, four_shard_oxia.root_prefix)
        _lose_replies(hooks, after=1)  # a's Write is answered; b's lands and every reply of it is lost
        with pytest.raises(CoordinationError) as failed:
            coordination.put_many([(a, b"a", a, EXPECTED_ABSENT), (b, b"b", b, EXPECTED_ABSENT)])
        hooks.clear()
        landed, unknown = failed.value.outcomes
        assert landed == coordination.get(a, a).version_id  # reported landed, with its version
        assert isinstance(unknown, WriteOutcomeUnknown) and unknown.key == b
        assert coordination.get(b, b).value == b"b"  # it did land: "unknown" was right, "failed" would not be


def test_put_many_reports_a_landed_shard_when_the_guard_refuses_a_later_one(four_shard_oxia):  # noqa: F811
    with Coordination(four_shard_oxia) as coordination:
        a, b = _on_two_shards(coordination, four_shard_oxia.root_prefix)
        calls = []

        def guard():
            calls.append(1)
            if len(calls) == 2:
                raise StaleBlob("injected: too old by now")

        with pytest.raises(StaleBlob) as refused:
            coordination.put_many([(a, b"a", a, EXPECTED_ABSENT), (b, b"b", b, EXPECTED_ABSENT)], guard=guard)
        assert refused.value.outcomes == [coordination.get(a, a).version_id, None]  # b was never sent
        assert coordination.get(b, b) is None


# --- the writer: a reservation in doubt is resolved before it is reported -----------------------------


def test_a_landed_reservation_whose_retry_trips_the_age_check_completes(config, hooks):
    clock = ShiftedClock()
    with LogWriter(config, auto_initialize=True, clock=clock) as w:
        w.append(T, 0, _records("before"))

        def lose_the_reservations_reply():
            del hooks["writer.before_reserve_cas"]

            def lost():
                del hooks["coordination.after_write"]
                clock.advance(config.gc_grace_ms / 1000)  # the retry's age check now fails
                raise _LostReply()

            hooks["coordination.after_write"] = lost

        hooks["writer.before_reserve_cas"] = lose_the_reservations_reply
        result = w.append(T, 0, _records("landed"))  # not StaleBlob: the reservation had landed
        assert (result.start_offset, result.end_offset) == (4, 6)
        assert read_control(w.coordination, w.keys(T, 0)).record.pending is None
    assert _log(config) == _records("before") + _records("landed")


def test_a_landed_reservation_someone_else_finished_is_reported_landed(config, hooks):
    clock = ShiftedClock()
    with LogWriter(config, auto_initialize=True, clock=clock) as w, LogWriter(config, auto_initialize=True) as other:
        w.append(T, 0, _records("before"))

        def lose_the_reservations_reply():
            del hooks["writer.before_reserve_cas"]

            def lost():
                del hooks["coordination.after_write"]
                other.append(T, 0, _records("other"))  # finishes w's pending, then appends its own
                clock.advance(config.gc_grace_ms / 1000)
                raise _LostReply()

            hooks["coordination.after_write"] = lost

        hooks["writer.before_reserve_cas"] = lose_the_reservations_reply
        result = w.append(T, 0, _records("landed"))
        assert (result.start_offset, result.end_offset) == (4, 6)
    assert _log(config) == _records("before") + _records("landed") + _records("other")


class _HeldBack:
    """Wraps ``Coordination._send_puts``: the first Write to ``key`` does not reach the server
    (every send of it fails in transit) until :meth:`deliver` sends it, late."""

    def __init__(self, coordination: Coordination, key: str):
        self.coordination, self.key = coordination, key
        self.send = coordination._send_puts
        self.held: tuple[int, list] | None = None
        coordination._send_puts = self

    def __call__(self, shard: int, requests: list) -> list:
        if self.held is None and any(r.key == self.key for r in requests):
            self.held = (shard, requests)
        if self.held is not None and requests is self.held[1]:
            raise _LostReply()
        return self.send(shard, requests)

    def deliver(self) -> None:
        shard, requests = self.held
        self.send(shard, requests)
        self.held = (shard, [])  # its later sends go through


def test_a_reservation_stays_in_doubt_after_a_later_rounds_clean_conflict(config, hooks):
    """Round 1's CAS gets no answer (held back); round 2 finds the control unchanged and sends
    its CAS on the same version, but round 1's arrives first and lands, and another writer
    finishes it: round 2's conflict is clean. That does not make round 1's attempt not have
    landed: round 3 looks for it, finds it, and reports its offsets (not a second copy)."""
    with LogWriter(config, auto_initialize=True) as w, LogWriter(config, auto_initialize=True) as other:
        w.append(T, 0, _records("before"))
        w.coordination._deadline_s = 1.0
        held = _HeldBack(w.coordination, w.keys(T, 0).control)
        rounds = []

        def round_starts():
            rounds.append(1)
            if len(rounds) == 2:
                held.deliver()  # round 1's CAS arrives late, and lands
                other.append(T, 0, _records("other"))  # finishes it, then appends its own

        hooks["writer.before_reserve_cas"] = round_starts
        result = w.append(T, 0, _records("late"))
        hooks.clear()
        assert held.held[1] == []  # delivered (the other writer's append counted a round of its own)
        assert (result.start_offset, result.end_offset) == (4, 6)
    assert _log(config) == _records("before") + _records("late") + _records("other")


def test_a_reservation_in_doubt_whose_next_cas_trips_the_age_check_is_unknown_not_stale(config, hooks):
    """Round 1's CAS gets no answer and may still land; round 2's age check refuses its CAS.
    ``StaleBlob`` ("nothing references it") would be false: the held request can still land,
    and here it does."""
    clock = ShiftedClock()
    with LogWriter(config, auto_initialize=True, clock=clock) as w:
        w.append(T, 0, _records("before"))
        w.coordination._deadline_s = 1.0
        held = _HeldBack(w.coordination, w.keys(T, 0).control)
        rounds = []

        def round_starts():
            rounds.append(1)
            if len(rounds) == 2:
                clock.advance(config.gc_grace_ms / 1000)

        hooks["writer.before_reserve_cas"] = round_starts
        with pytest.raises(AppendOutcomeUnknown):
            w.append(T, 0, _records("late"))
        hooks.clear()
        held.deliver()  # it lands after all: the append is in the log, as "unknown" allowed
        control = read_control(w.coordination, w.keys(T, 0)).record
        assert (control.pending.start_offset, control.pending.end_offset) == (4, 6)
    assert _log(config) == _records("before") + _records("late")
