"""The broker's HTTP surface as a bare ASGI application (no framework: a dozen routes do not need
one, and a request/route layer cost a quarter of the throughput when measured).
Bodies are decoded, validated and encoded with
msgspec (:mod:`broker_lite.models`); ``/openapi.json`` is generated from the same models
(:mod:`broker_lite.openapi`).

Routes (the reference broker's HTTP API, plus groups, topics and the OpenAPI document):

- ``GET /health``, ``GET /metrics`` (JSON), ``GET /metrics/prometheus``, ``GET /openapi.json``;
- ``POST /produce`` (role ``write``), through the group commit (:mod:`broker_lite.batcher`):
  200 every group committed, 409 some failed (per-partition errors), 404 every group names a
  topic or partition that does not exist (a partition past the topic's count, a topic not
  created automatically: docs/protocol.md section 10.2), 503 + ``Retry-After`` all refused for
  backpressure (nothing written). A topic without a record is created on its first produce
  (``LLOG_AUTO_CREATE_TOPICS``) with ``LLOG_DEFAULT_PARTITIONS`` partitions or enough for the
  partitions the produce names, and a topic so created grows when a produce names a higher
  partition (up to ``LLOG_MAX_AUTO_PARTITIONS``), as the reference broker initializes any
  partition on its first write; a topic created explicitly keeps its count (docs/protocol.md
  section 10.2). With a ``producer_id`` and a
  ``sequence`` per group the produce is idempotent (Kafka's idempotent producer,
  :meth:`llog.writer.LogWriter.append_shared`): a group sent again, to any broker, is answered
  with the offsets of its first send (``duplicate``) and written once; an older sequence fails
  the group with ``DuplicateSequence``, a gap with ``OutOfOrderSequence`` (409);
- ``POST /producers`` (role ``write``): a new producer id (Kafka's InitProducerId);
- ``POST /consume`` (role ``read``, :mod:`broker_lite.consume`): 200 with per-partition results
  (errors among them, ``auto_offset_reset`` for offsets retention removed), 503 +
  ``Retry-After`` when too many consumes fetch or wait;
- ``POST /groups/{group}/commit`` and ``GET /groups/{group}`` (role ``read``): the consumer
  groups the Spark source commits (``llog.consumer_groups``): offsets and lag. Offsets belong to
  an incarnation of a topic (docs/protocol.md section 12): a commit goes to the one its ``topic_id``
  names (what the consume results said), checked against the topic's current one (409
  ``UnknownTopicId`` when it is not), else to the one current when the commit is handled;
- ``GET /topics``, ``GET /topics/{topic}``: each topic's record (partition count, state,
  effective config, ``topic_id``; docs/protocol.md section 10.1), and per partition of its current
  incarnation its log start offset, high watermark and bytes.

Any request: 400 for no ``Content-Length`` (a chunked body), an empty or malformed body, or a
body not of the route's shape (the error names the field); 413 for a body over
``LLOG_BROKER_MAX_REQUEST_BYTES``, checked before it is read; 401/403 with auth on
(:mod:`broker_lite.auth`); 404 for any other path or a route the role does not serve (405 is
never used: the seed answers 404); 503 + ``Retry-After`` while shutting down. Every response
carries ``X-Request-Id`` (the client's, or a new one), which the broker's log lines name.

Oxia and S3 calls never run on the event loop: the group commit and the consume service run them
in thread pools, the rest go through :func:`asyncio.to_thread`. Shutdown answers every admitted
request (:meth:`Batcher.close`, :meth:`ConsumeService.close`).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import re
import socket
import time
import uuid

import msgspec
import numpy as np
import pyarrow as pa

from broker_lite import openapi
from broker_lite.auth import UNRESTRICTED, Auth, AuthError, Forbidden, Principal, check_kafka_listener
from broker_lite.batcher import BackPressure, Batcher, BatcherClosed, Outcome, RequestTooLarge, payload_bytes
from broker_lite.consume import ConsumeBusy, ConsumeService
from broker_lite.metrics import PROMETHEUS_CONTENT_TYPE, BrokerMetrics, route_label
from broker_lite.models import (
    ConsumeRequest, ErrorBody, GroupCommitRequest, GroupCommitResponse, GroupCommitted, GroupDescription,
    GroupPartitionLag, Health, PartitionSummary, ProduceRequest, ProduceResponse, ProduceResult, ProducerAllocated,
    TopicConfig, TopicDescription, TopicList, TopicSummary,
)
from llog.config import Config
from llog.consumer_groups import commit_offsets, describe_group, log_bounds
from llog.deployment import pass_gate
from llog.describe import describe_partition
from llog.discovery import partition_controls, topic_records
from llog.errors import (
    EmptyAppend, InvalidOffset, InvalidPartition, InvalidPayload, InvalidTopicName, LlogError, PartitionNotInitialized,
    TopicDeleted, TopicNotFound, UnknownPartition,
)
from llog.keys import PartitionKeys, TopicPartition, validate_group, validate_topic
from llog.reader import LogReader
from llog.records import TopicRecord
from llog.topics import TopicSettings
from llog.writer import AppendGroup, LogWriter

log = logging.getLogger(__name__)

_JSON = (b"content-type", b"application/json")
_ENCODE = msgspec.json.Encoder()
_DECODERS = {model: msgspec.json.Decoder(model) for model in (ProduceRequest, ConsumeRequest, GroupCommitRequest)}
#: llog errors that mean the request itself is bad (a 400).
_BAD_INPUT = (InvalidTopicName, InvalidPartition, InvalidPayload, EmptyAppend, InvalidOffset)
#: llog errors that mean the request names a topic or partition that does not exist (a 404).
_NOT_FOUND = (PartitionNotInitialized, TopicNotFound, TopicDeleted, UnknownPartition)
#: A produce answers 404 when every group failed with one of these (docs/protocol.md section 10.2).
_NOTHING_THERE = frozenset(e.__name__ for e in _NOT_FOUND)
BACKPRESSURE = "BackPressureRejected"
ROLES = {"write": ("write",), "read": ("read",), "both": ("write", "read")}
_GROUP_COMMIT = re.compile(r"^/groups/([^/]+)/commit$")
_GROUP = re.compile(r"^/groups/([^/]+)$")
_TOPIC = re.compile(r"^/topics/([^/]+)$")


class _Refused(Exception):
    """A request refused as a whole: ``status`` with an :class:`ErrorBody`."""

    def __init__(self, status: int, error_type: str, message: str, headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.headers = status, error_type, headers or []


class BrokerApp:
    """The ASGI application. ``host``/``port`` are what ``/health`` reports; ``role`` defaults
    to ``LLOG_BROKER_ROLE``."""

    def __init__(self, config: Config, host: str = "127.0.0.1", port: int = 8080, broker_id: str | None = None,
                 role: str | None = None, auth: Auth | None = None, kafka_port: int | None = None,
                 kafka_advertised_host: str | None = None):
        """``kafka_port``: also serve Kafka clients on that port (docs/kafka.md; 0: any free
        port, ``self.kafka.port`` once started), naming ``kafka_advertised_host`` (default
        ``host``) in its answers."""
        self.config = config.require("oxia_service_address", "s3_bucket")
        check_kafka_listener(auth, kafka_port)
        self.kafka_port, self.kafka_advertised_host = kafka_port, kafka_advertised_host
        self.kafka = None
        self.host, self.port = host, port
        self.role = role or config.broker_role
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        self.roles = ROLES[self.role]
        self.auth = auth
        self.broker_id = broker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.max_request_bytes = min(config.broker_max_request_bytes, config.batch_max_buffer_bytes)
        self.started_at_ms = int(time.time() * 1000)
        self.metrics = BrokerMetrics(config=self.config, broker_id=self.broker_id, host=host, port=port,
                                     started_at_ms=self.started_at_ms, roles=self.roles)
        self.writer: LogWriter | None = None
        self.reader: LogReader | None = None
        self.batcher: Batcher | None = None
        self.consume: ConsumeService | None = None
        self._stopping = False
        self._requests = itertools.count(1)
        self._id_prefix = uuid.uuid4().hex[:8]

    def _request_id(self) -> bytes:
        """A new request id: this process's random prefix and a counter (unique, and cheaper
        than a UUID per request)."""
        return f"{self._id_prefix}-{next(self._requests)}".encode()

    # --- lifespan -------------------------------------------------------------------------------

    async def start(self) -> None:
        if "write" in self.roles:
            self.writer = await asyncio.to_thread(LogWriter, self.config, auto_initialize=True)
            self.batcher = Batcher(self.writer, self.config)
        # Reads (consume, groups, topics) share the writer's clients when there is one.
        self.reader = await asyncio.to_thread(
            LogReader, self.config, self.writer and self.writer.coordination, self.writer and self.writer.objects)
        # Before it serves anything, a read-only broker too (it commits consumer groups): this
        # machine's clock and the root prefix's G (docs/protocol.md section 9.2); refused, it exits.
        await asyncio.to_thread(pass_gate, self.config, self.reader.coordination, self.reader.objects,
                                f"broker {self.broker_id}")
        if "read" in self.roles or self.config.tail_cache_dir:
            self.consume = ConsumeService(self.reader, self.config, serves_reads="read" in self.roles)
            if self.batcher is not None:
                self.batcher.on_durable = self.consume.produced
        self.metrics.attach(writer=self.writer, reader=self.reader, batcher=self.batcher, consume=self.consume)
        if self.kafka_port is not None:
            from broker_lite.kafka.server import KafkaListener

            self.kafka = KafkaListener(self, self.host, self.kafka_port, self.kafka_advertised_host)
            await self.kafka.start()
        # The clients, modules and caches built so far live as long as the process: out of the
        # garbage collector's way (its full collections were 100+ ms pauses of every request).
        gc.collect()
        gc.freeze()
        log.info("broker %s serving %s on %s:%d (auth %s)", self.broker_id, "+".join(self.roles), self.host,
                 self.port, "on" if self.auth else "off")

    async def stop(self) -> None:
        self._stopping = True
        if self.kafka is not None:
            await self.kafka.stop()
        self.metrics.close()
        if self.batcher is not None:
            await self.batcher.close()
        if self.consume is not None:
            await self.consume.close()
        for client in (self.reader, self.writer):
            if client is not None:
                await asyncio.to_thread(client.close)

    # --- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as e:  # noqa: BLE001 - the server reports it and exits
                    await send({"type": "lifespan.startup.failed", "message": f"{type(e).__name__}: {e}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope, receive, send) -> None:
        started = time.perf_counter()
        method, path = scope["method"], scope["path"]
        request_id = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")[:128] or self._request_id()
        headers: list[tuple[bytes, bytes]] = []
        content_type = _JSON
        self.metrics.request_started()
        try:
            try:
                status, body, headers = await self._route(method, path, scope, receive)
            except AuthError as e:  # 401 from authenticate, 403 from Principal.require
                raise _Refused(e.status, e.error_type, str(e), e.headers) from None
            except _BAD_INPUT as e:
                raise _Refused(400, type(e).__name__, str(e)) from None
            except _NOT_FOUND as e:
                raise _Refused(404, type(e).__name__, str(e)) from None
            except LlogError as e:  # Oxia or S3 failed after their retries: try again later, not a bug
                raise _Refused(503, type(e).__name__, str(e), [(b"retry-after", b"1")]) from None
            if isinstance(body, bytes):  # the Prometheus text
                content_type = (b"content-type", PROMETHEUS_CONTENT_TYPE.encode())
            elif isinstance(body, msgspec.Raw):
                body = bytes(body)
            else:
                body = _ENCODE.encode(body)
        except _Refused as e:
            status, headers = e.status, e.headers
            body = _ENCODE.encode(ErrorBody(e.error_type, str(e)))
            if status >= 500 or status in (401, 403):
                log.warning("[%s] %s %s -> %d %s: %s", request_id.decode(errors="replace"), method, path, status,
                            e.error_type, e)
        except Exception as e:  # noqa: BLE001 - a bug: answer 500 and say which request
            log.exception("[%s] %s %s failed", request_id.decode(errors="replace"), method, path)
            status, headers = 500, []
            body = _ENCODE.encode(ErrorBody("InternalError", f"{type(e).__name__}: {e}"))
        await send({"type": "http.response.start", "status": status,
                    "headers": [content_type, (b"x-request-id", request_id), *headers]})
        await send({"type": "http.response.body", "body": body})
        self.metrics.observe_request(route_label(path), status, time.perf_counter() - started)

    async def _route(self, method: str, path: str, scope, receive):
        if method == "GET" and path == "/health":
            return 200, Health("ok", self.broker_id, self.host, self.port, self.started_at_ms), []
        if method == "GET" and path == "/openapi.json":
            return 200, msgspec.Raw(openapi.document_bytes()), []
        principal = self._principal(scope)
        if method == "GET" and path == "/metrics":
            principal.require("admin")
            return 200, self.metrics.snapshot(), []
        if method == "GET" and path == "/metrics/prometheus":
            principal.require("admin")
            return 200, self.metrics.prometheus(), []
        if method == "POST" and path == "/produce" and "write" in self.roles:
            request = self._decode(ProduceRequest, await self._body(scope, receive))
            if self.auth is not None:
                principal.require("produce", {g.topic for g in request.topic_partitions})
            return await self._produce(request)
        if method == "POST" and path == "/producers" and "write" in self.roles:
            if not principal.produce:  # an id is for producing: a key that may produce nowhere gets none
                raise Forbidden(principal.name, "produce", None)
            return 200, ProducerAllocated(str(uuid.uuid4())), []
        if method == "POST" and path == "/consume" and "read" in self.roles:
            request = self._decode(ConsumeRequest, await self._body(scope, receive))
            if self.auth is not None:
                principal.require("consume", {p.topic for p in request.topic_partitions})
            return await self._consume(request)
        if (match := _GROUP_COMMIT.match(path)) and method == "POST" and "read" in self.roles:
            group = _name(match, validate_group)
            request = self._decode(GroupCommitRequest, await self._body(scope, receive))
            principal.require("groups", [group])
            principal.require("consume", {o.topic for o in request.offsets})
            return await self._commit(group, request)
        if (match := _GROUP.match(path)) and method == "GET" and "read" in self.roles:
            group = _name(match, validate_group)
            principal.require("groups", [group])
            return await self._describe_group(group, principal)
        if method == "GET" and path == "/topics":  # the topics this key may produce to or consume
            topics = await asyncio.to_thread(self._topics)
            return 200, TopicList([t for t in topics if _may_see(principal, t.topic)]), []
        if (match := _TOPIC.match(path)) and method == "GET":
            topic = match.group(1)
            if not _may_see(principal, topic):
                principal.require("consume", [topic])  # raises Forbidden naming the topic
            return 200, await asyncio.to_thread(self._topic, topic), []
        raise _Refused(404, "NotFound", f"no route for {method} {path} on this broker (role {self.role})")

    def _principal(self, scope) -> Principal:
        return UNRESTRICTED if self.auth is None else self.auth.authenticate(scope["headers"])

    async def _body(self, scope, receive) -> bytes:
        """The request body, refused before it is read when ``Content-Length`` is missing or too
        large."""
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is None or not length.isdigit():
            self.metrics.malformed_request()
            raise _Refused(400, "LengthRequired", "a Content-Length header is required (no chunked bodies)")
        if int(length) > self.max_request_bytes:
            raise _Refused(413, "RequestTooLarge", f"the body is {int(length)} bytes, more than the "
                                                   f"{self.max_request_bytes} this broker accepts")
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refused(400, "Disconnected", "the client went away before sending the whole body")
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        if not raw:
            self.metrics.malformed_request()
            raise _Refused(400, "EmptyBody", "the request body is empty")
        return raw

    def _decode(self, model: type, raw: bytes):
        try:
            return _DECODERS[model].decode(raw)
        except msgspec.ValidationError as e:
            self.metrics.malformed_request()
            raise _Refused(400, "InvalidRequest", f"the body is not a {model.__name__}: {e}") from None
        except msgspec.DecodeError as e:
            self.metrics.malformed_request()
            raise _Refused(400, "MalformedRequest", f"the body is not UTF-8 JSON: {e}") from None

    # --- POST /produce --------------------------------------------------------------------------

    async def _produce(self, request: ProduceRequest):
        producer = request.producer_id
        for i, g in enumerate(request.topic_partitions):
            if (producer is None) != (g.sequence is None):
                raise _Refused(400, "InvalidRequest", f"topic_partitions[{i}]: a sequence goes with the request's "
                                                      "producer_id, and a producer_id needs a sequence in every group")
        groups = [AppendGroup(g.topic, g.partition, _records(g.records), producer_id=producer, sequence=g.sequence)
                  for g in request.topic_partitions]
        if self._stopping:
            return self._unavailable(groups, "BrokerShuttingDown", "the broker is shutting down", 1)
        try:
            outcomes = await self.batcher.produce(groups)
        except BackPressure as e:
            self.metrics.produce_rejected(backpressure=True)
            return self._unavailable(groups, BACKPRESSURE, str(e), e.retry_after_s)
        except BatcherClosed as e:
            self.metrics.produce_rejected()
            return self._unavailable(groups, type(e).__name__, str(e), 1)
        except RequestTooLarge as e:  # the body check makes this rare (JSON is larger than its records)
            self.metrics.produce_rejected()
            raise _Refused(413, type(e).__name__, str(e)) from None
        except _BAD_INPUT as e:
            self.metrics.produce_rejected()
            raise _Refused(400, type(e).__name__, str(e)) from None
        results = [_result(g, o) for g, o in zip(groups, outcomes)]
        failed = [r for r in results if not r.ok]
        if failed and len(failed) == len(results) and all(r.error_type in _NOTHING_THERE for r in failed):
            # The client's mistake, not a conflict: nothing it names exists (docs/protocol.md section 10.2).
            self.metrics.produce_rejected()
            first = failed[0]
            more = f" (and {len(failed) - 1} more group(s): see results)" if len(failed) > 1 else ""
            return 404, ProduceResponse(results, 0, len(failed), error_type=first.error_type,
                                        error=first.error + more), []
        committed = [(g, o) for g, o in zip(groups, outcomes) if not isinstance(o, BaseException) and not o.duplicate]
        self.metrics.produce_accepted(sum(len(g.records) for g, _ in committed),
                                      sum(payload_bytes(g.records) for g, _ in committed),
                                      [(g.topic, g.partition) for g, _ in committed])
        return (409 if failed else 200), ProduceResponse(results, len(results) - len(failed), len(failed)), []

    @staticmethod
    def _unavailable(groups: list[AppendGroup], error_type: str, message: str, retry_after_s: int):
        results = [ProduceResult(g.topic, g.partition, False, error_type=error_type, error=message) for g in groups]
        body = ProduceResponse(results, 0, len(results), retry_after_ms=retry_after_s * 1000)
        return 503, body, [(b"retry-after", str(retry_after_s).encode())]

    # --- POST /consume --------------------------------------------------------------------------

    async def _consume(self, request: ConsumeRequest):
        if self._stopping:
            raise _Refused(503, "BrokerShuttingDown", "the broker is shutting down", [(b"retry-after", b"1")])
        try:
            response = await self.consume.consume(request)
        except ConsumeBusy as e:
            self.metrics.consume_failed(backpressure=True)
            raise _Refused(503, BACKPRESSURE, str(e), [(b"retry-after", str(e.retry_after_s).encode())]) from None
        except _BAD_INPUT as e:
            self.metrics.consume_failed()
            raise _Refused(400, type(e).__name__, str(e)) from None
        return 200, response, []

    # --- consumer groups ------------------------------------------------------------------------

    async def _commit(self, group: str, request: GroupCommitRequest):
        offsets: dict[TopicPartition, int] = {}
        named: dict[str, set[str]] = {}  # per topic, the topic ids the request names
        for o in request.offsets:
            tp = _topic_partition(o.topic, o.partition)
            offsets[tp] = max(o.offset, offsets.get(tp, 0))
            if o.topic_id is not None:
                named.setdefault(tp.topic, set()).add(o.topic_id)
        try:
            moved = await asyncio.to_thread(self._commit_offsets, group, offsets, named)
        except PartitionNotInitialized as e:
            raise _Refused(404, type(e).__name__, str(e)) from None
        except InvalidOffset as e:
            raise _Refused(400, type(e).__name__, str(e)) from None
        return 200, GroupCommitResponse(group, [GroupCommitted(tp.topic, tp.partition, o, tp in moved)
                                                for tp, o in offsets.items()]), []

    def _commit_offsets(self, group: str, offsets: dict[TopicPartition, int],
                        named: dict[str, set[str]]) -> dict[TopicPartition, int]:
        """Commit to the topics' incarnations current now (their records, read now), after
        checking each is the one the request names (``named``: per topic, the ``topic_id`` the
        consumer read from, if it said), each partition exists in it and each offset is at most
        its log end (high watermark + 1): a commit past the end would hide records written later.
        Nothing is committed when a check fails. An incarnation deleted after the checks gets the
        commit among its own keys, never a later topic's (docs/protocol.md section 12)."""
        coordination, root = self.reader.coordination, self.config.root_prefix
        at = time.monotonic()
        current = {r.topic: r.topic_id for r in topic_records(coordination, root, {tp.topic for tp in offsets})}
        for topic, topic_id in current.items():  # no later consume here answers an older incarnation
            self.consume.learn_incarnation(topic, topic_id, at)
        for topic in sorted({tp.topic for tp in offsets}):
            if topic not in current:
                raise TopicNotFound(topic)
            stale = sorted(named.get(topic, set()) - {current[topic]})
            if stale:
                raise _Refused(409, "UnknownTopicId", f"topic {topic!r} is incarnation {current[topic]}, not "
                                                      f"{', '.join(stale)}: it was deleted (and created again) after "
                                                      "those offsets were read; nothing was committed")
        bounds = log_bounds(coordination, {tp: PartitionKeys(root, tp, current[tp.topic]) for tp in offsets})
        for tp, (_, end) in bounds.items():
            if offsets[tp] > end:
                raise InvalidOffset(f"{tp}: offset {offsets[tp]} is past the log end {end} (the high watermark + 1)")
        return commit_offsets(coordination, root, group, offsets, topic_ids=current)

    async def _describe_group(self, group: str, principal: Principal):
        rows = await asyncio.to_thread(describe_group, self.reader.coordination, self.config.root_prefix, group)
        rows = [r for r in rows if principal.allows("consume", r.topic)]
        partitions = [GroupPartitionLag(r.topic, r.partition, r.committed_offset, r.committed_at_ms,
                                        r.high_watermark, r.lag) for r in rows]
        return 200, GroupDescription(group, partitions, sum(p.lag for p in partitions)), []

    # --- topics ---------------------------------------------------------------------------------

    def _topics(self) -> list[TopicSummary]:
        """Every topic record (one scan of one shard, docs/protocol.md section 10.1; every topic has
        one, docs/protocol.md section 12), by name."""
        return [self._summary(record) for record in topic_records(self.reader.coordination, self.config.root_prefix)]

    def _summary(self, record: TopicRecord) -> TopicSummary:
        settings = TopicSettings.of(record.topic, record, self.config).as_kafka()
        return TopicSummary(record.topic, record.partitions, record.state, record.topic_id,
                            msgspec.convert(settings, TopicConfig))

    def _topic(self, topic: str) -> TopicDescription:
        """The topic's record and the initialized partitions of the incarnation it names, each
        with its log start offset (docs/protocol.md section 10.3)."""
        try:
            validate_topic(topic)
        except InvalidTopicName as e:
            raise _Refused(400, type(e).__name__, str(e)) from None
        coordination, root = self.reader.coordination, self.config.root_prefix
        record, controls = partition_controls(coordination, root, topic)
        if record is None:
            raise _Refused(404, "TopicNotFound", f"topic {topic!r} has no topic record")
        rows = [describe_partition(coordination, root, topic, p, self.reader.objects, record.topic_id)
                for p in sorted(controls)]
        partitions = [PartitionSummary(r.partition, r.log_state, r.log_start_offset, r.high_watermark,
                                       r.index_entries, r.compacted_entries, r.bytes) for r in rows]
        summary = self._summary(record)
        return TopicDescription(topic, partitions, record.partitions, summary.state, summary.topic_id, summary.config)


