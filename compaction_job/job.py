"""The compaction job: apply retention and compact partitions (docs/protocol.md section 10.3,
docs/protocol.md section 6), then collect the blobs nothing references any more (section 9), as one
Spark job. Meant to run on a schedule (every 5 minutes in ``databricks.yml``).

The driver discovers the partitions (every one, or those of ``--topics`` / ``--topic-pattern``),
shuffles them into groups of ``--partitions-per-task`` and runs one Spark task per group. A task
builds one :class:`llog.compactor.Compactor` from the driver's config and, for each partition of
its group, reads the blobs the partition references (for GC), then, holding the partition's
compactor claim, runs its retention pass (drops whole index entries older than the topic's
``retention.ms`` or beyond its ``retention.bytes``, never younger than the grace period) and
compacts it run after run until nothing is left or ``--max-runtime`` (from the job's start) has
passed. The driver then
deletes the blobs under ``R/wal-shared/`` that no partition referenced and that were older than
the grace period when the job began, and the partitions' compacted blobs that nothing references
(orphans of crashed compactions) and that were as old (:mod:`llog.gc` says why that order is
safe).

Crash safety: every compaction step is idempotent and recorded in ``meta/compaction``, so a task
or driver that dies leaves at most a record that the next run (or any compactor) resumes, and a
claim that expires with the task's Oxia session. Two runs at once are safe too: a partition one
of them has claimed is skipped by the other. Nothing is deleted unless every partition's
references were read: a task that fails fails the job before GC.

The driver, before it takes GC's time, and every task, before it reads a partition, pass the
deployment gate (docs/protocol.md section 9.2): a job whose ``LLOG_GC_GRACE_MS`` is not the root
prefix's ``G``, or whose driver's or executor's clock is off the S3 server's, compacts and
deletes nothing. A task's refusal fails the run, not one partition.

GC reads the references of every partition, whatever ``--topics`` says (a shared blob holds many
topics). A partition's references are read before it is compacted, so the blobs this run's
compactions stop referencing are collected by the next run rather than right away (a reader that
resolved the index just before the swap may still be fetching them).

Examples::

    spark-submit compaction_job/main.py --max-runtime 240
    python -m compaction_job --topics orders,payments --max-offsets 200000 --no-gc
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial

from llog.compactor import DEFAULT_MAX_OFFSETS, Compactor, PartitionCompaction
from llog.config import Config, positive
from llog.coordination import Coordination
from llog.deployment import pass_gate, process_name
from llog.discovery import partitions_of
from llog.errors import ConfigError, LlogError, TopicDeleted
from llog.gc import GcReport, all_partitions, check_grace, collect_garbage, gc_figures, referenced_blobs
from llog.keys import PartitionKeys, partition_keys, validate_topic
from llog.metrics import metrics_file, write_run_metrics
from llog.objects import ObjectStore
from llog.sink_batches import pinned_references

#: Partitions one Spark task compacts, one after another, by default.
DEFAULT_PARTITIONS_PER_TASK = 16


@dataclass(frozen=True)
class JobOptions:
    """What to compact and how; the defaults are the command line's."""

    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    max_offsets: int = DEFAULT_MAX_OFFSETS
    #: Seconds from the job's start after which no partition starts another compaction.
    max_runtime_s: float | None = None
    gc: bool = True
    #: Run each compacted partition's retention pass first (docs/protocol.md section 10.3).
    retention: bool = True
    #: GC grace period; None: the config's ``gc_grace_ms`` (never less).
    grace_ms: int | None = None
    partitions_per_task: int = DEFAULT_PARTITIONS_PER_TASK

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):  # "a,b" as well as ("a", "b")
            object.__setattr__(self, "topics", _topic_list(self.topics))
        if self.topics and self.topic_pattern is not None:
            raise ValueError("give at most one of topics and topic_pattern")
        for topic in self.topics:
            validate_topic(topic)
        if self.topic_pattern is not None:
            _pattern(self.topic_pattern)
        if self.max_offsets < 1:
            raise ValueError(f"max_offsets must be >= 1, got {self.max_offsets}")
        if self.max_runtime_s is not None and self.max_runtime_s <= 0:
            raise ValueError(f"max_runtime_s must be > 0, got {self.max_runtime_s}")
        if self.grace_ms is not None and self.grace_ms < 1:
            raise ValueError(f"grace_ms must be >= 1, got {self.grace_ms}")
        if self.partitions_per_task < 1:
            raise ValueError(f"partitions_per_task must be >= 1, got {self.partitions_per_task}")

    def gc_grace_ms(self, config: Config) -> int:
        """The grace period GC uses: ``grace_ms`` or the config's; ValueError if below the config's."""
        return check_grace(config.gc_grace_ms if self.grace_ms is None else self.grace_ms, config)


