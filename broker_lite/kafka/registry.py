"""The Kafka listeners' registry and group coordinator claims in Oxia (docs/protocol.md section
9.5): each listener registers as ``R/kafka/listeners/{node_id}`` (ephemeral), Metadata names the
registered listeners as the brokers, and ``R/kafka/groups/{group}`` (ephemeral) names the one
listener that coordinates a group.

Oxia calls are blocking: they run in threads, and the state they change (the node id, the cached
brokers, the claims held) is changed on the event loop only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from llog import failpoints
from llog.coordination import Coordination
from llog.errors import ClaimHeld, CorruptRecord, LlogError
from llog.keys import (
    KAFKA_PARTITION_KEY, kafka_group_key, kafka_groups_range, kafka_listener_key, kafka_listeners_range,
)
from llog.records import now_ms

log = logging.getLogger(__name__)

#: How often a listener scans the registry again and checks its own record (section 9.5).
REFRESH_S = 2.0
#: Rounds of "scan, create the lowest free node id" before giving up.
_REGISTER_ATTEMPTS = 16
_MAX_NODE_ID = 2 ** 31 - 1


@dataclass(frozen=True)
class Listener:
    """LISTENER (docs/protocol.md section 9.5): a registered listener, or a group's coordinator."""

    node_id: int
    host: str
    port: int
    broker_id: str
    at_ms: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> Listener:
        try:
            obj = json.loads(raw)
            listener = cls(**{name: obj[name] for name in ("node_id", "host", "port", "broker_id", "at_ms")})
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptRecord(f"{key}: not a LISTENER record ({e})") from None
        if (not isinstance(listener.node_id, int) or not 0 <= listener.node_id <= _MAX_NODE_ID
                or not isinstance(listener.port, int) or not isinstance(listener.host, str)):
            raise CorruptRecord(f"{key}: not a LISTENER record: {raw[:200]!r}")
        return listener


