"""Oxia access: get, CAS, ceiling get, range scan, delete range, ephemeral claims (docs/protocol.md
section 2), each with a deadline and a bounded retry.

Every request carries a gRPC deadline (``LLOG_OXIA_REQUEST_TIMEOUT_MS``, *T*) added by a channel
interceptor. Connecting takes up to 3 attempts, each waiting at most *T* for the server to answer
and then for its first shard assignments, with a short backoff between; ``close`` runs with a
bound too. Transient failures (unavailable, deadline exceeded, expired session) are retried with
jittered backoff for up to max(30 s, 3 *T*), long enough to ride through an Oxia restart:
channels reconnect within a second of the server coming back, shard assignments follow it, and
a session the server no longer knows is replaced. Every final error names the address. A
conditional write whose earlier attempt failed in transit reports a conflict as
``VersionConflict(outcome_unknown=True)``, since the conflict may be with itself.

Gets and puts from concurrent threads to the same shard share one RPC (:class:`_Combiner`), as
Oxia's Go client batches them: a writer committing eight partitions at once sends one Write per
protocol step instead of eight. Each key keeps its own condition and result.

Requests travel as the protobuf runtime's messages (:mod:`llog.oxia_client_pb2`) on channels of
our own, routed by the shard assignments as Oxia's clients route them (:class:`_Shards`). The
``oxia`` package (0.2.1) is imported only for the sessions behind ephemeral records (claims):
its pure-Python messages cost more than the RPC itself, and importing it (betterproto2,
pydantic) took 0.11 s at the start of every process that plans or reads, a stream's planner
included, which Spark starts anew for every query.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import xxhash

from llog import deployment, failpoints
from llog import oxia_client_pb2 as wire
from llog.config import Config
from llog.errors import ClaimHeld, CoordinationError, ValueTooLarge, VersionConflict, WriteOutcomeUnknown
from llog.metrics import OpTimings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ``expected_version`` of a put that may only create its key (Oxia's -1).
EXPECTED_ABSENT = -1
#: Streams that live as long as the client; they must not get a request deadline.
_LONG_LIVED = ("GetShardAssignments", "GetNotifications", "GetSequenceUpdates", "WriteStream")
_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
}
_SERVICE = "/io.streamnative.oxia.proto.OxiaClient/"
#: Retries are bounded by time (``Coordination._deadline_s``); this caps their number as well.
_RETRY_ATTEMPTS = 100
_RETRY_MAX_WAIT_S = 1.0
#: Connecting: one attempt after each wait, each attempt within the request timeout.
_BUILD_BACKOFF_S = (0.0, 0.5, 1.0)
_CLOSE_TIMEOUT_S = 5.0
#: The value-size budget (docs/protocol.md section 2): every put of a larger value is refused
#: before it is sent (:class:`ValueTooLarge`). Every value kind llog writes is bounded below it.
MAX_VALUE_BYTES = 1024 * 1024
#: gRPC message limit, both ways, on every channel to Oxia: far above the budget, since one
#: message carries many values (a range scan's batch of records, one Write for many puts).
#: gRPC's default receive limit (4 MiB) made a value Oxia had accepted unreadable.
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: A restarted server is reconnected to within a second (gRPC's default backoff grows to 2 min);
#: the message limits set explicitly (:data:`GRPC_MAX_MESSAGE_BYTES`).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES)]
WRITE_OPS = ("put", "delete", "delete_range")


def oxia_key_order(key: str) -> tuple:
    """Sort key of Oxia's hierarchical key order: segment by segment, and a key's last segment
    before any deeper key's segment at that depth (``a/z`` < ``a/b/c``; ``a`` < ``a/``)."""
    segments = key.split("/")
    return (*((1, s) for s in segments[:-1]), (0, segments[-1]))


@dataclass(frozen=True)
class Versioned:
    """A key's value and version id as Oxia returned them."""

    key: str
    value: bytes
    version_id: int


class _Status(Exception):
    """A request's status other than OK (the RPC itself succeeded)."""


class _KeyNotFound(_Status):
    pass


class _UnexpectedVersion(_Status):
    pass


class _SessionNotFound(_Status):
    """The server no longer knows the session an ephemeral put named: retried with a new one."""


class _NoLeader(Exception):
    """The shard assignments name no shard or leader for a request (they are changing): retried."""


