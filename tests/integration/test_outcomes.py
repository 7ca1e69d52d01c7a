"""No misreported outcome (issue 29, item 5), on real Oxia and S3: a write that landed is never
reported failed, and a reservation whose outcome is unknown is never reported as "nothing
written" (``StaleBlob``, a plain failure) nor as success until it is resolved.

Replies are lost at ``coordination.after_write`` (after the server applied a Write, before its
results are read: :data:`llog.failpoints.POINTS`); a request that must arrive late is held back
by a wrapper of ``Coordination._send_puts`` that sends it later, to the same server.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from llog.clock import ShiftedClock
from llog.control import read_control
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.deployment import pass_gate
from llog.errors import AppendFailed, AppendOutcomeUnknown, CoordinationError, LlogError, StaleBlob, WriteOutcomeUnknown
from llog.objects import ObjectStore
from llog.reader import LogReader
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter

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
    """Two keys on different shards, for a client that has passed the deployment gate (whose own
    write, ``R/deployment``, would otherwise be the first Write a test counts)."""
    pass_gate(coordination.config, coordination, make_objects=ObjectStore)
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


def test_put_many_reports_a_landed_shard_when_a_later_shard_fails_for_good(four_shard_oxia, hooks):
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


def test_put_many_reports_a_landed_shard_when_the_guard_refuses_a_later_one(four_shard_oxia):
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



# --- every answer is one of three: done, not done, in doubt (docs/protocol.md section 4.6) ----------


DONE, NOT_DONE, IN_DOUBT = "done", "not done", "in doubt"

#: Where an append fails (a failpoint where Oxia fails once, or how the reserving CAS's request or
#: reply is lost), and the answer section 4.6 prescribes: for one partition, and for two partitions
#: on two Oxia shards (their reserving CASes go in one request per shard, the first partition's first).
FAILURES = [
    ("writer.after_blob_put", NOT_DONE, (NOT_DONE, NOT_DONE)),
    ("writer.before_reserve_cas", NOT_DONE, (NOT_DONE, NOT_DONE)),
    # The first shard's request never arrives: that partition is in doubt until the next round
    # finds the control unchanged and its CAS lands; the second shard's request is not sent.
    ("reserve: request lost", DONE, (DONE, NOT_DONE)),
    ("reserve: reply lost", DONE, (DONE, DONE)),  # landed; the next round's read shows it
    ("reserve: reply lost, Oxia unreadable", IN_DOUBT, (IN_DOUBT, DONE)),
    ("writer.after_reserve", DONE, (DONE, DONE)),
    ("control.before_materialize", DONE, (DONE, DONE)),
    ("writer.after_index_put", DONE, (DONE, DONE)),
    ("control.before_clear", DONE, (DONE, DONE)),
    ("writer.after_clear", DONE, (DONE, DONE)),
    ("control.before_tripwire", DONE, (DONE, DONE)),
]
_IDS = [f for f, _, _ in FAILURES]


def _unreadable(*args, **kwargs):
    raise CoordinationError("injected: Oxia cannot be read")


def _plant(failure: str, hooks, w: LogWriter, first: int, fired: list[str]) -> Callable[[], None]:
    """Make the next append of ``w`` fail at ``failure`` (``first``: the partition whose request
    is lost); returns what records, after the append, that it did (in ``fired``)."""
    if failure == "reserve: request lost":
        w.coordination._deadline_s = 1.0
        held = _HeldBack(w.coordination, w.keys(T, first).control)  # never delivered
        return lambda: fired.extend([failure] if held.held is not None else [])
    if failure.startswith("reserve: reply lost"):
        def arm():
            del hooks["writer.before_reserve_cas"]

            def lost():
                del hooks["coordination.after_write"]
                fired.append(failure)
                if failure.endswith("unreadable"):  # no later round can look for the reservation
                    w.coordination.get_many = _unreadable
                raise _LostReply()

            hooks["coordination.after_write"] = lost

        hooks["writer.before_reserve_cas"] = arm
        return lambda: None

    def fail():  # Oxia fails there, once
        del hooks[failure]
        fired.append(failure)
        raise CoordinationError(f"injected: Oxia failed at {failure}")

    hooks[failure] = fail
    return lambda: None


def _answers(answer: list | LlogError, partitions: list[int]) -> dict[int, str]:
    """Each partition's answer: done (checked: offsets 4..6), not done or in doubt."""
    if isinstance(answer, list):
        results, errors = answer, {}
    elif isinstance(answer, AppendFailed):
        results, errors = answer.results, {p: e for (_, p), e in answer.errors.items()}
    else:
        results, errors = [], {p: answer for p in partitions}
    out = {}
    for r in results:
        assert (r.start_offset, r.end_offset) == (4, 6), r
        out[r.partition] = DONE
    for p, e in errors.items():
        out[p] = IN_DOUBT if isinstance(e, AppendOutcomeUnknown) else NOT_DONE
    return out


