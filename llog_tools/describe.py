"""``llog describe TOPIC`` and ``llog topics describe``: what is in a topic's partitions (read by
:mod:`llog.describe`), what keeping it costs, and the tables and JSON the commands print.

Per topic (:func:`describe_topics`): its record (section 1: ``topic_id``, state, partition count,
effective config), its partitions (:func:`llog.describe.describe_partition`), its bytes and an
estimate of their monthly storage cost at S3 Standard list prices (:mod:`llog_tools.pricing`). A
topic whose partitions were written before topic records existed has no record: it is described
from its partitions, and says so.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from llog.config import Config
from llog.consumer_groups import GROUP_COLUMNS, PartitionLag
from llog.coordination import Coordination
from llog.describe import PartitionDescription, describe_topic
from llog.errors import TopicNotFound
from llog.keys import validate_topic
from llog.objects import ObjectStore
from llog.records import TopicRecord
from llog.topics import TopicSettings, list_topic_records, read_topic
from llog_tools.pricing import PriceTable, PriceTableError, load_prices

#: The partition table's columns (:func:`format_partition_table`).
PARTITION_COLUMNS = ("PARTITION", "STATE", "LOG-START-OFFSET", "LOG-END-OFFSET", "RECORDS", "WAL_BYTES", "COMPACTED_BYTES",
                     "INDEX_ENTRIES", "CURSOR", "PENDING")


# --- topics ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicDescription:
    topic: str
    #: From the topic record (docs/protocol.md section 10.1).
    topic_id: str
    state: str
    #: The record's partition count.
    partition_count: int
    #: The effective settings (Kafka's names): the record's, else the defaults.
    config: dict[str, Any]
    partitions: list[PartitionDescription]
    #: Partitions below the count with no ``meta/control`` (a create that crashed midway; the
    #: first writer initializes them).
    uninitialized_partitions: list[int] = field(default_factory=list)
    #: The partitions' bytes in S3; None when unknown (no object store).
    bytes: int | None = None
    #: Estimated USD a month to keep ``bytes`` in S3 Standard; None when unknown (``cost_basis``
    #: says why), else at the list prices of ``cost_region`` (``cost_basis`` says which).
    monthly_cost_usd: float | None = None
    cost_region: str | None = None
    cost_basis: str = ""

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)


def describe_topics(coordination: Coordination, objects: ObjectStore | None, root: str,
                    topics: list[str] | None = None, config: Config | None = None,
                    prices: PriceTable | None = None) -> list[TopicDescription]:
    """``topics`` (None: every topic), by name. ``config``
    gives the settings' defaults and the region whose prices the cost is at
    (``s3_region_name``); default: the object store's config. ``prices``: default the table
    :func:`llog_tools.pricing.load_prices` finds; when it finds none the cost is unknown, and the
    description says why. Raises :class:`TopicNotFound` for a named topic without a record."""
    config = config or (objects.config if objects is not None else Config())
    if topics is None:
        records = {r.topic: r for r in list_topic_records(coordination, root)}  # one scan of one shard
        names = sorted(records)
    else:
        names = list(dict.fromkeys(topics))
        for name in names:
            validate_topic(name)
        records = {name: _record(coordination, root, name) for name in names}
    prices, no_prices = _price_table(prices)
    described = []
    for name in names:
        record = records.get(name)
        if record is None:
            raise TopicNotFound(name)
        partitions = describe_topic(coordination, root, name, objects)
        described.append(_topic_description(name, record, partitions, config, objects, prices, no_prices))
    return described


def _record(coordination: Coordination, root: str, topic: str) -> TopicRecord | None:
    found = read_topic(coordination, root, topic)
    return found.record if found is not None else None


def _price_table(prices: PriceTable | None) -> tuple[PriceTable | None, str]:
    """The price table, or None and why there is none (a description then says the cost is
    unknown instead of failing)."""
    if prices is not None:
        return prices, ""
    try:
        return load_prices(), ""
    except PriceTableError as e:
        return None, f"unknown: {e}"


def _topic_description(topic: str, record: TopicRecord, partitions: list[PartitionDescription], config: Config,
                       objects: ObjectStore | None, prices: PriceTable | None, no_prices: str) -> TopicDescription:
    found = [p.partition for p in partitions]
    count = record.partitions
    total = None if any(p.bytes is None for p in partitions) else sum(p.bytes for p in partitions)
    cost = region = None
    if objects is None:
        basis = "unknown: no object store to list the compacted objects' sizes"
    elif prices is None:
        basis = no_prices
    else:
        estimate = prices.monthly_storage_cost(total, config.s3_region_name)
        cost, region, basis = estimate.usd_per_month, estimate.region, estimate.basis()
    return TopicDescription(
        topic=topic,
        topic_id=record.topic_id,
        state=record.state,
        partition_count=count,
        config=TopicSettings.of(topic, record, config).as_kafka(),
        partitions=partitions,
        uninitialized_partitions=sorted(set(range(count)) - set(found)),
        bytes=total,
        monthly_cost_usd=cost,
        cost_region=region,
        cost_basis=basis,
    )


# --- output ------------------------------------------------------------------------------------------


def format_topic_descriptions(descriptions: list[TopicDescription]) -> str:
    """Per topic a header line and a table of its partitions; a total line when there are
    several topics."""
    if not descriptions:
        return "no topics"
    blocks = [_topic_block(d) for d in descriptions]
    if len(descriptions) > 1:
        blocks.append(_total_line(descriptions))
    return "\n\n".join(blocks)


def _topic_block(d: TopicDescription) -> str:
    state = d.state
    settings = " ".join(f"{k}={v}" for k, v in d.config.items())
    header = (f"topic {d.topic}  id={d.topic_id or '-'}  partitions={d.partition_count}  state={state}  "
              f"config: {settings}  bytes={_bytes(d.bytes)}  est. monthly cost: {_cost(d)}")
    lines = [header]
    if d.uninitialized_partitions:
        lines.append(f"  not initialized yet: partition(s) {', '.join(map(str, d.uninitialized_partitions))}")
    lines.append(format_partition_table(d.partitions) if d.partitions else "  no initialized partitions")
    return "\n".join(lines)


def _total_line(descriptions: list[TopicDescription]) -> str:
    sizes = [d.bytes for d in descriptions]
    total = None if None in sizes else sum(sizes)
    return f"{len(descriptions)} topic(s), {sum(d.records for d in descriptions)} record(s), bytes={_bytes(total)}"


def format_partition_table(rows: list[PartitionDescription]) -> str:
    table = [PARTITION_COLUMNS] + [
        (str(r.partition), r.log_state, str(r.log_start_offset), str(r.log_end_offset), str(r.records),
         str(r.wal_bytes), _or_dash(r.compacted_bytes), str(r.index_entries), _or_dash(r.compaction_cursor),
         f"{r.pending.start_offset}..{r.pending.end_offset}" if r.pending else "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(PARTITION_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table)


def format_descriptions(topic: str, rows: list[PartitionDescription],
                        groups: dict[str, list[PartitionLag]] | None = None) -> str:
    """``llog describe TOPIC``: the partitions of one topic, without its record; with ``groups``
    (:func:`llog.consumer_groups.topic_group_lags`), each group's offsets and lag on it."""
    if not rows:
        return f"topic {topic!r} has no initialized partitions"
    text = f"topic {topic}: {len(rows)} partition(s)\n" + format_partition_table(rows)
    if groups is not None:
        text += "\n\n" + (format_group_lags(groups) if groups else "no consumer group has committed offsets on it")
    return text


