"""Raw Kafka requests for the Kafka listener's tests: what a client library does not let a test
send (a batch sent twice to two listeners, a corrupt batch, a version not served, requests
pipelined on one connection)."""

from __future__ import annotations

import importlib
import io
import socket
import struct

from aiokafka.record._crecords import DefaultRecordBatchBuilder
from kio.serial import entity_reader, entity_writer


def request(address: str, api_key: int, version: int, body: bytes, correlation: int = 7,
            flexible: bool = False) -> bytes:
    """Send one request (header v1, or v2 when ``flexible``) to ``address`` (``host:port``) on a
    connection of its own and return the response after its correlation id."""
    host, port = address.split(":")
    client = b"test"
    header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client + (b"\0" if flexible else b"")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        frame = header + body
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", read_exactly(sock, 4))[0]
        data = read_exactly(sock, size)
    assert struct.unpack(">i", data[:4])[0] == correlation
    return data[4:]


def read_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the listener closed the connection"
        out += chunk
    return out


class Pipeline:
    """One connection on which a test pipelines requests: :meth:`send` writes a request (kio's
    type for ``api`` at ``version``) without waiting for its answer, :meth:`receive` reads the
    next response, whichever request it answers (a test asserts the order)."""

    def __init__(self, address: str, timeout_s: float = 60):
        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.correlation = 0
        self._sent: dict[int, type] = {}

    def frame(self, api: str, version: int, **fields) -> bytes:
        """The framed request (a new correlation id), remembered so :meth:`receive` reads its
        answer; not sent: :meth:`send` sends it, or several at once with ``sock.sendall``."""
        request_module = importlib.import_module(f"kio.schema.{api}.v{version}.request")
        response_module = importlib.import_module(f"kio.schema.{api}.v{version}.response")
        name = "".join(part.title() for part in api.split("_"))
        request_class = getattr(request_module, f"{name}Request")
        self.correlation += 1
        self._sent[self.correlation] = getattr(response_module, f"{name}Response")
        header_class = request_class.__header_schema__
        out = io.BytesIO()
        entity_writer(header_class)(out, header_class(request_api_key=request_class.__api_key__,
                                                      request_api_version=version, correlation_id=self.correlation,
                                                      client_id="pipeline"))
        entity_writer(request_class)(out, request_class(**fields))
        body = out.getvalue()
        return struct.pack(">i", len(body)) + body

    def send(self, api: str, version: int, **fields) -> int:
        """Send one request; its correlation id."""
        self.sock.sendall(self.frame(api, version, **fields))
        return self.correlation

    def receive(self) -> tuple[int, object]:
        """``(correlation id, response)`` of the next response on the connection."""
        data = memoryview(read_exactly(self.sock, struct.unpack(">i", read_exactly(self.sock, 4))[0]))
        correlation = struct.unpack(">i", data[:4])[0]
        response_class = self._sent.pop(correlation)
        _, used = entity_reader(response_class.__header_schema__)(data, 0)
        return correlation, entity_reader(response_class)(data, used)[0]

    def call(self, api: str, version: int, **fields):
        """Send one request and return its response (with no other request in flight)."""
        correlation = self.send(api, version, **fields)
        answered, response = self.receive()
        assert answered == correlation, f"request {correlation} answered by {answered}"
        return response

    def close(self) -> None:
        self.sock.close()


def record_batch(values: list[bytes], producer_id: int = -1, sequence: int = -1) -> bytes:
    """A record batch (magic 2, uncompressed) of ``values``; idempotent when ``producer_id`` and
    ``sequence`` are given (epoch 0)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=producer_id,
                                        producer_epoch=0, base_sequence=sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())
