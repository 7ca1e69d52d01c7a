"""Topics as objects (docs/protocol.md sections 10.1, 10.2 and 10.4) on real Oxia and the S3 server: create,
list, describe, alter and delete; auto-creation by writers; writers that disagree on the
partition count; delete (a tombstone per partition, docs/protocol.md section 12) and re-create; a
delete that is interrupted and finished."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from llog.clock import SYSTEM
from llog.compactor import Compactor
from llog.consumer_groups import commit_offsets, committed_offsets
from llog.control import initialize_partition, read_control, update_control
from llog.discovery import list_topics, topic_partitions
from llog.errors import (
    AppendFailed, ClaimHeld, InvalidTopicConfig, TopicAlreadyExists, TopicBeingDeleted, TopicDeleted, TopicNotFound,
    TopicRecreated, UnknownPartition,
)
from llog.keys import TopicPartition, partition_keys
from llog.reader import LogReader
from llog.records import ACTIVE, DELETED, DELETING
from llog.topics import (
    TopicCache, TopicSettings, _mark_deleting, alter_topic, create_topic, delete_topic, list_topic_records, parse_config,
    parse_config_pairs, read_topic,
)
from llog.writer import AppendGroup, LogWriter
from tests.helpers.clocks import past_the_lag
from tests.helpers.retention import check_deleted, compacted_objects, current_keys, index_entries, keys_left


def _values(reader, topic: str, partition: int) -> list[bytes]:
    start, hw = reader.offsets(topic, partition)
    return [r.value for r in reader.read_range(topic, partition, start)] if hw >= start else []


def _controls(writer, config, topic: str, partitions: range):
    """The ``meta/control`` of each partition of the topic's current incarnation."""
    return [read_control(writer.coordination, current_keys(writer.coordination, config.root_prefix, topic, p)).record
            for p in partitions]


# --- create, list, describe, alter, delete -----------------------------------------------------------


def test_create_list_describe_alter_and_delete(config, writer):
    c, root = writer.coordination, config.root_prefix
    created = create_topic(c, root, "orders", 2, parse_config_pairs(["retention.ms=1000"]))
    assert (created.topic, created.partitions, created.config, created.state) \
        == ("orders", 2, {"retention.ms": 1000}, ACTIVE)
    uuid.UUID(created.topic_id)
    assert created.created_at_ms == created.updated_at_ms > 0

    described = read_topic(c, root, "orders")
    assert described.record == created and isinstance(described.version, int)
    assert [(r.topic_id, r.log_start_offset, r.high_watermark) for r in _controls(writer, config, "orders", range(2))] \
        == [(created.topic_id, 1, 0)] * 2
    settings = TopicSettings.of("orders", created, config)
    assert (settings.retention_ms, settings.retention_bytes, settings.cleanup_policy) \
        == (1000, config.retention_bytes, "delete")

    with pytest.raises(TopicAlreadyExists, match="'orders' already exists .*2 partition"):
        create_topic(c, root, "orders", 5)
    assert create_topic(c, root, "orders", 5, if_not_exists=True) == created  # as it is: not 5 partitions
    assert read_topic(c, root, "orders").version == described.version

    create_topic(c, root, "audit", 1)
    assert [(r.topic, r.partitions) for r in list_topic_records(c, root)] == [("audit", 1), ("orders", 2)]

    grown = alter_topic(c, root, "orders", partitions=4)
    assert grown.partitions == 4 and grown.topic_id == created.topic_id and grown.updated_at_ms >= created.updated_at_ms
    assert [(r.topic_id, r.sequence_counter) for r in _controls(writer, config, "orders", range(4))] \
        == [(created.topic_id, 1)] * 4  # the new partitions are initialized, with the record's topic_id
    assert topic_partitions(c, root, "orders") == [0, 1, 2, 3]
    version = read_topic(c, root, "orders").version
    with pytest.raises(InvalidTopicConfig, match="has 4 partitions; the count only grows"):
        alter_topic(c, root, "orders", partitions=3)
    assert read_topic(c, root, "orders").version == version

    changed = alter_topic(c, root, "orders", set_config={"retention.bytes": "2048", "compression.type": "zstd"})
    assert changed.config == {"retention.ms": 1000, "retention.bytes": 2048, "compression.type": "zstd"}
    dropped = alter_topic(c, root, "orders", delete_config=["retention.ms"])
    assert dropped.config == {"retention.bytes": 2048, "compression.type": "zstd"}
    assert TopicSettings.of("orders", dropped, config).retention_ms == config.retention_ms  # back to the default
    assert read_topic(c, root, "orders").record == dropped
    assert alter_topic(c, root, "orders", partitions=4) == dropped  # nothing to change: no write
    assert read_topic(c, root, "orders").record.updated_at_ms == dropped.updated_at_ms

    doomed = [current_keys(c, root, "orders", p) for p in range(4)]
    report = delete_topic(c, writer.objects, root, "orders")
    assert report.partitions == 4
    assert read_topic(c, root, "orders") is None
    for keys in doomed:  # each partition is its tombstone (docs/protocol.md section 12), nothing else
        assert check_deleted(c, keys).sequence_counter == 1
        with pytest.raises(TopicDeleted):
            read_control(c, keys)
    assert [r.topic for r in list_topic_records(c, root)] == ["audit"]
    assert topic_partitions(c, root, "orders") == []
    with pytest.raises(TopicNotFound):
        alter_topic(c, root, "orders", partitions=5)