def _check_answers(config, w: LogWriter, partitions: list[int], failure: str, expected: tuple[str, ...],
                   hooks, staged: bool = False) -> None:
    """Each partition holds ``before``; an append of ``landed`` to all of them (``append_shared``,
    or with ``staged`` ``upload`` and ``commit_staged``) fails at ``failure``: each partition's
    answer is the one ``expected``, and its log agrees with it."""
    for p in partitions:
        w.append(T, p, _records("before"))
    fired: list[str] = []
    after = _plant(failure, hooks, w, partitions[0], fired)
    groups = [AppendGroup(T, p, _records("landed")) for p in partitions]
    try:
        answer = w.commit_staged(w.upload(groups)) if staged else w.append_shared(groups)
    except LlogError as e:
        answer = e
    hooks.clear()
    after()
    for name in ("get_many", "_send_puts"):
        w.coordination.__dict__.pop(name, None)
    assert fired == [failure], f"the failure planted at {failure} did not happen there (saw {fired})"
    assert _answers(answer, partitions) == dict(zip(partitions, expected)), repr(answer)
    for p, outcome in zip(partitions, expected):
        control = read_control(w.coordination, w.keys(T, p)).record
        # Not done: nothing reserved. Done, or in doubt and in fact landed here: reserved once.
        assert control.sequence_counter == (4 if outcome == NOT_DONE else 7), (p, control)
        w.append(T, p, _records("after"))  # finishes whatever is pending
        landed = [] if outcome == NOT_DONE else _records("landed")
        assert _log(config, p) == _records("before") + landed + _records("after"), (failure, p)
        assert read_control(w.coordination, w.keys(T, p)).record.pending is None


@pytest.mark.parametrize("staged", [False, True], ids=["append_shared", "commit_staged"])
@pytest.mark.parametrize("failure,expected,_", FAILURES, ids=_IDS)
def test_every_failure_of_an_append_is_answered_done_not_done_or_in_doubt(config, hooks, failure, expected, _,
                                                                          staged):
    with LogWriter(config, auto_initialize=True) as w:
        _check_answers(config, w, [0], failure, (expected,), hooks, staged)
        # Oxia failing after the reservation landed (the tripwire aside: its check is only logged)
        # is logged and counted, and the append is done.
        after_reserve = {"writer.after_reserve", "control.before_materialize", "writer.after_index_put",
                         "control.before_clear", "writer.after_clear"}
        assert w.stats["failed_after_reserve"] == (1 if failure in after_reserve else 0)


@pytest.mark.parametrize("staged", [False, True], ids=["append_shared", "commit_staged"])
@pytest.mark.parametrize("failure,_,expected", FAILURES, ids=_IDS)
def test_every_failure_of_an_append_across_shards_is_answered_per_partition(
        four_shard_oxia, hooks, failure, _, expected, staged):
    with Coordination(four_shard_oxia) as c:
        create_topic(c, four_shard_oxia.root_prefix, T, 16)
    with LogWriter(four_shard_oxia) as w:
        partitions = []
        for p in range(16):  # the first two partitions whose controls are on different shards
            keys = w.keys(T, p)
            shard = w.coordination._shard(keys.control, keys.partition_key)
            if all(w.coordination._shard(w.keys(T, q).control, w.keys(T, q).partition_key) != shard
                   for q in partitions):
                partitions.append(p)
            if len(partitions) == 2:
                break
        assert len(partitions) == 2, "partitions 0..15 should span two shards of four"
        _check_answers(four_shard_oxia, w, partitions, failure, expected, hooks, staged)