@dataclass
class CompactionReport:
    """What one run did."""

    partitions_seen: int = 0
    partitions_compacted: int = 0
    compactions: int = 0
    records: int = 0
    bytes: int = 0
    skipped_claimed: int = 0
    recoveries: int = 0
    #: Retention: records (offsets), index entries and body bytes dropped, and from how many partitions.
    retention_records: int = 0
    retention_entries: int = 0
    retention_bytes: int = 0
    partitions_retained: int = 0
    partitions_failed: int = 0
    #: ``"topic[partition]: error"`` for each partition whose compaction failed.
    errors: list[str] = field(default_factory=list)
    #: Partitions whose references GC read, and what it did (None with ``--no-gc``).
    gc_partitions: int = 0
    gc: GcReport | None = None
    duration_s: float = 0.0
    #: Every compacted partition's ``PartitionCompaction`` as a dict (not in the JSON line).
    partitions: list[dict] = field(default_factory=list, repr=False)

    def to_json(self) -> str:
        """One JSON line, without the per-partition details."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "partitions"}
        if fields["gc"] is not None:
            del fields["gc"]["deleted_uris"]
        return json.dumps({"job": "llog_compaction", **fields})

    def summary(self) -> str:
        lines = [f"compaction_job: {self.partitions_seen} partition(s) seen, {self.partitions_compacted} compacted in "
                 f"{self.compactions} compaction(s): {self.records:,} record(s), {self.bytes:,} bytes rewritten; "
                 f"{self.skipped_claimed} skipped (claimed elsewhere), {self.recoveries} recovery(ies), "
                 f"{self.partitions_failed} failed",
                 f"compaction_job: retention dropped {self.retention_records:,} record(s) ({self.retention_entries} "
                 f"index entries, {self.retention_bytes:,} bytes) from {self.partitions_retained} partition(s)"]
        lines += [f"  failed: {e}" for e in self.errors]
        if self.gc is not None:
            lines.append(f"compaction_job: GC over {self.gc_partitions} partition(s): {self.gc.listed} blob(s) "
                         f"listed, {self.gc.referenced} referenced, {self.gc.too_young} too young, "
                         f"{self.gc.deleted} deleted ({self.gc.deleted_bytes:,} bytes)")
        lines.append(f"compaction_job: done in {self.duration_s:.1f}s")
        return "\n".join(lines)

    def figures(self) -> dict[str, tuple[str, float]]:
        """The run's numbers for :func:`llog.metrics.write_run_metrics`."""
        figures = {
            "partitions_seen": ("Partitions the run was to compact", self.partitions_seen),
            "partitions_compacted": ("Partitions compacted at least once", self.partitions_compacted),
            "partitions_failed": ("Partitions whose compaction failed", self.partitions_failed),
            "partitions_skipped_claimed": ("Compactions skipped: another compactor held the claim",
                                           self.skipped_claimed),
            "compactions": ("Compactions (one compacted blob each)", self.compactions),
            "compacted_records": ("Records rewritten into compacted blobs", self.records),
            "compacted_bytes": ("Record bytes rewritten into compacted blobs", self.bytes),
            "recoveries": ("Compactions of crashed compactors finished", self.recoveries),
            "partitions_retained": ("Partitions whose retention dropped records", self.partitions_retained),
            "retention_records": ("Records retention dropped", self.retention_records),
            "retention_entries": ("Index entries retention dropped", self.retention_entries),
            "retention_bytes": ("Body bytes retention dropped", self.retention_bytes),
        }
        if self.gc is not None:
            figures["gc_partitions"] = ("Partitions whose references GC read", self.gc_partitions)
            figures.update(gc_figures(self.gc, prefix="gc_"))
        return figures


