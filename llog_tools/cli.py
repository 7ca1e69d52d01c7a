"""The ``llog`` command: local stack, topics (create, list, describe, alter, delete), describe,
consumer groups, fence/unfence, produce and consume, and one-shot compaction, retention and
garbage collection (no Spark).

Every command that may write passes the deployment gate first (docs/protocol.md section 9.2):
with another ``LLOG_GC_GRACE_MS`` than the root prefix's, or a clock off the S3 server's, it
fails before it reads anything. The commands that only read do not.

Connection settings come from the environment or the local stack's settings file
(:mod:`llog.config`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from llog.config import Config, positive
from llog.consumer_groups import describe_group, format_group, format_offsets, reset_offsets, topic_group_lags
from llog.coordination import Coordination
from llog.describe import describe_topic
from llog.errors import LlogError
from llog.fence import fence, unfence
from llog_tools.describe import format_descriptions
from llog_tools.stack.command import add_stack_command


def _pass_gate(config: Config, coordination: Coordination, command: str, objects=None) -> None:
    """A command that may write passes the deployment gate before it reads anything
    (docs/protocol.md section 9.2): refused with another ``G`` than the root prefix's, or on a
    machine whose clock is off the S3 server's, even where it would have changed nothing."""
    from llog.deployment import pass_gate, process_name
    from llog.objects import ObjectStore

    pass_gate(config, coordination, objects, f"llog {command}, {process_name()}", make_objects=ObjectStore)


def _describe(args) -> int:
    config = Config.load()
    with Coordination(config) as coordination:
        rows = describe_topic(coordination, config.root_prefix, args.topic)
        groups = None if args.json else topic_group_lags(coordination, config.root_prefix, args.topic)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(format_descriptions(args.topic, rows, groups))
    return 0


def _describe_group(args) -> int:
    config = Config.load()
    with Coordination(config) as coordination:
        rows = describe_group(coordination, config.root_prefix, args.group, args.topic or None)
    if args.json:
        print(json.dumps([dict(dataclasses.asdict(r), log_end_offset=r.log_end_offset, lag=r.lag) for r in rows],
                         indent=2))
    else:
        print(format_group(args.group, rows))
    return 0


def _reset_group(args) -> int:
    config = Config.load()
    with Coordination(config) as coordination:
        if not args.dry_run:
            _pass_gate(config, coordination, "groups reset")
        offsets = reset_offsets(coordination, config.root_prefix, args.group, args.to, args.topic or None,
                                dry_run=args.dry_run)
    if args.json:
        print(json.dumps([{"topic": tp.topic, "partition": tp.partition, "offset": o}
                          for tp, o in sorted(offsets.items())], indent=2))
    else:
        print(format_offsets(args.group, offsets, args.dry_run))
    return 0


def _set_fence(args) -> int:
    from llog.topics import TopicCache

    config = Config.load()
    with Coordination(config) as coordination:
        _pass_gate(config, coordination, args.command)
        keys = TopicCache(coordination, config, auto_create=False).keys(args.topic, args.partition)
        state = (fence if args.command == "fence" else unfence)(coordination, keys, config)
    print(f"{keys.tp}: {state.record.log_state} (high watermark {state.record.high_watermark})")
    return 0


def _produce(args) -> int:
    from llog.writer import LogWriter

    lines = [line.rstrip(b"\n") for line in (open(args.file, "rb") if args.file else sys.stdin.buffer)]
    with LogWriter(Config.load(), auto_initialize=True) as writer:
        result = writer.append(args.topic, args.partition, lines)
    print(f"{args.topic}[{args.partition}]: wrote {result.count} record(s) at offsets "
          f"{result.start_offset}..{result.end_offset}")
    return 0


