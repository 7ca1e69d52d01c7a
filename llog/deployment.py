"""One grace period ``G`` per deployment, and clocks that agree with it (docs/protocol.md section 9).

Every timing rule of the protocol is a fraction of ``G`` (``LLOG_GC_GRACE_MS``): writers refuse
blobs older than ``G/2``, materializers stop after ``G/4``, compaction and retention leave
entries younger than ``G`` alone, GC deletes only blobs older than ``G``. Those rules protect one
another only if every process under a root prefix uses the same ``G``: a sink started with an hour
beside a GC of ten minutes would reference blobs the GC may already have deleted. So the first
process that writes, compacts or collects under a root prefix records its ``G`` in
``R/deployment`` (created only if absent), and every later one compares its own with it and
refuses to run with another, naming both.

The rules also compare times taken on different machines, and the blob ages GC judges come from
the S3 server's clock (an object's ``Last-Modified``). A process whose clock is more than
:data:`MAX_SKEW_FRACTION` of ``G`` away from the S3 server's ``Date`` is refused, or, a reader,
warned about.

**The gate** (:func:`pass_gate`, section 9.2): both checks, once per process and config, before
the process's first write. It cannot be skipped: :class:`llog.coordination.Coordination` and
:class:`llog.objects.ObjectStore`, the only code that writes to Oxia and to S3, call it before
their first write (``put``, ``put_many``, ``delete``, ``delete_range``, claims; a blob's PUT, a
batch delete), so whatever runs a protocol step passes it, whoever wrote the code that calls them.
Actors also pass it by name where they start (a broker, a listener, the compaction job's driver
before its GC takes its time, a sink task), so a refused one stops before it reads or plans.
Since the clients call it, this module imports neither: the Oxia client registers itself here
(:func:`register_oxia_client`) for a process whose first write is to S3.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.errors import ClockSkew, ConfigError, GraceMismatch, VersionConflict
from llog.keys import TOPICS_PARTITION_KEY

if TYPE_CHECKING:  # they call the gate before they write: this module imports neither
    from llog.coordination import Coordination
    from llog.objects import ObjectStore

log = logging.getLogger(__name__)

#: How far a process's clock may be from the S3 server's, as a fraction of ``G`` (30 s of the
#: default 10 minutes): well inside the margins the timing rules leave (``G/4`` and more).
MAX_SKEW_FRACTION = 0.05
#: How much older than the moment it is sent an HTTP ``Date`` may be: truncated to the second, and
#: cached for up to a second by some servers.
DATE_SLACK_MS = 2000

#: The clock the gate compares with the S3 server's: this machine's, not an actor's ``clock``
#: (tests shift those to make time pass). A test stands for a machine whose clock is off by
#: replacing it (``monkeypatch.setattr(deployment, "MACHINE_CLOCK", ShiftedClock(s))``).
MACHINE_CLOCK: Clock = SYSTEM


@dataclass(frozen=True)
class _OxiaClient:
    make: Callable[[Config], Coordination]
    expected_absent: int


#: The Oxia client the gate makes when its caller has none (an S3 write first), and Oxia's
#: "absent" version: registered by :mod:`llog.coordination` as it is imported.
_oxia: _OxiaClient | None = None


def register_oxia_client(make: Callable[[Config], Coordination], expected_absent: int) -> None:
    """What :mod:`llog.coordination` hands the gate: how to make its client, and the expected
    version of a create if absent."""
    global _oxia
    _oxia = _OxiaClient(make, expected_absent)


def deployment_key(root: str) -> str:
    """``R/deployment``: the deployment record, on the topic records' shard."""
    return f"{root}/deployment"


@dataclass(frozen=True)
class Deployment:
    gc_grace_ms: int
    created_at_ms: int
    created_by: str


def agree_on_grace(coordination: Coordination, config: Config, clock: Clock, who: str) -> Deployment:
    """Record this process's ``G`` under the root prefix if none is recorded yet; otherwise
    raise :class:`GraceMismatch` unless it equals the recorded one. ``who`` names the process
    in the record and in errors."""
    key, pk = deployment_key(config.root_prefix), TOPICS_PARTITION_KEY
    for _ in range(2):
        found = coordination.get(key, pk)
        if found is not None:
            raw = json.loads(found.value)
            recorded = Deployment(int(raw["gc_grace_ms"]), int(raw.get("created_at_ms", 0)),
                                  str(raw.get("created_by", "?")))
            if recorded.gc_grace_ms != config.gc_grace_ms:
                raise GraceMismatch(
                    f"{who} runs with LLOG_GC_GRACE_MS={config.gc_grace_ms}, but root prefix {config.root_prefix!r} "
                    f"was set up with {recorded.gc_grace_ms} (by {recorded.created_by}): every writer, compactor, "
                    f"retention pass, GC and sink under one root prefix must use the same grace period, or blobs "
                    f"one of them still references may be deleted by another")
            return recorded
        mine = Deployment(config.gc_grace_ms, clock.now_ms(), who)
        try:
            coordination.put(key, json.dumps(mine.__dict__).encode(), pk, _oxia.expected_absent)
            log.info("root prefix %r: recorded LLOG_GC_GRACE_MS=%d", config.root_prefix, config.gc_grace_ms)
            return mine
        except VersionConflict:
            continue  # another process recorded one first (or our attempt landed): compare with it
    raise AssertionError("unreachable: the record exists after a conflict")


