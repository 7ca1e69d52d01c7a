"""Kafka's classic consumer groups on the listener (docs/kafka.md section 6): FindCoordinator,
JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups and
DescribeGroups, registered with :func:`~broker_lite.kafka.server.serve`.

The clients run the assignors; the coordinator runs membership, as Kafka's classic group
coordinator does: a group is Empty, PreparingRebalance (members join, within the rebalance
timeout), CompletingRebalance (the leader got the members and sends the assignment) or Stable
(members heartbeat within their session timeout). Membership lives in this listener's memory,
for the groups whose claim in Oxia it holds (:mod:`broker_lite.kafka.registry`, docs/protocol.md
section 9.5); committed offsets are llog's consumer-group records (:mod:`llog.consumer_groups`),
so every listener, ``llog groups describe``, the HTTP broker and the Spark source see them.

Everything here runs on the event loop; Oxia calls run in threads.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
import time
import uuid
import weakref
from dataclasses import dataclass, field

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from kio.schema.errors import ErrorCode

from broker_lite.kafka.server import CLIENT, _build, error_code, serve
from llog.consumer_groups import (
    MAX_METADATA_BYTES, committed_offsets, delete_offsets, groups_with_offsets, has_offsets, store_offsets,
)
from llog.discovery import partitions_of
from llog.errors import InvalidGroupId, InvalidOffset, InvalidTopicName, LlogError, TopicNotFound
from llog.keys import TopicPartition, validate_group
from llog.records import ConsumerOffset

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
#: Kafka's ``group.min.session.timeout.ms`` and ``group.max.session.timeout.ms`` defaults.
MIN_SESSION_TIMEOUT_MS, MAX_SESSION_TIMEOUT_MS = 6_000, 1_800_000
#: Kafka's ``group.initial.rebalance.delay.ms`` default: the first rebalance of an empty group
#: waits this long (at most its rebalance timeout) for more members.
INITIAL_REBALANCE_DELAY_MS = 3_000
#: How often session timeouts and rebalance deadlines are checked.
SWEEP_S = 0.25
#: A claim whose group has had no member, no pending member id and no request for this long is
#: released (docs/protocol.md section 9.5, release). Long enough for the OffsetCommit that follows
#: a FindCoordinator, and for the commits of a consumer that assigns partitions itself (every 5 s
#: by default) to keep the claim they use.
IDLE_RELEASE_S = 5.0
#: Kafka's transaction coordinator key type (FindCoordinator v1+): transactions are not served.
_TRANSACTION = 1
_NONE = datetime.timedelta(0)
#: The protocol type of Kafka's consumers, whose metadata names the topics they subscribe to.
CONSUMER_PROTOCOL = "consumer"
_SEEN_STATES = {s.lower(): s for s in (EMPTY, PREPARING, COMPLETING, STABLE, DEAD)}


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    group_instance_id: str | None = None
    assignment: bytes = b""
    seen: float = field(default_factory=time.monotonic)
    #: The pending JoinGroup (PreparingRebalance) and SyncGroup (CompletingRebalance) answers.
    join: asyncio.Future | None = None
    sync: asyncio.Future | None = None

    def metadata(self, protocol: str) -> bytes:
        return next(m for name, m in self.protocols if name == protocol)


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    #: Member ids handed out with MEMBER_ID_REQUIRED (JoinGroup v4+), until when they may join.
    pending: dict[str, float] = field(default_factory=dict)
    #: PreparingRebalance: the join completes once every member joined, not before ``ready_at``
    #: (the initial delay), and at ``deadline`` without those that did not.
    ready_at: float = 0.0
    deadline: float = 0.0
    completing: bool = False
    #: CompletingRebalance: by when the leader's SyncGroup must have come.
    sync_deadline: float = 0.0
    #: Static members (KIP-345): group.instance.id -> the member id that holds it now.
    static: dict[str, str] = field(default_factory=dict)

    def drop(self, member: Member) -> None:
        """Forget ``member`` (and its instance id, while it holds it)."""
        del self.members[member.member_id]
        if member.group_instance_id is not None and self.static.get(member.group_instance_id) == member.member_id:
            del self.static[member.group_instance_id]

    def idle(self) -> bool:
        """No member, no member id handed out, no rebalance or delete under way."""
        return not self.members and not self.pending and self.state == EMPTY and not self.completing

    def supported(self) -> set[str]:
        """The protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()


@dataclass(frozen=True)
class _Joined:
    """A JoinGroup answer, built into the version asked by its handler."""

    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()


