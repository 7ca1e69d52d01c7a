"""Idempotent produce (Kafka's idempotent producer) on real Oxia and S3: a producer id and a
sequence per partition make a resent batch come back with its first offsets and land once, also
when the broker that took it died and the resend went to another broker; sequences out of order
and older than the last batch are refused; produce without a producer id is as before."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest

from llog.clock import ShiftedClock
from llog.control import read_control
from llog.errors import (DuplicateSequence, GroupsFailed, InvalidPayload, LlogError, LogFenced, OffsetOutOfRange,
                         OutOfOrderSequence, StorageError)
from llog.fence import fence
from llog.reader import LogReader
from llog.writer import MAX_PRODUCERS_PER_PARTITION, AppendGroup, LogWriter
from tests.helpers.broker_process import run_broker

T = "idem"


def _log(config, partition: int = 0, topic: str = T) -> list[bytes]:
    with LogReader(config) as reader:
        return [r.value for r in reader.read_range(topic, partition, 1)]


def _records(tag: str, n: int = 3) -> list[str]:
    return [f"{tag}/{i}" for i in range(n)]


def _body(producer: str | None, *groups: tuple[int, int | None, list[str]], topic: str = T) -> dict:
    body = {"topic_partitions": [{"topic": topic, "partition": p, "records": records,
                                  **({"sequence": seq} if seq is not None else {})} for p, seq, records in groups]}
    if producer is not None:
        body["producer_id"] = producer
    return body


def _produce(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/produce", json=body, timeout=60)


def _offsets(response: httpx.Response) -> list[tuple[int, int]]:
    return [(r["start_offset"], r["end_offset"]) for r in response.json()["results"]]


# --- the writer ------------------------------------------------------------------------------------


def test_a_resent_batch_gets_its_first_offsets_and_lands_once(config):
    with LogWriter(config, auto_initialize=True) as w:
        first = w.append_shared([AppendGroup(T, 0, [b"a", b"b"], producer_id="p", sequence=0)])[0]
        w.append(T, 0, [b"plain"])
        again = w.append_shared([AppendGroup(T, 0, [b"a", b"b"], producer_id="p", sequence=0)])[0]
        assert again.duplicate and not first.duplicate
        assert (again.start_offset, again.end_offset, again.index_key) == (1, 2, first.index_key)
        nxt = w.append_shared([AppendGroup(T, 0, [b"c"], producer_id="p", sequence=2)])[0]
        assert (nxt.start_offset, nxt.duplicate) == (4, False)
        producers = read_control(w.coordination, w.keys(T, 0)).record.extra["producers"]
        assert producers["p"]["sequence"] == 2 and producers["p"]["start_offset"] == 4
    assert _log(config) == [b"a", b"b", b"plain", b"c"]


def test_older_and_out_of_order_sequences_are_refused_and_the_rest_of_the_append_is_written(config):
    with LogWriter(config, auto_initialize=True) as w:
        w.append_shared([AppendGroup(T, 0, [b"0", b"1"], producer_id="p", sequence=0),
                         AppendGroup(T, 0, [b"2"], producer_id="p", sequence=2)])
        with pytest.raises(DuplicateSequence):
            w.append_shared([AppendGroup(T, 0, [b"0", b"1"], producer_id="p", sequence=0)])
        with pytest.raises(OutOfOrderSequence, match="expects 3"):
            w.append_shared([AppendGroup(T, 0, [b"5"], producer_id="p", sequence=5)])
        # One partition's body: a duplicate, a gap, another producer's batch, a plain group, a
        # batch resent within the same append. Staged again without the first two.
        with pytest.raises(GroupsFailed) as failed:
            w.append_shared([AppendGroup(T, 0, [b"2"], producer_id="p", sequence=2),
                             AppendGroup(T, 0, [b"9"], producer_id="p", sequence=9),
                             AppendGroup(T, 0, [b"q0"], producer_id="q", sequence=0),
                             AppendGroup(T, 0, [b"plain"]),
                             AppendGroup(T, 0, [b"q0"], producer_id="q", sequence=0),
                             AppendGroup(T, 1, [b"other partition"])])
        dup, gap, q, plain, q_again, other = failed.value.outcomes
        assert (dup.duplicate, dup.start_offset) == (True, 3)
        assert isinstance(gap, OutOfOrderSequence)
        assert (q.start_offset, plain.start_offset, q.duplicate) == (4, 5, False)
        assert (q_again.start_offset, q_again.duplicate) == (4, True)
        assert (other.start_offset, other.duplicate) == (1, False)
        with pytest.raises(InvalidPayload, match="both producer_id and sequence"):
            w.append_shared([AppendGroup(T, 0, [b"x"], producer_id="p")])
    assert _log(config) == [b"0", b"1", b"2", b"q0", b"plain"]
    assert _log(config, 1) == [b"other partition"]


def _resent_within_one_body(w: LogWriter) -> list:
    """One append whose body holds producer p's batch 0..1, its next 2..3, and 0..1 again (a
    resend the broker merged into the same group commit as the originals); each group's outcome."""
    try:
        return w.append_shared([AppendGroup(T, 0, [b"a0", b"a1"], producer_id="p", sequence=0),
                                AppendGroup(T, 0, [b"b2", b"b3"], producer_id="p", sequence=2),
                                AppendGroup(T, 0, [b"a0", b"a1"], producer_id="p", sequence=0)])
    except GroupsFailed as failed:
        return failed.outcomes
    except LlogError as error:  # the same error for every group
        return [error] * 3