def _records(records: list) -> pa.BinaryArray | list[bytes]:
    """A group's records as bytes: ASCII strings (the common case) straight into one Arrow
    array (one join, the lengths are the offsets: cheaper here than pyarrow's conversion of
    Python strings, which measured 7-90 us per 100 records), other strings through that
    conversion, base64 records decoded already."""
    if all(type(r) is str for r in records):
        text = "".join(records)
        if text.isascii() and len(text) < 2**31:
            offsets = np.zeros(len(records) + 1, dtype=np.int32)
            np.cumsum(np.fromiter(map(len, records), dtype=np.int32, count=len(records)), out=offsets[1:])
            return pa.BinaryArray.from_buffers(pa.binary(), len(records),
                                               [None, pa.py_buffer(offsets), pa.py_buffer(text.encode("ascii"))])
        return pa.array(records, type=pa.string()).view(pa.binary())
    return [r.encode() if isinstance(r, str) else r.base64 for r in records]


def _may_see(principal: Principal, topic: str) -> bool:
    return principal.admin or principal.allows("produce", topic) or principal.allows("consume", topic)


def _name(match: re.Match, validate) -> str:
    try:
        return validate(match.group(1))
    except LlogError as e:
        raise _Refused(400, type(e).__name__, str(e)) from None


def _topic_partition(topic: str, partition: int) -> TopicPartition:
    try:
        return TopicPartition(topic, partition)
    except LlogError as e:
        raise _Refused(400, type(e).__name__, str(e)) from None


def _result(group: AppendGroup, outcome: Outcome) -> ProduceResult:
    if isinstance(outcome, BaseException):
        error_type = type(outcome).__name__ if isinstance(outcome, LlogError) else "InternalError"
        return ProduceResult(group.topic, group.partition, False, error_type=error_type, error=str(outcome))
    return ProduceResult(outcome.topic, outcome.partition, True, outcome.start_offset, outcome.end_offset,
                         outcome.count, outcome.index_key, outcome.wal_uri, outcome.duplicate)