def _consume(args) -> int:
    from llog.reader import LogReader

    with LogReader(Config.load()) as reader:
        offset = args.offset if args.offset is not None else reader.offsets(args.topic, args.partition)[0]
        for record in reader.iter_from(args.topic, args.partition, offset, args.to):
            fields = [_text(record.value)]  # as Kafka's console consumer: "null" for a tombstone or no key
            if args.print_keys:
                fields.insert(0, _text(record.key))
            if args.print_offsets:
                fields.insert(0, str(record.offset))
            print("\t".join(fields))
    return 0


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="backslashreplace")


def _compact(args) -> int:
    from llog_tools import progress
    from llog.compactor import DEFAULT_MAX_OFFSETS, Compactor

    deadline = None if args.max_runtime is None else time.monotonic() + args.max_runtime
    with Compactor(Config.load(), max_offsets=args.max_offsets or DEFAULT_MAX_OFFSETS) as compactor:
        done = compactor.compact_partition(args.topic, args.partition, deadline, progress=progress.task)
    if args.json:
        print(json.dumps(dataclasses.asdict(done), indent=2))
    elif done.skipped_claimed:
        print(f"{args.topic}[{args.partition}]: skipped, another compactor holds its claim")
    else:
        print(f"{args.topic}[{args.partition}]: {done.compactions} compaction(s), {done.records:,} record(s) and "
              f"{done.bytes:,} bytes rewritten from {done.source_entries} WAL entries ({done.source_gets} GETs), "
              f"{done.recoveries} recovery(ies)")
    return 0


def _sinks_unpin(args) -> int:
    from llog.clock import SYSTEM
    from llog.objects import ObjectStore
    from llog.sink_batches import unpin_committed, unpin_unreadable

    if args.committed != (args.batch is not None):
        print("llog: error: sinks unpin: --batch and --committed go together (a readable pin is retired only when "
              "its cut is committed)", file=sys.stderr)
        return 2
    config = Config.load().require("oxia_service_address", "s3_bucket")
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            if args.committed:
                _pass_gate(config, coordination, "sinks unpin", objects)
                print(unpin_committed(coordination, objects, config, args.sink_id, args.batch, SYSTEM))
                return 0
            done = unpin_unreadable(coordination, objects, config.root_prefix, args.sink_id)
    finally:
        objects.close()
    print(done)
    return 0 if ": deleted" in done or ": no pinned batch" in done else 1


def _sinks_finish(args) -> int:
    """``llog sinks finish``: docs/protocol.md section 9.1, the operator finishes a pinned cut."""
    from llog.sink_batches import SinkBatchOutOfOrder, finish_pinned, pin_batch
    from llog.writer import LogWriter, SinkBatch

    config = Config.load().require("oxia_service_address", "s3_bucket")
    with LogWriter(config) as writer:
        _pass_gate(config, writer.coordination, "sinks finish", writer.objects)
        finish_pinned(writer.coordination, writer.objects, config, args.sink_id, args.batch, writer.clock)
        try:
            pinned = pin_batch(writer.coordination, writer.objects, config, args.sink_id, args.batch, [], writer.clock,
                               replay_only=True)
        except SinkBatchOutOfOrder:  # the query's own replay committed it and went on meanwhile
            print(f"sink {args.sink_id} batch {args.batch}: finished, and the query has committed it and pinned a "
                  f"later batch since")
            return 0
        done = writer.commit_staged(pinned, SinkBatch(args.sink_id, args.batch))
    now = sum(r is not None for r in done)
    print(f"sink {args.sink_id} batch {args.batch}: {now} slice(s) of the pinned cut committed now, {len(done) - now} "
          f"before ({sum(s.msg_count for s in pinned)} record(s) in all). The pin is finished: a replay of batch "
          f"{args.batch} commits nothing more and drops its own rows (their blobs are left to GC), so the batch holds "
          f"the rows of the attempt that pinned it, once")
    return 0


