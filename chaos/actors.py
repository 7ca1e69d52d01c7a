"""The processes of a chaos run: ``python -m chaos.actors ROLE --dir D --name N ...``.

Settings come from ``LLOG_*`` environment variables (the controller passes its config). Each
actor works until SIGTERM. A writer (``append_shared`` to the main topic, to the topic the
admin deletes and re-creates, and to one that writers create on first use and grow by writing
to ever higher partitions: docs/protocol.md section 10.2) and a producer (``POST /produce`` to the broker, idempotent or
not) append one JSON line per acknowledged group to ``D/acks/N.jsonl``, only after the
acknowledgement, with the incarnation (``topic_id``) the ack says the records landed in, when the
append was first sent (``sent_at``) and when it was acknowledged (``acked_at``). The admin writes
each incarnation it deletes to ``D/deletes/N.jsonl`` before the delete.
Readers (direct, and consumers through the broker) write what they read of the re-created topic,
with the incarnation they read it in, to ``D/reads/N.jsonl``; consumers commit group offsets
(``commit_offsets``, ``POST /groups/{group}/commit``). With ``--lose-replies P`` a writer or
compactor loses the reply of each Oxia Write with probability ``P`` after the server applied it
(failpoint ``coordination.after_write``), and counts it in its activity file. What a reader, a
compactor (``InconsistentReadState``) or GC sees that the protocol forbids (an unreadable or wrong
record, a gap) goes to ``D/violations/N.jsonl``;
transient failures (a server restarting) are logged and retried. Every actor writes a ``begin``
line to ``D/activity/N.jsonl`` before each operation (an append, one partition's compaction pass,
a GC pass, one partition's read) and an ``end`` line, with what the operation did, after it: a
SIGKILL that leaves a ``begin`` last killed the actor mid-operation, and the ``end`` lines are
what the run counts as compactions completed (and compaction records resumed) and blobs GC
deleted. A compactor also writes a ``step`` line at each step of a compaction
(:data:`BETWEEN_COMPACTION_STEPS`): one killed after such a line left its ``meta/compaction``
record for the next one to resume.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx

from llog import failpoints
from llog.compactor import Compactor
from llog.config import Config
from llog.consumer_groups import commit_offsets, committed_offsets
from llog.errors import (
    AppendFailed, CorruptBatch, CorruptRecord, InconsistentReadState, ObjectNotFound, OffsetOutOfRange,
    PartitionNotInitialized, TopicNotFound,
)
from llog.gc import gc_pass
from llog.keys import TopicPartition
from llog_tools.stack.haproxy import PARTITION_HEADER
from llog.reader import LogReader, ReadRequest
from llog.topics import create_topic, delete_topic, read_topic
from llog.writer import AppendGroup, LogWriter

#: Errors that mean the log is damaged, not that a server is briefly away.
DAMAGE = (InconsistentReadState, CorruptBatch, CorruptRecord, ObjectNotFound)

_stopping = False


def _stop(*_):
    global _stopping
    _stopping = True


def record_value(name: str, seq: int, topic: str, partition: int, i: int) -> bytes:
    """The unique value of record ``i`` of a writer's append ``seq`` to ``topic[partition]``."""
    return f"{name}:{seq}:{topic}:{partition}:{i}".encode()


#: The fields of :func:`record_value`.
VALUE_FIELDS = 5


class _LostReply(grpc.RpcError):
    """A Write's reply lost after the server applied it: transient to the client (UNAVAILABLE),
    so it retries, or reports the outcome unknown."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def __str__(self):
        return "chaos: the reply of a write was lost"


def _lose_replies(args, activity: "_Lines") -> None:
    """From ``--lose-replies``: each Write's reply is lost with that probability (the seed's)."""
    if args.lose_replies <= 0:
        return
    rng = random.Random(args.seed ^ 0x5EED)

    def lose():
        if rng.random() < args.lose_replies:
            activity.write(lost_response=1)
            raise _LostReply()

    failpoints.hooks["coordination.after_write"] = lose


class _Lines:
    """Append-only JSON lines, flushed line by line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)

    def write(self, **fields) -> None:
        self._file.write(json.dumps(fields) + "\n")

    @contextlib.contextmanager
    def operation(self, name: str, **fields):
        """A ``begin`` line, then the block, then an ``end`` line with the fields the block put in
        the dict it was given (also when it raised; never when the process was killed)."""
        self.write(begin=name, **fields)
        did: dict = {}
        try:
            yield did
        finally:
            self.write(end=name, **fields, **did)


