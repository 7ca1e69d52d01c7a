"""The balancer in front of ``llog stack up --brokers N``: HAProxy (:data:`HAPROXY`), its config
(a partition's requests to one broker, by the consistent hash of :data:`PARTITION_HEADER`) and its
statistics (docs/brokers.md)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from llog.errors import LlogError
from llog_tools.stack.network import HOST, http_text
from llog_tools.stack.state import StackPaths, read_record


#: The load balancer in front of ``--brokers N``: Debian's HAProxy (``apt-get install haproxy``).
HAPROXY = "/usr/sbin/haproxy"

#: The request header whose value (``topic/partition``) the balancer hashes to pick a broker, so
#: that one broker produces a partition and serves its consumes from its tail cache.
PARTITION_HEADER = "X-Llog-Partition"

#: The response header the balancer adds: the name of the broker that answered (``broker-0``..).
BROKER_HEADER = "X-Llog-Broker"

#: Seconds the balancer waits for a broker's answer: more than a long poll's longest wait
#: (``LLOG_BROKER_MAX_WAIT_MS``, 30 s by default).
_BALANCER_SERVER_TIMEOUT_S = 65


def haproxy_config(port: int, stats_port: int, brokers: Sequence[Mapping], split_roles: bool) -> str:
    """HAProxy's config for the balancer on ``port`` (statistics on ``stats_port``, ``/stats``;
    ``/stats;csv`` as CSV) in front of ``brokers`` (their ``record["brokers"]`` entries).

    ``balance hdr(X-Llog-Partition)`` with ``hash-type consistent``: a key maps to one broker,
    and a broker going down moves only its own keys (each to the next broker on the ring), back
    once it is up; a request without the header goes round robin. ``retries`` with
    ``option redispatch``: a connection refused (a broker just killed, not yet marked down) is
    tried again on another broker; a request a broker accepted is never sent twice. One thread:
    on a machine of 2 cores the brokers need the CPU more than HAProxy does."""
    def servers(role: str | None) -> list[str]:
        return [f"    server {b['name']} {HOST}:{b['port']} check" for b in brokers if role in (None, b["role"])]

    def backend(name: str, role: str | None) -> list[str]:
        return [f"backend {name}", f"    balance hdr({PARTITION_HEADER})", "    hash-type consistent",
                "    option httpchk GET /health", "    http-check expect status 200",
                "    default-server inter 500ms fall 2 rise 2", *servers(role), ""]

    lines = [
        f"# written by llog stack up: {len(brokers)} brokers{' (split roles)' if split_roles else ''}",
        "global", "    nbthread 1", "    maxconn 4096", "    log stderr format raw local0 notice", "",
        "defaults", "    mode http", "    log global", "    option httplog", "    option dontlog-normal",
        "    option redispatch", "    retries 3", "    timeout connect 2s", "    timeout queue 10s",
        "    timeout client 70s", f"    timeout server {_BALANCER_SERVER_TIMEOUT_S}s",
        "    timeout http-keep-alive 30s", "",
        "frontend brokers", f"    bind {HOST}:{port}", f"    http-response set-header {BROKER_HEADER} %s",
    ]
    if split_roles:
        lines += ["    acl writes path /produce /producers", "    acl reads path /consume",
                  "    acl reads path_beg /groups/", "    use_backend writers if writes",
                  "    use_backend readers if reads"]
    lines += ["    default_backend brokers", "", *backend("brokers", None)]
    if split_roles:
        lines += [*backend("writers", "write"), *backend("readers", "read")]
    lines += ["listen stats", f"    bind {HOST}:{stats_port}", "    stats enable", "    stats uri /stats", ""]
    return "\n".join(lines)


def haproxy_stats(stack_dir: Path | None = None) -> list[dict[str, str]]:
    """The balancer's statistics (HAProxy's ``/stats;csv``): one row per frontend, backend and
    server, each a dict of its columns (``pxname``, ``svname``, ``status``, ``stot`` requests,
    ``hrsp_5xx``, ``qtime``/``rtime`` ms, ...); empty without a balancer or an answer."""
    record = read_record(StackPaths(stack_dir)) or {}
    balancer = (record.get("broker") or {}).get("balancer")
    return [] if balancer is None else read_haproxy_stats(balancer["stats_url"])


def read_haproxy_stats(stats_url: str) -> list[dict[str, str]]:
    """HAProxy's statistics at ``stats_url`` (its ``stats uri``) as :func:`haproxy_stats` gives them."""
    text = http_text(stats_url + ";csv")
    if not text:
        return []
    header, *rows = text.lstrip("# ").splitlines()
    names = header.split(",")
    return [dict(zip(names, row.split(","))) for row in rows if row]


def wait_balanced(paths: StackPaths, deadline: float, timeout_s: float) -> None:
    """Until ``deadline``, wait for the balancer to see every broker up (its health checks)."""
    while True:
        rows = haproxy_stats(paths.root)
        down = sorted({r["svname"] for r in rows if r["svname"] not in ("FRONTEND", "BACKEND")
                       and r["status"] not in ("UP", "no check")})
        if rows and not down:
            return
        if time.monotonic() > deadline:
            raise LlogError(f"HAProxy does not see {', '.join(down) or 'its brokers'} up within {timeout_s:.0f} s")
        time.sleep(0.1)
