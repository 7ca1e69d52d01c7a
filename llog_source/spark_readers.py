"""``spark.readStream.format("llog")`` and ``spark.read.format("llog")``.

The stream reader lives in one long-lived Python process on the driver, so it keeps state
between calls: the ``availableNow`` target and the offsets last committed for ``groupId``.

Committing a consumer group's offsets: Spark calls ``commit(end)`` for a batch only when it
plans the next one, and never for the last batch of an ``availableNow`` run. But every call of
``latestOffset(start, limit)`` comes after the batch ending at ``start`` has completed (Spark
runs one batch at a time and asks for the next end only after the previous batch is in its
commit log; on restart it re-runs an uncommitted batch before asking). So ``start`` is
committed there, and in ``commit(end)`` too, whichever comes first.

pyspark 4.0 and 4.1 (no admission control for Python sources, ``llog_source.compat``) call
``latestOffset()`` without the start: it returns the ends of every partition found, and what
needs the start moves to ``partitions(start, end)``, the first call that has it: data loss
(a partition gone, or whose end moved back) is reported there, the consumer group committed at
``start`` and the batch logged (``lag.report_batch``). A later ``latestOffset()`` commits the
end of the batch last planned: Spark asks for the next end only after that batch completed.
``maxOffsetsPerTrigger`` is refused when the query starts, naming the pyspark version: a limit
needs the start, and after a restart the reader has none until Spark plans with it, too late to
bound that batch. ``availableNow`` runs as Spark's wrapper for sources without it: one batch up
to the ends found when the run starts, and no ``latestOffset()`` after it, so a group's offsets
for a run's last batch are committed when a later run plans a batch. Progress has no
``latestOffset`` (no ``reportLatestOffset``), so :func:`~llog_source.lag.offsets_behind_latest`
reads zero; the batch log line still has the lag.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

from llog.consumer_groups import commit_offsets
from llog.keys import TopicPartition
from llog.process_clients import coordination, freeze_kept_objects
from llog_source.lag import report_batch
from llog_source.options import InvalidSourceOption, SourceOptions
from llog_source.planning import (
    Found, LlogSplit, LlogSplits, PartitionOffsets, Positions, advance, check_subscription, current_topic_ids, data_loss,
    from_spark, pack, partition_offsets, plan_splits, rate_limit, recreated, recreated_problem, resolve_positions,
    subscription_offsets, to_spark, topic_ids_of,
)
from llog_source.schema import source_schema
from llog_source.compat import (
    ADMISSION_CONTROL, PYSPARK_VERSION, ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)

#: Spark's availableNow interface, where this pyspark has it (module doc).
_AVAILABLE_NOW = (SupportsTriggerAvailableNow,) if ADMISSION_CONTROL else ()


class _Planner:
    """What the batch and stream readers share: Oxia access on the driver, reads on executors.
    The driver's planner process needs Oxia only: what reads S3 is imported in the tasks."""

    def __init__(self, options: SourceOptions):
        self.options = options

    def found(self) -> dict[TopicPartition, PartitionOffsets]:
        """The subscription's partitions and their log start offsets and high watermarks, now."""
        config = self.options.config
        found = subscription_offsets(coordination(config), config.root_prefix, self.options.subscription)
        # Group commits go to the incarnation the offsets were planned in (docs/protocol.md section 12).
        self._topic_ids = {**getattr(self, "_topic_ids", {}), **{tp.topic: o.topic_id for tp, o in found.items()}}
        return found

    def log_starts(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offsets of ``partitions`` now (earliest; 1 for one that no longer exists)."""
        config = self.options.config
        found = partition_offsets(coordination(config), config.root_prefix, partitions)
        return {tp: found[tp].earliest if tp in found else 1 for tp in partitions}

    def splits(self, start: Positions, end: Positions, topic_ids: Mapping[str, str | None]) -> list[LlogSplit]:
        """Splits of ``start..end`` in the incarnations ``topic_ids`` (those ``end`` was taken
        from, docs/protocol.md section 12.6). A topic it names none for (offsets checkpointed by
        1.2) is planned in its incarnation now, as 1.2 did."""
        config = self.options.config
        unnamed = {tp.topic for tp in end} - set(topic_ids)
        if unnamed:
            topic_ids = {**current_topic_ids(coordination(config), config.root_prefix, unnamed), **topic_ids}
        return plan_splits(coordination(config), config.root_prefix, start, end, self.options.min_partitions,
                           self.options.max_records_per_partition, topic_ids=topic_ids)

    def read(self, split: LlogSplit | LlogSplits) -> Iterator[pa.RecordBatch]:
        if not isinstance(split, (LlogSplit, LlogSplits)):  # Spark's stand-in when nothing was planned
            return iter(())
        from llog_source.partition_reader import read_split

        options = self.options
        return _then_freeze(batch for one in (split.splits if isinstance(split, LlogSplits) else (split,))
                            for batch in read_split(one, options.config, options.fail_on_data_loss,
                                                    options.include_headers))


def topic_ids_found(found: Found) -> dict[str, str | None]:
    """The incarnation of each topic of ``found`` (docs/protocol.md section 12.6)."""
    return {tp.topic: offsets.topic_id for tp, offsets in found.items()}


def _then_freeze(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task's batches, then its Python worker's kept objects frozen (``freeze_kept_objects``:
    Spark collects garbage after every task)."""
    yield from batches
    freeze_kept_objects()


class LlogStreamReader(_Planner, DataSourceStreamReader, *_AVAILABLE_NOW):
    def __init__(self, options: SourceOptions):
        if options.max_offsets_per_trigger and not ADMISSION_CONTROL:
            raise InvalidSourceOption(
                f"maxOffsetsPerTrigger needs pyspark >= 4.2 (admission control for Python data sources); this is "
                f"pyspark {PYSPARK_VERSION}. Leave it out (each micro-batch reads all that is new) or bound tasks "
                "with maxRecordsPerPartition")
        super().__init__(options)
        self._target: Positions | None = None  # availableNow: the ends found when the run began
        self._latest: Positions | None = None
        self._committed: Positions = {}
        # pyspark < 4.2: the end of the batch last planned, and the incarnations it names
        self._planned: tuple[Positions, dict[str, str]] | None = None
        self._name = f"group {options.group_id}" if options.group_id else options.subscription.describe()

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's names
        found = self.found()
        check_subscription(self.options.subscription, found)
        return to_spark(resolve_positions("startingOffsets", self.options.starting, found,
                                          self.options.fail_on_data_loss), topic_ids_found(found))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = {tp: offsets.latest for tp, offsets in self.found().items()}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:  # noqa: N802
        """The next batch's end. pyspark < 4.2 gives neither argument (module doc)."""
        if start is None:
            if self._planned is not None:
                self._commit_group(*self._planned)  # that batch is done (module doc)
            found = self.found()
            self._latest = {tp: offsets.latest for tp, offsets in found.items()}
            return to_spark(self._latest, topic_ids_found(found))
        previous_end, previous_ids = from_spark(start), topic_ids_of(start)
        self._commit_group(previous_end, previous_ids)  # the batch that ended there is done (module doc)
        found = self.found()
        begin, latest = advance(previous_end, found, self.options.fail_on_data_loss, self._target, previous_ids)
        end = rate_limit(begin, latest, limit.max_rows) if isinstance(limit, ReadMaxRows) else latest
        # A partition that appeared empty is listed once it has records, so idle discovery
        # does not plan empty batches.
        end = {tp: n for tp, n in end.items() if tp in previous_end or n > begin[tp]}
        self._latest = latest
        records = sum(n - begin[tp] for tp, n in end.items())
        if records:
            report_batch(self._name, end, latest, records)
        # The end names the incarnations it was taken from: partitions() plans in them (section 12.6).
        return to_spark(end, topic_ids_found(found))

    def reportLatestOffset(self) -> dict | None:  # noqa: N802
        return to_spark(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[LlogSplit | LlogSplits]:
        """Splits for ``start..end``. Spark's ``start`` is the previous batch's end: a partition
        discovered since starts at its log start offset, as does one whose end moved back (read
        again, failOnDataLoss=false); both as :func:`advance` planned them when the batch's end
        was taken. A position below the log start is left to the tasks: they fail naming the
        removed offsets, or skip them (``read_split``), as ``advance`` did on the driver."""
        begin, finish = from_spark(start), from_spark(end)
        begin_ids, finish_ids = topic_ids_of(start), topic_ids_of(end)
        if not ADMISSION_CONTROL:
            self._settle(begin, finish, begin_ids, finish_ids)
        anew = [tp for tp in finish if tp not in begin or begin[tp] > finish[tp]
                or recreated(tp.topic, begin_ids, finish_ids.get(tp.topic))]
        begin.update(self.log_starts(anew) if anew else {})
        if not ADMISSION_CONTROL:
            self._planned = (finish, finish_ids)
            records = sum(max(0, n - begin[tp]) for tp, n in finish.items())
            if records:
                report_batch(self._name, finish, self._latest or finish, records)
        splits = self.splits(begin, finish, finish_ids)
        # Small splits share a task, unless minPartitions asks for tasks (planning.pack).
        return splits if self.options.min_partitions else pack(splits)

    def commit(self, end: dict) -> None:
        self._commit_group(from_spark(end), topic_ids_of(end))

    def _settle(self, begin: Positions, finish: Positions, begin_ids: Mapping[str, str],
                finish_ids: Mapping[str, str]) -> None:
        """pyspark < 4.2: the group commit and data loss checks ``latestOffset`` does with the
        start where it has it (module doc). The batch ending at ``begin`` (in ``begin_ids``) is
        done; ``finish`` lists every partition found when it was taken (in ``finish_ids``)."""
        self._commit_group(begin, begin_ids)
        fail = self.options.fail_on_data_loss
        for tp in sorted(begin):
            if tp not in finish:
                data_loss(fail, f"partition {tp} no longer exists", "dropping it from the query")
            elif recreated(tp.topic, begin_ids, finish_ids.get(tp.topic)):
                data_loss(fail, recreated_problem(tp, begin[tp], begin_ids[tp.topic], finish_ids[tp.topic]),
                          "reading the new topic from its log start offset")
            elif begin[tp] > finish[tp]:
                data_loss(fail, f"{tp} was at offset {begin[tp]} but its high watermark is now {finish[tp] - 1}",
                          "reading it again from its log start offset")

    def _commit_group(self, positions: Mapping[TopicPartition, int], topic_ids: Mapping[str, str]) -> None:
        """Commit ``positions`` for the group, in the incarnations ``topic_ids`` (those of the
        batch's offsets; for a topic they name none, the one last found)."""
        group = self.options.group_id
        changed = {tp: n for tp, n in positions.items() if self._committed.get(tp) != n}
        if group is None or not changed:
            return
        config = self.options.config
        topic_ids = {**getattr(self, "_topic_ids", {}), **topic_ids}
        commit_offsets(coordination(config), config.root_prefix, group, changed, topic_ids)
        self._committed.update(changed)


class LlogBatchReader(_Planner, DataSourceReader):
    def partitions(self) -> list[LlogSplit]:
        found = self.found()
        check_subscription(self.options.subscription, found)
        fail = self.options.fail_on_data_loss
        start = resolve_positions("startingOffsets", self.options.starting, found, fail)
        end = resolve_positions("endingOffsets", self.options.ending, found, fail)
        for tp in sorted(found):
            if end[tp] < start[tp]:
                raise InvalidSourceOption(f"endingOffsets {end[tp]} of {tp} is before its startingOffsets {start[tp]}")
        return self.splits(start, end, topic_ids_found(found))


def check_readable(options: SourceOptions) -> None:
    """What ``load()`` checks beyond the options themselves: named topics and assigned
    partitions exist."""
    check_subscription(options.subscription, _Planner(options).found())


def check_schema(schema, options: SourceOptions) -> None:
    """A read has fixed columns, like Kafka's: a user-specified schema must be exactly them."""
    expected = source_schema(options.include_headers)
    if schema is not None and schema != expected:
        raise InvalidSourceOption(f"format('llog') has a fixed schema ({expected.simpleString()}) and cannot "
                                  f"be read with another one: {schema.simpleString()}")
