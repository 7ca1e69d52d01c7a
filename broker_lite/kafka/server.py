"""The broker's Kafka listener (docs/kafka.md): Kafka's wire protocol on a TCP port of the broker's
own process and event loop, so a Kafka produce joins the HTTP produces' group commit and a Kafka
fetch shares the reader and the long poll.

One task per connection reads requests; each request is handled in a task of its own, started
in arrival order, and a writer answers them in that same order, as Kafka requires of pipelined
requests (docs/kafka.md section 2). What a connection's requests do happens in the order sent
where Kafka says it does (docs/protocol.md section 9.5, one connection's requests):
- a produce admits its batches into the group commit before its handler first awaits anything,
  so a connection's produces enter it in the order sent, and a partition's batches are written
  in admission order (which an idempotent producer's sequences need, with up to five in flight);
- the APIs of :data:`ORDERED_APIS` (the group coordinator's and the admin APIs) run one at a
  time per connection, each once the one before it on that connection is answered, as Kafka's
  broker serves them (a commit then a commit, or a commit then an OffsetFetch, land in that
  order);
- fetches, ListOffsets, Metadata, ApiVersions and InitProducerId overlap everything: a fetch
  parked in its long poll holds back no later request, only its own answer's place in line.

Requests and responses are kio's types for the exact version asked (:func:`_build` fills the
fields that version has); record batches are :mod:`broker_lite.kafka.batches`.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import dataclasses
import datetime
import functools
import hashlib
import importlib
import io
import logging
import secrets
import struct
import time
import uuid
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from broker_lite.batcher import BackPressure, BatcherClosed, RequestTooLarge, payload_bytes
from broker_lite.kafka.batches import KafkaBatchError, decode_produced, encode_fetched
from broker_lite.consume import ConsumeStats
from broker_lite.models import ConsumePartition
from llog.deployment import pass_gate
from llog.errors import (
    DuplicateSequence, EmptyAppend, InvalidPartition, InvalidPayload, InvalidTopicName, LlogError, OffsetOutOfRange,
    OutOfOrderSequence, PartitionNotInitialized, StorageError, TopicBeingDeleted, TopicNotFound, UnknownPartition,
)
from llog.keys import TopicPartition, validate_partition, validate_topic
from llog.reader import ITER_WINDOW, Fetched, ReadRequest
from llog.writer import AppendGroup, AppendResult

if TYPE_CHECKING:
    from broker_lite.app import BrokerApp

log = logging.getLogger(__name__)

#: API key -> (kio module name, request class name, lowest and highest version served): docs/kafka.md
#: section 2. Produce stops at 12 and Fetch at 12: later versions name topics by id only.
APIS = {
    0: ("produce", "ProduceRequest", 3, 12),
    1: ("fetch", "FetchRequest", 4, 12),
    2: ("list_offsets", "ListOffsetsRequest", 1, 8),
    3: ("metadata", "MetadataRequest", 0, 12),
    18: ("api_versions", "ApiVersionsRequest", 0, 4),
    22: ("init_producer_id", "InitProducerIdRequest", 0, 5),
}
API_VERSIONS = 18
#: The modules that serve more APIs (each registers its handlers with :func:`serve`).
SERVING_MODULES: tuple[str, ...] = ("broker_lite.kafka.admin", "broker_lite.kafka.groups")
#: APIs other modules serve (``broker_lite.kafka.groups``, ...): API key -> handler, a coroutine
#: function ``(listener, request, response_class) -> response`` (:func:`serve`).
EXTRA_HANDLERS: dict = {}
#: The APIs whose requests on one connection run one at a time, in the order sent (module doc;
#: docs/protocol.md section 9.5): every API :func:`serve` registers (the group coordinator's:
#: commits, joins, syncs, heartbeats, leaves, offset fetches; the admin APIs).
ORDERED_APIS: set[int] = set()


def serve(api_key: int, module: str, request_class: str, low: int, high: int):
    """Register the decorated coroutine function as the handler of ``api_key``, versions
    ``low..high`` (kio's ``kio.schema.<module>.v<N>.request.<request_class>``), list it in
    ApiVersions and in :data:`ORDERED_APIS`. Called at import by the modules that serve APIs."""
    def register(handler):
        APIS[api_key] = (module, request_class, low, high)
        EXTRA_HANDLERS[api_key] = handler
        ORDERED_APIS.add(api_key)
        return handler
    return register
#: ``(client id, client host)`` of the request being handled, for handlers that name their
#: client (JoinGroup, DescribeGroups).
CLIENT: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar("kafka_client", default=("", ""))
#: Kafka's "no authorized operations" marker in Metadata.
_NO_OPERATIONS = -2147483648
#: ListOffsets' special timestamps.
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")
#: Bytes a Kafka request's size prefix may name, past LLOG_BROKER_MAX_REQUEST_BYTES, for the
#: request's own header and framing (a produce's record bytes are what the limit is about).
_HEADROOM = 64 * 1024


def cluster_id(root_prefix: str) -> str:
    """The cluster id every listener of ``root_prefix`` answers (docs/kafka.md section 3)."""
    return base64.urlsafe_b64encode(hashlib.sha256(root_prefix.encode()).digest()[:16]).rstrip(b"=").decode()


@functools.cache
def _classes(api_key: int, version: int) -> tuple[type, type]:
    """kio's request and response classes of ``api_key`` at ``version``."""
    module, request, _, _ = APIS[api_key]
    req = importlib.import_module(f"kio.schema.{module}.v{version}.request")
    resp = importlib.import_module(f"kio.schema.{module}.v{version}.response")
    return getattr(req, request), getattr(resp, request.replace("Request", "Response"))


@functools.cache
def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _build(response_class: type, class_name: str, /, **values):
    """An instance of the class ``class_name`` of ``response_class``'s module (the same
    version), with the fields of ``values`` that this version has."""
    cls = getattr(importlib.import_module(response_class.__module__), class_name)
    names = _fields(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


@functools.cache
def _reader(cls: type):
    return entity_reader(cls)


@functools.cache
def _writer(cls: type):
    return entity_writer(cls)


class _Unanswered:
    """A request that gets no response (a produce with ``acks=0``)."""


NO_RESPONSE = _Unanswered()


def error_code(e: BaseException) -> ErrorCode:
    """The Kafka error code of an llog error met serving a partition (docs/kafka.md section 8)."""
    if isinstance(e, KafkaBatchError):
        return ErrorCode(e.code)
    if isinstance(e, _NotServed):
        return ErrorCode.not_leader_or_follower
    if isinstance(e, (TopicNotFound, PartitionNotInitialized, UnknownPartition, TopicBeingDeleted,
                      InvalidTopicName, InvalidPartition)):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(e, OffsetOutOfRange):
        return ErrorCode.offset_out_of_range
    if isinstance(e, OutOfOrderSequence):
        return ErrorCode.out_of_order_sequence_number
    if isinstance(e, DuplicateSequence):
        return ErrorCode.duplicate_sequence_number
    if isinstance(e, (InvalidPayload, EmptyAppend)):
        return ErrorCode.invalid_record
    if isinstance(e, RequestTooLarge):
        return ErrorCode.message_too_large
    if isinstance(e, StorageError):
        return ErrorCode.kafka_storage_error
    return ErrorCode.request_timed_out  # retriable: an idempotent producer's resend is safe


class KafkaListener:
    """Serves Kafka clients for ``app`` (a started :class:`~broker_lite.app.BrokerApp`)."""

    def __init__(self, app: BrokerApp, host: str, port: int, advertised_host: str | None = None):
        self.app = app
        self.host, self.port = host, port
        self.advertised_host = advertised_host or host
        self.cluster_id = cluster_id(app.config.root_prefix)
        self.max_request_bytes = app.max_request_bytes + _HEADROOM
        self._server: asyncio.Server | None = None
        self.registry = None  # the listeners' registry in Oxia (registry.py), once started
        self._connections: set[asyncio.Task] = set()
        for module in SERVING_MODULES:  # they register their APIs (serve) when imported
            importlib.import_module(module)
        self._handlers = {0: self._produce, 1: self._fetch, 2: self._list_offsets, 3: self._metadata,
                          18: self._api_versions, 22: self._init_producer_id,
                          **{key: functools.partial(handler, self) for key, handler in EXTRA_HANDLERS.items()}}

    async def start(self) -> None:
        # Bound first (the port, if ephemeral, is then known and registered), served only once
        # registered: Metadata and FindCoordinator answer from the registration.
        self._server = await asyncio.start_server(self._serve, self.host, self.port, start_serving=False)
        if self.port == 0:  # an ephemeral port: the one the system gave
            self.port = self._server.sockets[0].getsockname()[1]
        from broker_lite.kafka.registry import ListenerRegistry

        # Before it registers or serves (docs/protocol.md section 9.2); its broker passed it first.
        await asyncio.to_thread(pass_gate, self.app.config, self.app.reader.coordination, self.app.reader.objects,
                                f"Kafka listener of broker {self.app.broker_id}")
        self.registry = ListenerRegistry(self.app.reader.coordination, self.app.config.root_prefix, self.advertised_host,
                                         self.port, self.app.broker_id, self.app.config.oxia_session_timeout_ms)
        await self.registry.start()
        await self._server.start_serving()
        log.info("Kafka listener on %s:%d (advertised %s:%d)", self.host, self.port, self.advertised_host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.registry is not None:
            await self.registry.stop()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)

    # --- connections ----------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = asyncio.current_task()  # cancelled at stop while open; forgotten once closed
        self._connections.add(connection)
        peer = writer.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else ""
        answers: asyncio.Queue = asyncio.Queue()
        replier = asyncio.create_task(self._reply(answers, writer))
        ordered: asyncio.Task | None = None  # the connection's last request of ORDERED_APIS
        try:
            while True:
                try:
                    size = _SIZE.unpack(await reader.readexactly(4))[0]
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                if not 0 < size <= self.max_request_bytes:
                    log.warning("Kafka client %s: a request of %d bytes (at most %d): closing the connection",
                                writer.get_extra_info("peername"), size, self.max_request_bytes)
                    return
                frame = await reader.readexactly(size)
                parsed = self._parse(frame)
                if parsed is None:
                    log.warning("Kafka client %s: a request that cannot be parsed (API key and version %s): "
                                "closing the connection", writer.get_extra_info("peername"),
                                _KEY_VERSION.unpack_from(frame) if size >= 4 else "unknown")
                    return
                header, request, response_class = parsed
                handler = self._handlers[header.request_api_key]
                CLIENT.set((getattr(header, "client_id", None) or "", host))  # the handler's task copies it
                if header.request_api_key in ORDERED_APIS:
                    answering = ordered = asyncio.create_task(_after(ordered, functools.partial(
                        self._timed, response_class, handler, request)))
                else:  # a produce's admission happens in this task's first step, so in arrival order
                    answering = asyncio.create_task(self._timed(response_class, handler, request))
                answers.put_nowait((header.correlation_id, response_class, answering))
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            answers.put_nowait(None)
            try:
                await asyncio.wait_for(replier, 30)  # what was asked is answered before closing
            except (TimeoutError, asyncio.CancelledError):
                replier.cancel()
            writer.close()
            self._connections.discard(connection)

    async def _reply(self, answers: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        """Write each response, in request order."""
        while (item := await answers.get()) is not None:
            correlation_id, response_class, task = item
            try:
                response = await task
            except Exception:  # noqa: BLE001 - a handler's bug closes this connection, not the broker
                log.exception("Kafka request %s failed", response_class.__name__)
                writer.close()
                return
            if response is NO_RESPONSE:
                continue
            writer.write(_encode(correlation_id, response_class, response))
            try:
                await writer.drain()
            except ConnectionError:
                return

    async def _timed(self, response_class: type, handler, request):
        """``handler``'s answer to ``request``, its duration and its partitions' error codes
        counted by API."""
        started = time.perf_counter()
        response = await handler(request, response_class)
        api = response_class.__name__.removesuffix("Response")
        errors = () if response is NO_RESPONSE else [code.name for code in _error_codes(response)]
        self.app.metrics.observe_kafka_request(api, time.perf_counter() - started, errors)
        return response

    def _parse(self, frame: bytes):
        """``(header, request, response class)`` of one request, or None when it cannot be
        parsed. An ApiVersions request of a version not served is parsed as v0 (Kafka's rule:
        its answer lists what is served)."""
        if len(frame) < 8:
            return None
        api_key, version = _KEY_VERSION.unpack_from(frame)
        if api_key not in APIS:
            return None
        low, high = APIS[api_key][2:]
        unsupported = not low <= version <= high
        if unsupported and api_key != API_VERSIONS:
            return None
        request_class, response_class = _classes(api_key, 0 if unsupported else version)
        try:
            view = memoryview(frame)
            header, used = _reader(request_class.__header_schema__)(view, 0)
            if unsupported:
                return header, None, response_class
            request, _ = _reader(request_class)(view, used)
        except Exception:  # noqa: BLE001 - whatever kio's reader raises on bytes that are not the request
            return None
        return header, request, response_class

    # --- ApiVersions, Metadata, InitProducerId --------------------------------------------------

    async def _api_versions(self, request, response_class):
        keys = [_build(response_class, "ApiVersion", api_key=k, min_version=low, max_version=high)
                for k, (_, _, low, high) in sorted(APIS.items())]
        code = ErrorCode.none if request is not None else ErrorCode.unsupported_version
        return _build(response_class, response_class.__name__, error_code=code, api_keys=tuple(keys),
                      throttle_time=datetime.timedelta(0))

    def known_brokers(self) -> list[tuple[int, str, int]]:
        """``(node id, host, port)`` of the listeners a client is told of: the registered ones
        (registry.py), this one always among them."""
        return [(b.node_id, b.host, b.port) for b in self.registry.brokers()]

    async def _metadata(self, request, response_class):
        brokers = tuple(_build(response_class, "MetadataResponseBroker", node_id=node, host=host, port=port, rack=None)
                        for node, host, port in self.known_brokers())
        names = None if request.topics is None else [t.name for t in request.topics]
        allow = getattr(request, "allow_auto_topic_creation", True)
        records = await asyncio.to_thread(self._topics, names, allow)
        topics = [self._metadata_topic(response_class, name, record) for name, record in records]
        return _build(response_class, response_class.__name__, throttle_time=datetime.timedelta(0),
                      brokers=brokers, cluster_id=self.cluster_id, controller_id=self.registry.node_id,
                      topics=tuple(topics),
                      cluster_authorized_operations=_NO_OPERATIONS)

    def _topics(self, names: list[str] | None, allow_create: bool) -> list[tuple[str, object]]:
        """``(name, topic record or the error)`` of each topic Metadata asks for (all: every
        topic); a missing one created on first use where allowed (docs/kafka.md section 4)."""
        from llog.discovery import topic_records

        reader = self.app.reader
        if names is None:
            return [(r.topic, r) for r in topic_records(reader.coordination, self.app.config.root_prefix)
                    if not r.deleting]
        writer = self.app.writer
        out = []
        for name in names:
            try:
                validate_topic(name)
                if allow_create and writer is not None and self.app.config.auto_create_topics:
                    record = writer.topics.require(name)
                else:
                    record = reader.topics.get(name)
                    if record is None:
                        raise TopicNotFound(name)
                out.append((name, record))
            except LlogError as e:
                out.append((name, e))
        return out

    def _metadata_topic(self, response_class, name: str, record):
        if isinstance(record, BaseException):
            code = ErrorCode.invalid_topic_exception if isinstance(record, InvalidTopicName) else error_code(record)
            return _build(response_class, "MetadataResponseTopic", error_code=code, name=name,
                          topic_id=uuid.UUID(int=0), is_internal=False, partitions=(),
                          topic_authorized_operations=_NO_OPERATIONS)
        partitions = tuple(
            _build(response_class, "MetadataResponsePartition", error_code=ErrorCode.none, partition_index=p,
                   leader_id=self.registry.node_id, leader_epoch=0, replica_nodes=(self.registry.node_id,),
                   isr_nodes=(self.registry.node_id,),
                   offline_replicas=())
            for p in range(record.partitions))
        return _build(response_class, "MetadataResponseTopic", error_code=ErrorCode.none, name=name,
                      topic_id=uuid.UUID(record.topic_id) if record.topic_id else uuid.UUID(int=0),
                      is_internal=False, partitions=partitions, topic_authorized_operations=_NO_OPERATIONS)

    async def _init_producer_id(self, request, response_class):
        if request.transactional_id is not None:  # transactions are not served (docs/kafka.md section 7)
            return _build(response_class, response_class.__name__, throttle_time=datetime.timedelta(0),
                          error_code=ErrorCode.invalid_request, producer_id=-1, producer_epoch=-1)
        if self.app.writer is None:
            return _build(response_class, response_class.__name__, throttle_time=datetime.timedelta(0),
                          error_code=ErrorCode.not_leader_or_follower, producer_id=-1, producer_epoch=-1)
        return _build(response_class, response_class.__name__, throttle_time=datetime.timedelta(0),
                      error_code=ErrorCode.none, producer_id=1 + secrets.randbelow(2 ** 62 - 1), producer_epoch=0)

    # --- Produce --------------------------------------------------------------------------------

    async def _produce(self, request, response_class):
        """Every partition's batch decoded and checked, then the good ones into the group commit
        together (one request's partitions are committed or refused each as a whole)."""
        slots: list[tuple[str, int, AppendGroup | BaseException]] = []
        for topic in request.topic_data:
            for part in topic.partition_data:
                slots.append((topic.name, part.index, self._group(topic.name, part.index, part.records)))
        groups = [g for _, _, g in slots if isinstance(g, AppendGroup)]
        outcomes: list[object] = []
        if groups:
            outcomes = await self._commit(groups)
        answered = iter(outcomes)
        results = [(t, p, g if not isinstance(g, AppendGroup) else next(answered)) for t, p, g in slots]
        committed = [(g, o) for g, o in zip(groups, outcomes) if isinstance(o, AppendResult) and not o.duplicate]
        if committed:
            self.app.metrics.produce_accepted(sum(len(g.records) for g, _ in committed),
                                              sum(payload_bytes(g.records) for g, _ in committed),
                                              [(g.topic, g.partition) for g, _ in committed])
        if request.acks == 0:
            return NO_RESPONSE
        by_topic: dict[str, list] = {}
        for topic, partition, outcome in results:
            if isinstance(outcome, AppendResult):
                part = _build(response_class, "PartitionProduceResponse", index=partition, error_code=ErrorCode.none,
                              base_offset=outcome.start_offset, log_append_time=None, log_start_offset=-1, record_errors=(), error_message=None)
            else:
                part = _build(response_class, "PartitionProduceResponse", index=partition,
                              error_code=error_code(outcome), base_offset=-1, log_append_time=None,
                              log_start_offset=-1, record_errors=(), error_message=str(outcome)[:1000])
            by_topic.setdefault(topic, []).append(part)
        responses = tuple(_build(response_class, "TopicProduceResponse", name=t, partition_responses=tuple(ps))
                          for t, ps in by_topic.items())
        return _build(response_class, response_class.__name__, responses=responses,
                      throttle_time=datetime.timedelta(0))

    def _group(self, topic: str, partition: int, records) -> AppendGroup | BaseException:
        """The append group of one partition's batch, or why it is refused."""
        if self.app.batcher is None:
            return _NotServed("this broker's role does not write")
        try:
            validate_topic(topic)
            validate_partition(partition)
            batch = decode_produced(records, self.app.config.max_record_bytes,
                                    max_batch_bytes=self.app.config.broker_max_request_bytes)
        except (KafkaBatchError, LlogError) as e:
            return e
        v2 = batch.records
        producer = f"kafka-{batch.producer_id}-{batch.producer_epoch}" if batch.producer_id >= 0 else None
        return AppendGroup(topic, partition, v2.column("value"), keys=v2.column("key"), headers=v2.column("headers"),
                           timestamps=v2.column("timestamp"), producer_id=producer,
                           sequence=batch.base_sequence if producer is not None else None)

    async def _commit(self, groups: list[AppendGroup]) -> list[object]:
        if self.app._stopping:
            return [BatcherClosed("the broker is shutting down")] * len(groups)
        try:
            return await self.app.batcher.produce(groups)
        except (BackPressure, BatcherClosed) as e:
            self.app.metrics.produce_rejected(backpressure=isinstance(e, BackPressure))
            return [e] * len(groups)
        except RequestTooLarge as e:
            self.app.metrics.produce_rejected()
            return [e] * len(groups)

    # --- Fetch ----------------------------------------------------------------------------------

    async def _fetch(self, request, response_class):
        wanted = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                  for t in request.topics for p in t.partitions]
        max_bytes = max(request.max_bytes, 1)
        answered = await self._fetch_pass(wanted, max_bytes)
        wait_s = min(request.max_wait.total_seconds() * 1000, self.app.config.broker_max_wait_ms) / 1000
        deadline = time.monotonic() + wait_s
        while (sum(n for _, n, _ in answered) < request.min_bytes and time.monotonic() < deadline
               and all(isinstance(o, Fetched) for _, _, o in answered)):
            more = {TopicPartition(t, p): _next_offset(o, offset)
                    for (t, p, offset, _), (_, _, o) in zip(wanted, answered)}
            if not await self.app.consume.wait_for(more, deadline - time.monotonic()):
                break
            cache = self.app.consume.cache
            woken = [i for i, (topic, partition, _, _) in enumerate(wanted)
                     if (tail := cache.tail(TopicPartition(topic, partition))) is not None
                     and tail >= more[TopicPartition(topic, partition)]]
            if woken and len(woken) < len(wanted):
                # Woken by a produce here: the partitions it wrote are read again (a tail cache
                # hit, no Oxia read); the others keep their answer of a moment ago, as if the
                # poll had ended then for them.
                kept = sum(n for i, (_, n, _) in enumerate(answered) if i not in woken)
                again = await self._fetch_pass([wanted[i] for i in woken], max(max_bytes - kept, 1))
                for i, answer in zip(woken, again):
                    answered[i] = answer
            else:
                answered = await self._fetch_pass(wanted, max_bytes)
        by_topic: dict[str, list] = {}
        for (topic, partition, _, _), (records, _, outcome) in zip(wanted, answered):
            by_topic.setdefault(topic, []).append(self._partition_data(response_class, partition, outcome, records))
        responses = tuple(_build(response_class, "FetchableTopicResponse", topic=t, partitions=tuple(ps))
                          for t, ps in by_topic.items())
        return _build(response_class, response_class.__name__, throttle_time=datetime.timedelta(0),
                      error_code=ErrorCode.none, session_id=0, responses=responses)

    async def _fetch_pass(self, wanted, max_bytes: int) -> list[tuple[bytes | None, int, object]]:
        """Each partition's record batches (bytes), their record bytes, and the reader's outcome:
        the broker's consume service answers, from its tail cache when hot."""
        if self.app.consume is None or "read" not in self.app.roles:
            return [(None, 0, _NotServed("this broker's role does not read"))] * len(wanted)
        out: list[tuple[bytes | None, int, object] | None] = [None] * len(wanted)
        partitions, indexes = [], []
        for i, (topic, partition, offset, partition_max) in enumerate(wanted):
            try:
                validate_topic(topic)
                validate_partition(partition)
                if offset < 1:
                    raise OffsetOutOfRange(topic, partition, offset, 0, 1)
            except LlogError as e:
                out[i] = (None, 0, e)
                continue
            partitions.append(ConsumePartition(topic, partition, offset, max(partition_max, 1)))
            indexes.append(i)
        if partitions:
            stats = ConsumeStats()
            try:
                answered = [r for r, _ in await self.app.consume.fetch(partitions, max_bytes, _fetch_result, stats)]
            except LlogError as e:  # ConsumeBusy: too many fetches queued for Oxia and S3
                answered = [(None, 0, e)] * len(partitions)
            self.app.metrics.kafka_fetched(stats.cache_hits, stats.cache_misses)
            for i, answer in zip(indexes, answered):
                out[i] = answer
        return out

    def _partition_data(self, response_class, partition: int, outcome, records: bytes | None):
        if isinstance(outcome, Fetched):
            end = outcome.high_watermark + 1
            return _build(response_class, "PartitionData", partition_index=partition, error_code=ErrorCode.none,
                          high_watermark=end, last_stable_offset=end, log_start_offset=outcome.log_start_offset,
                          aborted_transactions=(), preferred_read_replica=-1, records=records or b"")
        if isinstance(outcome, OffsetOutOfRange):
            return _build(response_class, "PartitionData", partition_index=partition,
                          error_code=ErrorCode.offset_out_of_range, high_watermark=outcome.high_watermark + 1,
                          last_stable_offset=outcome.high_watermark + 1,
                          log_start_offset=outcome.log_start_offset, aborted_transactions=(),
                          preferred_read_replica=-1, records=b"")
        return _build(response_class, "PartitionData", partition_index=partition,
                      error_code=error_code(outcome), high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, aborted_transactions=(),
                      preferred_read_replica=-1, records=b"")

    # --- ListOffsets ----------------------------------------------------------------------------

    async def _list_offsets(self, request, response_class):
        wanted = [(t.name, p.partition_index, p.timestamp) for t in request.topics for p in t.partitions]
        if "read" not in self.app.roles:
            found = [_NotServed("this broker's role does not read")] * len(wanted)
        else:
            found = await asyncio.to_thread(self._offsets, wanted)
        by_topic: dict[str, list] = {}
        for (topic, partition, timestamp), result in zip(wanted, found):
            if isinstance(result, BaseException):
                part = _build(response_class, "ListOffsetsPartitionResponse", partition_index=partition,
                              error_code=error_code(result), timestamp=-1, offset=-1, leader_epoch=-1, old_style_offsets=())
            else:
                offset, at = result
                part = _build(response_class, "ListOffsetsPartitionResponse", partition_index=partition,
                              error_code=ErrorCode.none, timestamp=at, offset=offset, leader_epoch=0,
                              old_style_offsets=(offset,))
            by_topic.setdefault(topic, []).append(part)
        topics = tuple(_build(response_class, "ListOffsetsTopicResponse", name=t, partitions=tuple(ps))
                       for t, ps in by_topic.items())
        return _build(response_class, response_class.__name__, throttle_time=datetime.timedelta(0), topics=topics)

    def _offsets(self, wanted) -> list[tuple[int, int] | BaseException]:
        """``(offset, timestamp)`` for each ListOffsets ask (docs/kafka.md section 5)."""
        out = []
        for topic, partition, timestamp in wanted:
            try:
                validate_topic(topic)
                validate_partition(partition)
                start, high_watermark = self.app.reader.offsets(topic, partition)
                if timestamp == EARLIEST:
                    out.append((start, -1))
                elif timestamp == LATEST:
                    out.append((high_watermark + 1, -1))
                else:
                    out.append(self._by_time(topic, partition, start, high_watermark, timestamp))
            except LlogError as e:
                out.append(e)
        return out

    def _by_time(self, topic: str, partition: int, start: int, high_watermark: int,
                 timestamp: int) -> tuple[int, int]:
        """The first offset whose record time is ``>= timestamp`` (or, for ``MAX_TIMESTAMP``, the
        record with the largest time) and that time, scanning the partition from its log start;
        ``(-1, -1)`` when there is none."""
        best: tuple[int, int] | None = None
        position = start
        while position <= high_watermark:
            upto = min(high_watermark, position + ITER_WINDOW - 1)
            for batch in self.app.reader.read_batches([ReadRequest(topic, partition, position, upto)])[0].batches:
                if not batch.num_rows:
                    continue
                times = _record_times(batch)
                offsets = batch.column("offset").to_numpy()
                if timestamp == MAX_TIMESTAMP:
                    i = int(np.argmax(times))
                    if best is None or times[i] > best[1]:
                        best = (int(offsets[i]), int(times[i]))
                    continue
                hits = np.flatnonzero(times >= timestamp)
                if len(hits):
                    return int(offsets[hits[0]]), int(times[hits[0]])
            position = upto + 1
        return best if best is not None else (-1, -1)  # none at or after: Kafka's answer


async def _after(previous: asyncio.Task | None, answer):
    """``answer()`` (a coroutine function) awaited once ``previous`` (the connection's ordered
    request before it) is done, however that ended; the connection's writer writes each answer
    in its turn."""
    if previous is not None and not previous.done():
        await asyncio.wait({previous})
    return await answer()


class _NotServed(LlogError):
    """The broker's role does not serve this API (a write-only broker asked to fetch)."""


def _error_codes(entity) -> list[ErrorCode]:
    """Every error code other than none in a response (its own, its topics', its partitions')."""
    out = []
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, ErrorCode):
            if value is not ErrorCode.none:
                out.append(value)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for item in value:
                out += _error_codes(item)
    return out


def _record_times(batch: pa.RecordBatch) -> np.ndarray:
    """Each record's time: its event time, else its entry's ``created_at_ms``."""
    stamps = batch.column("timestamp")
    created = batch.column("created_at_ms").to_numpy()
    if stamps.null_count == len(stamps):
        return created
    return np.where(stamps.is_null().to_numpy(zero_copy_only=False), created,
                    stamps.fill_null(0).to_numpy())


def _next_offset(outcome: Fetched, offset: int) -> int:
    return offset + outcome.count


def _fetch_result(partition, outcome, log_start, topic_id) -> tuple[tuple[bytes | None, int, object], int]:
    """A partition's answer to a fetch (:meth:`ConsumeService.fetch`): its record batches, their
    record bytes and the outcome, and the record bytes again (what the byte budgets count)."""
    if isinstance(outcome, Fetched):
        encoded, nbytes = _encode_fetched(outcome)
        return (encoded, nbytes, outcome), nbytes
    return (None, 0, outcome), 0


def _encode_fetched(fetched: Fetched) -> tuple[bytes, int]:
    """One record batch per run of records with one ``created_at_ms`` (an entry), and the
    record bytes."""
    parts, nbytes = [], 0
    for batch in fetched.batches:
        if not batch.num_rows:
            continue
        nbytes += payload_bytes(batch.column("value"))
        created = batch.column("created_at_ms").to_numpy()
        cuts = [0, *(np.flatnonzero(np.diff(created)) + 1).tolist(), batch.num_rows]
        first = int(batch.column("offset")[0].as_py())
        records = pa.RecordBatch.from_arrays([batch.column(c) for c in ("key", "value", "headers", "timestamp")],
                                             names=["key", "value", "headers", "timestamp"])
        for lo, hi in zip(cuts, cuts[1:]):
            parts.append(encode_fetched(records.slice(lo, hi - lo), first + lo, int(created[lo])))
    return b"".join(parts), nbytes


def _encode(correlation_id: int, response_class: type, response) -> bytes:
    """The framed response: size, header (its version per the response's schema), body."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_class = response_class.__header_schema__
    _writer(header_class)(out, _build(header_class, header_class.__name__, correlation_id=correlation_id))
    _writer(response_class)(out, response)
    data = out.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    return bytes(data)