def clock_skew_ms(objects, clock: Clock) -> tuple[int, int]:
    """The range of skews (this clock minus the S3 server's, in ms) consistent with one reading of
    the server's ``Date``: it was stamped between this clock's readings before and after the
    request, truncated to the second, and may be up to a second old (servers such as the local
    one, on fasthttp, refresh a cached ``Date`` once a second)."""
    server_ms, started_ms, ended_ms = objects.server_time_ms(clock)
    return started_ms - server_ms - DATE_SLACK_MS, ended_ms - server_ms


def check_clock(objects, config: Config, clock: Clock, refuse: bool = True) -> int:
    """:class:`ClockSkew` (``refuse``) or a warning when this clock is surely more than
    :data:`MAX_SKEW_FRACTION` of ``G`` away from the S3 server's: when no skew within that
    allowance fits the reading (:func:`clock_skew_ms`). Returns the smallest skew that fits, in ms."""
    low, high = clock_skew_ms(objects, clock)
    skew = 0 if low <= 0 <= high else (low if low > 0 else high)
    allowed = int(config.gc_grace_ms * MAX_SKEW_FRACTION)
    if abs(skew) > allowed:
        message = (f"this machine's clock is {skew / 1000:+.1f} s off the S3 server's; at most {allowed / 1000:.1f} s "
                   f"({MAX_SKEW_FRACTION:.0%} of LLOG_GC_GRACE_MS={config.gc_grace_ms}) is allowed: the protocol's "
                   f"timing rules compare blob ages across machines (synchronize the clock, e.g. with NTP)")
        if refuse:
            raise ClockSkew(message)
        log.warning("%s", message)
    return skew


def check_deployment(coordination: Coordination, objects: ObjectStore, config: Config, who: str) -> Deployment:
    """The gate's checks (section 9.2): the machine's clock close to the S3 server's
    (:func:`check_clock` on :data:`MACHINE_CLOCK`), then one ``G`` (:func:`agree_on_grace`).
    The clock first: a machine refused for it records nothing, not even ``R/deployment``."""
    check_clock(objects, config, MACHINE_CLOCK)
    return agree_on_grace(coordination, config, MACHINE_CLOCK, who)


#: By config, what the gate found for it in this process (:func:`pass_gate`).
_passed: dict[Config, Deployment] = {}
_config_locks: dict[Config, threading.Lock] = {}
_registry_lock = threading.Lock()
#: The configs this thread is checking now: the gate's own create of ``R/deployment`` goes through.
_checking = threading.local()


def process_name() -> str:
    """How a process that did not name itself is named in ``R/deployment`` and in errors: its
    program, host and pid."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{program} on {socket.gethostname()} (pid {os.getpid()})"


def pass_gate(config: Config, coordination: Coordination | None = None, objects: ObjectStore | None = None,
              who: str | None = None, make_objects: Callable[[Config], ObjectStore] | None = None) -> bool:
    """The deployment gate (section 9.2): before this process first writes under
    ``config.root_prefix``, its clock and its ``G`` (:func:`check_deployment`); raises
    :class:`ClockSkew` or :class:`GraceMismatch` and lets nothing be written while they fail.
    Once passed, never again for this config in this process (threads wait for the one that
    checks). ``coordination`` and ``objects``: the caller's clients; for one not given, a client
    made for the check and closed after it (S3's by ``make_objects``). ``who`` names the actor
    (default: :func:`process_name`).

    Returns True once passed; False only when called back from the gate's own create of
    ``R/deployment`` (the Oxia client calls it before every write), which goes through."""
    if config in _passed:
        return True
    checking = getattr(_checking, "configs", None)
    if checking is not None and config in checking:
        return False
    with _registry_lock:
        lock = _config_locks.setdefault(config, threading.Lock())
    with lock:
        if config in _passed:
            return True
        _checking.configs = (checking or frozenset()) | {config}
        try:
            with _clients(config, coordination, objects, make_objects) as (coordination, objects):
                _passed[config] = check_deployment(coordination, objects, config, who or process_name())
        finally:
            _checking.configs = checking
    return True


@contextmanager
def _clients(config: Config, coordination: Coordination | None, objects: ObjectStore | None,
             make_objects: Callable[[Config], ObjectStore] | None):
    """The clients given, and for one not given a client of its own, closed after the check."""
    if _oxia is None:  # nothing in this process has imported llog.coordination: nothing reads Oxia
        raise ConfigError("the deployment gate reads R/deployment in Oxia, and this process has no Oxia client "
                          "(llog.coordination was never imported)")
    if objects is None and make_objects is None:
        raise ConfigError("the deployment gate compares this machine's clock with the S3 server's, and was given "
                          "no S3 client")
    made = []
    if coordination is None:
        coordination = _oxia.make(config)
        made.append(coordination)
    if objects is None:
        objects = make_objects(config)
        made.append(objects)
    try:
        yield coordination, objects
    finally:
        for client in made:
            client.close()
