"""The broker's group commit (``broker_lite.batcher``) on real Oxia and the S3 server: concurrent
requests share one PUT and each gets its own offsets, a lone request waits for no window,
batches seal at the byte limit and never run two at once on one partition, backpressure refuses
and recovers with nothing lost, a failed flush fails exactly its requests, per partition, bad
input never reaches a batch, and closing answers every admitted request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_lite.batcher import BackPressure, Batcher, BatcherClosed, RequestTooLarge
from llog import failpoints
from llog.errors import CoordinationError, InvalidPayload, InvalidTopicName, LogFenced, UnknownPartition
from llog.fence import fence
from llog.reader import LogReader
from llog.writer import AppendGroup, AppendResult, LogWriter

#: Long enough that no test depends on the delay timer unless it says so.
NEVER_MS = 600_000


def _records(tag: str, n: int, size: int = 10) -> list[bytes]:
    return [f"{tag}/{i}".encode().ljust(size, b".") for i in range(n)]


class _WatchedWriter(LogWriter):
    """A writer that notes when two of its appends run at once on one partition, and whose
    appends wait for ``hold`` (when set up) before they start."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hold: threading.Event | None = None
        self.running: list[set[tuple[str, int]]] = []
        self.most_at_once = 0
        self.shared_partitions: list[set[tuple[str, int]]] = []
        self._watch = threading.Lock()

    def append_shared(self, groups, **kwargs):
        mine = {(g.topic, g.partition) for g in groups}
        with self._watch:
            self.shared_partitions += [mine & other for other in self.running if mine & other]
            self.running.append(mine)
            self.most_at_once = max(self.most_at_once, len(self.running))
        try:
            if self.hold is not None:
                assert self.hold.wait(60)
            return super().append_shared(groups, **kwargs)
        finally:
            with self._watch:
                self.running.remove(mine)


def _puts(writer: LogWriter) -> int:
    return writer.objects.stats["put"]


def _read(config, topic: str, partition: int, start: int, end: int) -> list[bytes]:
    with LogReader(config) as reader:
        return [r.value for r in reader.read_range(topic, partition, start, end)]


def test_concurrent_requests_share_a_put_and_each_gets_its_own_offsets(config):
    config = config.replace(batch_max_delay_ms=NEVER_MS)

    async def main():
        with LogWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            requests = [[AppendGroup("t", i % 3, _records(f"r{i}", 1 + i % 4))] for i in range(20)]
            answers = await asyncio.gather(*(batcher.produce(r) for r in requests))
            # The first request flushes alone (nothing was running); the other 19 gathered
            # while it ran and went as one batch when it finished.
            await batcher.close()
            assert _puts(writer) == 2 and batcher.stats["flushes"] == 2
            return requests, answers

    requests, answers = asyncio.run(main())
    ranges = {}
    for request, [produced] in zip(requests, answers):
        group = request[0]
        assert (produced.topic, produced.partition) == ("t", group.partition)  # an AppendResult, not an error
        assert produced.count == len(group.records)
        assert _read(config, "t", group.partition, produced.start_offset, produced.end_offset) == group.records
        ranges.setdefault(group.partition, []).append((produced.start_offset, produced.end_offset))
    for partition, taken in ranges.items():  # every offset of the partition once, admission order kept
        assert [o for lo, hi in taken for o in range(lo, hi + 1)] == list(range(1, sum(hi - lo + 1 for lo, hi in taken) + 1))


def test_a_request_spanning_partitions_and_a_lone_request_waits_for_no_window(config):
    config = config.replace(batch_max_delay_ms=NEVER_MS)

    async def main():
        with LogWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            groups = [AppendGroup("a", 0, _records("x", 3)), AppendGroup("b", 1, _records("y", 2)),
                      AppendGroup("a", 0, _records("z", 1))]
            answer = await asyncio.wait_for(batcher.produce(groups), 60)  # not the 10-minute window
            await batcher.close()
            return groups, answer

    groups, answer = asyncio.run(main())
    assert [(p.topic, p.partition, p.start_offset, p.end_offset) for p in answer] == [
        ("a", 0, 1, 3), ("b", 1, 1, 2), ("a", 0, 4, 4)]
    assert _read(config, "a", 0, 1, 4) == groups[0].records + groups[2].records


