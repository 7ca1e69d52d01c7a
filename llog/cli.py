"""The ``llog`` command: local stack, describe, consumer groups, fence/unfence, produce and consume,
and one-shot compaction and garbage collection (no Spark).

Connection settings come from the environment or the local stack's settings file
(:mod:`llog.config`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import math
import sys
import time

from llog import local_stack
from llog.config import Config
from llog.consumer_groups import describe_group, format_group, format_offsets, reset_offsets
from llog.coordination import Coordination
from llog.describe import describe_topic, format_descriptions
from llog.errors import LlogError
from llog.fence import fence, unfence
from llog.keys import PartitionKeys, TopicPartition


def _describe(args) -> int:
    config = Config.load()
    with Coordination(config) as coordination:
        rows = describe_topic(coordination, config.root_prefix, args.topic)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(format_descriptions(args.topic, rows))
    return 0


def _describe_group(args) -> int:
    config = Config.load()
    with Coordination(config) as coordination:
        rows = describe_group(coordination, config.root_prefix, args.group, args.topic or None)
    if args.json:
        print(json.dumps([dict(dataclasses.asdict(r), lag=r.lag) for r in rows], indent=2))
    else:
        print(format_group(args.group, rows))
    return 0


def _reset_group(args) -> int:
    config = Config.load()
    with Coordination(config) as coordination:
        offsets = reset_offsets(coordination, config.root_prefix, args.group, args.to, args.topic or None,
                                dry_run=args.dry_run)
    if args.json:
        print(json.dumps([{"topic": tp.topic, "partition": tp.partition, "offset": o}
                          for tp, o in sorted(offsets.items())], indent=2))
    else:
        print(format_offsets(args.group, offsets, args.dry_run))
    return 0


def _set_fence(args) -> int:
    config = Config.load()
    keys = PartitionKeys(config.root_prefix, TopicPartition(args.topic, args.partition))
    with Coordination(config) as coordination:
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
        for record in reader.iter_from(args.topic, args.partition, args.offset, args.to):
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
    from llog.compactor import DEFAULT_MAX_OFFSETS, Compactor

    deadline = None if args.max_runtime is None else time.monotonic() + args.max_runtime
    with Compactor(Config.load(), max_offsets=args.max_offsets or DEFAULT_MAX_OFFSETS) as compactor:
        done = compactor.compact_partition(args.topic, args.partition, deadline)
    if args.json:
        print(json.dumps(dataclasses.asdict(done), indent=2))
    elif done.skipped_claimed:
        print(f"{args.topic}[{args.partition}]: skipped, another compactor holds its claim")
    else:
        print(f"{args.topic}[{args.partition}]: {done.compactions} compaction(s), {done.records:,} record(s) and "
              f"{done.bytes:,} bytes rewritten from {done.source_entries} WAL entries ({done.source_gets} GETs), "
              f"{done.recoveries} recovery(ies)")
    return 0


def _gc(args) -> int:
    from llog.gc import check_grace, gc_pass
    from llog.objects import ObjectStore

    config = Config.load().require("oxia_service_address", "s3_bucket")
    try:
        grace_ms = check_grace(config.gc_grace_ms if args.grace_ms is None else args.grace_ms, config)
    except ValueError as e:
        print(f"llog: error: --grace-ms: {e}", file=sys.stderr)
        return 2
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            report = gc_pass(coordination, objects, config.root_prefix, grace_ms, dry_run=args.dry_run)
    finally:
        objects.close()
    if args.json:
        print(json.dumps(dict(dataclasses.asdict(report), dry_run=args.dry_run), indent=2))
    else:
        print(f"{report.listed} blob(s): {report.referenced} referenced, {report.too_young} younger than "
              f"{grace_ms} ms, {report.deleted} {'to delete' if args.dry_run else 'deleted'} "
              f"({report.deleted_bytes:,} bytes)")
        if args.dry_run:
            print("\n".join(report.deleted_uris))
    return 0


def positive(kind):
    """An argparse type: a positive ``int``, or a positive finite ``float`` (argparse names the
    argument in the error)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be {'>= 1' if kind is int else '> 0'}, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llog", description="llog: a leaderless log on Oxia and S3.")
    sub = parser.add_subparsers(dest="command", required=True)
    local_stack.add_stack_command(sub)

    p = sub.add_parser("describe", help="per partition: state, high watermark, index, cursor, pending")
    p.add_argument("topic")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_describe)

    groups = sub.add_parser("groups", help="consumer groups: committed offsets and lag").add_subparsers(
        dest="groups_command", required=True)
    p = groups.add_parser("describe", help="per partition: committed offset, high watermark, lag")
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
    p.add_argument("--offset", type=int, default=1, help="first offset (default 1)")
    p.add_argument("--to", type=int, default=None, help="last offset (default: the high watermark)")
    p.add_argument("--print-offsets", action="store_true")
    p.add_argument("--print-keys", action="store_true", help="print each record's key before its value")
    p.set_defaults(func=_consume)

    p = sub.add_parser("compact", help="compact one partition now, in this process (the compaction job does all)")
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

    p = sub.add_parser("gc", help="delete blobs no partition references, older than the grace period")
    p.add_argument("--grace-ms", type=positive(int), default=None,
                   help="grace period (default and minimum: LLOG_GC_GRACE_MS)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_gc)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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