# --- the tasks ----------------------------------------------------------------------------------

def compact_group(config: Config, group: Sequence[tuple[str, int, str, bool, bool]], max_offsets: int,
                  deadline_epoch: float | None, retention: bool = True) -> dict:
    """One task's work: for each ``(topic, partition, topic_id, compact, scan)`` (a partition of
    the topic incarnation the driver planned with), read the partition's
    references if ``scan`` (all of them first), then (``retention``: apply its retention and)
    compact it if ``compact``. Returns the
    compactions (a failed one as ``{"topic", "partition", "error"}``) and the references. A failed
    reference scan raises: GC must not run without it. A partition whose topic was deleted after
    the driver planned it references nothing (its scan skips it, docs/protocol.md section 9.2) and
    has nothing to compact: it counts as compacted zero times, not as failed."""
    # The deadline crosses machines as wall-clock time; compact_partition wants monotonic time.
    deadline = None if deadline_epoch is None else time.monotonic() + (deadline_epoch - time.time())
    compactions = []
    with Compactor(config, max_offsets=max_offsets) as compactor:
        # Before anything: this executor's clock and G (a refusal fails the task, and so the run).
        compactor.check_deployment(f"compaction job task (compactor {compactor.compactor_id})")
        # Every reference is read before any of these partitions is compacted (one multi-key read
        # of their controls, then their index scans).
        referenced = referenced_blobs(compactor.coordination, config.root_prefix,
                                      [partition_keys(config.root_prefix, t, p, i) for t, p, i, _, scan in group if scan])
        for topic, partition, topic_id, compact, _ in group:
            if compact:
                try:
                    done = compactor.compact_partition(topic, partition, deadline, retention=retention,
                                                       topic_id=topic_id)
                    compactions.append(dataclasses.asdict(done))
                except TopicDeleted:  # deleted since the driver planned it (section 12.3): nothing to do
                    compactions.append(dataclasses.asdict(PartitionCompaction(topic, partition)))
                except ConfigError:
                    raise  # not this partition's failure: the run's (GraceMismatch, ClockSkew)
                except LlogError as e:
                    compactions.append({"topic": topic, "partition": partition, "error": f"{type(e).__name__}: {e}"})
    return {"compactions": compactions, "referenced": sorted(referenced)}


def _task(settings: dict[str, str], max_offsets: int, deadline_epoch: float | None, retention: bool,
          groups: Iterable[list]) -> Iterator[dict]:
    """A Spark task (``mapPartitions``): its slice holds one group."""
    config = Config.load(settings)
    for group in groups:
        yield compact_group(config, group, max_offsets, deadline_epoch, retention)


# --- the driver ---------------------------------------------------------------------------------

def select_partitions(coordination: Coordination, root: str, options: JobOptions,
                      everything: list[PartitionKeys] | None = None) -> list[PartitionKeys]:
    """The partitions to compact: of ``options.topics``, of topics matching ``options.topic_pattern``
    (full match, like the source's ``topicPattern``), or all (``everything`` if given)."""
    if options.topics:
        return partitions_of(coordination, root, options.topics)
    if everything is None:
        everything = all_partitions(coordination, root)
    if options.topic_pattern is not None:
        pattern = _pattern(options.topic_pattern)
        return [k for k in everything if pattern.fullmatch(k.tp.topic)]
    return everything


def plan(coordination: Coordination, root: str, options: JobOptions, rng: random.Random | None = None
         ) -> tuple[list[PartitionKeys], list[list[tuple[str, int, str, bool, bool]]]]:
    """The partitions to compact, and the shuffled task groups: every partition to compact, and
    with GC every partition at all (to read its references)."""
    everything = all_partitions(coordination, root) if options.gc or not options.topics else None
    selected = select_partitions(coordination, root, options, everything)
    chosen = set(selected)
    work = [(k.tp.topic, k.tp.partition, k.topic_id, k in chosen, options.gc)
            for k in sorted(chosen | set(everything or ()), key=lambda k: (k.tp, k.topic_id))]
    (rng or random).shuffle(work)
    size = options.partitions_per_task
    return selected, [work[i:i + size] for i in range(0, len(work), size)]