@pytest.mark.parametrize("settings, named", [
    ({"retention.ms": "soon"}, "retention.ms='soon'"),
    ({"retention.ms": -2}, "retention.ms=-2"),
    ({"retention.bytes": True}, "retention.bytes=True"),
    ({"cleanup.policy": "compact"}, "cleanup.policy='compact'"),
    ({"compression.type": "gzip"}, "compression.type='gzip'"),
    ({"segment.ms": 1000}, "'segment.ms'"),
])
def test_bad_settings_are_refused_naming_them_and_nothing_is_written(config, writer, settings, named):
    c, root = writer.coordination, config.root_prefix
    with pytest.raises(InvalidTopicConfig, match=named.replace(".", r"\.")):
        create_topic(c, root, "bad", 1, settings)
    assert read_topic(c, root, "bad") is None and topic_partitions(c, root, "bad") == []

    create_topic(c, root, "good", 1)
    before = read_topic(c, root, "good")
    with pytest.raises(InvalidTopicConfig, match=named.replace(".", r"\.")):
        alter_topic(c, root, "good", set_config=settings)
    assert read_topic(c, root, "good") == before


def test_bad_config_pairs_partition_counts_and_deleted_names_are_refused(config, writer):
    c, root = writer.coordination, config.root_prefix
    with pytest.raises(InvalidTopicConfig, match="'retention.ms' must look like name=value"):
        parse_config_pairs(["retention.ms"])
    assert parse_config_pairs(["retention.bytes = 10", "cleanup.policy=delete"]) == {
        "retention.bytes": 10, "cleanup.policy": "delete"}
    assert parse_config({"retention.ms": "-1"}) == {"retention.ms": -1}
    for partitions in (0, -1, True, "2"):
        with pytest.raises(InvalidTopicConfig, match="partitions must be an integer >= 1"):
            create_topic(c, root, "bad", partitions)
    assert read_topic(c, root, "bad") is None and topic_partitions(c, root, "bad") == []
    create_topic(c, root, "good", 1, {"retention.ms": 5})
    before = read_topic(c, root, "good")
    with pytest.raises(InvalidTopicConfig, match="unknown topic setting 'retention'"):
        alter_topic(c, root, "good", delete_config=["retention"])
    assert read_topic(c, root, "good") == before


# --- writers: auto-creation, the partition count --------------------------------------------------------