class ListenerRegistry:
    """This listener's registration, the registered listeners (refreshed every
    :data:`REFRESH_S`), and the groups it coordinates."""

    def __init__(self, coordination: Coordination, root: str, host: str, port: int, broker_id: str,
                 session_timeout_ms: int):
        self.coordination, self.root = coordination, root
        self.host, self.port, self.broker_id = host, port, broker_id
        self.session_timeout_s = session_timeout_ms / 1000
        self.me: Listener | None = None
        self._version = -1
        self._brokers: list[Listener] = []
        self._claims: dict[str, int] = {}  # group -> the version of its claim we created
        self._releasing: dict[str, asyncio.Task] = {}  # group -> the delete of its claim, under way
        self._last_refresh = time.monotonic()
        self._task: asyncio.Task | None = None
        #: Called with the groups given up when the session is taken as lost, or the listener stops.
        self.on_lost: list[Callable[[list[str]], None]] = []
        self.stopped = False

    @property
    def node_id(self) -> int:
        return self.me.node_id

    def brokers(self) -> list[Listener]:
        """The registered listeners as last scanned, this one always among them, by node id."""
        others = [b for b in self._brokers if b.node_id != self.me.node_id]
        return sorted([self.me, *others], key=lambda b: b.node_id)

    async def start(self) -> None:
        self.me, self._version, self._brokers = await asyncio.to_thread(self._register)
        self._last_refresh = time.monotonic()
        self._task = asyncio.create_task(self._refresh_loop())
        log.info("Kafka listener registered as node %d", self.me.node_id)

    async def stop(self) -> None:
        """Give up every group and the registration (each at the version created), so members
        move to another listener at once."""
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
        claims, self._claims = dict(self._claims), {}
        self._notify(list(claims))
        await asyncio.to_thread(self._release, claims, self.me, self._version)

    def _release(self, claims: dict[str, int], me: Listener | None, version: int) -> None:
        try:
            for group, claimed in claims.items():
                self.coordination.release(kafka_group_key(self.root, group), KAFKA_PARTITION_KEY, claimed)
            if me is not None:
                self.coordination.release(kafka_listener_key(self.root, me.node_id), KAFKA_PARTITION_KEY, version)
        except LlogError as e:  # the session's end removes them anyway
            log.warning("Kafka listener: releasing its claims failed (%s); they go when its Oxia session ends", e)

    def _release_registrations(self, stale: dict[int, int]) -> None:
        """Delete this process's registrations under node ids it no longer uses (node id ->
        version), each at the version scanned."""
        try:
            for node_id, version in stale.items():
                self.coordination.release(kafka_listener_key(self.root, node_id), KAFKA_PARTITION_KEY, version)
        except LlogError as e:
            log.warning("Kafka listener: deleting its earlier registrations %s failed (%s); trying at the next "
                        "refresh", sorted(stale), e)

    # --- registration ---------------------------------------------------------------------------

    def _scan(self) -> list[tuple[Listener, int]]:
        start, end = kafka_listeners_range(self.root)
        return [(Listener.from_json(v.value, v.key), v.version_id)
                for v in self.coordination.range_scan(start, end, KAFKA_PARTITION_KEY)]

    def _register(self) -> tuple[Listener, int, list[Listener]]:
        """Create ``R/kafka/listeners/{n}`` for the lowest free ``n`` (section 9.5)."""
        for _ in range(_REGISTER_ATTEMPTS):
            found = self._scan()
            taken = {listener.node_id for listener, _ in found}
            node_id = next(n for n in range(len(taken) + 1) if n not in taken)
            me = Listener(node_id, self.host, self.port, self.broker_id, now_ms())
            try:
                version = self.coordination.claim(kafka_listener_key(self.root, node_id), me.to_json(),
                                                  KAFKA_PARTITION_KEY)
            except ClaimHeld:
                continue  # another listener took it meanwhile: scan again
            return me, version, [listener for listener, _ in found] + [me]
        raise LlogError(f"Kafka listener: no free node id after {_REGISTER_ATTEMPTS} rounds of registering")

    async def _refresh_loop(self) -> None:
        while not self.stopped:
            await asyncio.sleep(REFRESH_S)
            try:
                failpoints.hit("kafka_registry.before_refresh_scan")
                found = await asyncio.to_thread(self._scan)
            except LlogError as e:
                log.warning("Kafka listener: scanning the registry failed: %s", e)
                if time.monotonic() - self._last_refresh > self.session_timeout_s:
                    await self._lost("no registry scan succeeded for the Oxia session timeout")
                continue
            self._last_refresh = time.monotonic()
            stale = {listener.node_id: version for listener, version in found
                     if listener.broker_id == self.broker_id and listener.node_id != self.me.node_id}
            if stale:  # an earlier registration of ours whose delete failed (_lost): not a broker
                await asyncio.to_thread(self._release_registrations, stale)
            self._brokers = [listener for listener, _ in found if listener.node_id not in stale]
            if not any(listener.node_id == self.me.node_id and version == self._version
                       for listener, version in found):
                await self._lost(f"its record {kafka_listener_key(self.root, self.me.node_id)} is gone")

    async def _lost(self, why: str) -> None:
        """The Oxia session is taken as lost: give up every group, delete the old registration
        and claims at the versions created (gone already if the session did end; if it lives,
        as when only scans failed, they would otherwise outlive the giving up: section 9.5,
        refresh), and register again."""
        claims, self._claims = dict(self._claims), {}
        log.warning("Kafka listener node %d: %s; giving up its %d group(s) and registering again",
                    self.me.node_id, why, len(claims))
        self._notify(list(claims))
        await asyncio.to_thread(self._release, claims, self.me, self._version)
        try:
            self.me, self._version, self._brokers = await asyncio.to_thread(self._register)
            self._last_refresh = time.monotonic()
        except LlogError as e:
            log.warning("Kafka listener: registering again failed (%s); trying at the next refresh", e)

    def _notify(self, groups: list[str]) -> None:
        for callback in self.on_lost:
            callback(groups)

    # --- group coordinators ---------------------------------------------------------------------

    def holds(self, group: str) -> bool:
        return group in self._claims

    def held(self) -> list[str]:
        """The groups whose claim this listener holds."""
        return list(self._claims)

    def lowest(self) -> bool:
        """Whether this listener has the lowest node id in its view of the registry: the one that
        lists the groups nobody coordinates (docs/kafka.md section 6, ListGroups)."""
        return self.brokers()[0].node_id == self.me.node_id

    async def release(self, group: str) -> None:
        """Delete ``group``'s claim (at the version created), so a group nobody uses leaves no
        record behind (section 9.5, release). A lookup of the group meanwhile waits for it."""
        version = self._claims.pop(group, None)
        if version is None or group in self._releasing:
            return
        task = asyncio.create_task(asyncio.to_thread(self._release, {group: version}, None, -1))
        self._releasing[group] = task
        try:
            await asyncio.shield(task)
        finally:
            if self._releasing.get(group) is task:
                del self._releasing[group]

    async def claimed(self) -> set[str]:
        """The groups some listener holds a claim for (one range scan)."""
        start, end = kafka_groups_range(self.root)
        found = await asyncio.to_thread(self.coordination.range_scan, start, end, KAFKA_PARTITION_KEY)
        return {v.key[len(start):] for v in found if v.key.startswith(start)}

    async def coordinator(self, group: str, claim: bool = True) -> Listener | None:
        """The listener that coordinates ``group``: the holder of its claim; when nobody holds
        it, this listener after claiming it (only with ``claim``; else None)."""
        if group in self._claims:
            return self.me
        releasing = self._releasing.get(group)
        if releasing is not None:  # read the claim once its delete is done, not the record being deleted
            await asyncio.wait({releasing})
        for _ in range(_REGISTER_ATTEMPTS):
            holder, version = await asyncio.to_thread(self._coordinator, group, self.me, claim)
            if version is None or self.stopped:
                return holder
            if holder.node_id == self.me.node_id:  # ours, whichever registration's lookup made it
                self._claims[group] = version
                return self.me
            # Registered anew while claiming: the claim names a node id no longer ours. Delete it
            # (at the version made) and look again as the new registration (section 9.5, refresh).
            await asyncio.to_thread(self._release, {group: version}, None, -1)
        raise LlogError(f"Kafka group {group}: this listener registered anew {_REGISTER_ATTEMPTS} times while "
                        "claiming it")

    def _coordinator(self, group: str, me: Listener, claim: bool) -> tuple[Listener | None, int | None]:
        """``(holder, version)``: the claim's holder, with the claim's version when the holder is
        this listener (``me`` created it, or it names this listener's node id), else None.

        A claim naming this listener's ``broker_id`` is judged against the registration current
        when it is read (``self.me``, read after the get), not ``me``, the one the lookup began
        as: the listener may have registered anew meanwhile, and another lookup claimed the group
        under the new node id (section 9.5, refresh). Only a claim under a node id that is not the
        current one is an old registration's, and deleted."""
        key = kafka_group_key(self.root, group)
        for _ in range(3):
            found = self.coordination.get(key, KAFKA_PARTITION_KEY)
            if found is not None:
                holder = Listener.from_json(found.value, key)
                current = self.me  # after the get: a claim read is never newer than this registration
                if holder.broker_id == current.broker_id and holder.node_id == current.node_id:
                    return holder, found.version_id  # ours: adopted (made by another lookup, or before a refresh)
                if holder.broker_id == current.broker_id:
                    # Ours under a node id of an earlier registration whose delete failed (section
                    # 9.5, refresh): nobody serves it. Delete it at the version read, then claim.
                    self.coordination.release(key, KAFKA_PARTITION_KEY, found.version_id)
                    continue
                return holder, None
            if not claim:
                return None, None
            try:
                claimed = Listener(me.node_id, me.host, me.port, me.broker_id, now_ms())
                return claimed, self.coordination.claim(key, claimed.to_json(), KAFKA_PARTITION_KEY)
            except ClaimHeld:
                continue  # another listener won the create: read who
        raise LlogError(f"{key}: claimed and released three times while being read")

    async def verify(self, group: str) -> bool:
        """Whether this listener still holds ``group``'s claim, at the version it created (one
        get); a lost claim is forgotten."""
        version = self._claims.get(group)
        if version is None:
            return False
        found = await asyncio.to_thread(self.coordination.get, kafka_group_key(self.root, group), KAFKA_PARTITION_KEY)
        if found is not None and found.version_id == version:
            return True
        self._claims.pop(group, None)
        return False