class GroupCoordinator:
    """The groups one listener coordinates."""

    def __init__(self, listener):
        self.listener = listener
        self.registry = listener.registry
        self.groups: dict[str, Group] = {}
        #: When a request last used each group whose claim this listener holds.
        self.touched: dict[str, float] = {}
        self.registry.on_lost.append(self._give_up)
        self._sweeper = asyncio.create_task(self._sweep())

    # --- ownership ------------------------------------------------------------------------------

    async def owned(self, group_id: str, create: bool = True) -> Group | None:
        """The group's state when this listener coordinates it (claiming it when free), else None
        (also when Oxia cannot say: the member is answered NOT_COORDINATOR and looks again)."""
        try:
            holder = await self.registry.coordinator(group_id)
        except LlogError as e:
            log.warning("Kafka group %s: finding its coordinator failed: %s", group_id, e)
            return None
        if holder is None or holder.node_id != self.registry.node_id or not self.registry.holds(group_id):
            return None
        self.touched[group_id] = time.monotonic()
        group = self.groups.get(group_id)
        if group is None and create:
            group = self.groups[group_id] = Group(group_id)
        return group

    def _give_up(self, group_ids: list[str]) -> None:
        """The claims are lost (or the listener stops): pending answers say NOT_COORDINATOR and the
        members look the coordinator up again."""
        for group_id in group_ids:
            self.touched.pop(group_id, None)
            group = self.groups.pop(group_id, None)
            if group is None:
                continue
            for member in group.members.values():
                _answer(member.join, _Joined(ErrorCode.not_coordinator, member.member_id))
                _answer(member.sync, (ErrorCode.not_coordinator, b""))
            log.info("Kafka group %s: no longer coordinated here", group_id)

    # --- the state machine ----------------------------------------------------------------------

    def prepare(self, group: Group, why: str) -> None:
        """Start a rebalance: every member must join again within the rebalance timeout."""
        if group.state == PREPARING:
            return
        now = time.monotonic()
        if group.state == COMPLETING:  # the assignment being sent is void
            for member in group.members.values():
                _answer(member.sync, (ErrorCode.rebalance_in_progress, b""))
                member.sync = None
        timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=0.0)
        delay = min(INITIAL_REBALANCE_DELAY_MS / 1000, timeout) if group.state == EMPTY else 0.0
        group.state, group.ready_at, group.deadline = PREPARING, now + delay, now + timeout
        log.info("Kafka group %s: rebalancing (%s)", group.group_id, why)

    def maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING or group.completing:
            return
        now = time.monotonic()
        everyone = all(m.join is not None for m in group.members.values())
        if (everyone and now >= group.ready_at) or now >= group.deadline:
            group.completing = True
            asyncio.create_task(self._complete_join(group))

    async def _complete_join(self, group: Group) -> None:
        """The new generation: members that did not join are removed; the leader gets every
        member's metadata. The claim is checked first (docs/protocol.md section 9.5)."""
        try:
            try:
                ours = await self.registry.verify(group.group_id)
            except LlogError as e:
                log.warning("Kafka group %s: checking the claim failed (%s); trying again", group.group_id, e)
                await asyncio.sleep(SWEEP_S)
                return
            if not ours:
                self._give_up([group.group_id])
                return
            if group.state != PREPARING or self.groups.get(group.group_id) is not group:
                return
            for member in [m for m in group.members.values() if m.join is None]:
                log.info("Kafka group %s: member %s did not join in time", group.group_id, member.member_id)
                group.drop(member)
            group.generation += 1
            now = time.monotonic()
            if not group.members:
                group.state, group.protocol, group.leader = EMPTY, None, None
                return
            candidates = group.supported()
            votes: dict[str, int] = {}
            for member in group.members.values():  # each member votes for its first choice all support
                choice = next(name for name, _ in member.protocols if name in candidates)
                votes[choice] = votes.get(choice, 0) + 1
            group.protocol = max(sorted(votes), key=lambda name: votes[name])
            group.protocol_type = next(iter(group.members.values())).protocol_type
            if group.leader not in group.members:
                group.leader = next(iter(group.members))
            group.state = COMPLETING
            group.sync_deadline = now + max(m.rebalance_timeout_s for m in group.members.values())
            everyone = tuple((m.member_id, m.group_instance_id, m.metadata(group.protocol))
                             for m in group.members.values())
            for member in group.members.values():
                member.seen = now
                member.assignment = b""
                _answer(member.join, _Joined(ErrorCode.none, member.member_id, group.generation, group.protocol_type,
                                             group.protocol, group.leader,
                                             everyone if member.member_id == group.leader else ()))
                member.join = None
            log.info("Kafka group %s: generation %d, %d member(s), protocol %s, leader %s", group.group_id,
                     group.generation, len(group.members), group.protocol, group.leader)
        finally:
            group.completing = False

    def remove(self, group: Group, member: Member, why: str) -> None:
        group.drop(member)
        _answer(member.join, _Joined(ErrorCode.unknown_member_id, member.member_id))
        _answer(member.sync, (ErrorCode.unknown_member_id, b""))
        log.info("Kafka group %s: member %s %s", group.group_id, member.member_id, why)
        if group.state in (STABLE, COMPLETING):
            self.prepare(group, f"member {member.member_id} {why}")
        self.maybe_complete_join(group)

    async def _sweep(self) -> None:
        """Session timeouts, rebalance deadlines, and the leader's SyncGroup deadline."""
        while not self.registry.stopped:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for group in list(self.groups.values()):
                group.pending = {m: until for m, until in group.pending.items() if until > now}
                for member in list(group.members.values()):
                    if member.join is None and now - member.seen > member.session_timeout_s:
                        self.remove(group, member, "left: its session timed out")
                if group.state == COMPLETING and now > group.sync_deadline:
                    self.prepare(group, "the leader sent no assignment within the rebalance timeout")
                self.maybe_complete_join(group)
            for group_id in self.registry.held():
                if self._unused(group_id, now):
                    asyncio.create_task(self.release(group_id, f"no member and no request for {IDLE_RELEASE_S:.0f} s"))

    def _unused(self, group_id: str, now: float) -> bool:
        group = self.groups.get(group_id)
        return (group is None or group.idle()) and now - self.touched.setdefault(group_id, now) > IDLE_RELEASE_S

    async def release(self, group_id: str, why: str, unused: bool = True) -> None:
        """Forget the group and delete its claim: a listener keeps no record for a group nobody
        uses (docs/protocol.md section 9.5, release). Its next member claims it again, here or
        on another listener. With ``unused``, only if it is still unused (a request may have come
        since the sweep looked)."""
        if unused and not self._unused(group_id, time.monotonic()):
            return
        self.groups.pop(group_id, None)
        self.touched.pop(group_id, None)
        log.info("Kafka group %s: releasing its claim (%s)", group_id, why)
        await self.registry.release(group_id)

    # --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup --------------------------------------------

    async def join(self, request, version: int) -> _Joined:
        member_id = request.member_id
        try:
            validate_group(request.group_id)
        except InvalidGroupId:
            return _Joined(ErrorCode.invalid_group_id, member_id)
        session_ms = _ms(request.session_timeout)
        rebalance_ms = _ms(request.rebalance_timeout) if version >= 1 else session_ms
        if not MIN_SESSION_TIMEOUT_MS <= session_ms <= MAX_SESSION_TIMEOUT_MS:
            return _Joined(ErrorCode.invalid_session_timeout, member_id)
        if not request.protocol_type or not request.protocols:
            return _Joined(ErrorCode.inconsistent_group_protocol, member_id)
        group = await self.owned(request.group_id)
        if group is None:
            return _Joined(ErrorCode.not_coordinator, member_id)
        if group.state == DEAD:  # being deleted: the client finds the coordinator again and retries
            return _Joined(ErrorCode.coordinator_not_available, member_id)
        instance = getattr(request, "group_instance_id", None) or None
        known = group.static.get(instance) if instance is not None else None
        if instance is not None and member_id and member_id != known:
            # KIP-345: the instance id is held by another member id (a newer instance), or by none
            return _Joined(ErrorCode.fenced_instance_id if known is not None else ErrorCode.unknown_member_id,
                           member_id)
        protocols = [(p.name, p.metadata) for p in request.protocols]
        others = [m for m in group.members.values() if m.member_id not in (member_id, known)]
        if others and (request.protocol_type != group.protocol_type
                       or not {name for name, _ in protocols} & set.intersection(
                           *({name for name, _ in m.protocols} for m in others))):
            return _Joined(ErrorCode.inconsistent_group_protocol, member_id)
        client_id, client_host = CLIENT.get()
        replaced = False
        if not member_id and known is not None:
            # KIP-345: a static member back with a new member id takes its instance's place; the
            # old member id is fenced from now on.
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            leader = group.leader
            member = self._replace(group, group.members[known], member_id)
            unchanged = member.protocols == protocols and member.protocol_type == request.protocol_type
            member.session_timeout_s, member.rebalance_timeout_s = session_ms / 1000, rebalance_ms / 1000
            member.client_id, member.client_host, member.seen = client_id, client_host, time.monotonic()
            if group.state == STABLE and unchanged:
                # No rebalance: the member gets its assignment back with SyncGroup. The leader
                # named is the one before the swap, so a returning leader does not assign again
                # (an assignment a Stable group would not hand out), as Kafka answers.
                return _Joined(ErrorCode.none, member_id, group.generation, group.protocol_type, group.protocol,
                               leader)
            replaced = True  # else a rebalance, even in CompletingRebalance: the leader assigns to the old id
        elif not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            # KIP-394 (not for static members, KIP-345): the member joins again with the id, so
            # a lost answer leaves no member behind
            if version >= 4 and instance is None:
                group.pending[member_id] = time.monotonic() + session_ms / 1000
                return _Joined(ErrorCode.member_id_required, member_id)
        elif member_id in group.pending:
            del group.pending[member_id]
        elif member_id not in group.members:
            return _Joined(ErrorCode.unknown_member_id, member_id)
        member = group.members.get(member_id)
        if (not replaced and member is not None and member.protocols == protocols and (
                group.state == COMPLETING or (group.state == STABLE and member_id != group.leader))):
            # Kafka's rule: a member that joins again with nothing changed gets the current
            # generation (the leader in Stable rebalances: it may want a new assignment).
            member.seen = time.monotonic()
            everyone = tuple((m.member_id, m.group_instance_id, m.metadata(group.protocol))
                             for m in group.members.values()) if member_id == group.leader else ()
            return _Joined(ErrorCode.none, member_id, group.generation, group.protocol_type, group.protocol,
                           group.leader, everyone)
        if member is None:
            member = group.members[member_id] = Member(member_id, client_id, client_host, session_ms / 1000,
                                                       rebalance_ms / 1000, request.protocol_type, protocols,
                                                       instance)
            if instance is not None:
                group.static[instance] = member_id
            why = f"member {member_id} joined"
        else:
            member.protocols, member.protocol_type = protocols, request.protocol_type
            member.session_timeout_s, member.rebalance_timeout_s = session_ms / 1000, rebalance_ms / 1000
            why = f"member {member_id} joined again"
        group.protocol_type = request.protocol_type
        member.seen = time.monotonic()
        _answer(member.join, _Joined(ErrorCode.rebalance_in_progress, member_id))  # a join sent again
        member.join = asyncio.get_running_loop().create_future()
        waiting = member.join
        self.prepare(group, why)
        self.maybe_complete_join(group)
        # The sweep completes the join by the rebalance deadline; the bound is for a bug's sake.
        done, _ = await asyncio.wait({waiting}, timeout=rebalance_ms / 1000 + INITIAL_REBALANCE_DELAY_MS / 1000 + 30)
        if not done:
            log.error("Kafka group %s: a JoinGroup was not answered by the rebalance deadline", group.group_id)
            return _Joined(ErrorCode.rebalance_in_progress, member_id)
        return waiting.result()

    def _replace(self, group: Group, old: Member, member_id: str) -> Member:
        """The static member ``old`` goes on as ``member_id`` (KIP-345); what the old id waits for
        is answered FENCED_INSTANCE_ID."""
        _answer(old.join, _Joined(ErrorCode.fenced_instance_id, old.member_id))
        _answer(old.sync, (ErrorCode.fenced_instance_id, b""))
        old.join = old.sync = None
        log.info("Kafka group %s: static member %s goes on as %s (instance %s)", group.group_id, old.member_id,
                 member_id, old.group_instance_id)
        del group.members[old.member_id]
        if group.leader == old.member_id:
            group.leader = member_id
        old.member_id = member_id
        group.members[member_id] = old
        group.static[old.group_instance_id] = member_id
        return old

    @staticmethod
    def _member(group: Group, member_id: str, instance: str | None) -> tuple[ErrorCode, Member | None]:
        """The member a request names, checked as Kafka does: with an instance id, a member id
        that no longer holds it is fenced (KIP-345)."""
        if instance:
            known = group.static.get(instance)
            if known is None:
                return ErrorCode.unknown_member_id, None
            if known != member_id:
                return ErrorCode.fenced_instance_id, None
        member = group.members.get(member_id)
        return (ErrorCode.none, member) if member is not None else (ErrorCode.unknown_member_id, None)

    async def sync(self, request) -> tuple[ErrorCode, bytes, Group | None]:
        try:
            validate_group(request.group_id)
        except InvalidGroupId:
            return ErrorCode.invalid_group_id, b"", None
        group = await self.owned(request.group_id, create=False)
        if group is None:
            return (ErrorCode.unknown_member_id if self.registry.holds(request.group_id)
                    else ErrorCode.not_coordinator), b"", None
        code, member = self._member(group, request.member_id, getattr(request, "group_instance_id", None))
        if member is None:
            return code, b"", group
        if request.generation_id != group.generation:
            return ErrorCode.illegal_generation, b"", group
        protocol_type, protocol = getattr(request, "protocol_type", None), getattr(request, "protocol_name", None)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol is not None and protocol != group.protocol):
            return ErrorCode.inconsistent_group_protocol, b"", group
        member.seen = time.monotonic()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress, b"", group
        if group.state == STABLE:
            return ErrorCode.none, member.assignment, group
        member.sync = asyncio.get_running_loop().create_future()
        waiting = member.sync
        if member.member_id == group.leader:
            assignments = {a.member_id: a.assignment for a in request.assignments}
            group.state = STABLE
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
                _answer(m.sync, (ErrorCode.none, m.assignment))
                m.sync = None
            log.info("Kafka group %s: generation %d is stable", group.group_id, group.generation)
        done, _ = await asyncio.wait({waiting}, timeout=member.rebalance_timeout_s + 30)
        if not done:
            return ErrorCode.rebalance_in_progress, b"", group
        code, assignment = waiting.result()
        return code, assignment, group

    async def heartbeat(self, request) -> ErrorCode:
        try:
            validate_group(request.group_id)
        except InvalidGroupId:
            return ErrorCode.invalid_group_id
        group = await self.owned(request.group_id, create=False)
        if group is None:
            return ErrorCode.unknown_member_id if self.registry.holds(request.group_id) else ErrorCode.not_coordinator
        code, member = self._member(group, request.member_id, getattr(request, "group_instance_id", None))
        if member is None:
            return code
        member.seen = time.monotonic()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        if request.generation_id != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    async def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """Each ``(member id, group instance id)`` leaves: a static member by its instance id, with
        its member id or none (KIP-345, LeaveGroup v3+)."""
        try:
            validate_group(group_id)
        except InvalidGroupId:
            return ErrorCode.invalid_group_id, []
        group = await self.owned(group_id, create=False)
        if group is None:
            if self.registry.holds(group_id):
                return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members)
            return ErrorCode.not_coordinator, []
        codes = []
        for member_id, instance in members:
            if instance and not member_id:  # by instance id alone (the admin client's removeMembers)
                member_id = group.static.get(instance, "")
            code, member = self._member(group, member_id, instance)
            if member is None:
                codes.append(code)
            else:
                self.remove(group, member, "left the group")
                codes.append(ErrorCode.none)
        return ErrorCode.none, codes

    # --- offsets --------------------------------------------------------------------------------

    async def commit(self, request) -> dict[tuple[str, int], ErrorCode]:
        """Each partition's answer; the offsets are written only when the generation check
        passes and a get finds the claim still held (docs/protocol.md section 9.5)."""
        wanted = {(t.name, p.partition_index): (p.committed_offset, p.committed_metadata or "")
                  for t in request.topics for p in t.partitions}
        code = await self._commit_check(request)
        if code == ErrorCode.none:
            code = await self._claim_check(request.group_id)
        if code != ErrorCode.none:
            return {key: code for key in wanted}
        out, offsets, metadata = {}, {}, {}
        for (topic, partition), (offset, text) in wanted.items():
            if len(text.encode()) > MAX_METADATA_BYTES:
                out[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            try:
                tp = TopicPartition(topic, partition)
            except LlogError:
                out[(topic, partition)] = ErrorCode.unknown_topic_or_partition
                continue
            offsets[tp], metadata[tp] = offset, text
        if not offsets:
            return out
        app = self.listener.app
        try:
            stored = await asyncio.to_thread(store_offsets, app.reader.coordination, app.config.root_prefix,
                                             request.group_id, offsets, metadata)
        except LlogError as e:
            log.warning("Kafka group %s: committing offsets failed: %s", request.group_id, e)
            stored = {tp: e for tp in offsets}
        for tp, result in stored.items():
            if isinstance(result, InvalidOffset):
                out[(tp.topic, tp.partition)] = ErrorCode.offset_out_of_range
            elif isinstance(result, LlogError):
                out[(tp.topic, tp.partition)] = error_code(result)
            else:
                out[(tp.topic, tp.partition)] = ErrorCode.none
        return out

    async def _commit_check(self, request) -> ErrorCode:
        """Kafka's rule: a member of the current generation, or (generation -1, no member id) a
        consumer that assigns partitions itself while the group has no members."""
        try:
            validate_group(request.group_id)
        except InvalidGroupId:
            return ErrorCode.invalid_group_id
        group = await self.owned(request.group_id, create=False)
        if group is None and not self.registry.holds(request.group_id):
            return ErrorCode.not_coordinator
        generation, member_id = request.generation_id_or_member_epoch, request.member_id
        if generation < 0 and not member_id:
            if group is not None and group.state == DEAD:
                return ErrorCode.coordinator_not_available
            return ErrorCode.none if group is None or not group.members else ErrorCode.unknown_member_id
        if group is None:
            return ErrorCode.illegal_generation
        if group.state == DEAD:
            return ErrorCode.coordinator_not_available
        code, member = self._member(group, member_id, getattr(request, "group_instance_id", None))
        if member is None:
            return code
        if group.state == COMPLETING:
            return ErrorCode.rebalance_in_progress
        if generation != group.generation:
            return ErrorCode.illegal_generation
        member.seen = time.monotonic()
        return ErrorCode.none

    async def _claim_check(self, group_id: str) -> ErrorCode:
        """The claim, read right before a commit's CAS (docs/protocol.md section 9.5, timing
        rule): a coordinator that lost it (its session ended during a pause, and another listener
        may have claimed the group since) writes nothing and gives the group up, however soon
        after the loss the commit is served."""
        try:
            ours = await self.registry.verify(group_id)
        except LlogError as e:
            log.warning("Kafka group %s: checking the claim before a commit failed: %s", group_id, e)
            return ErrorCode.coordinator_not_available
        if not ours:
            self._give_up([group_id])
            return ErrorCode.not_coordinator
        return ErrorCode.none

    # --- DeleteGroups, OffsetDelete -----------------------------------------------------------

    async def delete_group(self, group_id: str) -> ErrorCode:
        """Kafka's DeleteGroups for one group: refused while it has members; else, once a get
        finds the claim still held (docs/protocol.md section 9.5, delete), its committed offsets
        are deleted (section 9.3, delete) and its claim released."""
        try:
            validate_group(group_id)
        except InvalidGroupId:
            return ErrorCode.invalid_group_id
        group = await self.owned(group_id, create=False)
        if group is None and not self.registry.holds(group_id):
            return ErrorCode.not_coordinator
        if group is not None and group.state == DEAD:
            return ErrorCode.group_id_not_found  # another delete of it is under way
        if group is not None and not group.idle():
            return ErrorCode.non_empty_group
        existed = group is not None
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        group.state = DEAD  # joins and commits meanwhile: COORDINATOR_NOT_AVAILABLE, and they try again
        code = await self._claim_check(group_id)  # a claim lost during a pause: delete nothing (section 9.5)
        if code != ErrorCode.none:
            if self.groups.get(group_id) is group:  # the claim could not be read: as after a failed delete
                group.state = EMPTY
            return code
        app = self.listener.app
        try:
            deleted = await asyncio.to_thread(delete_offsets, app.reader.coordination, app.config.root_prefix,
                                              group_id)
        except LlogError as e:
            log.warning("Kafka group %s: deleting its offsets failed: %s", group_id, e)
            if self.groups.get(group_id) is group:
                group.state = EMPTY
            return ErrorCode.coordinator_not_available
        log.info("Kafka group %s: deleted, with its offsets on %d partition(s)", group_id, len(deleted))
        await self.release(group_id, "deleted", unused=False)
        return ErrorCode.none if deleted or existed else ErrorCode.group_id_not_found

    async def delete_offsets(self, group_id: str, wanted: list[tuple[str, int]]
                             ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """Kafka's OffsetDelete: the group's error, and each partition's. A topic a member
        subscribes to keeps its offsets (GROUP_SUBSCRIBED_TO_TOPIC); the others' are deleted,
        once a get finds the claim still held (docs/protocol.md section 9.5, delete)."""
        try:
            validate_group(group_id)
        except InvalidGroupId:
            return ErrorCode.invalid_group_id, {}
        group = await self.owned(group_id, create=False)
        if group is None and not self.registry.holds(group_id):
            return ErrorCode.not_coordinator, {}
        code = await self._claim_check(group_id)  # a claim lost during a pause: delete nothing (section 9.5)
        if code != ErrorCode.none:
            return code, {}
        group = self.groups.get(group_id)  # as it is now, after the get
        if group is not None and group.state == DEAD:
            return ErrorCode.group_id_not_found, {}
        members = group is not None and bool(group.members)
        if members and group.protocol_type != CONSUMER_PROTOCOL:
            return ErrorCode.non_empty_group, {}  # Kafka's rule: it cannot tell what such a group uses
        subscribed = _subscribed(group) if members else set()
        out, todo = {}, {}
        for topic, partition in wanted:
            if subscribed is None or topic in subscribed:
                out[(topic, partition)] = ErrorCode.group_subscribed_to_topic
            else:
                try:
                    todo.setdefault(topic, []).append(TopicPartition(topic, partition))
                except LlogError:
                    out[(topic, partition)] = ErrorCode.unknown_topic_or_partition
        app = self.listener.app
        coordination, root = app.reader.coordination, app.config.root_prefix

        def run() -> bool:
            if not members and not has_offsets(coordination, root, group_id):
                return False
            for topic, partitions in todo.items():
                try:
                    delete_offsets(coordination, root, group_id, partitions)
                    code = ErrorCode.none
                except (TopicNotFound, InvalidTopicName):
                    code = ErrorCode.unknown_topic_or_partition
                out.update({(tp.topic, tp.partition): code for tp in partitions})
            return True

        try:
            if not await asyncio.to_thread(run):
                return ErrorCode.group_id_not_found, {}
        except LlogError as e:
            log.warning("Kafka group %s: deleting offsets failed: %s", group_id, e)
            return ErrorCode.coordinator_not_available, {}
        return ErrorCode.none, out

    async def listed(self) -> dict[str, tuple[str, str]]:
        """ListGroups' answer, group -> (protocol type, state): the groups coordinated here (those
        without members only when they have committed offsets, as Empty), and on the listener
        with the lowest node id, the groups with committed offsets whose claim nobody holds."""
        out, memberless = {}, []
        for group_id in self.registry.held():
            group = self.groups.get(group_id)
            if group is not None and group.members:
                out[group_id] = (group.protocol_type or "", group.state)
            else:
                memberless.append(group_id)
        app = self.listener.app
        coordination, root = app.reader.coordination, app.config.root_prefix
        if self.registry.lowest():
            claimed = await self.registry.claimed()
            with_offsets = await asyncio.to_thread(groups_with_offsets, coordination, root)
            nobodys = (with_offsets - claimed) | (with_offsets & set(memberless))
        else:
            nobodys = {g for g in memberless if await asyncio.to_thread(has_offsets, coordination, root, g)}
        for group_id in nobodys:
            group = self.groups.get(group_id)
            out[group_id] = (group.protocol_type or "" if group is not None else "", EMPTY)
        return out

    def has_offsets(self, group_id: str) -> bool:
        """Whether the group has a committed offset (runs in a thread)."""
        app = self.listener.app
        return has_offsets(app.reader.coordination, app.config.root_prefix, group_id)

    def committed(self, group_id: str, wanted: list[tuple[str, list[int]]] | None
                  ) -> dict[tuple[str, int], ConsumerOffset]:
        """The committed offsets of ``group_id`` on ``wanted`` (every partition it has committed
        when None), with their metadata; a partition without one is left out. Runs in a thread."""
        app = self.listener.app
        coordination, root = app.reader.coordination, app.config.root_prefix
        topics = None if wanted is None else {t for t, _ in wanted}
        found = partitions_of(coordination, root, topics)
        ids = {k.tp.topic: k.topic_id for k in found}
        if wanted is None:
            partitions = [k.tp for k in found]
        else:
            partitions = [TopicPartition(t, p) for t, ps in wanted if t in ids for p in ps if p >= 0]
        return {(tp.topic, tp.partition): o
                for tp, o in committed_offsets(coordination, root, group_id, partitions, ids).items()}


def _subscribed(group: Group) -> set[str] | None:
    """The topics the group's members subscribe to, from their metadata (Kafka's
    ConsumerProtocolSubscription); None when some member's cannot be read (then, as Kafka
    takes it, every topic)."""
    topics: set[str] = set()
    for member in group.members.values():
        chosen = [member.metadata(group.protocol)] if group.protocol else [m for _, m in member.protocols]
        for metadata in chosen:
            found = _subscription_topics(metadata)
            if found is None:
                return None
            topics |= found
    return topics


def _subscription_topics(metadata: bytes) -> set[str] | None:
    """The topics of a ConsumerProtocolSubscription (every version, 0-3, starts with them, which
    aiokafka's v0 schema reads), or None if it is not one."""
    try:
        topics = ConsumerProtocolMemberMetadata.decode(metadata).subscription
    except (ValueError, TypeError, IndexError, struct.error):
        return None
    if topics is None or not all(isinstance(topic, str) for topic in topics):
        return None
    return set(topics)


def _answer(future: asyncio.Future | None, value) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _ms(value) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else int(value)


_COORDINATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def coordinator(listener) -> GroupCoordinator:
    """The listener's group coordinator, made on first use."""
    found = _COORDINATORS.get(listener)
    if found is None:
        found = _COORDINATORS[listener] = GroupCoordinator(listener)
    return found


# --- the handlers -------------------------------------------------------------------------------


@serve(10, "find_coordinator", "FindCoordinatorRequest", 0, 5)
async def find_coordinator(listener, request, response_class):
    version = response_class.__version__
    keys = request.coordinator_keys if version >= 4 else (request.key,)
    key_type = getattr(request, "key_type", 0)
    answers = []
    for key in keys:
        code, message, holder = ErrorCode.none, None, None
        if key_type == _TRANSACTION:
            code, message = ErrorCode.invalid_request, "transactions are not served (docs/kafka.md section 7)"
        else:
            try:
                validate_group(key)
                holder = await coordinator(listener).registry.coordinator(key)
            except InvalidGroupId as e:
                code, message = ErrorCode.invalid_group_id, str(e)
            except LlogError as e:
                code, message = ErrorCode.coordinator_not_available, str(e)
        answers.append((key, code, message, holder))
    if version >= 4:
        coordinators = tuple(_build(response_class, "Coordinator", key=key, error_code=code, error_message=message,
                                    node_id=h.node_id if h else -1, host=h.host if h else "",
                                    port=h.port if h else -1) for key, code, message, h in answers)
        return _build(response_class, response_class.__name__, throttle_time=_NONE, coordinators=coordinators)
    _, code, message, h = answers[0]
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code,
                  error_message=message, node_id=h.node_id if h else -1, host=h.host if h else "",
                  port=h.port if h else -1)


@serve(11, "join_group", "JoinGroupRequest", 0, 9)
async def join_group(listener, request, response_class):
    joined = await coordinator(listener).join(request, response_class.__version__)
    members = tuple(_build(response_class, "JoinGroupResponseMember", member_id=m, group_instance_id=instance,
                           metadata=metadata) for m, instance, metadata in joined.members)
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=joined.error,
                  generation_id=joined.generation, protocol_type=joined.protocol_type,
                  protocol_name=joined.protocol if joined.protocol is not None or response_class.__version__ >= 7
                  else "", leader=joined.leader, skip_assignment=False, member_id=joined.member_id, members=members)