def test_a_writer_creates_a_missing_topic_on_first_use_and_grows_it(config, reader):
    """docs/protocol.md section 10.2: created with max(LLOG_DEFAULT_PARTITIONS, highest named + 1), marked
    auto_created, grown by a write to a higher partition; past LLOG_MAX_AUTO_PARTITIONS refused."""
    with LogWriter(config.replace(default_partitions=3, max_auto_partitions=8), auto_initialize=True) as writer:
        c, root = writer.coordination, config.root_prefix
        result = writer.append("fresh", 0, [b"a", b"b"])
        assert (result.start_offset, result.end_offset) == (1, 2)
        created = read_topic(c, root, "fresh").record
        assert (created.partitions, created.config, created.state, created.auto_created) == (3, {}, ACTIVE, True)
        assert [r.topic_id for r in _controls(writer, config, "fresh", range(3))] == [created.topic_id] * 3

        assert writer.append("fresh", 3, [b"grown"]).start_offset == 1  # one past the count: grown to 4
        grown = read_topic(c, root, "fresh").record
        assert (grown.partitions, grown.topic_id, grown.auto_created) == (4, created.topic_id, True)
        assert grown.updated_at_ms >= created.updated_at_ms

        # A shared append naming 1 and 5: grown to 6 once, both commit; 4 is initialized too.
        writer.append_shared([AppendGroup("fresh", 1, [b"c"]), AppendGroup("fresh", 5, [b"x"])])
        assert read_topic(c, root, "fresh").record.partitions == 6
        assert [r.topic_id for r in _controls(writer, config, "fresh", range(6))] == [created.topic_id] * 6

        # The bound: 8 partitions at most; partition 8 is refused, nothing created or grown for it,
        # and in a shared append the others commit.
        before = {p: keys_left(c, current_keys(c, root, "fresh", p)) for p in range(6)}
        limit = r"fresh\[8\] does not exist: topic 'fresh' has 6 partition\(s\), 0\.\.5; .* at most 8 partitions"
        with pytest.raises(UnknownPartition, match=limit) as e:
            writer.append("fresh", 8, [b"nope"])
        assert (e.value.partition, e.value.partitions) == (8, 6)
        assert read_topic(c, root, "fresh").record.partitions == 6
        assert keys_left(c, current_keys(c, root, "fresh", 8)) == []
        assert {p: keys_left(c, current_keys(c, root, "fresh", p)) for p in range(6)} == before
        with pytest.raises(AppendFailed) as failed:
            writer.append_shared([AppendGroup("fresh", 7, [b"last"]), AppendGroup("fresh", 9, [b"past"])])
        assert [(r.partition, r.start_offset) for r in failed.value.results] == [(7, 1)]
        assert isinstance(failed.value.errors[("fresh", 9)], UnknownPartition)
        assert read_topic(c, root, "fresh").record.partitions == 8
        with pytest.raises(UnknownPartition, match=r"topic 'new' does not exist yet; .* at most 8 partitions"):
            writer.append("new", 8, [b"x"])  # a create past the bound creates nothing
        assert read_topic(c, root, "new") is None
    assert _values(reader, "fresh", 0) == [b"a", b"b"] and _values(reader, "fresh", 1) == [b"c"]
    assert [_values(reader, "fresh", p) for p in (3, 5, 7)] == [[b"grown"], [b"x"], [b"last"]]


def test_a_topic_created_explicitly_is_not_grown_by_writes(config, reader):
    with LogWriter(config.replace(default_partitions=1), auto_initialize=True) as writer:
        c, root = writer.coordination, config.root_prefix
        made = create_topic(c, root, "fixed", 2)
        assert not made.auto_created and b"auto_created" not in c.get(f"{root}/topics/fixed", "topics").value
        unknown = r"fixed\[2\] does not exist: topic 'fixed' has 2 partition\(s\), 0\.\.1; the topic was created explicitly"
        with pytest.raises(UnknownPartition, match=unknown):
            writer.append("fixed", 2, [b"nope"])
        assert read_topic(c, root, "fixed").record.partitions == 2
        assert keys_left(c, current_keys(c, root, "fixed", 2)) == []
        assert writer.append("fixed", 1, [b"ok"]).start_offset == 1
        # An alter keeps what the record says: explicit stays explicit, auto stays auto.
        assert not alter_topic(c, root, "fixed", partitions=3).auto_created
        writer.append("auto", 0, [b"a"])
        assert alter_topic(c, root, "auto", set_config={"retention.ms": 5}).auto_created
    assert _values(reader, "fixed", 1) == [b"ok"]


