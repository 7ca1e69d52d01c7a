"""The stack's network: its address (loopback), its ports (defaults, ``--<name>-port`` and
``LLOG_STACK_<NAME>_PORT``, free ones for tests) and the HTTP probes its health checks make."""

from __future__ import annotations

import dataclasses
import http.client
import os
import socket
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from llog.errors import ConfigError


#: The stack's address: every server of it listens on loopback only.
HOST = "127.0.0.1"


@dataclass(frozen=True)
class StackPorts:
    """The TCP ports of the stack, all on 127.0.0.1."""

    oxia: int
    oxia_metrics: int
    s3: int

    @classmethod
    def from_record(cls, ports: Mapping[str, int]) -> "StackPorts":
        """From ``stack.json``; a record of an older stack may name ports it no longer has."""
        return cls(**{field.name: ports[field.name] for field in dataclasses.fields(cls)})


DEFAULT_PORTS = StackPorts(oxia=16648, oxia_metrics=16649, s3=18333)

#: Each port's name in messages and in ``llog stack up --help``.
PORT_LABELS = {
    "oxia": "Oxia",
    "oxia_metrics": "Oxia metrics",
    "s3": "S3",
}

#: Seconds a health probe waits for an answer.
PROBE_TIMEOUT_S = 2


def port_env(name: str) -> str:
    return f"LLOG_STACK_{name.upper()}_PORT"


def resolve_ports(overrides: Mapping[str, int | None] | None = None,
                  env: Mapping[str, str] | None = None) -> StackPorts:
    """Ports from ``overrides`` (field name to port, None = unset), else ``LLOG_STACK_<NAME>_PORT``,
    else :data:`DEFAULT_PORTS`."""
    env = os.environ if env is None else env
    overrides = overrides or {}
    values = {}
    for name in PORT_LABELS:
        if overrides.get(name) is not None:
            values[name] = overrides[name]
        elif env.get(port_env(name)):
            try:
                values[name] = int(env[port_env(name)])
            except ValueError:
                raise ConfigError(f"{port_env(name)}={env[port_env(name)]!r} is not a port number") from None
        else:
            values[name] = getattr(DEFAULT_PORTS, name)
    return StackPorts(**values)


def free_ports() -> StackPorts:
    """Free ports chosen by the system, distinct. For tests."""
    return StackPorts(*system_ports(len(PORT_LABELS)))


def system_ports(count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """``count`` distinct free ports chosen by the system, none in ``avoid``."""
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)  # held open until all are chosen, so none is chosen twice
            sock.bind((HOST, 0))
            if sock.getsockname()[1] not in avoid:
                chosen.append(sock.getsockname()[1])
        return chosen
    finally:
        for sock in held:
            sock.close()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):
        return False


def http_text(url: str) -> str | None:
    """The body of a GET of ``url`` if it answers 200, else None."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            return response.read().decode(errors="replace") if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