def run(spark, options: JobOptions, config: Config) -> CompactionReport:
    """Run the job once on ``spark`` and return its report. Raises if a task failed (then
    nothing was collected); failed compactions are in the report.

    The driver passes the deployment gate first (docs/protocol.md section 9.2): with another
    ``G`` than the root prefix's, or a clock off the S3 server's, the run is refused
    (:class:`GraceMismatch`, :class:`ClockSkew`) before it takes GC's time, plans or starts a
    task. A task the gate refuses (an executor's clock) fails, and with it the run, before GC."""
    config = config.require("oxia_service_address", "s3_bucket")
    grace_ms = options.gc_grace_ms(config)
    started = time.monotonic()
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            pass_gate(config, coordination, objects, f"compaction job driver, {process_name()}")
            began = datetime.now(timezone.utc)  # after the gate, before discovery: GC's time (llog.gc)
            deadline_epoch = None if options.max_runtime_s is None else time.time() + options.max_runtime_s
            # GC's references: pinned sink batches first (llog.gc), before the tasks read the partitions'.
            pinned = pinned_references(coordination, objects, config.root_prefix) if options.gc else None
            selected, groups = plan(coordination, config.root_prefix, options)
        report = CompactionReport(partitions_seen=len(selected))
        referenced = (set(pinned.uris) if pinned is not None else set()) | _tally(
            report, _run_tasks(spark, groups, config, options, deadline_epoch))
        if options.gc:
            scanned = [partition_keys(config.root_prefix, topic, partition, topic_id)
                       for group in groups for topic, partition, topic_id, _, scan in group if scan]
            report.gc_partitions = len(scanned)
            report.gc = collect_garbage(objects, config.root_prefix, referenced, grace_ms, now=began,
                                        partitions=scanned, unreadable_pins=pinned.unreadable)
    finally:
        objects.close()
    report.duration_s = round(time.monotonic() - started, 3)
    return report


def _run_tasks(spark, groups: list[list], config: Config, options: JobOptions, deadline_epoch: float | None
               ) -> list[dict]:
    """One Spark task per group (:func:`_task`); their results. Raises if one failed."""
    if not groups:
        return []
    sc = spark.sparkContext
    sc.setJobDescription(f"llog compaction: {sum(map(len, groups))} partition(s) in {len(groups)} task(s)")
    try:
        return (sc.parallelize(groups, len(groups))
                .mapPartitions(partial(_task, config.to_options(), options.max_offsets, deadline_epoch,
                                       options.retention))
                .collect())
    finally:
        sc.setJobDescription(None)


def _tally(report: CompactionReport, results: list[dict]) -> set[str]:
    """Add the tasks' compactions to ``report``; the blobs their partitions reference."""
    referenced: set[str] = set()
    for result in results:
        referenced.update(result["referenced"])
        for done in result["compactions"]:
            report.partitions.append(done)
            if "error" in done:
                report.partitions_failed += 1
                report.errors.append(f"{done['topic']}[{done['partition']}]: {done['error']}")
                continue
            report.partitions_compacted += int(done["compactions"] > 0)
            report.partitions_retained += int(done["retention_records"] > 0)
            report.skipped_claimed += done["skipped_claimed"]
            for name in ("compactions", "records", "bytes", "recoveries", "retention_records", "retention_entries",
                         "retention_bytes"):
                setattr(report, name, getattr(report, name) + done[name])
    return referenced


# --- the command line ---------------------------------------------------------------------------