def test_without_auto_creation_a_missing_topic_is_not_found_and_not_created(config):
    root = config.root_prefix
    with LogWriter(config.replace(auto_create_topics=False), auto_initialize=True) as writer:
        with pytest.raises(TopicNotFound, match="'missing' does not exist"):
            writer.append("missing", 0, [b"x"])
        assert read_topic(writer.coordination, root, "missing") is None
        assert topic_partitions(writer.coordination, root, "missing") == []
        create_topic(writer.coordination, root, "made", 1)  # an existing one is written to
        assert writer.append("made", 0, [b"y"]).start_offset == 1
    with LogWriter(config) as writer:  # not auto-initializing: a topic needs its record
        with pytest.raises(TopicNotFound, match="'missing' does not exist"):
            writer.append("missing", 0, [b"x"])
        assert read_topic(writer.coordination, root, "missing") is None


def test_writers_that_disagree_on_the_partition_count_follow_the_record(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "pc", 2)
    assert writer.append("pc", 1, [b"a"]).start_offset == 1
    with LogWriter(config.replace(default_partitions=4), auto_initialize=True) as other:
        with pytest.raises(UnknownPartition) as e:
            other.append("pc", 3, [b"lost"])
        assert e.value.partitions == 2
        assert read_topic(c, root, "pc").record.partitions == 2  # its default does not grow the topic
        assert topic_partitions(c, root, "pc") == [0, 1]

        alter_topic(c, root, "pc", partitions=4)
        # Its cached record said 2 partitions: it reads the record again before refusing.
        assert other.append("pc", 3, [b"now"]).start_offset == 1
        assert writer.append("pc", 3, [b"too"]).start_offset == 2
    assert _values(reader, "pc", 3) == [b"now", b"too"]
    assert _values(reader, "pc", 1) == [b"a"]


# --- delete and re-create ----------------------------------------------------------------------------------


def test_a_deleted_and_recreated_topic_starts_empty(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    old = create_topic(c, root, "re", 2)
    with LogWriter(config, auto_initialize=True) as stale:  # alive across the delete and re-create
        for i in range(4):
            writer.append_shared([AppendGroup("re", 0, [f"old-{i}".encode()] * 3), AppendGroup("re", 1, [b"old"])])
        stale.append("re", 0, [b"old-stale"])  # caches the old record and control
        assert reader.offsets("re", 0) == (1, 13)
        commit_offsets(c, root, "g", {TopicPartition("re", 0): 5, TopicPartition("re", 1): 2})
        with Compactor(config, clock=past_the_lag(), max_offsets=6) as compactor:
            assert compactor.compact_partition("re", 0).compactions >= 1
        objects = writer.objects
        olds = [partition_keys(root, "re", p, old.topic_id) for p in range(2)]
        compacted = compacted_objects(objects, olds[0])
        assert compacted
        report = delete_topic(c, objects, root, "re")
        assert (report.partitions, report.compacted_objects) == (2, len(compacted))
        assert read_topic(c, root, "re") is None
        for keys in olds:
            tombstone = check_deleted(c, keys)  # the group offsets, the index, the claim went too
            assert tombstone.log_state == DELETED and tombstone.high_watermark == (13 if keys.tp.partition == 0 else 4)
            assert compacted_objects(objects, keys) == {}
        assert "re" not in list_topics(c, root)

        new = create_topic(c, root, "re", 2)
        assert new.topic_id != old.topic_id
        for p, control in enumerate(_controls(writer, config, "re", range(2))):  # docs/protocol.md section 10.4
            assert (control.topic_id, control.sequence_counter, control.log_start_offset) == (new.topic_id, 1, 1)
            assert index_entries(c, partition_keys(root, "re", p, new.topic_id)) == []
        assert committed_offsets(c, root, "g", [TopicPartition("re", p) for p in range(2)]) == {}

        assert writer.append("re", 0, [b"new-1"]).start_offset == 1
        # The stale writer's cached record names the old topic (CACHE_TTL_S): its append meets the
        # old partition's tombstone, reads the record again and lands in the new topic, after the
        # new record; nothing lands under the deleted incarnation.
        assert stale.keys("re", 0).topic_id == old.topic_id
        landed = stale.append("re", 0, [b"new-2"])
        assert (landed.start_offset, landed.end_offset, landed.topic_id) == (2, 2, new.topic_id)
        check_deleted(c, olds[0])
    assert reader.offsets("re", 0) == (1, 2)
    assert _values(reader, "re", 0) == [b"new-1", b"new-2"]
    assert read_control(c, partition_keys(root, "re", 0, new.topic_id)).record.topic_id == new.topic_id
    assert reader.offsets("re", 1) == (1, 0)


#: What the new topic of ``_recreate_at_fetch`` holds: written to it after the re-create, at
#: offsets 1..9 again.
NEW = [f"new-{i}".encode() for i in range(1, 10)]
OLD = [f"old-{i}".encode() for i in range(1, 10)]


def _recreate_at_fetch(hooks, writer, config, topic: str, fire_at: int = 1):
    """A hook for ``reader.before_fetch``: at its ``fire_at``-th hit, the topic is deleted,
    created again and written with :data:`NEW`, three appends of three."""
    hits = []

    def hook():
        hits.append(1)
        if len(hits) < fire_at:
            return
        del hooks["reader.before_fetch"]
        c, root = writer.coordination, config.root_prefix
        delete_topic(c, writer.objects, root, topic)
        create_topic(c, root, topic, 1)
        for i in range(0, len(NEW), 3):
            writer.append(topic, 0, NEW[i:i + 3])
    return hook


def _offsets_and_values(records) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in records]