def _sinks_list(args) -> int:
    from llog.clock import SYSTEM
    from llog.objects import ObjectStore
    from llog.sink_batches import list_pins, sink_command

    config = Config.load().require("oxia_service_address", "s3_bucket")
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            pins = list_pins(coordination, objects, config, SYSTEM)
    finally:
        objects.close()
    if args.json:
        print(json.dumps([dataclasses.asdict(p) for p in pins], indent=2))
        return 0
    for p in pins:
        if p.problem is not None:
            print(f"{p.key}: cannot be read ({p.problem}); `llog sinks unpin -- {p.key.rsplit('/', 1)[1]}`")
            continue
        if p.retired:
            print(f"{p.sink_id}  batch {p.batch_id}  retired {p.age_ms / 3_600_000:.1f} h ago  (no cut: a commit of "
                  f"batch {p.batch_id} commits nothing, an earlier one is refused)")
            continue
        state = "finished" if p.finished else "committed" if p.committed == p.slices else "half-committed" \
            if p.committed else "not committed"
        later = "" if not p.later else "  progress of a later batch in " + ", ".join(
            f"{tp} (batch {b})" for tp, b in p.later.items()) + ": not counted as this batch's"
        verdict = (f"  can be retired: `{sink_command('unpin', p.sink_id, p.batch_id, '--committed')}`"
                   if p.kept is None else f"  kept: {p.kept}")
        print(f"{p.sink_id}  batch {p.batch_id}  pinned {p.age_ms / 3_600_000:.1f} h ago  {p.committed} of "
              f"{p.slices} slice(s) committed  {state}{later}{verdict}")
    return 0


def _gc(args) -> int:
    from llog_tools import progress
    from llog.gc import check_grace, gc_figures, gc_pass
    from llog.metrics import metrics_file, write_run_metrics
    from llog.objects import ObjectStore

    config = Config.load().require("oxia_service_address", "s3_bucket")
    try:
        grace_ms = check_grace(config.gc_grace_ms if args.grace_ms is None else args.grace_ms, config)
    except ValueError as e:
        print(f"llog: error: --grace-ms: {e}", file=sys.stderr)
        return 2
    try:
        metrics_path = metrics_file(args.metrics_file, config.metrics_textfile_dir, "gc")
    except ValueError as e:
        print(f"llog: error: --metrics-file: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            report = gc_pass(coordination, objects, config.root_prefix, grace_ms, dry_run=args.dry_run,
                             progress=progress.task)
    except Exception as e:
        if metrics_path is not None:
            write_run_metrics(metrics_path, "gc", success=False, duration_s=time.monotonic() - started, figures={},
                              error_type=type(e).__name__)
        raise
    finally:
        objects.close()
    if metrics_path is not None:
        write_run_metrics(metrics_path, "gc", success=True, duration_s=time.monotonic() - started,
                          figures={**gc_figures(report), "dry_run": ("1 if the run was a dry run", args.dry_run)})
    if args.json:
        print(json.dumps(dict(dataclasses.asdict(report), dry_run=args.dry_run), indent=2))
    else:
        print(f"{report.listed} blob(s): {report.referenced} referenced, {report.too_young} younger than "
              f"{grace_ms} ms, {report.deleted} {'to delete' if args.dry_run else 'deleted'} "
              f"({report.deleted_bytes:,} bytes)")
        if args.dry_run:
            print("\n".join(report.deleted_uris))
        for key in report.unreadable_pins:
            print(f"pinned sink batch {key} cannot be read: no WAL blob was deleted ({report.kept_for_unreadable_pins} "
                  f"kept); fix it or remove it with `llog sinks unpin -- {key.rsplit('/', 1)[1]}`", file=sys.stderr)
    return 0


# --- topics ------------------------------------------------------------------------------------