@serve(14, "sync_group", "SyncGroupRequest", 0, 5)
async def sync_group(listener, request, response_class):
    code, assignment, group = await coordinator(listener).sync(request)
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code,
                  protocol_type=group.protocol_type if group else None, protocol_name=group.protocol if group else None,
                  assignment=assignment)


@serve(12, "heartbeat", "HeartbeatRequest", 0, 4)
async def heartbeat(listener, request, response_class):
    code = await coordinator(listener).heartbeat(request)
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code)


@serve(13, "leave_group", "LeaveGroupRequest", 0, 5)
async def leave_group(listener, request, response_class):
    version = response_class.__version__
    members = ([(m.member_id, m.group_instance_id) for m in request.members] if version >= 3
               else [(request.member_id, None)])
    code, codes = await coordinator(listener).leave(request.group_id, members)
    if version < 3:
        code = codes[0] if code == ErrorCode.none and codes else code
        return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code)
    responses = tuple(_build(response_class, "MemberResponse", member_id=m.member_id,
                             group_instance_id=m.group_instance_id, error_code=c)
                      for m, c in zip(request.members, codes))
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code, members=responses)


@serve(8, "offset_commit", "OffsetCommitRequest", 2, 9)
async def offset_commit(listener, request, response_class):
    codes = await coordinator(listener).commit(request)
    topics = tuple(_build(response_class, "OffsetCommitResponseTopic", name=t.name, partitions=tuple(
        _build(response_class, "OffsetCommitResponsePartition", partition_index=p.partition_index,
               error_code=codes[(t.name, p.partition_index)]) for p in t.partitions)) for t in request.topics)
    return _build(response_class, response_class.__name__, throttle_time=_NONE, topics=topics)