def _activity(args) -> _Lines:
    return _Lines(args.dir / "activity" / f"{args.name}.jsonl")


def _ack(acks: _Lines, name: str, seq: int, topic: str, topic_id: str, partition: int, start: int, count: int,
         sent_at: float) -> None:
    """One acknowledgement line, written after the acknowledgement: offsets ``start..start+count-1``
    of ``topic[partition]`` in incarnation ``topic_id``, ``sent_at`` the time the append was first
    sent (before its blob was written, so its index entry's ``created_at_ms``, and that of any
    compacted entry holding it, is no earlier: the run's retention check relies on it,
    :func:`chaos.run.judge_acks`) and ``acked_at`` the time now."""
    acks.write(name=name, seq=seq, topic=topic, topic_id=topic_id, partition=partition, start=start, count=count,
               sent_at=round(sent_at, 3), acked_at=round(time.time(), 3))


def _log(name: str, message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {name}: {message}", file=sys.stderr, flush=True)


def writer(args, config: Config) -> None:
    rng, acks, activity = random.Random(args.seed), _Lines(args.dir / "acks" / f"{args.name}.jsonl"), _activity(args)
    _lose_replies(args, activity)
    with LogWriter(config, auto_initialize=True) as log:
        for seq in range(1_000_000_000):
            if _stopping:
                return
            partitions = rng.sample(range(args.partitions), rng.randint(1, args.partitions))
            groups = [AppendGroup(args.topic, p, [record_value(args.name, seq, args.topic, p, i)
                                                  for i in range(rng.randint(1, 50))]) for p in partitions]
            if args.recreated and rng.random() < 0.5:  # in the same shared blob: the admin deletes this topic
                p = rng.randrange(args.partitions)
                groups.append(AppendGroup(args.recreated, p, [record_value(args.name, seq, args.recreated, p, i)
                                                              for i in range(rng.randint(1, 10))]))
            if args.grown and rng.random() < 0.3:  # created on first use, grown as higher partitions come up
                p = rng.randrange(min(_grown_partitions(args), args.partitions + seq // 25))
                groups.append(AppendGroup(args.grown, p, [record_value(args.name, seq, args.grown, p, i)
                                                          for i in range(rng.randint(1, 10))]))
            # The operation ends once its acks are recorded: a kill before that was mid-append.
            with activity.operation("append", seq=seq) as did:
                sent_at = time.time()  # before the blob's created_at_ms (section 4.2): see _ack
                try:
                    results = log.append_shared(groups)
                except AppendFailed as e:
                    _log(args.name, f"append {seq} partly failed: {e}")
                    results = e.results
                except Exception as e:  # noqa: BLE001 - a chaos run goes on; new values next time
                    _log(args.name, f"append {seq} failed: {type(e).__name__}: {e}")
                    results = []
                for r in results:
                    _ack(acks, args.name, seq, r.topic, r.topic_id, r.partition, r.start_offset, r.count, sent_at)
                did.update(acked=len(results), of=len(groups))
            if not results:
                time.sleep(0.2)
                continue
            time.sleep(rng.uniform(0, 0.05))


def _grown_partitions(args) -> int:
    """The partitions writers grow the topic created on first use to, at most."""
    return 2 * args.partitions


def _partitions(args) -> dict[str, range]:
    """The topics an actor follows, and the partitions of each it tries."""
    topics = {args.topic: range(args.partitions)}
    if args.recreated:
        topics[args.recreated] = range(args.partitions)
    if args.grown:
        topics[args.grown] = range(_grown_partitions(args))
    return topics


#: The compactor's failpoints (docs/protocol.md section 6) after which its ``meta/compaction``
#: record exists and stays until the cursor moved: a kill after one of them, before the next
#: ``end`` or step line, leaves a record that the next compactor's step 0 resumes (section 6.0).
#: The compactor actor writes a ``step`` line at each, and at ``compactor.after_cursor_move``
#: (the record is deleted next: a kill there may leave it or not).
BETWEEN_COMPACTION_STEPS = ("compactor.after_record_create", "compactor.after_index_overwrite",
                            "compactor.after_delete_range")
_LAST_COMPACTION_STEP = "compactor.after_cursor_move"


def _note_steps(activity: "_Lines") -> None:
    """A ``step`` line in the activity file at each compaction step (:data:`BETWEEN_COMPACTION_STEPS`)."""
    for point in (*BETWEEN_COMPACTION_STEPS, _LAST_COMPACTION_STEP):
        failpoints.hooks[point] = lambda point=point: activity.write(step=point)


def compaction_pass(c: Compactor, activity: "_Lines", violations: "_Lines", name: str, topic: str, p: int,
                    retention: bool) -> None:
    """One compactor pass over ``topic[p]`` (with ``retention``, also a retention pass), as an
    operation in the activity file. ``InconsistentReadState`` (the index, the cursor or the log
    start disagree: docs/protocol.md sections 5.5, 8.1) is a violation; other errors are logged and
    the next pass resumes."""
    try:
        with activity.operation("compact", topic=topic, partition=p, retention=retention) as did:
            done = c.compact_partition(topic, p, deadline=time.monotonic() + 5, retention=retention)
            did.update(compactions=done.compactions, records=done.records, recoveries=done.recoveries,
                       resumed=done.resumed_compactions, retained_records=done.retention_records)
        if done.compactions or done.retention_records:
            _log(name, f"{topic}[{p}]: {done.compactions} compaction(s), {done.records} records, "
                       f"retention dropped {done.retention_records}")
    except InconsistentReadState as e:
        violations.write(actor=name, topic=topic, partition=p, error=type(e).__name__, detail=str(e))
    except Exception as e:  # noqa: BLE001 - the next pass resumes
        _log(name, f"{topic}[{p}]: {type(e).__name__}: {e}")


def compactor(args, config: Config) -> None:
    rng, activity = random.Random(args.seed), _activity(args)
    violations = _Lines(args.dir / "violations" / f"{args.name}.jsonl")
    _lose_replies(args, activity)
    _note_steps(activity)
    with Compactor(config, max_offsets=args.max_offsets) as c:
        while not _stopping:
            for topic, partitions in _partitions(args).items():
                for p in partitions:
                    retention = rng.random() < 0.3  # a pass that also applies the topic's retention.ms
                    compaction_pass(c, activity, violations, args.name, topic, p, retention)
            time.sleep(0.3)


def gc(args, config: Config) -> None:
    violations, activity = _Lines(args.dir / "violations" / f"{args.name}.jsonl"), _activity(args)
    with LogReader(config) as reader:
        while not _stopping:
            try:
                with activity.operation("gc") as did:
                    report = gc_pass(reader.coordination, reader.objects, config.root_prefix, config.gc_grace_ms)
                    did.update(deleted=report.deleted)
                if report.deleted:
                    _log(args.name, f"deleted {report.deleted} blob(s)")
            except InconsistentReadState as e:
                violations.write(actor=args.name, error=type(e).__name__, detail=str(e))
            except Exception as e:  # noqa: BLE001 - the next pass starts over
                _log(args.name, f"{type(e).__name__}: {e}")
            time.sleep(1)


def _check_read(violations: "_Lines", name: str, topic: str, p: int, start: int, offsets, values) -> int:
    """How many of ``offsets``/``values`` (read from ``start``) follow on, each a chaos value;
    a violation for the first that does not."""
    for expected, (offset, value) in enumerate(zip(offsets, values), start):
        if offset != expected or value is None or len(value.split(b":")) != VALUE_FIELDS:
            violations.write(actor=name, topic=topic, partition=p, offset=expected, error="wrong record",
                             detail=f"offset {offset}, value {(value or b'')[:60]!r}")
            return expected - start
    return len(offsets)


def reader(args, config: Config) -> None:
    """Follows every partition of the three topics from its log start (one not there yet is
    tried again); a topic re-created (another ``topic_id``) is followed from its start again. What
    it reads of the topics other than the main one goes to its reads file with the incarnation it
    read it in."""
    violations, activity = _Lines(args.dir / "violations" / f"{args.name}.jsonl"), _activity(args)
    reads = _Lines(args.dir / "reads" / f"{args.name}.jsonl")
    following = {(t, p): (None, 1) for t, partitions in _partitions(args).items()
                 for p in partitions}  # -> (topic_id, next offset)
    with LogReader(config) as log:
        while not _stopping:
            for (topic, p), (topic_id, start) in following.items():
                try:
                    with activity.operation("read", topic=topic, partition=p, start=start) as did:
                        got = log.read_batches([ReadRequest(topic, p, start)])[0]
                        did.update(records=got.count)
                except OffsetOutOfRange:
                    with contextlib.suppress(Exception):  # retention moved the log start past it
                        following[(topic, p)] = (topic_id, log.offsets(topic, p)[0])
                    continue
                except (PartitionNotInitialized, TopicNotFound):
                    continue
                except DAMAGE as e:
                    violations.write(actor=args.name, topic=topic, partition=p, offset=start, error=type(e).__name__,
                                     detail=str(e))
                    continue
                except Exception as e:  # noqa: BLE001 - a server restarting, a topic re-created; read again
                    _log(args.name, f"{topic}[{p}] from {start}: {type(e).__name__}: {e}")
                    continue
                if topic_id is not None and got.topic_id != topic_id:  # re-created: start over
                    following[(topic, p)] = (got.topic_id, 1)
                    continue
                table = got.table()
                offsets, values = table.column("offset").to_pylist(), table.column("value").to_pylist()
                good = _check_read(violations, args.name, topic, p, start, offsets, values)
                if topic != args.topic and good:
                    reads.write(topic=topic, topic_id=got.topic_id, partition=p, start=start,
                                values=[v.decode() for v in values[:good]])
                following[(topic, p)] = (got.topic_id, start + good)
            time.sleep(0.2)


def admin(args, config: Config) -> None:
    """Deletes the re-created topic and creates it again (with ``retention.ms`` as the
    controller set it) every few seconds, while writers append to it. A delete killed midway is
    finished by the next one (the record stays DELETING until then)."""
    rng, activity = random.Random(args.seed), _activity(args)
    deletes = _Lines(args.dir / "deletes" / f"{args.name}.jsonl")
    with LogReader(config) as reader:
        while not _stopping:
            time.sleep(rng.uniform(4, 10))
            if _stopping:
                return
            try:
                with activity.operation("recreate", topic=args.recreated) as did:
                    old = read_topic(reader.coordination, config.root_prefix, args.recreated)
                    if old is not None:
                        # Before the delete: the run excuses the acknowledgements of an incarnation only if
                        # the admin named it here and its partitions are tombstones at the end.
                        deletes.write(topic=args.recreated, topic_id=old.record.topic_id, at=time.time())
                        delete_topic(reader.coordination, reader.objects, config.root_prefix, args.recreated,
                                     claim_wait_s=20, config=config)
                    new = create_topic(reader.coordination, config.root_prefix, args.recreated, args.partitions,
                                       settings=args.topic_settings, if_not_exists=True)
                    # A writer may have created it first (auto-creation): a new incarnation either way.
                    did.update(recreated=int(old is not None and new.topic_id != old.record.topic_id),
                               old=old.record.topic_id if old else None, new=new.topic_id)
                _log(args.name, f"{args.recreated}: {did}")
            except Exception as e:  # noqa: BLE001 - the next round finishes it
                _log(args.name, f"{args.recreated}: {type(e).__name__}: {e}")


def _group_watch(violations: "_Lines", name: str, group: str, seen: dict, committed: dict) -> None:
    """A group's committed offset never moves back (docs/protocol.md section 9.3): ``committed``
    (TopicPartition -> offset, read now) against what this actor read last (``seen``, updated);
    each move back is one violation."""
    for tp, offset in committed.items():
        if offset < seen.get(tp, 0):
            violations.write(actor=name, group=group, topic=tp.topic, partition=tp.partition, error="group moved back",
                             detail=f"committed offset {offset} after {seen[tp]}")
        seen[tp] = offset


def consumer(args, config: Config) -> None:
    """Reads the main topic as the Spark source does and commits its group's offsets after each
    read (``commit_offsets`` with the ``topic_id`` read), from the group's committed offsets on."""
    rng, activity = random.Random(args.seed), _activity(args)
    violations = _Lines(args.dir / "violations" / f"{args.name}.jsonl")
    group, seen = args.group, {}
    tps = [TopicPartition(args.topic, p) for p in range(args.partitions)]
    with LogReader(config) as log:
        while not _stopping:
            try:
                committed = {tp: c.offset for tp, c in committed_offsets(log.coordination, config.root_prefix, group,
                                                                         tps).items()}
                _group_watch(violations, args.name, group, seen, committed)
                tp = rng.choice(tps)
                start = committed.get(tp, 1)
                with activity.operation("consume", partition=tp.partition, start=start) as did:
                    try:
                        got = log.read_batches([ReadRequest(tp.topic, tp.partition, start, start + 199)])[0]
                    except OffsetOutOfRange:
                        start = log.offsets(tp.topic, tp.partition)[0]
                        got = log.read_batches([ReadRequest(tp.topic, tp.partition, start, start + 199)])[0]
                    table = got.table()
                    good = _check_read(violations, args.name, tp.topic, tp.partition, start,
                                       table.column("offset").to_pylist(), table.column("value").to_pylist())
                    if good:
                        commit_offsets(log.coordination, config.root_prefix, group, {tp: start + good},
                                       topic_ids={tp.topic: got.topic_id})
                    did.update(commits=int(good > 0), records=good)
            except Exception as e:  # noqa: BLE001 - a server restarting; again
                _log(args.name, f"{type(e).__name__}: {e}")
                time.sleep(0.5)
            time.sleep(rng.uniform(0.05, 0.3))


def _post(url: str, body: dict, timeout: float = 5.0, route: tuple[str, int] | None = None) -> httpx.Response:
    """``body`` to ``url``; ``route``: the topic-partition the balancer routes it by (its
    ``X-Llog-Partition`` header), as a client of ``llog stack up --brokers N`` sends it."""
    headers = {PARTITION_HEADER: f"{route[0]}/{route[1]}"} if route is not None else None
    return httpx.post(url, json=body, timeout=timeout, headers=headers)


def producer(args, config: Config) -> None:
    """Produces to the main topic through the broker (``POST /produce``); with ``--idempotent``
    as an idempotent producer (``POST /producers``, a sequence per partition), sending a batch
    again until it is answered (the broker writes it once and answers with its first offsets).
    A plain producer never sends a batch twice (its outcome unknown, it may be in the log,
    unacknowledged). A result with ``ok`` and offsets, in a 200 or a 409 (some groups written,
    others not) answer, is an acknowledgement. After any group not written, an idempotent producer
    takes a new producer id: a sequence is never reused for other records."""
    rng, acks, activity = random.Random(args.seed), _Lines(args.dir / "acks" / f"{args.name}.jsonl"), _activity(args)
    producer_id, sequences = None, {}
    for seq in range(1_000_000_000):
        if _stopping:
            return
        partitions = rng.sample(range(args.partitions), rng.randint(1, args.partitions))
        groups = [{"topic": args.topic, "partition": p,
                   "records": [record_value(args.name, seq, args.topic, p, i).decode() for i in range(rng.randint(1, 20))]}
                  for p in partitions]
        with activity.operation("produce", seq=seq) as did:
            sent_at = time.time()  # before the first attempt: an answer's entry is no older (see _ack)
            for attempt in range(60):
                if _stopping:
                    return
                try:
                    if args.idempotent and producer_id is None:
                        producer_id = _post(f"{args.broker}/producers", {}).json()["producer_id"]
                        sequences = {}
                    body = {"topic_partitions": groups}
                    if args.idempotent:
                        body["producer_id"] = producer_id
                        for g in groups:
                            g["sequence"] = sequences.get(g["partition"], 0)
                    answer = _post(f"{args.broker}/produce", body, route=(args.topic, groups[0]["partition"]))
                except (httpx.HTTPError, ValueError) as e:  # ValueError: /producers answered no JSON (a 503 page)
                    _log(args.name, f"produce {seq} attempt {attempt}: {type(e).__name__}: {e}")
                    if not args.idempotent:
                        break  # its outcome is unknown: never sent again, it would be written twice
                    time.sleep(0.3)
                    continue
                if answer.status_code != 200 and args.idempotent and answer.status_code >= 500:
                    time.sleep(0.3)
                    continue
                # 200: every group written; 409: some written (their results say ok), others not.
                results = answer.json().get("results", []) if answer.status_code in (200, 409) else []
                for r in results:
                    if r.get("ok"):
                        _ack(acks, args.name, seq, r["topic"], r["index_key"].rsplit("/", 5)[1], r["partition"],
                             r["start_offset"], r["count"], sent_at)
                        if args.idempotent:
                            sequences[r["partition"]] = sequences.get(r["partition"], 0) + r["count"]
                if args.idempotent and sum(1 for r in results if r.get("ok")) < len(groups):
                    # A group not written (refused, or the whole request): its partition's sequence
                    # now stands for records never sent again; new records under it would be taken
                    # for a resend (section 9.4) and answered with the old batch's offsets. A new
                    # producer id starts every partition again at 0.
                    producer_id = None
                did.update(acked=sum(1 for r in results if r.get("ok")), of=len(groups), status=answer.status_code)
                break
            else:
                producer_id = None  # gave up on this batch: a new producer id for the next
        time.sleep(rng.uniform(0, 0.1))


def kafka_producer(args, config: Config) -> None:
    """Produces to the main topic through the brokers' Kafka listeners (docs/kafka.md) with
    confluent-kafka's idempotent producer (librdkafka: pipelined batches, its own retries across
    listeners). A delivery report without error and with an offset is an acknowledgement of that
    one record (each record its own ``seq``). Kafka's answer to a batch sent again after llog has
    forgotten it (``DUPLICATE_SEQUENCE_NUMBER``) may reach the report as an error or as an
    unknown offset: not an acknowledgement, and never a second copy in the log."""
    from confluent_kafka import Producer

    from llog.coordination import Coordination
    from llog.discovery import topic_records

    rng, acks, activity = random.Random(args.seed), _Lines(args.dir / "acks" / f"{args.name}.jsonl"), _activity(args)
    with Coordination(config) as coordination:
        (record,) = topic_records(coordination, config.root_prefix, [args.topic])
    producer = Producer({"bootstrap.servers": args.kafka, "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 60_000, "socket.timeout.ms": 10_000, "log_level": 3})
    counts = {"acked": 0, "failed": 0}

    def delivered(err, message, seq: int, sent_at: float) -> None:
        if err is None and message.offset() >= 1:
            counts["acked"] += 1
            _ack(acks, args.name, seq, args.topic, record.topic_id, message.partition(), message.offset(), 1, sent_at)
        else:
            counts["failed"] += 1
            _log(args.name, f"record {seq}: {err} (offset {message.offset()})")

    seq = 0
    while not _stopping:
        partition = rng.randrange(args.partitions)
        with activity.operation("kafka_produce", seq=seq) as did:
            for _ in range(rng.randint(1, 20)):
                producer.produce(args.topic, record_value(args.name, seq, args.topic, partition, 0),
                                 partition=partition,
                                 on_delivery=lambda err, message, seq=seq, sent_at=time.time(): delivered(
                                     err, message, seq, sent_at))
                seq += 1
            producer.poll(0.05)
            did.update(**counts)
        time.sleep(rng.uniform(0, 0.05))
    producer.flush(_STOP_FLUSH_S)


#: How long a Kafka producer told to stop waits for the answers of what it sent.
_STOP_FLUSH_S = 8


def kafka_consumer(args, config: Config) -> None:
    """One member of a Kafka consumer group (``--group``, shared by every ``kafka_consumer``)
    through the brokers' Kafka listeners: confluent-kafka's consumer, classic group protocol,
    ``subscribe()`` to the main topic, no auto-commit; after each ``consume()`` it commits, once
    and synchronously, the next offset of each partition it consumed. Its ``D/kafka_group/N.jsonl``
    holds, in order: ``assign``/``revoke``/``lost`` (the partitions, the member's assignment number
    ``n`` and the time), ``consumed`` (per partition of an assignment, the offsets and values),
    ``commit`` (the offsets, written before the request is sent, with the time) and ``committed``
    (the answer: per partition an error name or null; a request that failed as a whole names
    its error for every partition)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition as KafkaPartition

    rng, activity = random.Random(args.seed), _activity(args)
    events = _Lines(args.dir / "kafka_group" / f"{args.name}.jsonl")
    assignment = {"n": 0}

    def assigned(event: str):
        def callback(consumer, partitions) -> None:
            if event == "assign":
                assignment["n"] += 1
            events.write(event=event, member=args.name, n=assignment["n"], at=time.time(),
                         partitions=sorted(p.partition for p in partitions))
        return callback

    consumer = Consumer({"bootstrap.servers": args.kafka, "group.id": args.group, "group.protocol": "classic",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         # The lowest session timeout the coordinator takes: a member paused past it is
                         # removed, and the group rebalances.
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "socket.timeout.ms": 10_000,
                         "fetch.wait.max.ms": 500, "log_level": 3})
    consumer.subscribe([args.topic], on_assign=assigned("assign"), on_revoke=assigned("revoke"),
                       on_lost=assigned("lost"))
    try:
        while not _stopping:
            with activity.operation("kafka_consume") as did:
                messages = consumer.consume(num_messages=rng.randint(1, 200), timeout=0.5)
                n, taken = assignment["n"], {}
                for message in messages:
                    if message.error() is not None:
                        _log(args.name, f"consume: {message.error()}")
                        continue
                    offsets, values = taken.setdefault(message.partition(), ([], []))
                    offsets.append(message.offset())
                    values.append((message.value() or b"").decode(errors="replace"))
                for p, (offsets, values) in sorted(taken.items()):
                    events.write(event="consumed", member=args.name, n=n, at=time.time(), partition=p, offsets=offsets,
                                 values=values)
                did.update(records=sum(len(offsets) for offsets, _ in taken.values()))
                if not taken:
                    continue
                wanted = {p: offsets[-1] + 1 for p, (offsets, _) in taken.items()}
                events.write(event="commit", member=args.name, n=n, sent=time.time(), offsets=wanted)
                try:
                    answer = consumer.commit(offsets=[KafkaPartition(args.topic, p, o) for p, o in wanted.items()],
                                             asynchronous=False)
                    errors = {tp.partition: tp.error.name() if tp.error else None for tp in answer}
                except KafkaException as e:
                    errors = {p: e.args[0].name() for p in wanted}
                events.write(event="committed", member=args.name, n=n, answered=time.time(), offsets=wanted,
                             errors=errors)
                did.update(commits=sum(error is None for error in errors.values()))
                if any(errors.values()):
                    _log(args.name, f"commit {wanted}: {errors}")
            time.sleep(rng.uniform(0, 0.1))
    finally:
        # Leave the group, but not for long: a LeaveGroup to a killed coordinator waits for its
        # socket timeout, and the run waits for every actor. The events are written line by line.
        closing = threading.Thread(target=consumer.close, daemon=True)
        closing.start()
        closing.join(_STOP_CLOSE_S)
        if closing.is_alive():
            os._exit(0)


#: How long a Kafka consumer told to stop waits to leave its group.
_STOP_CLOSE_S = 2


def broker_consumer(args, config: Config) -> None:
    """Consumes the main topic through the broker (``POST /consume``, from the log start when
    retention moved it) and commits through it (``POST /groups/{group}/commit`` with the
    ``topic_id`` consumed); checks that its group's committed offsets never move back."""
    rng, activity = random.Random(args.seed), _activity(args)
    violations = _Lines(args.dir / "violations" / f"{args.name}.jsonl")
    group, seen = args.group, {}
    position = {p: 1 for p in range(args.partitions)}
    while not _stopping:
        p = rng.randrange(args.partitions)
        try:
            with activity.operation("consume", partition=p, start=position[p]) as did:
                answer = _post(f"{args.broker}/consume", {"topic_partitions": [
                    {"topic": args.topic, "partition": p, "fetch_offset": position[p], "partition_max_bytes": 16384}],
                    "auto_offset_reset": "earliest"}, route=(args.topic, p))
                result = answer.json()["results"][0] if answer.status_code == 200 else {}
                if result.get("ok") and result.get("record_count"):
                    records = result["records"]
                    start = result["start_offset"]
                    good = _check_read(violations, args.name, args.topic, p, start, [r["offset"] for r in records],
                                       [r["payload"].encode() if "payload" in r else base64.b64decode(r.get("base64", ""))
                                        for r in records])
                    if good:
                        position[p] = start + good
                        committed = _post(f"{args.broker}/groups/{group}/commit", {"offsets": [
                            {"topic": args.topic, "partition": p, "offset": position[p],
                             "topic_id": result["topic_id"]}]}, route=(args.topic, p))
                        did.update(commits=int(committed.status_code == 200), records=good)
                        described = httpx.get(f"{args.broker}/groups/{group}", timeout=5)
                        if described.status_code == 200:
                            _group_watch(violations, args.name, group, seen, {
                                TopicPartition(row["topic"], row["partition"]): row["committed_offset"]
                                for row in described.json()["partitions"]})
        except Exception as e:  # noqa: BLE001 - the broker paused, killed or restarting; again
            _log(args.name, f"[{p}]: {type(e).__name__}: {e}")
            time.sleep(0.5)
        time.sleep(rng.uniform(0.05, 0.3))


ROLES = {"writer": writer, "compactor": compactor, "gc": gc, "reader": reader, "admin": admin, "consumer": consumer,
         "producer": producer, "broker_consumer": broker_consumer, "kafka_producer": kafka_producer,
         "kafka_consumer": kafka_consumer}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.actors")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--topic", default="chaos")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-offsets", type=int, default=200)
    parser.add_argument("--recreated", default="", help="the topic the admin deletes and re-creates")
    parser.add_argument("--grown", default="", help="the topic writers create on first use and grow")
    parser.add_argument("--topic-settings", type=json.loads, default={}, help="the re-created topic's settings (JSON)")
    parser.add_argument("--lose-replies", type=float, default=0.0)
    parser.add_argument("--broker", default="", help="the broker's base URL")
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument("--kafka", default="", help="the brokers' Kafka listeners (bootstrap servers)")
    parser.add_argument("--group", default="chaos")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    ROLES[args.role](args, Config.load())


if __name__ == "__main__":
    main()
