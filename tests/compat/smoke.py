"""The connectors end to end on whatever pyspark this Python has: ``check_pyspark.py`` runs it in
a throwaway venv with one pyspark version and llog installed from the checkout, against a local
stack (``LLOG_SETTINGS_FILE``).

Each check prints one line and ends up in the JSON summary printed last: ``pass``, ``degraded:
<what>`` (a feature this pyspark lacks, handled as ``pyspark_llog.compat`` documents) or
``FAIL: <error>``. Exits 1 if any check failed. Run from outside the checkout, so the installed
llog is the one imported.

Python workers and the Spark session run in America/New_York, so timestamps that pass through
Rows (the pyspark 4.0 stream writer) are checked against a local time that is not UTC.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ["TZ"] = "America/New_York"
time.tzset()

import pyspark_llog.compat as compat  # noqa: E402 - after the time zone is set

SCHEMA = ("key string, value binary, headers array<struct<key:string,value:binary>>, timestamp timestamp")
EPOCH = datetime(2024, 3, 10, 6, 30, tzinfo=timezone.utc)  # the New York DST change is at 07:00 UTC that day


def records(prefix: str, count: int) -> list[tuple]:
    """Rows of :data:`SCHEMA`: keyed, with headers (some empty or null), every 7th value null
    (a tombstone), event times a minute apart across a DST change (in ms: a record's timestamp
    is Kafka's, ms since the epoch)."""
    return [(f"{prefix}-k{i % 50}", None if i % 7 == 3 else f"{prefix}-v{i}".encode(),
             None if i % 5 == 0 else [(f"h{j}", f"{i}.{j}".encode()) for j in range(i % 3)],
             EPOCH + timedelta(minutes=i, milliseconds=i)) for i in range(count)]


def same(got: set[tuple], expected: set[tuple]) -> None:
    """Assert equal record sets, showing a record of each side that the other lacks."""
    assert got == expected, (f"read back {len(got)} records, wrote {len(expected)}; e.g. read "
                             f"{sorted(got - expected, key=repr)[:1]}, wrote {sorted(expected - got, key=repr)[:1]}")


def as_set(rows) -> set[tuple]:
    """Comparable records: (key, value, headers, event time in UTC); a naive time is local, as
    Spark's ``collect`` returns them."""
    out = set()
    for key, value, headers, ts in rows:
        value = bytes(value) if value is not None else None
        headers = tuple((h[0], bytes(h[1]) if h[1] is not None else None) for h in headers) if headers else ()
        out.add((key, value, headers, ts.astimezone(timezone.utc)))
    return out


class Smoke:
    def __init__(self, spark, options: dict[str, str], work: Path):
        self.spark, self.options, self.work = spark, options, work
        self.results: dict[str, str] = {}

    def check(self, name: str, fn) -> None:
        try:
            outcome = fn() or "pass"
        except Exception as e:  # noqa: BLE001 - each check reports its own failure
            traceback.print_exc()
            outcome = f"FAIL: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.results[name] = outcome
        print(f"compat: {name}: {outcome}", flush=True)

    # --- helpers ------------------------------------------------------------------------------

    def frame(self, rows):
        return self.spark.createDataFrame(rows, SCHEMA)

    def read_topic(self, topic: str) -> list:
        df = self.spark.read.format("llog").options(**self.options).option("topics", topic) \
            .option("includeHeaders", "true").load()
        return df.select("key", "value", "headers", "timestamp").collect()

    def read_back(self, topic: str) -> set[tuple]:
        return as_set((r.key.decode() if r.key is not None else None, r.value, r.headers, r.timestamp)
                      for r in self.read_topic(topic))

    def parquet_stream(self, directory: Path):
        return self.spark.readStream.schema(SCHEMA).parquet(str(directory))

    def add_file(self, directory: Path, rows) -> None:
        self.frame(rows).coalesce(1).write.mode("append").parquet(str(directory))

    def run(self, writer, checkpoint: Path):
        query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        query.awaitTermination(300)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        return query

    # --- checks -------------------------------------------------------------------------------

    def batch_write_and_read(self) -> None:
        rows = records("batch", 600)
        self.frame(rows).repartition(2).write.format("llog").options(**self.options) \
            .option("topic", "compat_batch").option("partitions", "3").mode("append").save()
        same(self.read_back("compat_batch"), as_set(rows))

    def stream_write(self) -> str | None:
        source, checkpoint = self.work / "stream_in", self.work / "stream_ck"
        first, second = records("s1", 500), records("s2", 300)
        self.add_file(source, first)

        def run():
            self.run(self.parquet_stream(source).writeStream.format("llog").options(**self.options)
                     .option("topic", "compat_stream").option("partitions", "2"), checkpoint)

        run()
        run()  # nothing new: writes nothing
        self.add_file(source, second)
        run()
        got = self.read_topic("compat_stream")
        assert len(got) == len(first) + len(second), f"{len(got)} records in the topic, wrote {len(first) + len(second)}"
        same(self.read_back("compat_stream"), as_set(first + second))
        if not compat.ARROW_STREAM_WRITER:
            return "degraded: no DataSourceStreamArrowWriter; the stream writer took Rows and converted them to Arrow"
        return None

    def foreach_batch(self) -> None:
        from llog_sink import write_batch

        source = self.work / "fb_in"
        rows = records("fb", 400)
        self.add_file(source, rows)
        self.run(self.parquet_stream(source).writeStream.foreachBatch(write_batch(topic="compat_fb", **self.options)),
                 self.work / "fb_ck")
        same(self.read_back("compat_fb"), as_set(rows))

    def stream_read(self) -> str | None:
        from llog.consumer_groups import describe_group
        from llog.coordination import Coordination
        from llog.config import Config

        seen: list[tuple] = []

        def collect(df, batch_id):
            seen.extend((r.partition, r.offset, bytes(r.value) if r.value is not None else None) for r in df.collect())

        checkpoint = self.work / "read_ck"

        def run():
            reader = self.spark.readStream.format("llog").options(**self.options).option("topics", "compat_batch") \
                .option("startingOffsets", "earliest").option("groupId", "compat")
            self.run(reader.load().writeStream.foreachBatch(collect), checkpoint)

        run()
        assert len(seen) == 600 and len(set(seen)) == 600, f"first run read {len(seen)} records, expected 600"
        more = records("more", 300)
        self.frame(more).coalesce(1).write.format("llog").options(**self.options).option("topic", "compat_batch") \
            .mode("append").save()
        run()
        assert len(seen) == 900 and len(set(seen)) == 900, f"two runs read {len(seen)} records, expected 900"
        assert {v for _, _, v in seen[600:]} == {v for _, v, _, _ in as_set(more)}, "second run read other records"
        config = Config.load(self.options)
        with Coordination(config) as coordination:
            lag = sum(r.lag for r in describe_group(coordination, config.root_prefix, "compat"))
        if lag and compat.ADMISSION_CONTROL:
            raise AssertionError(f"group 'compat' lags {lag} records after the run")
        if lag:
            return (f"degraded: no admission control; group offsets of a run's last batch are committed when the next "
                    f"batch is planned ({lag} records of lag left after the run)")
        return None

    def max_offsets_per_trigger(self) -> str | None:
        batches: list[int] = []
        reader = self.spark.readStream.format("llog").options(**self.options).option("topics", "compat_batch") \
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "200")
        writer = reader.load().writeStream.foreachBatch(lambda df, batch_id: batches.append(df.count()))
        if compat.ADMISSION_CONTROL:
            total = len(self.read_topic("compat_batch"))
            self.run(writer, self.work / "limit_ck")
            expected = [200] * (total // 200) + ([total % 200] if total % 200 else [])
            assert batches == expected, f"batches of {batches}, expected {expected} ({total} records, 200 a batch)"
            return None
        try:
            self.run(writer, self.work / "limit_ck")
        except Exception as e:  # noqa: BLE001 - the refusal is what is checked
            if "maxOffsetsPerTrigger needs pyspark >= 4.2" in str(e):
                return "degraded: refused with a clear error (no admission control before pyspark 4.2)"
            raise
        raise AssertionError(f"maxOffsetsPerTrigger ran on pyspark {compat.PYSPARK_VERSION} (batches {batches})")


def spark_session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2,1]").appName("llog-compat")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
            .config("spark.sql.session.timeZone", "America/New_York").getOrCreate())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    args = parser.parse_args(argv)
    summary: dict[str, object] = {**compat.features(), "python": sys.version.split()[0]}
    imports = {}
    for module in ("llog", "llog_tools.cli", "llog_sink", "llog_sink.spark_writers", "llog_source.spark_readers",
                   "pyspark_llog", "compaction_job", "broker_lite"):
        try:
            __import__(module)
            imports[module] = "pass"
        except Exception as e:  # noqa: BLE001
            imports[module] = f"FAIL: {type(e).__name__}: {e}"
    summary["imports"] = imports
    print(f"compat: pyspark {compat.PYSPARK_VERSION}: {compat.features()}; imports: {imports}", flush=True)
    from llog.config import Config

    root = f"compat-{uuid.uuid4().hex[:8]}"
    options = {k: v for k, v in Config.load({"llog.root.prefix": root}).to_options().items()}
    spark = spark_session()
    try:
        with tempfile.TemporaryDirectory(prefix="llog-compat-") as work:
            smoke = Smoke(spark, options, Path(work))
            smoke.check("batch_write_and_read", smoke.batch_write_and_read)
            smoke.check("stream_write", smoke.stream_write)
            smoke.check("foreach_batch", smoke.foreach_batch)
            smoke.check("stream_read", smoke.stream_read)
            smoke.check("max_offsets_per_trigger", smoke.max_offsets_per_trigger)
    finally:
        spark.stop()
    summary["checks"] = smoke.results
    failed = [k for k, v in imports.items() if v != "pass"] + [k for k, v in smoke.results.items()
                                                               if v.startswith("FAIL")]
    summary["ok"] = not failed
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