def _topic_list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _pattern(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as e:
        raise ValueError(f"topic pattern {text!r} is not a valid regular expression: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction_job", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run as `spark-submit compaction_job/main.py ARGS` or `python -m compaction_job ARGS` (a local\n"
               "Spark). Connection settings come from LLOG_* environment variables, else from the settings\n"
               "file of the local stack (`llog stack up`). Prints a summary and, last, the report as a JSON line.")
    subscription = parser.add_mutually_exclusive_group()
    subscription.add_argument("--topics", help="compact only these topics (comma-separated; default: every "
                                               "partition of every topic)")
    subscription.add_argument("--topic-pattern", help="compact only topics matching this regular expression "
                                                      "(full match)")
    parser.add_argument("--max-offsets", type=positive(int), default=DEFAULT_MAX_OFFSETS,
                        help=f"offsets one compaction rewrites at most (default {DEFAULT_MAX_OFFSETS:,})")
    parser.add_argument("--max-runtime", type=positive(float), default=None, metavar="SECONDS",
                        help="after this many seconds from the start, no partition starts another compaction "
                             "(default: no limit); keep it below the schedule's interval")
    parser.add_argument("--retention", action=argparse.BooleanOptionalAction, default=True,
                        help="before compacting a partition, drop its records past the topic's retention.ms / "
                             "retention.bytes (default: --retention)")
    parser.add_argument("--gc", action=argparse.BooleanOptionalAction, default=True,
                        help="after compacting, delete blobs no partition references (default: --gc)")
    parser.add_argument("--grace-ms", type=positive(int), default=None,
                        help="GC only blobs older than this (default and minimum: LLOG_GC_GRACE_MS, the value "
                             "writers use)")
    parser.add_argument("--metrics-file", metavar="PATH.prom",
                        help="write the run's metrics there for Prometheus (node_exporter's textfile format, "
                             "replaced atomically; default: compaction.prom in LLOG_METRICS_TEXTFILE_DIR if set)")
    parser.add_argument("--partitions-per-task", type=positive(int),
                        default=DEFAULT_PARTITIONS_PER_TASK,
                        help=f"partitions one Spark task compacts (default {DEFAULT_PARTITIONS_PER_TASK})")
    return parser


def parse_options(argv: list[str] | None, config: Config, parser: argparse.ArgumentParser | None = None
                  ) -> JobOptions:
    """The job's options from the command line; bad ones exit through ``parser.error`` (status 2)."""
    parser = parser or build_parser()
    return options_from_args(parser, parser.parse_args(argv), config)


def options_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, config: Config) -> JobOptions:
    try:
        options = JobOptions(topics=_topic_list(args.topics or ""), topic_pattern=args.topic_pattern,
                             max_offsets=args.max_offsets, max_runtime_s=args.max_runtime, gc=args.gc,
                             retention=args.retention,
                             grace_ms=args.grace_ms, partitions_per_task=args.partitions_per_task)
        if args.topics is not None and not options.topics:
            raise ValueError("--topics names no topic")
        options.gc_grace_ms(config)
    except ValueError as e:  # InvalidTopicName is a ValueError too
        parser.error(str(e).replace("grace period", "--grace-ms", 1))
    return options


def spark_session(app: str):
    """The session to run in, and whether this job owns it (and stops it): the cluster's when
    Spark started this process (``spark-submit``, a Databricks task), else a local one
    (``LLOG_SPARK_MASTER``, default ``local[2]``) whose workers run this Python."""
    from pyspark.sql import SparkSession

    if os.environ.get("PYSPARK_GATEWAY_PORT") or os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return SparkSession.builder.appName(app).getOrCreate(), False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    master = os.environ.get("LLOG_SPARK_MASTER", "local[2]")
    return SparkSession.builder.master(master).appName(app).config("spark.ui.enabled", "false").getOrCreate(), True


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = Config.load().require("oxia_service_address", "s3_bucket")
    except LlogError as e:
        print(f"compaction_job: error: {e}", file=sys.stderr)
        return 1
    options = options_from_args(parser, args, config)
    try:
        metrics_path = metrics_file(args.metrics_file, config.metrics_textfile_dir, "compaction")
    except ValueError as e:
        parser.error(f"--metrics-file: {e}")

    started = time.monotonic()
    spark, owned = spark_session("llog-compaction")
    try:
        report = run(spark, options, config)
    except Exception as e:
        if metrics_path is not None:
            write_run_metrics(metrics_path, "compaction", success=False, duration_s=time.monotonic() - started,
                              figures={}, error_type=type(e).__name__)
        if isinstance(e, LlogError):
            print(f"compaction_job: error: {e}", file=sys.stderr)
            return 1
        raise
    finally:
        if owned:
            spark.stop()
    if metrics_path is not None:
        write_run_metrics(metrics_path, "compaction", success=not report.partitions_failed,
                          duration_s=report.duration_s, figures=report.figures(),
                          error_type=None if not report.partitions_failed else "PartitionsFailed")
    print(report.summary())
    print(report.to_json(), flush=True)
    return 1 if report.partitions_failed else 0