def _assert_reads_exactly_the_new_topic(config, reader, topic: str) -> None:
    """The re-created topic reads back exactly what was written to it after the re-create
    (:data:`NEW` at offsets 1..9), in order, and nothing else: by ``reader``, which read the old
    topic, whole and window by window, and by a reader that never saw the old one."""
    expected = list(enumerate(NEW, start=1))
    assert reader.offsets(topic, 0) == (1, len(NEW))
    assert _offsets_and_values(reader.read_range(topic, 0, 1)) == expected
    assert _offsets_and_values(reader.iter_from(topic, 0, 1, window=2)) == expected
    assert [(o, reader.read_offset(topic, 0, o).value) for o in range(1, len(NEW) + 1)] == expected
    with LogReader(config) as fresh:
        assert _offsets_and_values(fresh.read_range(topic, 0, 1)) == expected


def test_a_read_midway_through_a_delete_and_recreate_never_mixes_the_two_topics(config, writer, reader, hooks):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "mix", 1)
    writer.append("mix", 0, OLD[0:3])
    writer.append("mix", 0, OLD[3:6])
    with LogWriter(config, clock=past_the_lag()) as later:  # too young to compact: stays a WAL entry
        later.append("mix", 0, OLD[6:9])
    with Compactor(config, writer.coordination, writer.objects, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition("mix", 0).records == 6  # 1..6 in a compacted object the delete removes
    hooks["reader.before_fetch"] = _recreate_at_fetch(hooks, writer, config, "mix")
    # The read resolved the old topic's offsets 1..9; the compacted object of 1..6 is gone when it
    # fetches, and resolving them again finds another incarnation: it fails, returning nothing.
    with pytest.raises(TopicRecreated, match=r"mix\[0\] was deleted and created again while this read ran"):
        reader.read_range("mix", 0, 1)
    assert "reader.before_fetch" not in hooks  # the delete and re-create ran midway
    _assert_reads_exactly_the_new_topic(config, reader, "mix")


def test_iter_from_across_a_delete_and_recreate_never_mixes_the_two_topics(config, writer, reader, hooks):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "mix", 1)
    writer.append("mix", 0, OLD)
    hooks["reader.before_fetch"] = _recreate_at_fetch(hooks, writer, config, "mix")
    values = []
    with pytest.raises(TopicRecreated, match=r"mix\[0\] was deleted and created again while this read ran"):
        for record in reader.iter_from("mix", 0, 1, window=3):
            values.append((record.offset, record.value))
    assert "reader.before_fetch" not in hooks
    # The first window was resolved and fetched (its WAL blob is still there: nothing collected
    # it) before the re-create: it is the old topic's, exactly. The next window is of another
    # incarnation: the iteration stops there, with nothing of the new topic.
    assert values == list(enumerate(OLD[:3], start=1))
    _assert_reads_exactly_the_new_topic(config, reader, "mix")