def format_group_lags(groups: dict[str, list[PartitionLag]]) -> str:
    """One table of every group's ``CURRENT-OFFSET``, ``LOG-END-OFFSET`` and ``LAG`` per partition,
    as ``kafka-consumer-groups --describe --all-groups`` prints them."""
    header = ("GROUP",) + GROUP_COLUMNS[1:]
    table = [header] + [(group, str(r.partition), str(r.committed_offset), str(r.log_start_offset),
                         str(r.log_end_offset), str(r.lag)) for group, rows in groups.items() for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    totals = ", ".join(f"{g} {sum(r.lag for r in rows)}" for g, rows in groups.items())
    return "\n".join([f"consumer groups: {len(groups)}, total lag: {totals}"]
                     + ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table])


def topic_descriptions_as_dicts(descriptions: list[TopicDescription]) -> list[dict[str, Any]]:
    """The descriptions as plain dicts (dataclasses' fields, ``records`` added), for ``--json``."""
    return [dict(dataclasses.asdict(d), records=d.records) for d in descriptions]


def format_topic_descriptions_json(descriptions: list[TopicDescription]) -> str:
    return json.dumps(topic_descriptions_as_dicts(descriptions), indent=2)


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _bytes(n: int | None) -> str:
    """``1234567 (1.2 MiB)``; ``unknown`` for None."""
    if n is None:
        return "unknown"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            break
        size /= 1024
    return str(n) if unit == "B" else f"{n} ({size:.1f} {unit})"


def _cost(d: TopicDescription) -> str:
    if d.monthly_cost_usd is None:
        return d.cost_basis
    usd = d.monthly_cost_usd
    shown = "$0.00" if usd == 0 else "<$0.01" if usd < 0.01 else f"${usd:,.2f}"
    return f"{shown} ({d.cost_basis})"