_STATUS_ERRORS = {wire.KEY_NOT_FOUND: _KeyNotFound, wire.UNEXPECTED_VERSION_ID: _UnexpectedVersion,
                  wire.SESSION_DOES_NOT_EXIST: _SessionNotFound}


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


class _Channels:
    """One channel per address, reconnecting quickly; with ``timeout_s``, every short request on
    it gets that deadline."""

    def __init__(self, timeout_s: float | None):
        self._lock = threading.Lock()
        self._interceptor = _Deadline(timeout_s) if timeout_s is not None else None
        self._channels: dict[str, tuple[grpc.Channel, grpc.Channel]] = {}

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            pair = self._channels.get(address)
            if pair is None:
                if self._interceptor is None:  # the assignments stream, consumed by its own thread
                    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                    pair = (channel, channel)
                else:
                    # Read and RangeScan are server streams; by default gRPC starts a thread to
                    # consume each one, which costs more than a small read itself.
                    channel = grpc.insecure_channel(address, options=[
                        *CHANNEL_OPTIONS, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
                    pair = (channel, grpc.intercept_channel(channel, self._interceptor))
                self._channels[address] = pair
            return pair[1]

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel, _ in channels:
            channel.close()


class _Shards:
    """A namespace's shards and their leaders, followed on Oxia's shard-assignment stream, and
    the calls to them.

    A key goes to the shard whose hash range holds the low 32 bits of the XXH64 hash of its
    partition key (of the key itself without one), as Oxia's clients route it. An event marks
    the first assignments; updates keep coming; a failed or closed stream stops its thread; the
    stream's backoff is short and wakes up on close. A namespace the server does not have fails
    at once, by name. Raises RuntimeError when no assignments come within ``init_timeout_s``.
    """

    def __init__(self, config: Config, init_timeout_s: float):
        self._service_address = config.oxia_service_address
        self._namespace = config.oxia_namespace
        self._requests = _Channels(config.oxia_request_timeout_ms / 1000)
        self._streams = _Channels(None)  # the long-lived assignments stream (no deadline)
        self._assignments: dict[int, tuple[str, int, int]] = {}  # shard -> (leader, min hash, max hash)
        self._calls: dict[tuple[str, str], Callable] = {}
        self._stubs: dict[str, object] = {}
        self._closed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._wake = threading.Event()
        self._problem = ""  # the stream's last error
        self._fatal: str | None = None  # a problem no retry solves
        self._thread = threading.Thread(target=self._follow, daemon=True, name="llog-oxia-assignments")
        self._thread.start()
        if not self._ready.wait(init_timeout_s) or self._fatal:
            self.close()
            if self._fatal:
                raise CoordinationError(f"Oxia at {self._service_address}: {self._fatal}")
            raise RuntimeError(f"no shard assignments within {init_timeout_s:.1f} s"
                               + (f" (last error: {self._problem})" if self._problem else ""))

    def _follow(self) -> None:
        delay = 0.05
        while not self._closed:
            try:
                assignments = self._streams.get(self._service_address).unary_stream(
                    _SERVICE + "GetShardAssignments", request_serializer=wire.ShardAssignmentsRequest.SerializeToString,
                    response_deserializer=wire.ShardAssignments.FromString)
                for update in assignments(wire.ShardAssignmentsRequest(namespace=self._namespace)):
                    namespace = update.namespaces[self._namespace]
                    if namespace.shard_key_router != wire.XXHASH3:
                        self._fatal = f"unknown shard key router {namespace.shard_key_router}"
                        self._ready.set()
                        return
                    shards = {a.shard: (a.leader, a.int32_hash_range.min_hash_inclusive,
                                        a.int32_hash_range.max_hash_inclusive) for a in namespace.assignments}
                    with self._lock:
                        self._assignments = shards
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

    def shard(self, key: str, partition_key: str | None) -> int:
        h = xxhash.xxh64(partition_key or key).intdigest() & 0xFFFFFFFF
        with self._lock:
            for shard, (_, low, high) in self._assignments.items():
                if low <= h <= high:
                    return shard
        raise _NoLeader(f"no shard of namespace {self._namespace!r} holds the hash of {partition_key or key!r}")

    def shards(self) -> list[int]:
        with self._lock:
            return list(self._assignments)

    def _leader(self, shard: int) -> str:
        with self._lock:
            assigned = self._assignments.get(shard)
        if assigned is None:  # reassigned meanwhile: transient, the retry routes again
            raise _NoLeader(f"shard {shard} has no leader in the current assignments")
        return assigned[0]

    def call(self, shard: int, method: str, request_type, response_type, streamed: bool) -> Callable:
        """``method`` on ``shard``'s leader (a server stream when ``streamed``), with a deadline."""
        leader = self._leader(shard)
        with self._lock:
            call = self._calls.get((leader, method))
        if call is None:
            channel = self._requests.get(leader)
            make = channel.unary_stream if streamed else channel.unary_unary
            call = make(_SERVICE + method, request_serializer=request_type.SerializeToString,
                        response_deserializer=response_type.FromString)
            with self._lock:
                self._calls[(leader, method)] = call
        return call

    def get_stub(self, shard: int):
        """The ``oxia`` package's stub for ``shard``'s leader, on the channel with deadlines: its
        sessions (:func:`_sessions`) call it."""
        from oxia.internal.proto.io.streamnative.oxia.proto import OxiaClientStub

        leader = self._leader(shard)
        with self._lock:
            stub = self._stubs.get(leader)
        if stub is None:
            stub = OxiaClientStub(self._requests.get(leader))
            with self._lock:
                self._stubs[leader] = stub
        return stub

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._streams.close()  # ends the stream
        self._thread.join(_CLOSE_TIMEOUT_S)
        self._requests.close()


def _sessions(shards: _Shards, config: Config):
    """The ``oxia`` package's session manager (a session per shard, kept alive by heartbeats),
    imported when the first ephemeral record is written."""
    from oxia.internal.sessions import SessionManager

    # At least 4 heartbeats per session timeout: the package's default cadence is floored at 2 s,
    # so a session of 2 s got one heartbeat every 1999 ms and expired over and over.
    timeout = config.oxia_session_timeout_ms
    return SessionManager(shards, timeout, config.client_identifier,
                          heartbeat_interval_ms=min(max(timeout // 10, 2000), timeout // 4))


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


def check_value_size(key: str, value: bytes) -> None:
    """The one check every put goes through, before anything is sent: ``value`` within
    :data:`MAX_VALUE_BYTES` (docs/protocol.md section 2); else :class:`ValueTooLarge`."""
    if len(value) > MAX_VALUE_BYTES:
        raise ValueTooLarge(f"{key}: a value of {len(value)} bytes is over the Oxia value budget of {MAX_VALUE_BYTES} "
                            f"bytes (docs/protocol.md section 2); nothing was written")


def _status_error(status: int) -> _Status | None:
    if status == wire.OK:
        return None
    error = _STATUS_ERRORS.get(status)
    return error() if error is not None else _Status(f"unknown status: {status}")


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, grpc.RpcError):
        return error.code() in _TRANSIENT_CODES
    return isinstance(error, (_SessionNotFound, _NoLeader))


def _describe(error: BaseException) -> str:
    """One line for an error; gRPC's own text is a multi-line repr."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return f"{error.code().name}: {error.details() if hasattr(error, 'details') else error}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _wait_ready(address: str, timeout_s: float) -> None:
    """Raises RuntimeError if no connection to ``address`` is ready within ``timeout_s``."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        raise RuntimeError(f"no connection within {timeout_s:.1f} s") from None
    finally:
        # Closing waits for the readiness future's polling thread, 0.2 s: on a thread of its
        # own, so that making a client (a stream's planner starting, say) does not wait for it.
        threading.Thread(target=channel.close, name="llog-oxia-probe-close", daemon=True).start()


def _failed_once(error: BaseException, fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` whose first attempt already failed with ``error``: the retries' first call raises
    it, so that they count it, log it and wait before calling ``fn`` again."""
    pending = [error]

    def attempt() -> T:
        if pending:
            raise pending.pop()
        return fn()

    return attempt


class Coordination:
    """The only code that talks to Oxia. Thread-safe; one per process is enough."""

    def __init__(self, config: Config):
        config.require("oxia_service_address")
        self.config = config
        self._shards = self._connect(config)
        self._sessions = None  # the oxia package's session manager, made by the first claim (_session)
        self._deadline_s = max(30.0, 3 * config.oxia_request_timeout_ms / 1000)
        self._lock = threading.Lock()
        self._combiners: dict[tuple[str, int], _Combiner] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        #: Latency and failures per operation (:meth:`_call`), for whoever exposes metrics.
        self.timings = OpTimings()
        self._gate_passed = False

    def _pass_gate(self) -> None:
        """Before this client's first write: the deployment gate (docs/protocol.md section 9.2)."""
        if not self._gate_passed:
            from llog.objects import ObjectStore  # the gate's S3 client (boto3): where a process first writes

            self._gate_passed = deployment.pass_gate(self.config, coordination=self, make_objects=ObjectStore)

    @staticmethod
    def _connect(config: Config) -> _Shards:
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
                return _Shards(config, max(0.1, attempt_deadline - time.monotonic()))
            except RuntimeError as e:
                problem = str(e)
                log.warning("connecting to Oxia at %s (attempt %d of %d): waiting for %s: %s", address,
                            attempt, len(_BUILD_BACKOFF_S), what, problem)
        raise CoordinationError(
            f"cannot connect to Oxia at {address}: waited for {what} ({problem}); gave up after "
            f"{len(_BUILD_BACKOFF_S)} attempts in {time.monotonic() - started:.1f} s (is it running? "
            "`llog stack status` shows the local one)")

    # --- batched single-key requests ----------------------------------------------------------

    def _shard(self, key: str, partition_key: str | None) -> int:
        return self._shards.shard(key, partition_key)

    def _session(self, shard: int):
        """This client's session on ``shard`` (ephemeral records live as long as it does)."""
        with self._lock:
            if self._sessions is None:
                self._sessions = _sessions(self._shards, self.config)
            sessions = self._sessions
        return sessions.get_session(shard)

    def _combiner(self, kind: str, shard: int) -> _Combiner:
        with self._lock:
            combiner = self._combiners.get((kind, shard))
            if combiner is None:
                send = self._send_gets if kind == "read" else self._send_puts
                combiner = self._combiners[(kind, shard)] = _Combiner(lambda requests: send(shard, requests))
            return combiner

    def _read(self, shard: int) -> Callable:
        return self._shards.call(shard, "Read", wire.ReadRequest, wire.ReadResponse, streamed=True)

    def _write(self, shard: int) -> Callable:
        return self._shards.call(shard, "Write", wire.WriteRequest, wire.WriteResponse, streamed=False)

    def _send_gets(self, shard: int, requests: list) -> list:
        with self._lock:
            self.stats["read_rpc"] += 1
        responses = [g for r in self._read(shard)(wire.ReadRequest(shard=shard, gets=requests)) for g in r.gets]
        if len(responses) != len(requests):
            raise CoordinationError(f"oxia answered {len(responses)} of {len(requests)} gets")
        results = []
        for request, response in zip(requests, responses):
            error = _status_error(response.status)
            if isinstance(error, _KeyNotFound):
                results.append(None)
            else:
                key = response.key if response.HasField("key") else request.key
                results.append(error or Versioned(key, response.value, response.version.version_id))
        return results

    def _send_puts(self, shard: int, requests: list) -> list:
        with self._lock:
            self.stats["write_rpc"] += 1
        response = self._write(shard)(wire.WriteRequest(shard=shard, puts=requests))
        failpoints.hit("coordination.after_write")  # a hook that raises loses the reply of a write that landed
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
        retrying = None
        error = None
        try:
            try:
                return fn()
            except BaseException as e:  # noqa: BLE001 - only a transient failure is retried
                if not _is_transient(e):
                    raise
                retrying = self._retrying(op, what, on_retry, started)
                return retrying(_failed_once(e, fn))
        except (grpc.RpcError, _SessionNotFound, _NoLeader) as e:
            attempts = retrying.statistics.get("attempt_number", 1) if retrying is not None else 1
            error = CoordinationError(
                f"oxia {op} {what} at {self.config.oxia_service_address} failed after {attempts} attempt(s) "
                f"in {time.monotonic() - started:.1f} s: {_describe(e)}")
            raise error from e
        except BaseException as e:
            error = e
            raise
        finally:
            self.timings.observe(op, time.monotonic() - started, error)

    def _retrying(self, op: str, what: str, on_retry: Callable[[], None] | None, started: float):
        """Jittered backoff, bounded in attempts and by the deadline counted from ``started``.
        Imported when a first attempt fails: tenacity imports tornado where it is installed (a
        notebook's kernel needs it), 0.05 s at the start of every process, and most never retry."""
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

        return Retrying(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(_RETRY_ATTEMPTS) | stop_after_delay(
                max(0.0, self._deadline_s - (time.monotonic() - started))),
            wait=wait_random_exponential(multiplier=0.05, max=_RETRY_MAX_WAIT_S),
            before_sleep=lambda state: (on_retry and on_retry(), log.warning(
                "oxia %s %s at %s failed (%s), retrying", op, what, self.config.oxia_service_address,
                _describe(state.outcome.exception()))),
            reraise=True,
        )

    # --- reads --------------------------------------------------------------------------------

    def get(self, key: str, partition_key: str) -> Versioned | None:
        return self._call("get", key, lambda: self._get(key, partition_key, wire.EQUAL))

    def ceiling(self, key: str, partition_key: str | None, within: str) -> Versioned | None:
        """Lowest key >= ``key`` that starts with ``within``; None if there is none.

        Oxia's CEILING answers with the next key in the whole keyspace, which may lie past the
        prefix; that answer means "none" here (docs/protocol.md section 5.2).
        """

        def fn():
            if partition_key is not None:
                found = self._get(key, partition_key, wire.CEILING)
            else:  # every shard's answer; the lowest in Oxia's key order
                request = wire.GetRequest(key=key, include_value=True, comparison_type=wire.CEILING)
                answers = [a for a in (self._combiner("read", shard).run(request) for shard in self._shards.shards())
                           if a is not None]
                found = min(answers, key=lambda a: oxia_key_order(a.key)) if answers else None
            return found if found is not None and found.key.startswith(within) else None

        return self._call("get", f"ceiling {key}", fn)

    def range_scan(self, start: str, end: str, partition_key: str) -> list[Versioned]:
        """Records with keys in ``[start, end)`` in Oxia's key order."""

        def fn():
            shard = self._shard(start, partition_key)
            scan = self._shards.call(shard, "RangeScan", wire.RangeScanRequest, wire.RangeScanResponse, streamed=True)
            return [Versioned(r.key, r.value, r.version.version_id)
                    for response in scan(wire.RangeScanRequest(shard=shard, start_inclusive=start, end_exclusive=end))
                    for r in response.records]

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
        as in :meth:`put`, before every RPC.

        Each key's outcome is its own, and a put that landed is never reported failed: when a
        shard's RPC fails for good, or ``guard`` refuses before one, the shards sent before it
        keep their results and the ones after it are not sent. That error (the guard's own, or
        :class:`CoordinationError`) is raised with ``outcomes`` set on it: per key its version
        id, its :class:`VersionConflict`, :class:`WriteOutcomeUnknown` where an attempt was sent
        and no answer came back (it may have landed), or None where nothing was sent."""
        for key, value, _, _ in items:
            check_value_size(key, value)
        self._pass_gate()
        out: list[int | VersionConflict | BaseException | None] = [None] * len(items)
        for shard, indexes in self._by_shard((key, pk) for key, _, pk, _ in items).items():
            batch = [wire.PutRequest(key=items[i][0], value=items[i][1], partition_key=items[i][2],
                                     expected_version_id=items[i][3]) for i in indexes]
            retried = sent = False

            def note_retry():
                nonlocal retried
                retried = True

            def send():
                nonlocal sent
                if guard is not None:
                    guard()
                sent = True  # from here on, this shard's puts may land whatever comes back
                return self._send_puts(shard, batch)

            try:
                results = self._call("put", f"{len(batch)} keys", send, on_retry=note_retry, count=len(batch))
            except Exception as e:
                if sent:
                    for i in indexes:
                        out[i] = WriteOutcomeUnknown(items[i][0], e)
                e.outcomes = out
                raise
            for i, result in zip(indexes, results):
                if isinstance(result, _UnexpectedVersion):
                    self._count_conflicts(1)
                    result = VersionConflict(items[i][0], items[i][3], outcome_unknown=retried)
                elif isinstance(result, BaseException):  # the server refused this put: not written
                    result = CoordinationError(f"oxia put {items[i][0]} failed: {result!r}")
                out[i] = result
            refused = next((out[i] for i in indexes if isinstance(out[i], CoordinationError)), None)
            if refused is not None:  # as an RPC that failed: the shards after it are not sent
                refused.outcomes = out
                raise refused
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
        (:data:`EXPECTED_ABSENT` = only if absent). Returns the new version id.
        Raises :class:`VersionConflict` when the condition fails.

        ``guard`` is called immediately before every attempt, retries included, and what it
        raises is raised unretried: a write guarded by a time check (docs/protocol.md section 8,
        timing assumption) re-checks it before each send, so a retry after an outage never
        sends a write whose check has expired."""
        check_value_size(key, value)
        self._pass_gate()
        in_transit_failure = False

        def note_retry():
            nonlocal in_transit_failure
            in_transit_failure = True

        def fn():
            if guard is not None:
                guard()
            shard = self._shard(key, partition_key)
            try:
                if ephemeral:  # needs the client's session
                    session = self._session(shard)
                    request = wire.PutRequest(key=key, value=value, partition_key=partition_key,
                                              expected_version_id=expected_version, session_id=session.session_id(),
                                              client_identity=session.client_identifier())
                    try:
                        return self._combiner("write", shard).run(request)
                    except _SessionNotFound:
                        # The server dropped it (this process or the server was away longer than
                        # the session timeout); the client would go on sending it until its own
                        # expiry check notices. Closed, the retry gets a new one. Only this very
                        # session: closing another thread's new one would delete its claims.
                        session.close()
                        raise
                request = wire.PutRequest(key=key, value=value, partition_key=partition_key,
                                          expected_version_id=expected_version)
                return self._combiner("write", shard).run(request)
            except _UnexpectedVersion:
                self._count_conflicts(1)
                raise VersionConflict(key, expected_version, outcome_unknown=in_transit_failure) from None

        return self._call("put", key, fn, on_retry=note_retry)

    def _count_conflicts(self, n: int) -> None:
        with self._lock:
            self.stats["cas_conflict"] += n

    def delete(self, key: str, partition_key: str, expected_version: int | None = None) -> bool:
        """Delete ``key`` (only at ``expected_version`` if given). False if it did not exist."""
        self._pass_gate()

        def fn():
            shard = self._shard(key, partition_key)
            request = wire.DeleteRequest(key=key, expected_version_id=expected_version)
            status = self._write(shard)(wire.WriteRequest(shard=shard, deletes=[request])).deletes[0].status
            if status == wire.KEY_NOT_FOUND:
                return False
            if status == wire.UNEXPECTED_VERSION_ID:
                raise VersionConflict(key, expected_version)
            if status != wire.OK:
                raise _status_error(status)
            return True

        return self._call("delete", key, fn)

    def delete_range(self, start: str, end: str, partition_key: str) -> None:
        """Delete every key in ``[start, end)`` on ``partition_key``'s shard."""
        self._pass_gate()

        def fn():
            shard = self._shard(partition_key, partition_key)
            request = wire.DeleteRangeRequest(start_inclusive=start, end_exclusive=end)
            error = _status_error(self._write(shard)(wire.WriteRequest(shard=shard, delete_ranges=[request]))
                                  .delete_ranges[0].status)
            if error is not None:
                raise error

        self._call("delete_range", f"{start}..{end}", fn)

    # --- claims (docs/protocol.md section 6) -------------------------------------------------------

    def claim(self, key: str, value: bytes, partition_key: str) -> int:
        """Create an ephemeral record that must not exist yet; returns its version id.
        Raises :class:`ClaimHeld` if someone holds it. Session expiry frees it after a crash."""
        try:
            return self.put(key, value, partition_key, expected_version=EXPECTED_ABSENT,
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
        def close() -> None:
            if self._sessions is not None:
                self._sessions.close()  # first: closing a session is a request to its shard
            self._shards.close()

        closer = threading.Thread(target=close, daemon=True, name="llog-oxia-close")
        closer.start()
        closer.join(_CLOSE_TIMEOUT_S)
        if closer.is_alive():
            log.warning("oxia client close did not finish within %.0fs; abandoning it", _CLOSE_TIMEOUT_S)

    def __enter__(self) -> "Coordination":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


deployment.register_oxia_client(Coordination, EXPECTED_ABSENT)  # the gate's Oxia client, for an S3 write first