def test_batches_seal_at_the_byte_limit_and_never_share_a_partition_in_flight(config):
    config = config.replace(batch_max_delay_ms=NEVER_MS, batch_max_bytes=2000)

    async def main():
        with _WatchedWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            writer.hold = threading.Event()
            first = asyncio.ensure_future(batcher.produce([AppendGroup("s", 0, _records("first", 1))]))
            await asyncio.sleep(0)  # flushing alone, held
            # Over the byte limit: sealed at once; a slot is free, but partition 0 is being written.
            big = asyncio.ensure_future(batcher.produce([AppendGroup("s", 0, _records("big", 10, 250))]))
            # Four requests of 500 record bytes to partition 1 reach the limit: sealed, queued behind.
            rest = [asyncio.ensure_future(batcher.produce([AppendGroup("s", 1, _records(f"r{i}", 10, 50))]))
                    for i in range(4)]
            await asyncio.sleep(0.5)
            assert batcher.stats["requests"] == 6 and batcher.stats["flushes"] == 0 and writer.most_at_once == 1
            writer.hold.set()
            answers = [await first, await big] + [await r for r in rest]
            await batcher.close()
            flushes = batcher.stats["flushes"]
            assert writer.shared_partitions == [] and writer.most_at_once <= 2
            return answers, flushes, _puts(writer)

    answers, flushes, puts = asyncio.run(main())
    assert flushes == puts == 3  # the first alone, the big one, the four together
    assert [(a[0].start_offset, a[0].end_offset) for a in answers[:2]] == [(1, 1), (2, 11)]  # seal order
    assert [(a[0].start_offset, a[0].end_offset) for a in answers[2:]] == [(1 + 10 * i, 10 + 10 * i) for i in range(4)]
    assert _read(config, "s", 0, 1, 11) == _records("first", 1) + _records("big", 10, 250)


def test_requests_that_cannot_start_keep_gathering_instead_of_queueing_small_batches(config):
    """The delay passes many times during a long flush of the same partition: the open batch
    stays open (sealed, it could not start anyway), so everything that arrived meanwhile goes in
    one PUT when the flush ends, not in twenty small ones."""
    config = config.replace(batch_max_delay_ms=5)

    async def main():
        with _WatchedWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            writer.hold = threading.Event()
            first = asyncio.ensure_future(batcher.produce([AppendGroup("g", 0, _records("first", 1))]))
            await asyncio.sleep(0)
            waiting = []
            for i in range(10):  # 100 ms of arrivals, 20 delays, on the partition being written
                waiting.append(asyncio.ensure_future(batcher.produce([AppendGroup("g", 0, _records(f"w{i}", 2))])))
                await asyncio.sleep(0.01)
            assert batcher.stats["flushes"] == 0 and len(writer.running) == 1 and batcher.sealed_batches == 0
            writer.hold.set()
            answers = [await first] + [await w for w in waiting]
            await batcher.close()
            return answers, _puts(writer)

    answers, puts = asyncio.run(main())
    assert puts == 2  # the first, then the ten together
    assert len({a[0].wal_uri for a in answers[1:]}) == 1
    assert [(a[0].start_offset, a[0].end_offset) for a in answers[1:]] == [(2 + 2 * i, 3 + 2 * i) for i in range(10)]


def test_a_request_is_answered_once_its_offsets_are_reserved_and_stays_readable_if_the_rest_fails(config):
    """An append is durable once its offsets are reserved (docs/protocol.md section 4): the request
    is answered then, before the index entry is written. Here the writer is held right after
    the reservation: the answer arrives, the records read back (the pending is the readable
    tail), and when the rest of the append then fails, nothing acknowledged is lost: the next
    writer finishes the pending."""
    config = config.replace(batch_max_delay_ms=NEVER_MS)
    held, release = threading.Event(), threading.Event()

    def after_reserve():
        held.set()
        assert release.wait(60)
        raise CoordinationError("Oxia went away after the reservation")

    async def main():
        with LogWriter(config, auto_initialize=True) as writer:
            writer.append("early", 0, [b"first"])
            batcher = Batcher(writer)
            failpoints.hooks["writer.after_reserve"] = after_reserve
            try:
                answer = await asyncio.wait_for(batcher.produce([AppendGroup("early", 0, [b"a", b"b"])]), 30)
                # Answered while the writer is held after its reservation (the hook runs a moment
                # after the answer is handed to the loop: wait for it, bounded).
                assert await asyncio.to_thread(held.wait, 30) and not release.is_set()
                readable = await asyncio.to_thread(_read, config, "early", 0, 2, 3)
            finally:
                release.set()
                await batcher.close()
                del failpoints.hooks["writer.after_reserve"]
            assert batcher.stats["flushes"] == 1 and batcher.buffered_bytes == 0
            return answer, readable

    answer, readable = asyncio.run(main())
    assert [(a.start_offset, a.end_offset) for a in answer] == [(2, 3)] and readable == [b"a", b"b"]
    with LogWriter(config) as writer:
        assert writer.append("early", 0, [b"c"]).start_offset == 4
    assert _read(config, "early", 0, 1, 4) == [b"first", b"a", b"b", b"c"]