@serve(9, "offset_fetch", "OffsetFetchRequest", 1, 9)
async def offset_fetch(listener, request, response_class):
    """Any listener answers: the offsets are in Oxia (docs/protocol.md section 9.5)."""
    version = response_class.__version__
    groups = request.groups if version >= 8 else (request,)
    answers = []
    for group in groups:
        wanted = None if group.topics is None else [(t.name, list(t.partition_indexes)) for t in group.topics]
        code, found = ErrorCode.none, {}
        try:
            validate_group(group.group_id)
            found = await asyncio.to_thread(coordinator(listener).committed, group.group_id, wanted)
        except InvalidGroupId:
            code = ErrorCode.invalid_group_id
        except LlogError as e:
            log.warning("Kafka group %s: reading committed offsets failed: %s", group.group_id, e)
            code = ErrorCode.coordinator_not_available
        if wanted is None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(found):
                by_topic.setdefault(topic, []).append(partition)
            wanted = list(by_topic.items())
        answers.append((group.group_id, code, wanted, found))
    suffix = "s" if version >= 8 else ""

    def topics(wanted, found):
        return tuple(_build(response_class, f"OffsetFetchResponseTopic{suffix}", name=topic, partitions=tuple(
            _build(response_class, f"OffsetFetchResponsePartition{suffix}", partition_index=p,
                   committed_offset=found[(topic, p)].offset if (topic, p) in found else -1,
                   committed_leader_epoch=-1, metadata=found[(topic, p)].metadata if (topic, p) in found else "",
                   error_code=ErrorCode.none) for p in partitions)) for topic, partitions in wanted)

    if version >= 8:
        return _build(response_class, response_class.__name__, throttle_time=_NONE, groups=tuple(
            _build(response_class, "OffsetFetchResponseGroup", group_id=g, error_code=code, topics=topics(w, f))
            for g, code, w, f in answers))
    _, code, wanted, found = answers[0]
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code,
                  topics=topics(wanted, found) if code == ErrorCode.none else ())