def test_a_topic_being_deleted_refuses_writes_and_a_second_delete_finishes_it(config, writer):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "del", 2)
    writer.append_shared([AppendGroup("del", 0, [b"a"]), AppendGroup("del", 1, [b"b"])])  # caches it ACTIVE

    marked = _mark_deleting(c, root, "del", SYSTEM)  # step 1 of a delete, then the deleter stops
    assert marked.record.state == DELETING and read_topic(c, root, "del").record.state == DELETING
    with LogWriter(config, auto_initialize=True) as fresh:
        with pytest.raises(TopicBeingDeleted, match="'del' is being deleted"):
            fresh.append("del", 0, [b"refused"])
    with pytest.raises(TopicAlreadyExists, match="being deleted"):
        create_topic(c, root, "del", 2)
    with pytest.raises(TopicAlreadyExists, match="being deleted"):
        create_topic(c, root, "del", 2, if_not_exists=True)
    with pytest.raises(TopicBeingDeleted):
        alter_topic(c, root, "del", partitions=3)
    k0, k1 = (partition_keys(root, "del", p, marked.record.topic_id) for p in range(2))
    assert read_control(c, k0).record.high_watermark == 1

    # A compactor holds partition 1's claim: the delete does partition 0, then gives up on 1.
    claim = c.claim(k1.compactor_claim, b'{"compactor_id": "test", "claimed_at_ms": 0}', k1.partition_key)
    objects = writer.objects
    with pytest.raises(ClaimHeld, match="run the delete again"):
        delete_topic(c, objects, root, "del", claim_wait_s=0)
    check_deleted(c, k0)
    assert read_topic(c, root, "del").record.state == DELETING
    # Writers are refused: the writer that cached the topic ACTIVE meets partition 0's tombstone
    # (nothing reserved, nothing initialized again) and reads the record afresh: DELETING, so
    # partition 1 is not written either.
    for partition in (0, 1):
        with pytest.raises(TopicBeingDeleted):
            writer.append("del", partition, [b"refused"])
    check_deleted(c, k0)
    assert read_control(c, k1).record.high_watermark == 1

    c.release(k1.compactor_claim, k1.partition_key, claim)
    report = delete_topic(c, objects, root, "del")
    assert report.partitions == 2
    assert read_topic(c, root, "del") is None
    for keys in (k0, k1):
        check_deleted(c, keys)
    recreated = create_topic(c, root, "del", 1)
    assert recreated.state == ACTIVE and recreated.topic_id != marked.record.topic_id
    assert writer.append("del", 0, [b"again"]).start_offset == 1
    check_deleted(c, k0)  # the new topic's partition 0 has keys of its own


