"""Raw Kafka requests for the Kafka listener's tests: what a client library does not let a test
send (a batch sent twice to two listeners, a corrupt batch, a version not served)."""

from __future__ import annotations

import socket
import struct


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