def _empty_or_log(config) -> list[bytes]:
    try:
        return _log(config)
    except OffsetOutOfRange:  # nothing was ever written
        return []


def test_a_batch_resent_within_its_body_is_a_duplicate_sequence_once_the_body_is_written(config):
    """docs/protocol.md section 9.4: the resend of 0..1 is older than 2..3, in the same body; it
    is answered DuplicateSequence because 0..1 was written (by this append), and lands once."""
    with LogWriter(config, auto_initialize=True) as w:
        first, second, resent = _resent_within_one_body(w)
    assert (first.start_offset, second.start_offset) == (1, 3)
    assert isinstance(resent, DuplicateSequence), resent
    assert _log(config) == [b"a0", b"a1", b"b2", b"b3"]


def _second_put_fails():
    """A ``writer.after_blob_put`` hook: the second blob PUT (the body staged again) fails."""
    puts = [0]

    def hook():
        puts[0] += 1
        if puts[0] == 2:
            raise StorageError("injected: S3 refused the PUT of the body staged again")
    return hook


def test_duplicate_sequence_is_never_said_of_a_batch_whose_body_then_fails(config, hooks):
    """Sections 4.6, 9.4: the resend's verdict (older than 2..3, whose run holds 0..1 of the same
    body) is known in the first round; the body is staged again without it, and that PUT fails:
    nothing is written, so the resend must get the failure too (not done), never DuplicateSequence,
    which a Kafka client completes as delivered."""
    with LogWriter(config, auto_initialize=True) as w:
        w.initialize_partition(T, 0)
        hooks["writer.after_blob_put"] = _second_put_fails()
        outcomes = _resent_within_one_body(w)
        hooks.clear()
    assert _empty_or_log(config) == []
    assert all(isinstance(o, StorageError) for o in outcomes), outcomes


def test_duplicate_sequence_is_never_said_of_a_batch_whose_body_is_then_fenced(config, hooks):
    """As above, with the partition fenced between the two rounds (`llog fence`, or a topic
    delete): 0..1 and 2..3 are LogFenced (not done), and so is the resend of 0..1."""
    puts = [0]

    with LogWriter(config, auto_initialize=True) as w:
        w.initialize_partition(T, 0)

        def fence_before_second_round():
            puts[0] += 1
            if puts[0] == 2:
                fence(w.coordination, w.keys(T, 0), config)

        hooks["writer.after_blob_put"] = fence_before_second_round
        outcomes = _resent_within_one_body(w)
        hooks.clear()
    assert _empty_or_log(config) == []
    assert all(isinstance(o, LogFenced) for o in outcomes), outcomes


def test_a_resend_of_a_batch_written_before_is_a_duplicate_sequence_whatever_its_body_does(config, hooks):
    """Section 9.4: 0..1 is in the control read (written by an earlier append); a body with 2..3,
    4..5 and 0..1 again judges 0..1 against the run those extend, but it shares no sequence with
    them: DuplicateSequence at once, also when the body staged again then fails."""
    with LogWriter(config, auto_initialize=True) as w:
        w.append_shared([AppendGroup(T, 0, [b"a0", b"a1"], producer_id="p", sequence=0)])
        hooks["writer.after_blob_put"] = _second_put_fails()
        with pytest.raises(GroupsFailed) as failed:
            w.append_shared([AppendGroup(T, 0, [b"b2", b"b3"], producer_id="p", sequence=2),
                             AppendGroup(T, 0, [b"c4", b"c5"], producer_id="p", sequence=4),
                             AppendGroup(T, 0, [b"a0", b"a1"], producer_id="p", sequence=0)])
        hooks.clear()
    after_first, after_second, resent = failed.value.outcomes
    assert isinstance(after_first, StorageError) and isinstance(after_second, StorageError)
    assert isinstance(resent, DuplicateSequence), resent
    assert _log(config) == [b"a0", b"a1"]