@serve(16, "list_groups", "ListGroupsRequest", 0, 5)
async def list_groups(listener, request, response_class):
    """The groups this listener coordinates, and, on the listener with the lowest node id, the
    groups with committed offsets that nobody coordinates (docs/kafka.md section 6): a client
    asks every broker, as for Kafka, and sees each group once."""
    states = {_SEEN_STATES.get(s.lower(), s) for s in getattr(request, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    try:
        found = await coordinator(listener).listed()
    except LlogError as e:
        log.warning("Kafka ListGroups: reading the groups failed: %s", e)
        return _build(response_class, response_class.__name__, throttle_time=_NONE,
                      error_code=ErrorCode.coordinator_not_available, groups=())
    groups = tuple(
        _build(response_class, "ListedGroup", group_id=group_id, protocol_type=protocol_type, group_state=state,
               group_type="classic")
        for group_id, (protocol_type, state) in sorted(found.items())
        if (not states or state in states) and (not types or "classic" in types))
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=ErrorCode.none,
                  groups=groups)


@serve(42, "delete_groups", "DeleteGroupsRequest", 0, 2)
async def delete_groups(listener, request, response_class):
    coord = coordinator(listener)
    results = []
    for group_id in request.groups_names:
        results.append(_build(response_class, "DeletableGroupResult", group_id=group_id,
                              error_code=await coord.delete_group(group_id)))
    return _build(response_class, response_class.__name__, throttle_time=_NONE, results=tuple(results))


@serve(47, "offset_delete", "OffsetDeleteRequest", 0, 0)
async def offset_delete(listener, request, response_class):
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    code, codes = await coordinator(listener).delete_offsets(request.group_id, wanted)
    topics = () if code != ErrorCode.none else tuple(
        _build(response_class, "OffsetDeleteResponseTopic", name=t.name, partitions=tuple(
            _build(response_class, "OffsetDeleteResponsePartition", partition_index=p.partition_index,
                   error_code=codes[(t.name, p.partition_index)]) for p in t.partitions)) for t in request.topics)
    return _build(response_class, response_class.__name__, throttle_time=_NONE, error_code=code, topics=topics)


@serve(15, "describe_groups", "DescribeGroupsRequest", 0, 5)
async def describe_groups(listener, request, response_class):
    coord = coordinator(listener)
    described = []
    for group_id in request.groups:
        values = dict(group_id=group_id, error_code=ErrorCode.none, error_message=None, group_state=DEAD,
                      protocol_type="", protocol_data="", members=(), authorized_operations=-2147483648)
        try:
            validate_group(group_id)
            group = coord.groups.get(group_id) if coord.registry.holds(group_id) else None
            if group is None:
                holder = await coord.registry.coordinator(group_id, claim=False)
                if holder is not None and holder.node_id != coord.registry.node_id:
                    values["error_code"] = ErrorCode.not_coordinator
            if (values["error_code"] == ErrorCode.none and (group is None or not group.members)
                    and await asyncio.to_thread(coord.has_offsets, group_id)):
                values["group_state"] = EMPTY  # Kafka's state of a group with offsets and no members
        except InvalidGroupId:
            values["error_code"], group = ErrorCode.invalid_group_id, None
        except LlogError:
            values["error_code"], group = ErrorCode.coordinator_not_available, None
        if group is not None and group.state != DEAD:
            values.update(group_state=group.state, protocol_type=group.protocol_type or "",
                          protocol_data=group.protocol or "" if group.state == STABLE else "",
                          members=tuple(_build(
                              response_class, "DescribedGroupMember", member_id=m.member_id,
                              group_instance_id=m.group_instance_id, client_id=m.client_id,
                              client_host=f"/{m.client_host}" if m.client_host else "",
                              member_metadata=m.metadata(group.protocol) if group.state == STABLE else b"",
                              member_assignment=m.assignment if group.state == STABLE else b"")
                              for m in group.members.values()))
        described.append(_build(response_class, "DescribedGroup", **values))
    return _build(response_class, response_class.__name__, throttle_time=_NONE, groups=tuple(described))