def _topics_create(args) -> int:
    from llog.topics import create_topic, parse_config_pairs

    config = Config.load()
    settings = parse_config_pairs(args.config or [])
    with Coordination(config) as coordination:
        _pass_gate(config, coordination, "topics create")
        record = create_topic(coordination, config.root_prefix, args.topic,
                              args.partitions or config.default_partitions, settings, args.if_not_exists)
    print(json.dumps(_topic_json(record, config), indent=2) if args.json else
          f"Created topic {record.topic} ({record.partitions} partition(s), id {record.topic_id})")
    return 0


def _topics_list(args) -> int:
    from llog.topics import list_topic_records

    config = Config.load()
    with Coordination(config) as coordination:
        records = list_topic_records(coordination, config.root_prefix)
    if args.json:
        print(json.dumps([_topic_json(r, config) for r in records], indent=2))
        return 0
    rows = [("TOPIC", "PARTITIONS", "STATE", "CONFIG")]
    rows += [(r.topic, str(r.partitions), r.state, ",".join(f"{k}={v}" for k, v in sorted(r.config.items())) or "-")
             for r in records]
    print(_table(rows))
    return 0


def _topics_describe(args) -> int:
    from llog_tools.describe import describe_topics, format_topic_descriptions, format_topic_descriptions_json
    from llog.objects import ObjectStore

    config = Config.load()
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            described = describe_topics(coordination, objects, config.root_prefix, args.topic or None, config)
    finally:
        objects.close()
    if args.json:
        print(format_topic_descriptions_json(described))
    else:
        print(format_topic_descriptions(described))
    return 0


def _topics_alter(args) -> int:
    from llog.topics import alter_topic, parse_config_pairs

    config = Config.load()
    if args.partitions is None and not args.config and not args.delete_config:
        print("llog: error: topics alter: give --partitions, --config or --delete-config", file=sys.stderr)
        return 2
    with Coordination(config) as coordination:
        _pass_gate(config, coordination, "topics alter")
        record = alter_topic(coordination, config.root_prefix, args.topic, args.partitions,
                             parse_config_pairs(args.config or []), args.delete_config or [])
    print(json.dumps(_topic_json(record, config), indent=2) if args.json else
          f"Topic {record.topic}: {record.partitions} partition(s), config "
          + (",".join(f"{k}={v}" for k, v in sorted(record.config.items())) or "(defaults)"))
    return 0


def _topics_delete(args) -> int:
    from llog.errors import TopicNotFound
    from llog.objects import ObjectStore
    from llog.topics import delete_topic

    config = Config.load()
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            _pass_gate(config, coordination, "topics delete", objects)
            report = delete_topic(coordination, objects, config.root_prefix, args.topic, args.claim_wait, config=config)
    except TopicNotFound:
        if not args.if_exists:
            raise
        print(f"topic {args.topic!r} does not exist: nothing to delete")
        return 0
    finally:
        objects.close()
    print(json.dumps(dataclasses.asdict(report), indent=2) if args.json else
          f"Deleted topic {report.topic}: {report.partitions} partition(s) and {report.compacted_objects} compacted "
          f"object(s); its WAL blobs go with the next garbage collection")
    return 0


def _topic_json(record, config: Config) -> dict:
    from llog.topics import TopicSettings

    return {**dataclasses.asdict(record), "effective_config": TopicSettings.of(record.topic, record, config).as_kafka()}