def test_sequences_wrap_after_2147483647_for_every_producer(config):
    """One rule for HTTP and Kafka producers (docs/protocol.md section 9.4): sequences are Kafka's
    int32 base sequences, which wrap to 0; the batch after the wrap is written."""
    end = 2 ** 31 - 1
    with LogWriter(config, auto_initialize=True) as w:
        def send(sequence: int, values: list[bytes]):
            return w.append_shared([AppendGroup(T, 0, values, producer_id="p", sequence=sequence)])[0]

        assert send(end - 1, [b"x", b"y", b"z"]).start_offset == 1  # end-1, end, 0
        assert send(1, [b"after"]).start_offset == 4
        assert send(1, [b"after"]).duplicate
        with pytest.raises(DuplicateSequence):  # older, and known written
            send(end - 1, [b"x", b"y", b"z"])
        with pytest.raises(OutOfOrderSequence, match="expects 2"):
            send(3, [b"gap"])
        with pytest.raises(InvalidPayload, match=r"0\.\.2147483647"):
            send(2 ** 31, [b"past int32"])
    assert _log(config) == [b"x", b"y", b"z", b"after"]


def test_the_129th_producer_evicts_the_least_recent_whose_resend_is_then_written_again(config):
    """docs/protocol.md section 9.4: a partition remembers its 128 most recently written producers.
    The 129th is written as usual and the least recent is forgotten (logged, counted); a resend of
    the forgotten producer's last batch is written again, as a new producer's first batch, and
    answered done, not duplicate. A resend of a producer still remembered is a duplicate."""
    clock = ShiftedClock()
    with LogWriter(config, auto_initialize=True, clock=clock) as w:
        first = w.append_shared([AppendGroup(T, 0, [b"p0/0", b"p0/1"], producer_id="p0", sequence=7)])[0]
        for n in range(1, MAX_PRODUCERS_PER_PARTITION + 1, 16):  # 128 more, 16 to an append
            clock.advance(0.01)  # each append's producers written later than the one before's
            w.append_shared([AppendGroup(T, 0, [f"p{i}/0".encode()], producer_id=f"p{i}", sequence=0)
                             for i in range(n, min(n + 16, MAX_PRODUCERS_PER_PARTITION + 1))])
        clock.advance(0.01)
        producers = read_control(w.coordination, w.keys(T, 0)).record.extra["producers"]
        assert len(producers) == MAX_PRODUCERS_PER_PARTITION and "p0" not in producers
        assert f"p{MAX_PRODUCERS_PER_PARTITION}" in producers  # the 129th was written as usual
        assert w.stats["producers_evicted"] == 1
        again = w.append_shared([AppendGroup(T, 0, [b"p0/0", b"p0/1"], producer_id="p0", sequence=7)])[0]
        assert not again.duplicate and again.start_offset == 2 + MAX_PRODUCERS_PER_PARTITION + 1
        assert (first.start_offset, first.duplicate) == (1, False)
        kept = w.append_shared([AppendGroup(T, 0, [b"p128/0"], producer_id="p128", sequence=0)])[0]
        assert kept.duplicate and kept.start_offset == 2 + MAX_PRODUCERS_PER_PARTITION
        assert w.stats["producers_evicted"] == 2  # p0, remembered again, pushed out the least recent
    written = _log(config)
    assert written.count(b"p0/0") == 2 and written.count(b"p128/0") == 1
    assert len(written) == 2 + MAX_PRODUCERS_PER_PARTITION + 2


# --- the broker --------------------------------------------------------------------------------------


def test_a_produce_resent_to_the_same_broker_is_answered_with_its_first_offsets(module_config, broker):
    topic = "idem-same"
    producer = httpx.post(f"{broker}/producers", timeout=10).json()["producer_id"]
    body = _body(producer, (0, 0, _records("a")), (1, 0, _records("b", 2)), topic=topic)
    first = _produce(broker, body)
    assert first.status_code == 200, first.text
    again = _produce(broker, body)
    assert again.status_code == 200, again.text
    assert _offsets(again) == _offsets(first) == [(1, 3), (1, 2)]
    assert [r.get("duplicate", False) for r in again.json()["results"]] == [True, True]
    assert [r.get("duplicate", False) for r in first.json()["results"]] == [False, False]
    nxt = _produce(broker, _body(producer, (0, 3, _records("c", 1)), topic=topic))
    assert _offsets(nxt) == [(4, 4)]
    older = _produce(broker, _body(producer, (0, 0, _records("a")), topic=topic))
    gap = _produce(broker, _body(producer, (0, 9, _records("d", 1)), topic=topic))
    assert (older.status_code, older.json()["results"][0]["error_type"]) == (409, "DuplicateSequence")
    assert (gap.status_code, gap.json()["results"][0]["error_type"]) == (409, "OutOfOrderSequence")
    plain = _produce(broker, _body(None, (0, None, ["plain"]), topic=topic))  # as before
    assert _offsets(plain) == [(5, 5)] and "duplicate" not in plain.json()["results"][0]
    assert _log(module_config, 0, topic) == [r.encode() for r in [*_records("a"), "c/0", "plain"]]
    for bad in (_body(producer, (0, None, ["x"]), topic=topic), _body(None, (0, 7, ["x"]), topic=topic),
                _body(producer, (0, 2 ** 31, ["x"]), topic=topic)):  # Kafka's base sequence is an int32
        response = _produce(broker, bad)
        assert (response.status_code, response.json()["error_type"]) == (400, "InvalidRequest"), response.text
    assert _log(module_config, 1, topic) == [r.encode() for r in _records("b", 2)]
    wrapped = _produce(broker, _body(producer, (2, 2 ** 31 - 2, _records("w", 2)), topic=topic))
    assert wrapped.status_code == 200 and _offsets(wrapped) == [(1, 2)]
    after = _produce(broker, _body(producer, (2, 0, _records("after", 1)), topic=topic))
    assert after.status_code == 200, after.text
    assert _offsets(after) == [(3, 3)]  # the sequence after 2147483647 is 0
    assert _log(module_config, 2, topic) == [r.encode() for r in [*_records("w", 2), "after/0"]]