def test_backpressure_refuses_with_a_retry_time_and_recovers_with_nothing_lost(config):
    config = config.replace(batch_max_delay_ms=NEVER_MS, batch_max_buffer_bytes=1500)

    async def main():
        with LogWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            held = asyncio.ensure_future(batcher.produce([AppendGroup("bp", 0, _records("a", 10, 100))]))
            await asyncio.sleep(0)  # ~1 KB in flight
            with pytest.raises(BackPressure, match="LLOG_BATCH_MAX_BUFFER_BYTES=1500; retry after 1 s") as refused:
                await batcher.produce([AppendGroup("bp", 0, _records("b", 10, 100))])
            assert refused.value.retry_after_s >= 1 and batcher.stats["backpressure_rejections"] == 1
            with pytest.raises(RequestTooLarge, match="1600 record bytes, more than LLOG_BATCH_MAX_BUFFER_BYTES=1500"):
                await batcher.produce([AppendGroup("bp", 0, _records("c", 16, 100))])  # never admissible: no retry
            first = await held
            again = await batcher.produce([AppendGroup("bp", 0, _records("b", 10, 100))])  # room again
            await batcher.close()
            assert batcher.buffered_bytes == 0
            return first, again

    first, again = asyncio.run(main())
    assert (first[0].start_offset, again[0].start_offset, again[0].end_offset) == (1, 11, 20)
    assert _read(config, "bp", 0, 1, 20) == _records("a", 10, 100) + _records("b", 10, 100)


def test_a_failed_flush_fails_exactly_its_requests_per_partition(config):
    config = config.replace(batch_max_delay_ms=NEVER_MS)
    with LogWriter(config, auto_initialize=True) as writer:
        writer.append("f", 1, [b"before"])
        fence(writer.coordination, writer.keys("f", 1), config)

    async def main():
        with LogWriter(config) as writer:  # partition 99 is past the topic's count (16)
            batcher = Batcher(writer)
            warmup = asyncio.ensure_future(batcher.produce([AppendGroup("f", 0, [b"w"])]))
            writer.initialize_partition("f", 0)
            await asyncio.sleep(0)
            mixed, fenced_only = await asyncio.gather(
                batcher.produce([AppendGroup("f", 0, [b"ok"]), AppendGroup("f", 1, [b"no"])]),
                batcher.produce([AppendGroup("f", 1, [b"no"]), AppendGroup("f", 99, [b"none"])]))
            only_bad = await batcher.produce([AppendGroup("f", 1, [b"no"])])  # the whole flush fails
            await warmup
            await batcher.close()
            return mixed, fenced_only, only_bad

    mixed, fenced_only, only_bad = asyncio.run(main())
    assert isinstance(mixed[0], AppendResult) and mixed[0].start_offset == 2
    assert isinstance(mixed[1], LogFenced)
    assert isinstance(fenced_only[0], LogFenced) and isinstance(fenced_only[1], UnknownPartition)
    assert isinstance(only_bad[0], LogFenced)
    assert _read(config, "f", 0, 1, 2) == [b"w", b"ok"] and _read(config, "f", 1, 1, 1) == [b"before"]


def test_bad_input_is_refused_before_it_reaches_a_batch(config):
    async def main():
        with LogWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            with pytest.raises(InvalidTopicName):
                await batcher.produce([AppendGroup("ok", 0, [b"a"]), AppendGroup("no/slash", 0, [b"b"])])
            with pytest.raises(InvalidPayload, match="groups\\[1\\].records\\[0\\] is str"):
                await batcher.produce([AppendGroup("ok", 0, [b"a"]), AppendGroup("ok", 1, ["text"])])
            assert batcher.stats["requests"] == 0 and batcher.buffered_bytes == 0
            good = await batcher.produce([AppendGroup("ok", 0, [b"a"])])
            await batcher.close()
            return good

    assert asyncio.run(main())[0].start_offset == 1


def test_close_answers_every_admitted_request_and_refuses_new_ones(config):
    config = config.replace(batch_max_delay_ms=NEVER_MS)

    async def main():
        with LogWriter(config, auto_initialize=True) as writer:
            batcher = Batcher(writer)
            waiting = [asyncio.ensure_future(batcher.produce([AppendGroup("c", 0, [f"{i}".encode()])]))
                       for i in range(5)]
            await asyncio.sleep(0)  # the first flushes, four wait in the open batch
            await batcher.close()
            assert all(w.done() for w in waiting)
            with pytest.raises(BatcherClosed):
                await batcher.produce([AppendGroup("c", 0, [b"late"])])
            return [(await w)[0] for w in waiting]

    answers = asyncio.run(main())
    assert all(isinstance(a, AppendResult) for a in answers)
    assert [a.start_offset for a in answers] == [i + 1 for i in range(5)]
    assert _read(config, "c", 0, 1, 5) == [f"{i}".encode() for i in range(5)]