def _retention(args) -> int:
    from llog.compactor import Compactor
    from llog.discovery import partitions_of

    config = Config.load()
    rows = []
    with Compactor(config) as compactor:
        for keys in partitions_of(compactor.coordination, config.root_prefix, args.topic or None):
            rows.append(compactor.retain_partition(keys.tp.topic, keys.tp.partition, keys.topic_id))
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return 0
    table = [("TOPIC", "PARTITION", "LOG_START", "DROPPED_RECORDS", "DROPPED_ENTRIES", "DROPPED_BYTES")]
    table += [(r.topic, str(r.partition), "skipped (claimed)" if r.skipped_claimed else str(r.log_start_offset),
               str(r.retention_records), str(r.retention_entries), str(r.retention_bytes)) for r in rows]
    print(_table(table))
    print(f"retention: {sum(r.retention_records for r in rows):,} record(s) dropped from {len(rows)} partition(s); "
          f"their blobs go with the next garbage collection")
    return 0


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llog", description="llog: a leaderless log on Oxia and S3.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_stack_command(sub)

    topics = sub.add_parser("topics", help="create, list, describe, alter and delete topics (docs/protocol.md section 10)"
                            ).add_subparsers(dest="topics_command", required=True)
    p = topics.add_parser("create", help="create a topic (its record and partitions)")
    p.add_argument("topic")
    p.add_argument("--partitions", type=positive(int), default=None, help="default: LLOG_DEFAULT_PARTITIONS")
    p.add_argument("--config", action="append", metavar="NAME=VALUE",
                   help="retention.ms, retention.bytes, cleanup.policy, compression.type (repeatable)")
    p.add_argument("--if-not-exists", action="store_true", help="an existing topic is not an error")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_topics_create)
    p = topics.add_parser("list", help="every topic, with its partition count and config")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_topics_list)
    p = topics.add_parser("describe", help="per partition: log start and end, records, bytes in S3; monthly cost")
    p.add_argument("topic", nargs="*", help="default: every topic")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_topics_describe)
    p = topics.add_parser("alter", help="add partitions (never fewer), set or delete settings")
    p.add_argument("topic")
    p.add_argument("--partitions", type=positive(int), default=None, help="the new count (only grows)")
    p.add_argument("--config", action="append", metavar="NAME=VALUE", help="set a setting (repeatable)")
    p.add_argument("--delete-config", action="append", metavar="NAME", help="back to the default (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_topics_alter)
    p = topics.add_parser("delete", help="fence the topic's partitions, remove its keys and compacted objects")
    p.add_argument("topic")
    p.add_argument("--if-exists", action="store_true", help="a missing topic is not an error")
    p.add_argument("--claim-wait", type=positive(float), default=60.0, metavar="SECONDS",
                   help="how long to wait per partition for a running compaction (default 60)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_topics_delete)

    p = sub.add_parser("retention", help="drop records past each topic's retention.ms / retention.bytes now "
                                         "(the compaction job does it on its schedule)")
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: every topic)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_retention)

    p = sub.add_parser("describe", help="per partition: state, log start and end offsets, index, cursor, pending; "
                                       "each consumer group's offsets and lag")
    p.add_argument("topic")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_describe)

    groups = sub.add_parser("groups", help="consumer groups: committed offsets and lag").add_subparsers(
        dest="groups_command", required=True)
    p = groups.add_parser("describe", help="per partition: current (committed) offset, log-end offset, lag")
    p.add_argument("group")
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all topics)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_describe_group)
    p = groups.add_parser("reset", help="move a group's committed offsets, backwards too (commits only move forward)")
    p.add_argument("group")
    p.add_argument("--to", required=True, metavar="earliest|latest|JSON",
                   help='earliest, latest (the log end: nothing left to read), or {"topic": {"0": 17, "1": -2}} '
                        '(-2 earliest, -1 latest)')
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all the group has)")
    p.add_argument("--dry-run", action="store_true", help="print what would be set, set nothing")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_reset_group)

    for name, text in (("fence", "reject appends to a partition"), ("unfence", "accept appends again")):
        p = sub.add_parser(name, help=text)
        p.add_argument("topic")
        p.add_argument("partition", type=int)
        p.set_defaults(func=_set_fence)

    p = sub.add_parser("produce", help="append lines of stdin (or --file) as records")
    p.add_argument("topic")
    p.add_argument("-p", "--partition", type=int, default=0)
    p.add_argument("--file", help="read records from this file, one per line")
    p.set_defaults(func=_produce)

    p = sub.add_parser("consume", help="print records from an offset to the high watermark")
    p.add_argument("topic")
    p.add_argument("-p", "--partition", type=int, default=0)
    p.add_argument("--offset", type=int, default=None, help="first offset (default: the log start offset, earliest)")
    p.add_argument("--to", type=int, default=None, help="last offset (default: the high watermark)")
    p.add_argument("--print-offsets", action="store_true")
    p.add_argument("--print-keys", action="store_true", help="print each record's key before its value")
    p.set_defaults(func=_consume)

    p = sub.add_parser("compact", help="compact one partition now, in this process (the compaction job does all)",
                       epilog="Progress shows on stderr while it is a terminal (LLOG_PROGRESS=0: never, 1: always).")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("--max-offsets", type=positive(int), default=None,
                   help="offsets one compaction rewrites at most (default 1,000,000)")
    p.add_argument("--max-runtime", type=positive(float), default=None, metavar="SECONDS",
                   help="start no compaction after this many seconds (default: until nothing is left)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_compact)

    # Handled in main() before parsing (every argument goes to the broker); here for --help.
    sub.add_parser("broker", add_help=False,
                   help="serve the HTTP broker (python -m broker_lite): llog broker [--host H] [--port P] [--role R]")

    # Handled in main() before parsing; here for --help.
    sub.add_parser("observe", add_help=False,
                   help="Prometheus scraping the local stack (llog observe up|down|status; make observe)")

    sinks = sub.add_parser("sinks", help="pinned sink batches (docs/protocol.md section 9.1)"
                           ).add_subparsers(dest="sinks_command", required=True)
    p = sinks.add_parser("unpin", help="delete a sink's pinned batch record that cannot be read (GC keeps every WAL "
                                       "blob while one exists); retire a readable one with --batch B --committed")
    p.add_argument("sink_id")
    p.add_argument("--batch", type=int, default=None, metavar="B",
                   help="with --committed: the batch the pin must hold (else nothing is deleted)")
    p.add_argument("--committed", action="store_true",
                   help="retire a readable pin whose cut is committed (a commit of B then commits nothing, an earlier "
                        "batch is refused); only when Spark will not replay batch B (the query is gone, or its "
                        "checkpoint's commits/ holds B). A sink id starting with '-' goes after '--'")
    p.set_defaults(func=_sinks_unpin)
    p = sinks.add_parser("finish", help="a replay of batch B that differs is refused (SinkBatchMismatch): commit the "
                                        "rest of the pinned cut and let the replay through without its own rows")
    p.add_argument("sink_id")
    p.add_argument("--batch", type=int, required=True, metavar="B", help="the pinned batch (else nothing is done)")
    p.set_defaults(func=_sinks_finish)
    p = sinks.add_parser("list", help="every pinned batch: its age and how much of its cut is committed")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_sinks_list)

    p = sub.add_parser("gc", help="delete blobs no partition references, older than the grace period",
                       epilog="Progress shows on stderr while it is a terminal (LLOG_PROGRESS=0: never, 1: always).")
    p.add_argument("--grace-ms", type=positive(int), default=None,
                   help="grace period (default and minimum: LLOG_GC_GRACE_MS)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--metrics-file", metavar="PATH.prom",
                   help="write the run's metrics there for Prometheus (node_exporter's textfile format, "
                        "replaced atomically; default: gc.prom in LLOG_METRICS_TEXTFILE_DIR if set)")
    p.set_defaults(func=_gc)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["observe"]:  # Prometheus for the local stack (llog_tools/observe.py has its own parser)
        from llog_tools import observe

        return observe.main(argv[1:])
    if argv[:1] == ["broker"]:
        # The broker is a package above the core (it imports llog, never the other way): run it
        # as its own module in this process's place, with every argument after ``broker``.
        os.execv(sys.executable, [sys.executable, "-m", "broker_lite", *argv[1:]])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LlogError as e:
        print(f"llog: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