def test_producers_with_and_without_ids_share_group_commits_and_resends_land_once(module_config, broker):
    """Concurrent requests to one partition (the batcher merges them into shared appends),
    half of them idempotent; every idempotent one is then sent again, concurrently with new
    plain ones. Each record is in the log once, and each resend answers its first offsets."""
    topic = "idem-mixed"

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            async def send(body):
                response = await client.post(f"{broker}/produce", json=body)
                assert response.status_code == 200, response.text
                return response.json()["results"][0]

            idempotent = [_body(f"p{n}", (0, 0, _records(f"p{n}")), topic=topic) for n in range(12)]
            plain = [_body(None, (0, None, _records(f"plain{n}")), topic=topic) for n in range(24)]
            first = await asyncio.gather(*(send(b) for pair in zip(idempotent, plain[:12]) for b in pair))
            again = await asyncio.gather(*(send(b) for pair in zip(idempotent, plain[12:]) for b in pair))
            return first[0::2], again[0::2]

    first, again = asyncio.run(run())
    assert [(r["start_offset"], r["end_offset"]) for r in again] == [(r["start_offset"], r["end_offset"]) for r in first]
    assert all(r["duplicate"] for r in again) and not any(r.get("duplicate") for r in first)
    log = _log(module_config, 0, topic)
    assert len(log) == 3 * 12 * 3 and len(set(log)) == len(log)  # 12 idempotent once, 24 plain
    for n, r in enumerate(first):
        assert log[r["start_offset"] - 1:r["end_offset"]] == [x.encode() for x in _records(f"p{n}")]


@pytest.mark.parametrize("kill", ["after_answer", "before_answer"])
def test_a_produce_resent_to_another_broker_after_the_first_died_lands_once(config, kill):
    """The first broker takes the request and dies (SIGKILL) after answering it, or once its
    offsets are reserved, maybe before its answer went out; the client sends the same request to
    a second broker, which answers with the first offsets."""
    body = _body("client-1", (0, 0, _records("a")), (1, 0, _records("b", 2)))
    settings = {"LLOG_FAILPOINT": "writer.after_reserve"} if kill == "before_answer" else {}
    first_offsets = None
    with run_broker(config, **settings) as (first_url, first_proc):
        try:
            response = _produce(first_url, body)
        except httpx.TransportError:
            response = None  # it died before answering: the client cannot tell whether it was written
        if kill == "before_answer":
            # The failpoint fired: the broker killed itself (SIGKILL) once the offsets were
            # reserved, with no answer sent; nobody else has killed it yet.
            assert response is None, f"the broker answered {response.status_code}: the failpoint did not fire"
            assert first_proc.wait(30) == -signal.SIGKILL
        else:
            assert response.status_code == 200 and first_proc.poll() is None, response.text
            first_offsets = _offsets(response)
            first_proc.kill()
        first_proc.wait(30)
    with run_broker(config) as (second_url, _):
        again = _produce(second_url, body)
    assert again.status_code == 200, again.text
    assert [r["duplicate"] for r in again.json()["results"]] == [True, True]
    assert _offsets(again) == [(1, 3), (1, 2)]
    if first_offsets is not None:
        assert first_offsets == _offsets(again)
    assert _log(config, 0) == [r.encode() for r in _records("a")]
    assert _log(config, 1) == [r.encode() for r in _records("b", 2)]


def test_post_producers_allocates_a_new_id_each_time(broker):
    ids = {httpx.post(f"{broker}/producers", timeout=10).json()["producer_id"] for _ in range(3)}
    assert len(ids) == 3
    assert json.loads(httpx.get(f"{broker}/openapi.json").text)["paths"]["/producers"]["post"]