def test_a_writer_with_the_record_cached_active_writes_until_the_delete_fences(config, writer, reader):
    """Writers trust a cached record for ``CACHE_TTL_S`` (docs/protocol.md section 10.2: re-read when
    it does not answer): between a delete's step 1 and its fence, a writer that cached the topic
    ACTIVE still appends; the fence (step 2) is what stops it, and the delete removes it all."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "late", 1)
    writer.append("late", 0, [b"a"])
    _mark_deleting(c, root, "late", SYSTEM)
    assert writer.append("late", 0, [b"b"]).start_offset == 2
    keys = writer.keys("late", 0)
    delete_topic(c, writer.objects, root, "late")
    assert check_deleted(c, keys).high_watermark == 2 and read_topic(c, root, "late") is None
    # Its next append meets the partition's tombstone, reads the record again (gone) and,
    # auto-initializing, creates the topic anew: the old records are not visible, and nothing
    # lands under the deleted incarnation.
    landed = writer.append("late", 0, [b"c"])
    assert landed.start_offset == 1 and landed.topic_id == read_topic(c, root, "late").record.topic_id != keys.topic_id
    check_deleted(c, keys)
    assert _values(reader, "late", 0) == [b"c"]


# --- what an earlier incarnation leaves behind ------------------------------------------------------------


def test_keys_of_an_earlier_incarnation_are_not_seen_by_a_create(config, writer, reader):
    """Keys written late under a deleted incarnation's ``topic_id`` (a writer's initializer, a
    group commit: docs/protocol.md section 12) are debris the new topic never reads: it starts empty,
    without group offsets, and the debris is left as it was."""
    c, root = writer.coordination, config.root_prefix
    earlier = partition_keys(root, "left", 0, str(uuid.uuid4()))
    initialize_partition(c, earlier)
    commit_offsets(c, root, "g", {TopicPartition("left", 0): 1}, topic_ids={"left": earlier.topic_id})
    debris = keys_left(c, earlier)
    assert debris == sorted([earlier.control, earlier.compaction_cursor, earlier.consumer_group("g")])
    record = create_topic(c, root, "left", 1)
    control = read_control(c, current_keys(c, root, "left", 0)).record
    assert (control.topic_id, control.sequence_counter) == (record.topic_id, 1)
    assert committed_offsets(c, root, "g", [TopicPartition("left", 0)]) == {}
    assert writer.append("left", 0, [b"new"]).start_offset == 1
    assert _values(reader, "left", 0) == [b"new"]
    assert topic_partitions(c, root, "left") == [0] and list_topics(c, root) == ["left"]
    assert keys_left(c, earlier) == debris


def test_a_tombstone_met_by_an_append_refuses_it(config, writer):
    """A partition whose ``meta/control`` is a tombstone while the topic record still names its
    incarnation as live (never in a correct run: a delete marks the record DELETING first):
    ``TopicRecreated``, nothing reserved, nothing initialized again. The tombstone is written by
    the control CAS the protocol uses (a stand-in for the race, which has no failpoint)."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "owned", 1)
    writer.append("owned", 0, [b"a"])
    keys = writer.keys("owned", 0)
    tombstone = update_control(c, keys, lambda control: control.with_changes(log_state=DELETED), "test", config)
    with pytest.raises(TopicRecreated, match=r"owned\[0\]: meta/control of topic id .* is a tombstone.*nothing was "
                                             r"reserved"):
        writer.append("owned", 0, [b"b"])
    assert c.get(keys.control, keys.partition_key).version_id == tombstone.version  # not written
    assert tombstone.record.high_watermark == 1
    with pytest.raises(TopicDeleted):
        read_control(c, keys)
    assert [e.end_offset for e in index_entries(c, keys)] == [1]


def test_racing_creates_make_one_topic(config, writer):
    c, root = writer.coordination, config.root_prefix
    with ThreadPoolExecutor(8) as pool:
        records = list(pool.map(lambda _: create_topic(c, root, "race", 3, if_not_exists=True), range(8)))
    assert len({r.topic_id for r in records}) == 1
    assert read_topic(c, root, "race").record.topic_id == records[0].topic_id
    assert [r.topic_id for r in _controls(writer, config, "race", range(3))] == [records[0].topic_id] * 3
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda _: _create_or_error(c, root, "race2"), range(4)))
    assert sum(isinstance(o, TopicAlreadyExists) for o in outcomes) == 3
    winner, = [o for o in outcomes if not isinstance(o, Exception)]
    assert winner.topic_id == read_topic(c, root, "race2").record.topic_id


def _create_or_error(c, root, topic):
    try:
        return create_topic(c, root, topic, 1)
    except TopicAlreadyExists as e:
        return e


def test_the_topic_cache_never_answers_an_absence_from_the_cache(config, writer):
    """A Spark task that found a topic missing must see it once the driver's first commit created
    it (a second write without the `partitions` option was refused as a count mismatch)."""
    cache = TopicCache(writer.coordination, config, auto_create=False)
    assert cache.get("arrives") is None
    create_topic(writer.coordination, config.root_prefix, "arrives", 3)
    assert cache.get("arrives").partitions == 3
    alter_topic(writer.coordination, config.root_prefix, "arrives", 5)
    assert cache.get("arrives").partitions == 3  # a record is cached (CACHE_TTL_S)
    assert cache.get("arrives", fresh=True).partitions == 5
