"""The broker's HTTP surface as a bare ASGI application (no framework: five routes do not need
one, and a request/route layer costs a quarter of the throughput here; see
``shared/research/broker/recommendation.md``). Bodies are decoded and encoded with msgspec
(:mod:`broker_lite.models`).

Built so far: ``GET /health`` and ``POST /produce`` (the seed's contract, ``HTTP_API.txt``),
answered through the group commit (:mod:`broker_lite.batcher`):

- 200: every topic-partition group committed, each with its offsets;
- 409: at least one group failed (per-partition errors, ``error_type`` the llog error's name),
  the others committed;
- 503 + ``Retry-After``: refused for backpressure, nothing written (every group
  ``BackPressureRejected``), also while shutting down;
- 400: no ``Content-Length`` (a chunked body), an empty or malformed body, a body that does not
  match the request shape, or llog's topic rule broken; the error names the field;
- 413: ``Content-Length`` over ``LLOG_BROKER_MAX_REQUEST_BYTES`` (or the buffer), checked before
  the body is read;
- 404: any other path; 405 is never used (the seed answers 404).

Writer calls never run on the event loop: the group commit runs them in its thread pool, and
the clients are built and closed in a thread at start-up and shutdown (lifespan). Shutdown
answers every admitted request (:meth:`Batcher.close`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid

import msgspec

from broker_lite.batcher import BackPressure, Batcher, BatcherClosed, Outcome, RequestTooLarge
from broker_lite.models import ErrorBody, Health, ProduceRequest, ProduceResponse, ProduceResult
from llog.config import Config
from llog.errors import EmptyAppend, InvalidPartition, InvalidPayload, InvalidTopicName, LlogError
from llog.writer import AppendGroup, LogWriter

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_PRODUCE = msgspec.json.Decoder(ProduceRequest)
_ENCODE = msgspec.json.Encoder()
#: llog errors that mean the request itself is bad (a 400), raised when it is admitted.
_BAD_INPUT = (InvalidTopicName, InvalidPartition, InvalidPayload, EmptyAppend)
BACKPRESSURE = "BackPressureRejected"


class _Refused(Exception):
    """A request refused as a whole: ``status`` with an :class:`ErrorBody`."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type = status, error_type


class BrokerApp:
    """The ASGI application. ``host``/``port`` are what ``/health`` reports."""

    def __init__(self, config: Config, host: str = "127.0.0.1", port: int = 8080, broker_id: str | None = None):
        self.config = config.require("oxia_service_address", "s3_bucket")
        self.host, self.port = host, port
        self.broker_id = broker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.max_request_bytes = min(config.broker_max_request_bytes, config.batch_max_buffer_bytes)
        self.started_at_ms = int(time.time() * 1000)
        self.writer: LogWriter | None = None
        self.batcher: Batcher | None = None

    # --- lifespan -------------------------------------------------------------------------------

    async def start(self) -> None:
        self.writer = await asyncio.to_thread(LogWriter, self.config, auto_initialize=True)
        self.batcher = Batcher(self.writer, self.config)
        log.info("broker %s serving on %s:%d", self.broker_id, self.host, self.port)

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
        if self.writer is not None:
            await asyncio.to_thread(self.writer.close)

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
        method, path = scope["method"], scope["path"]
        headers: list[tuple[bytes, bytes]] = []
        try:
            if method == "GET" and path == "/health":
                status, body = 200, Health("ok", self.broker_id, self.host, self.port, self.started_at_ms)
            elif method == "POST" and path == "/produce":
                raw = await self._body(scope, receive)
                status, body, headers = await self._produce(raw)
            else:
                raise _Refused(404, "NotFound", f"no route for {method} {path}")
        except _Refused as e:
            status, body = e.status, ErrorBody(e.error_type, str(e))
        await send({"type": "http.response.start", "status": status, "headers": _JSON + headers})
        await send({"type": "http.response.body", "body": _ENCODE.encode(body)})

    async def _body(self, scope, receive) -> bytes:
        """The request body, refused before it is read when ``Content-Length`` is missing or too
        large."""
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is None or not length.isdigit():
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
            raise _Refused(400, "EmptyBody", "the request body is empty")
        return raw

    # --- POST /produce --------------------------------------------------------------------------

    async def _produce(self, raw: bytes) -> tuple[int, ProduceResponse, list[tuple[bytes, bytes]]]:
        try:
            request = _PRODUCE.decode(raw)
        except msgspec.ValidationError as e:
            raise _Refused(400, "InvalidRequest", f"the request does not have the produce shape: {e}") from None
        except msgspec.DecodeError as e:
            raise _Refused(400, "MalformedRequest", f"the body is not UTF-8 JSON: {e}") from None
        groups = [AppendGroup(g.topic, g.partition,
                              [r.encode() if isinstance(r, str) else r.base64 for r in g.records])
                  for g in request.topic_partitions]
        try:
            outcomes = await self.batcher.produce(groups)
        except BackPressure as e:
            return self._unavailable(groups, BACKPRESSURE, str(e), e.retry_after_s)
        except BatcherClosed as e:
            return self._unavailable(groups, type(e).__name__, str(e), 1)
        except RequestTooLarge as e:  # the body check above makes this rare (JSON is larger than its records)
            raise _Refused(413, type(e).__name__, str(e)) from None
        except _BAD_INPUT as e:
            raise _Refused(400, type(e).__name__, str(e)) from None
        results = [_result(g, o) for g, o in zip(groups, outcomes)]
        failed = sum(not r.ok for r in results)
        return (409 if failed else 200), ProduceResponse(results, len(results) - failed, failed), []

    @staticmethod
    def _unavailable(groups: list[AppendGroup], error_type: str, message: str, retry_after_s: int):
        results = [ProduceResult(g.topic, g.partition, False, error_type=error_type, error=message) for g in groups]
        body = ProduceResponse(results, 0, len(results), retry_after_ms=retry_after_s * 1000)
        return 503, body, [(b"retry-after", str(retry_after_s).encode())]


def _result(group: AppendGroup, outcome: Outcome) -> ProduceResult:
    if isinstance(outcome, BaseException):
        error_type = type(outcome).__name__ if isinstance(outcome, LlogError) else "InternalError"
        return ProduceResult(group.topic, group.partition, False, error_type=error_type, error=str(outcome))
    return ProduceResult(outcome.topic, outcome.partition, True, outcome.start_offset, outcome.end_offset,
                         outcome.count, outcome.index_key, outcome.wal_uri)
