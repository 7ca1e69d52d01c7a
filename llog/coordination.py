"""Oxia access: get, CAS, ceiling get, range scan, delete range, ephemeral claims (PROTOCOL.md
section 2), each with a deadline and a bounded retry.

The Oxia Python client (0.2.1) has no request timeouts: every request here carries a gRPC
deadline (``LLOG_OXIA_REQUEST_TIMEOUT_MS``, *T*) added by a channel interceptor. Building the
client takes up to 3 attempts, each waiting at most *T* for the server to answer and then for
its first shard assignments, with a short backoff between; ``close`` runs with a bound too.
Transient failures (unavailable, deadline exceeded, expired session) are retried with jittered
backoff for up to max(30 s, 3 *T*), long enough to ride through an Oxia restart: channels
reconnect within a second of the server coming back, shard discovery follows it, and a session
the server no longer knows is replaced. Every final error names the address. A conditional
write whose earlier attempt failed in transit reports a conflict as
``VersionConflict(outcome_unknown=True)``, since the conflict may be with itself.

Gets and puts from concurrent threads to the same shard share one RPC (:class:`_Combiner`), as
Oxia's Go client batches them: a writer committing eight partitions at once sends one Write per
protocol step instead of eight. Each key keeps its own condition and result.

Gets and puts travel as the protobuf runtime's messages (:mod:`llog.oxia_client_pb2`) on the
client's own channels; the oxia client's pure-Python messages cost more than the RPC itself.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import oxia
import oxia.ex
from oxia.internal.compare import compare_with_slash
from oxia.internal.connection_pool import ConnectionPool
from oxia.internal.proto.io.streamnative.oxia.proto import OxiaClientStub
from oxia.internal.service_discovery import ServiceDiscovery
from oxia.internal.sessions import SessionManager
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from llog import oxia_client_pb2 as wire
from llog.config import Config
from llog.errors import ClaimHeld, CoordinationError, VersionConflict

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Streams that live as long as the client; they must not get a request deadline.
_LONG_LIVED = ("GetShardAssignments", "GetNotifications", "GetSequenceUpdates", "WriteStream")
_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
}
_READ = "/io.streamnative.oxia.proto.OxiaClient/Read"
_WRITE = "/io.streamnative.oxia.proto.OxiaClient/Write"
_SHARD_ASSIGNMENTS = "/io.streamnative.oxia.proto.OxiaClient/GetShardAssignments"
#: Oxia's key order (hierarchical: segment by segment), for merging answers across shards.
_OXIA_KEY_ORDER = functools.cmp_to_key(compare_with_slash)
#: Retries are bounded by time (``Coordination._deadline_s``); this caps their number as well.
_RETRY_ATTEMPTS = 100
_RETRY_MAX_WAIT_S = 1.0
#: Building the client: one attempt after each wait, each attempt within the request timeout.
_BUILD_BACKOFF_S = (0.0, 0.5, 1.0)
_CLOSE_TIMEOUT_S = 5.0
#: A restarted server is reconnected to within a second (gRPC's default backoff grows to 2 min).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000)]
WRITE_OPS = ("put", "delete", "delete_range")


@dataclass(frozen=True)
class Versioned:
    """A key's value and version id as Oxia returned them."""

    key: str
    value: bytes
    version_id: int


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class _Deadline(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Gives every short request a deadline."""

    def __init__(self, timeout_s: float):
        self._timeout_s = timeout_s

    def _details(self, d):
        if d.timeout is not None or d.method.rsplit("/", 1)[-1] in _LONG_LIVED:
            return d
        return _CallDetails(d.method, self._timeout_s, d.metadata, d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _DeadlineConnectionPool(ConnectionPool):
    """Channels that reconnect quickly; with ``timeout_s``, every short request gets that deadline."""

    def __init__(self, timeout_s: float | None):
        super().__init__()
        self._interceptor = _Deadline(timeout_s) if timeout_s is not None else None

    def get(self, address) -> OxiaClientStub:
        with self._lock:
            conn = self.connections.get(address)
            if conn is None:
                if self._interceptor is None:  # the assignments stream, consumed by its own thread
                    channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
                    conn = (channel, OxiaClientStub(channel))
                else:
                    # Read and RangeScan are server streams; by default gRPC starts a thread to
                    # consume each one, which costs more than a small read itself.
                    channel = grpc.insecure_channel(address, options=[
                        *_CHANNEL_OPTIONS, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
                    conn = (channel, OxiaClientStub(grpc.intercept_channel(channel, self._interceptor)))
                self.connections[address] = conn
            return conn[1]


class _ServiceDiscovery(ServiceDiscovery):
    """The client's shard-assignment stream, without the races of oxia 0.2.1's.

    That class starts its stream thread before it creates the barrier the thread waits on: when
    the first assignments arrive before the constructor gets there (a loaded machine), the
    thread dies with ``AttributeError: ... '_init_barrier'`` and the constructor waits out its
    30 s. It also waits on that barrier again at every later update, so it stops following
    assignments after the first. Here an event marks the first assignments; updates keep
    coming; a failed or closed discovery stops its thread; the stream's backoff is short and
    wakes up on close. A namespace the server does not have fails at once, by name. The stream
    speaks protobuf (``wire``), as the reads and writes do: the client's own messages import
    pydantic on first use, a tenth of a second on the start-up of every process.
    """

    def __init__(self, service_address: str, stream_pool: ConnectionPool, request_pool: ConnectionPool,
                 namespace: str, init_timeout_s: float):
        self._assignments = {}
        self._service_address = service_address
        self._connection_pool = request_pool  # get_stub / get_leader: the pool whose requests have deadlines
        self._stream_pool = stream_pool  # the long-lived assignments stream (no deadline)
        self._namespace = namespace
        self._closed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._wake = threading.Event()
        self._problem = ""  # the stream's last error
        self._fatal: str | None = None  # a problem no retry solves
        self._thread = threading.Thread(target=self.get_assignments, daemon=True, name="llog-oxia-assignments")
        self._thread.start()
        if not self._ready.wait(init_timeout_s) or self._fatal:
            self.close()
            if self._fatal:
                raise CoordinationError(f"Oxia at {service_address}: {self._fatal}")
            raise RuntimeError(f"no shard assignments within {init_timeout_s:.1f} s"
                               + (f" (last error: {self._problem})" if self._problem else ""))

    def get_assignments(self) -> None:
        delay = 0.05
        while not self._closed:
            try:
                assignments = self._stream_pool.get(self._service_address)._channel.unary_stream(
                    _SHARD_ASSIGNMENTS, request_serializer=wire.ShardAssignmentsRequest.SerializeToString,
                    response_deserializer=wire.ShardAssignments.FromString)
                for sa in assignments(wire.ShardAssignmentsRequest(namespace=self._namespace)):
                    self._parse_assignments(sa.namespaces[self._namespace])
                    self._ready.set()
                    delay = 0.05
            except (grpc.RpcError, ValueError) as e:  # ValueError: the channel was closed under it
                if self._closed:
                    return
                self._problem = _describe(e)
                if "namespace not found" in self._problem:
                    self._fatal = f"namespace {self._namespace!r} does not exist (LLOG_OXIA_NAMESPACE)"
                    self._ready.set()
                    return
                if not isinstance(e, grpc.RpcError) or e.code() != grpc.StatusCode.CANCELLED:
                    log.info("oxia shard assignments from %s: %s; reconnecting", self._service_address, self._problem)
            self._wake.wait(delay)
            delay = min(2.0, delay * 2)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._stream_pool.close()  # ends the stream
        self._thread.join(_CLOSE_TIMEOUT_S)


class _OxiaClient(oxia.Client):
    """``oxia.Client`` whose requests carry deadlines and whose shard discovery has no start-up
    race (:class:`_ServiceDiscovery`). Raises RuntimeError when no assignments come in time."""

    def __init__(self, config: Config, init_timeout_s: float):  # the parent's __init__ is replaced whole
        self._closed = False
        self._connections = _DeadlineConnectionPool(config.oxia_request_timeout_ms / 1000)
        try:
            self._service_discovery = _ServiceDiscovery(config.oxia_service_address, _DeadlineConnectionPool(None),
                                                        self._connections, config.oxia_namespace, init_timeout_s)
        except BaseException:
            self._connections.close()  # nothing half-built stays open
            raise
        self._session_manager = SessionManager(self._service_discovery, config.oxia_session_timeout_ms,
                                               config.client_identifier)

    def close(self):
        self._service_discovery.close()  # first, so its thread does not reconnect while the rest closes
        super().close()


class _Slot:
    __slots__ = ("request", "result", "error", "done")

    def __init__(self, request):
        self.request, self.result, self.error = request, None, None
        self.done = threading.Event()


class _Combiner:
    """Concurrent requests to one shard share one RPC.

    The first caller to find the shard idle sends everything queued and keeps sending what
    queues up meanwhile; the others wait for their own result. An idle shard adds no delay.
    ``send(requests)`` returns one result or exception per request; an RPC failure fails every
    request of that batch, and each caller's own retry decides what to do.
    """

    def __init__(self, send: Callable[[list], list]):
        self._send = send
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._busy = False

    def run(self, request):
        slot = _Slot(request)
        with self._lock:
            self._queue.append(slot)
            lead = not self._busy
            self._busy = True
        if lead:
            self._drain()
        slot.done.wait()  # every send has a gRPC deadline, so this ends
        if slot.error is not None:
            raise slot.error
        return slot.result

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._busy = False
                    return
            try:
                results = self._send([slot.request for slot in batch])
            except BaseException as e:  # noqa: BLE001 - handed to every waiting caller
                results = [e] * len(batch)
            for slot, result in zip(batch, results):
                if isinstance(result, BaseException):
                    slot.error = result
                else:
                    slot.result = result
                slot.done.set()


def _status_error(status: int) -> BaseException | None:
    if status == wire.OK:
        return None
    if status == wire.KEY_NOT_FOUND:
        return oxia.ex.KeyNotFound()
    if status == wire.UNEXPECTED_VERSION_ID:
        return oxia.ex.UnexpectedVersionId()
    if status == wire.SESSION_DOES_NOT_EXIST:
        return oxia.ex.SessionNotFound()
    return oxia.ex.OxiaException(f"unknown status: {status}")


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, grpc.RpcError):
        return error.code() in _TRANSIENT_CODES
    return isinstance(error, oxia.ex.SessionNotFound)


def _describe(error: BaseException) -> str:
    """One line for an error; gRPC's own text is a multi-line repr."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return f"{error.code().name}: {error.details() if hasattr(error, 'details') else error}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _wait_ready(address: str, timeout_s: float) -> None:
    """Raises RuntimeError if no connection to ``address`` is ready within ``timeout_s``."""
    channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        raise RuntimeError(f"no connection within {timeout_s:.1f} s") from None
    finally:
        # Closing waits for the readiness future's polling thread, 0.2 s: on a thread of its
        # own, so that making a client (a stream's planner starting, say) does not wait for it.
        threading.Thread(target=channel.close, name="llog-oxia-probe-close", daemon=True).start()


class Coordination:
    """The only code that talks to Oxia. Thread-safe; one per process is enough."""

    def __init__(self, config: Config):
        config.require("oxia_service_address")
        self.config = config
        self._client = self._build_client(config)
        self._deadline_s = max(30.0, 3 * config.oxia_request_timeout_ms / 1000)
        self._lock = threading.Lock()
        self._combiners: dict[tuple[str, int], _Combiner] = {}
        self._rpc_cache: dict[OxiaClientStub, tuple[Callable, Callable]] = {}
        self.stats: collections.Counter[str] = collections.Counter()

    @staticmethod
    def _build_client(config: Config) -> _OxiaClient:
        """Each attempt has the request timeout for the server to answer and then for its first
        shard assignments (a loaded machine can make one attempt slow); a few attempts with
        backoff, so the whole is bounded. The error names the address and what was waited for."""
        address, step = config.oxia_service_address, config.oxia_request_timeout_ms / 1000
        started = time.monotonic()
        for attempt, backoff_s in enumerate(_BUILD_BACKOFF_S, 1):
            time.sleep(backoff_s)
            attempt_deadline = time.monotonic() + step
            what = "a connection"
            try:
                _wait_ready(address, step)
                what = "the first shard assignments"
                return _OxiaClient(config, max(0.1, attempt_deadline - time.monotonic()))
            except RuntimeError as e:
                problem = str(e)
                log.warning("connecting to Oxia at %s (attempt %d of %d): waiting for %s: %s", address,
                            attempt, len(_BUILD_BACKOFF_S), what, problem)
        raise CoordinationError(
            f"cannot connect to Oxia at {address}: waited for {what} ({problem}); gave up after "
            f"{len(_BUILD_BACKOFF_S)} attempts in {time.monotonic() - started:.1f} s (is it running? "
            "`llog stack status` shows the local one)")

    # --- batched single-key requests ----------------------------------------------------------

    def _shard(self, key: str, partition_key: str) -> int:
        return self._client._service_discovery.get_leader(key, partition_key)[0]

    def _combiner(self, kind: str, shard: int) -> _Combiner:
        with self._lock:
            combiner = self._combiners.get((kind, shard))
            if combiner is None:
                send = self._send_gets if kind == "read" else self._send_puts
                combiner = self._combiners[(kind, shard)] = _Combiner(lambda requests: send(shard, requests))
            return combiner

    def _rpcs(self, shard: int) -> tuple[Callable, Callable]:
        """The Read and Write calls to ``shard``'s leader, on the client's (deadline) channel."""
        stub = self._client._service_discovery.get_stub(shard)
        with self._lock:
            rpcs = self._rpc_cache.get(stub)
            if rpcs is None:
                channel = stub._channel
                rpcs = self._rpc_cache[stub] = (channel.unary_stream(
                    _READ, request_serializer=wire.ReadRequest.SerializeToString,
                    response_deserializer=wire.ReadResponse.FromString,
                ), channel.unary_unary(
                    _WRITE, request_serializer=wire.WriteRequest.SerializeToString,
                    response_deserializer=wire.WriteResponse.FromString,
                ))
            return rpcs

    def _send_gets(self, shard: int, requests: list) -> list:
        with self._lock:
            self.stats["read_rpc"] += 1
        read, _ = self._rpcs(shard)
        responses = [g for r in read(wire.ReadRequest(shard=shard, gets=requests)) for g in r.gets]
        if len(responses) != len(requests):
            raise CoordinationError(f"oxia answered {len(responses)} of {len(requests)} gets")
        results = []
        for request, response in zip(requests, responses):
            error = _status_error(response.status)
            if isinstance(error, oxia.ex.KeyNotFound):
                results.append(None)
            else:
                key = response.key if response.HasField("key") else request.key
                results.append(error or Versioned(key, response.value, response.version.version_id))
        return results

    def _send_puts(self, shard: int, requests: list) -> list:
        with self._lock:
            self.stats["write_rpc"] += 1
        _, write = self._rpcs(shard)
        response = write(wire.WriteRequest(shard=shard, puts=requests))
        if len(response.puts) != len(requests):
            raise CoordinationError(f"oxia answered {len(response.puts)} of {len(requests)} puts")
        return [_status_error(r.status) or r.version.version_id for r in response.puts]

    def _get(self, key: str, partition_key: str, comparison: int) -> Versioned | None:
        request = wire.GetRequest(key=key, include_value=True, comparison_type=comparison)
        return self._combiner("read", self._shard(key, partition_key)).run(request)

    # --- plumbing -----------------------------------------------------------------------------

    def _call(self, op: str, what: str, fn: Callable[[], T], on_retry: Callable[[], None] | None = None,
              count: int = 1) -> T:
        with self._lock:
            self.stats[op] += count
        started = time.monotonic()
        retrying = Retrying(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(_RETRY_ATTEMPTS) | stop_after_delay(self._deadline_s),
            wait=wait_random_exponential(multiplier=0.05, max=_RETRY_MAX_WAIT_S),
            before_sleep=lambda state: (on_retry and on_retry(), log.warning(
                "oxia %s %s at %s failed (%s), retrying", op, what, self.config.oxia_service_address,
                _describe(state.outcome.exception()))),
            reraise=True,
        )
        try:
            return retrying(fn)
        except (grpc.RpcError, oxia.ex.SessionNotFound) as e:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise CoordinationError(
                f"oxia {op} {what} at {self.config.oxia_service_address} failed after {attempts} attempt(s) "
                f"in {time.monotonic() - started:.1f} s: {_describe(e)}") from e

    # --- reads --------------------------------------------------------------------------------

    def get(self, key: str, partition_key: str) -> Versioned | None:
        return self._call("get", key, lambda: self._get(key, partition_key, wire.EQUAL))

    def ceiling(self, key: str, partition_key: str | None, within: str) -> Versioned | None:
        """Lowest key >= ``key`` that starts with ``within``; None if there is none.

        Oxia's CEILING answers with the next key in the whole keyspace, which may lie past the
        prefix; that answer means "none" here (PROTOCOL.md section 5.2).
        """

        def fn():
            if partition_key is not None:
                found = self._get(key, partition_key, wire.CEILING)
            else:  # every shard's answer; the lowest in Oxia's key order
                request = wire.GetRequest(key=key, include_value=True, comparison_type=wire.CEILING)
                shards = [shard for shard, _ in self._client._service_discovery.get_all_shards()]
                answers = [a for a in (self._combiner("read", shard).run(request) for shard in shards) if a is not None]
                found = min(answers, key=lambda a: _OXIA_KEY_ORDER(a.key)) if answers else None
            return found if found is not None and found.key.startswith(within) else None

        return self._call("get", f"ceiling {key}", fn)

    def range_scan(self, start: str, end: str, partition_key: str) -> list[Versioned]:
        """Records with keys in ``[start, end)`` in Oxia's key order."""

        def fn():
            return [Versioned(k, v, ver.version_id())
                    for k, v, ver in self._client.range_scan(start, end, partition_key=partition_key)]

        return self._call("range_scan", f"{start}..{end}", fn)

    def get_many(self, requests: Sequence[tuple[str, str]], ceiling_within: Sequence[str | None] | None = None
                 ) -> list[Versioned | None]:
        """Several gets in one Read RPC per shard: ``(key, partition_key)`` each. Where
        ``ceiling_within`` gives a prefix for a request, that get is a CEILING get answered like
        :meth:`ceiling`; where it gives ``None`` (or is omitted), an exact get."""
        prefixes = list(ceiling_within) if ceiling_within is not None else [None] * len(requests)
        if len(prefixes) != len(requests):
            raise ValueError(f"get_many: {len(prefixes)} ceiling prefixes for {len(requests)} requests")
        out: list[Versioned | None] = [None] * len(requests)
        for shard, indexes in self._by_shard((key, pk) for key, pk in requests).items():
            batch = [wire.GetRequest(key=requests[i][0], include_value=True,
                                     comparison_type=wire.EQUAL if prefixes[i] is None else wire.CEILING)
                     for i in indexes]
            results = self._call("get", f"{len(batch)} keys", lambda: self._raise_first(self._send_gets(shard, batch)),
                                 count=len(batch))
            for i, found in zip(indexes, results):
                if found is not None and (prefixes[i] is None or found.key.startswith(prefixes[i])):
                    out[i] = found
        return out

    def put_many(self, items: Sequence[tuple[str, bytes, str, int | None]],
                 guard: Callable[[], None] | None = None) -> list[int | VersionConflict]:
        """Several puts in one Write RPC per shard: ``(key, value, partition_key,
        expected_version)`` each. Returns the new version id, or the :class:`VersionConflict`
        of a put whose condition failed (``outcome_unknown`` as in :meth:`put`). ``guard``
        as in :meth:`put`, before every RPC."""
        out: list[int | VersionConflict] = [0] * len(items)
        for shard, indexes in self._by_shard((key, pk) for key, _, pk, _ in items).items():
            batch = [wire.PutRequest(key=items[i][0], value=items[i][1], partition_key=items[i][2],
                                     expected_version_id=items[i][3]) for i in indexes]
            retried = False

            def note_retry():
                nonlocal retried
                retried = True

            def send():
                if guard is not None:
                    guard()
                return self._send_puts(shard, batch)

            results = self._call("put", f"{len(batch)} keys", send, on_retry=note_retry, count=len(batch))
            for i, result in zip(indexes, results):
                if isinstance(result, oxia.ex.UnexpectedVersionId):
                    self._count_conflicts(1)
                    result = VersionConflict(items[i][0], items[i][3], outcome_unknown=retried)
                elif isinstance(result, BaseException):
                    raise CoordinationError(f"oxia put {items[i][0]} failed: {result!r}")
                out[i] = result
        return out

    def _by_shard(self, keys) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, (key, partition_key) in enumerate(keys):
            groups.setdefault(self._shard(key, partition_key), []).append(i)
        return groups

    @staticmethod
    def _raise_first(results: list) -> list:
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    # --- writes -------------------------------------------------------------------------------

    def put(self, key: str, value: bytes, partition_key: str, expected_version: int | None = None,
            ephemeral: bool = False, guard: Callable[[], None] | None = None) -> int:
        """Write ``value``; with ``expected_version`` only if the key is at that version
        (``oxia.EXPECTED_RECORD_DOES_NOT_EXIST`` = only if absent). Returns the new version id.
        Raises :class:`VersionConflict` when the condition fails.

        ``guard`` is called immediately before every attempt, retries included, and what it
        raises is raised unretried: a write guarded by a time check (PROTOCOL.md section 8,
        timing assumption) re-checks it before each send, so a retry after an outage never
        sends a write whose check has expired."""
        in_transit_failure = False

        def note_retry():
            nonlocal in_transit_failure
            in_transit_failure = True

        def fn():
            if guard is not None:
                guard()
            try:
                if ephemeral:  # needs the client's session
                    session = self._client._session_manager.get_session(self._shard(key, partition_key))
                    try:
                        return self._client.put(key, value, partition_key=partition_key,
                                                expected_version_id=expected_version, ephemeral=True)[1].version_id()
                    except oxia.ex.SessionNotFound:
                        # The server dropped it (this process or the server was away longer than
                        # the session timeout); the client would go on sending it until its own
                        # expiry check notices. Closed, the retry gets a new one. Only this very
                        # session: closing another thread's new one would delete its claims.
                        session.close()
                        raise
                request = wire.PutRequest(key=key, value=value, partition_key=partition_key,
                                          expected_version_id=expected_version)
                return self._combiner("write", self._shard(key, partition_key)).run(request)
            except oxia.ex.UnexpectedVersionId:
                self._count_conflicts(1)
                raise VersionConflict(key, expected_version, outcome_unknown=in_transit_failure) from None

        return self._call("put", key, fn, on_retry=note_retry)

    def _count_conflicts(self, n: int) -> None:
        with self._lock:
            self.stats["cas_conflict"] += n

    def delete(self, key: str, partition_key: str, expected_version: int | None = None) -> bool:
        """Delete ``key`` (only at ``expected_version`` if given). False if it did not exist."""

        def fn():
            try:
                return self._client.delete(key, partition_key=partition_key, expected_version_id=expected_version)
            except oxia.ex.UnexpectedVersionId:
                raise VersionConflict(key, expected_version) from None

        return self._call("delete", key, fn)

    def delete_range(self, start: str, end: str, partition_key: str) -> None:
        """Delete every key in ``[start, end)`` on ``partition_key``'s shard."""
        self._call("delete_range", f"{start}..{end}",
                   lambda: self._client.delete_range(start, end, partition_key=partition_key))

    # --- claims (PROTOCOL.md section 6) -------------------------------------------------------

    def claim(self, key: str, value: bytes, partition_key: str) -> int:
        """Create an ephemeral record that must not exist yet; returns its version id.
        Raises :class:`ClaimHeld` if someone holds it. Session expiry frees it after a crash."""
        try:
            return self.put(key, value, partition_key, expected_version=oxia.EXPECTED_RECORD_DOES_NOT_EXIST,
                            ephemeral=True)
        except VersionConflict as e:
            holder = self.get(key, partition_key)
            if e.outcome_unknown and holder is not None and holder.value == value:
                return holder.version_id  # our own earlier attempt landed
            raise ClaimHeld(f"{key} is held" + (f" by {holder.value.decode(errors='replace')}" if holder else "")) from None

    def release(self, key: str, partition_key: str, version_id: int) -> bool:
        """Delete a claim only if it is still the version we created."""
        try:
            return self.delete(key, partition_key, expected_version=version_id)
        except VersionConflict:
            return False

    # --- lifecycle ----------------------------------------------------------------------------

    def writes(self) -> int:
        with self._lock:
            return sum(self.stats[op] for op in WRITE_OPS)

    def close(self) -> None:
        """Close the client; bounded, since the client's close can hang after a server restart."""
        closer = threading.Thread(target=self._client.close, daemon=True, name="llog-oxia-close")
        closer.start()
        closer.join(_CLOSE_TIMEOUT_S)
        if closer.is_alive():
            log.warning("oxia client close did not finish within %.0fs; abandoning it", _CLOSE_TIMEOUT_S)

    def __enter__(self) -> "Coordination":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

