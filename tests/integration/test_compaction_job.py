"""The compaction job (``compaction_job``) on real Spark (local mode) over real Oxia and the S3 server,
and ``llog compact`` / ``llog gc``: the report's numbers, every record read back with the same
bytes, exactly the old unreferenced blobs collected, a killed compactor recovered, bad
arguments refused with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from uuid import uuid4

import pytest

from compaction_job.job import JobOptions, main, parse_options, run
from jobs.local_spark import local_spark
from llog.coordination import Coordination
from llog.describe import describe_topic
from llog.errors import StaleBlob
from llog.keys import s3_uri, shared_wal_object, shared_wal_prefix
from llog.objects import ObjectStore
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter
from tests.helpers import compactor_process

REPO = Path(__file__).resolve().parents[2]
GRACE_MS = 3000
#: Each compaction takes at most this many offsets: two 5-record entries.
MAX_OFFSETS = 10


@pytest.fixture
def config(stack):
    """The test's own root prefix, and a short GC grace period for the writer and the job alike."""
    return stack.replace(root_prefix=f"t{uuid4().hex[:12]}", gc_grace_ms=GRACE_MS)


class _RewritingWriter(LogWriter):
    """Appends that upload again on :class:`StaleBlob`, as the error tells a client to (nothing of
    the attempt landed). The module's G is 3 s, so a put-and-commit has 1.5 s; under a loaded
    machine one took 1.8 s."""

    def append(self, *args, **kwargs):
        return self._rewriting(super().append, *args, **kwargs)

    def append_shared(self, *args, **kwargs):
        return self._rewriting(super().append_shared, *args, **kwargs)

    @staticmethod
    def _rewriting(call, *args, **kwargs):
        for attempt in range(3):
            try:
                return call(*args, **kwargs)
            except StaleBlob:
                if attempt == 2:
                    raise


@pytest.fixture
def writer(config):
    with _RewritingWriter(config, auto_initialize=True) as w:
        yield w


@pytest.fixture(scope="module")
def spark():
    session = local_spark("compaction-job-tests")
    yield session
    session.stop()


@pytest.fixture
def objects(config):
    store = ObjectStore(config)
    yield store
    store.close()


def _blobs(config, objects) -> set[str]:
    return {s3_uri(config.s3_bucket, o.key) for o in objects.list(shared_wal_prefix(config.root_prefix))}


def _values(reader, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in reader.read_range(topic, partition, 1)]


def _wait_older_than_grace(since: float) -> None:
    """Sleep until what was written before ``since`` (time.time()) is older than the grace period
    (S3 times have whole seconds)."""
    time.sleep(max(0.0, since + GRACE_MS / 1000 + 1.5 - time.time()))


def _fill(writer, objects, config):
    """orders[0], orders[1], payments[0]: four shared appends of 5 records each (binary values),
    orders[0] two more appends of 3 on its own; audit[0] shares the first blob and has one of its
    own. Returns the records per partition and the blobs by what references them."""
    expected: dict[tuple[str, int], list[bytes]] = {}
    blobs: dict[str, set[str]] = {"compacted_only": set(), "audit": set()}
    for topic, partitions in (("orders", 2), ("payments", 1), ("audit", 1)):
        create_topic(writer.coordination, config.root_prefix, topic, partitions)
    for a in range(4):
        groups = [AppendGroup(t, p, [f"{t}/{p}/{a}/{i}".encode() + b"\x00\xff" * i for i in range(5)])
                  for t, p in (("orders", 0), ("orders", 1), ("payments", 0))]
        if a == 0:
            groups.append(AppendGroup("audit", 0, [b"audit/shared/%d" % i for i in range(5)]))
        results = writer.append_shared(groups)
        for g in groups:
            expected.setdefault((g.topic, g.partition), []).extend(g.records)
        blobs["audit" if a == 0 else "compacted_only"].add(results[0].wal_uri)
    for a in range(2):
        records = [f"orders/0/single/{a}/{i}".encode() for i in range(3)]
        result = writer.append("orders", 0, records)
        expected[("orders", 0)].extend(records)
        blobs["compacted_only"].add(result.wal_uri)
    result = writer.append("audit", 0, [b"audit/own/%d" % i for i in range(5)])
    expected[("audit", 0)].extend(b"audit/own/%d" % i for i in range(5))
    blobs["audit"].add(result.wal_uri)
    blobs["orphan"] = {objects.put(shared_wal_object(config.root_prefix), b"an aborted batch's blob")}
    return expected, blobs


def test_job_compacts_the_topics_and_collects_old_unreferenced_blobs(spark, config, writer, reader, objects):
    expected, blobs = _fill(writer, objects, config)
    assert _blobs(config, objects) == set().union(*blobs.values())  # 5 + 2 + 1 blobs
    _wait_older_than_grace(time.time())
    young = objects.put(shared_wal_object(config.root_prefix), b"a blob still being committed")

    # Run 1: two topics. orders[0] has 26 records in 6 entries: 3 compactions of <= 10 offsets;
    # orders[1] and payments[0] 20 in 4: 2 each.
    report = run(spark, JobOptions(topics=("orders", "payments"), max_offsets=MAX_OFFSETS), config)
    assert (report.partitions_seen, report.partitions_compacted, report.compactions) == (3, 3, 7)
    assert (report.records, report.skipped_claimed, report.recoveries, report.partitions_failed) == (66, 0, 0, 0)
    assert report.bytes > sum(len(v) for tp, vs in expected.items() if tp[0] != "audit" for v in vs)
    # GC read the references of all 4 partitions before compacting: only the orphan is garbage
    # now; the blobs this run stopped referencing go in the next run. The 7 compacted blobs this
    # run wrote are listed too, and too young.
    assert (report.gc_partitions, report.gc.listed, report.gc.too_young, report.gc.deleted) == (4, 16, 8, 1)
    assert report.gc.deleted_bytes == len(b"an aborted batch's blob")
    assert _blobs(config, objects) == blobs["compacted_only"] | blobs["audit"] | {young}
    for (topic, partition), values in expected.items():
        assert _values(reader, topic, partition) == values
    with Coordination(config) as coordination:
        rows = {(t, r.partition): r for t in ("orders", "payments", "audit")
                for r in describe_topic(coordination, config.root_prefix, t)}
    assert {tp: r.wal_entries for tp, r in rows.items()} == {("orders", 0): 0, ("orders", 1): 0, ("payments", 0): 0,
                                                            ("audit", 0): 2}
    assert json.loads(report.to_json())["compactions"] == 7
    assert json.loads(report.to_json())["gc"] == {"listed": 16, "referenced": 7, "too_young": 8, "deleted": 1,
                                                  "deleted_bytes": len(b"an aborted batch's blob"),
                                                  "unreadable_pins": [], "kept_for_unreadable_pins": 0}

    # Run 2: every partition (audit[0] too: one compaction of 10 offsets). The blobs only the
    # compacted partitions used, and the young one now old, are collected; audit's are kept
    # (referenced when this run read them).
    _wait_older_than_grace(time.time())
    report = run(spark, JobOptions(max_offsets=MAX_OFFSETS), config)
    assert (report.partitions_seen, report.compactions, report.records) == (4, 1, 10)
    assert report.gc.deleted == len(blobs["compacted_only"]) + 1 == 6
    assert _blobs(config, objects) == blobs["audit"]
    for (topic, partition), values in expected.items():
        assert _values(reader, topic, partition) == values

    # Run 3: nothing left to compact, and audit's blobs are garbage now.
    report = run(spark, JobOptions(max_offsets=MAX_OFFSETS), config)
    assert (report.partitions_seen, report.compactions, report.gc.deleted) == (4, 0, 2)
    assert _blobs(config, objects) == set()
    for (topic, partition), values in expected.items():
        assert _values(reader, topic, partition) == values


def test_job_applies_retention_before_compacting_and_gc_collects_what_it_dropped(spark, config, writer, reader,
                                                                                   objects):
    """docs/protocol.md section 10.3 in the job: a topic with retention.ms=1000 loses its entries once
    they are older than both that and the grace period; a topic without keeps everything."""
    create_topic(writer.coordination, config.root_prefix, "expiring", 1, {"retention.ms": 1000})
    old = [writer.append_shared([AppendGroup("expiring", 0, [b"e%d-%d" % (a, i) for i in range(5)]),
                                 AppendGroup("kept", 0, [b"k%d-%d" % (a, i) for i in range(5)])])[0].wal_uri
           for a in range(2)]
    _wait_older_than_grace(time.time())
    report = run(spark, JobOptions(max_offsets=MAX_OFFSETS), config)
    assert (report.retention_records, report.retention_entries, report.partitions_retained) == (10, 2, 1)
    assert report.retention_bytes > 0 and json.loads(report.to_json())["retention_records"] == 10
    assert "retention dropped 10 record(s)" in report.summary()
    assert reader.offsets("expiring", 0) == (11, 10)  # empty now: the next offset written is 11
    assert _values(reader, "kept", 0) == [b"k%d-%d" % (a, i) for a in range(2) for i in range(5)]  # compacted
    assert set(old) <= _blobs(config, objects)  # GC read the references before the pass: next run
    _wait_older_than_grace(time.time())
    report = run(spark, JobOptions(max_offsets=MAX_OFFSETS), config)
    assert report.retention_records == 0 and not set(old) & _blobs(config, objects)
    assert writer.append("expiring", 0, [b"new"]).start_offset == 11
    assert _values(reader, "kept", 0) == [b"k%d-%d" % (a, i) for a in range(2) for i in range(5)]


def test_job_recovers_a_killed_compactor_and_skips_a_claimed_partition(spark, config, writer, reader):
    values = [b"k/%d" % i for i in range(40)]
    for i in range(0, 40, 5):
        writer.append("k", 0, values[i:i + 5])
    killed = compactor_process.run(config, "k", [0], max_offsets=MAX_OFFSETS,
                                   failpoint="compactor.after_index_overwrite", session_timeout_ms=8000)
    assert killed.returncode == -9, killed.stderr
    options = JobOptions(max_offsets=MAX_OFFSETS, gc=False, max_runtime_s=60)
    report = run(spark, options, config)  # the killed compactor's session is still alive
    assert (report.partitions_seen, report.skipped_claimed, report.compactions, report.gc) == (1, 1, 0, None)
    time.sleep(10)  # its session has expired now
    report = run(spark, options, config)
    assert (report.skipped_claimed, report.recoveries, report.compactions, report.records) == (0, 1, 3, 30)
    assert _values(reader, "k", 0) == values


def test_a_job_with_a_smaller_g_than_the_deployments_deletes_nothing(spark, config, objects):
    """The review's H2: writers run with G = 60 s, the job with 3 s. A slice staged 4.5 s ago is
    within the writers' rules (its commit may come up to G/2 after it) and unreferenced yet. The
    job is refused before its GC takes its time; the blob stays, and its commit reads back."""
    from llog.errors import GraceMismatch
    from llog.reader import LogReader

    deployment = config.replace(gc_grace_ms=60_000)
    with LogWriter(deployment) as writer:
        create_topic(writer.coordination, config.root_prefix, "orders", 1)
        staged = writer.upload([AppendGroup("orders", 0, [b"r1", b"r2", b"r3"])])
        _wait_older_than_grace(time.time())  # older than the job's G, young by the deployment's
        with pytest.raises(GraceMismatch, match=rf"LLOG_GC_GRACE_MS={GRACE_MS}, but .* set up with 60000"):
            run(spark, JobOptions(), config)
        assert staged[0].wal_uri in _blobs(config, objects)
        results = writer.commit_staged(staged)
    assert [(r.start_offset, r.end_offset) for r in results] == [(1, 3)]
    with LogReader(deployment) as reader:
        assert _values(reader, "orders", 0) == [b"r1", b"r2", b"r3"]


@pytest.fixture
def cli_env(config, monkeypatch):
    monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
    for name, value in config.to_options().items():
        monkeypatch.setenv(name, value)
    return {**os.environ}


@pytest.mark.parametrize("argv,message", [
    (["--topics", "a", "--topic-pattern", "b"], "argument --topic-pattern: not allowed with argument --topics"),
    (["--max-offsets", "-1"], "argument --max-offsets: must be >= 1, got -1"),
    (["--max-offsets", "many"], "argument --max-offsets: 'many' is not an integer"),
    (["--max-runtime", "-5"], "argument --max-runtime: must be > 0, got -5"),
    (["--partitions-per-task", "0"], "argument --partitions-per-task: must be >= 1, got 0"),
    (["--grace-ms", str(GRACE_MS - 1)], f"--grace-ms {GRACE_MS - 1} ms is below LLOG_GC_GRACE_MS={GRACE_MS} ms"),
    (["--topics", "no/such"], "invalid topic name 'no/such'"),
    (["--topics", " , "], "--topics names no topic"),
    (["--topic-pattern", "(unclosed"], "topic pattern '(unclosed' is not a valid regular expression"),
    (["--gc", "--no-such-option"], "unrecognized arguments: --no-such-option"),
])
def test_bad_arguments_fail_with_a_clear_error_before_spark_starts(cli_env, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_arguments_become_options(config):
    options = parse_options(["--topics", "a, b", "--max-offsets", "7", "--max-runtime", "1.5", "--no-gc",
                             "--grace-ms", str(GRACE_MS * 2), "--partitions-per-task", "3"], config)
    assert options == JobOptions(topics=("a", "b"), max_offsets=7, max_runtime_s=1.5, gc=False,
                                 grace_ms=GRACE_MS * 2, partitions_per_task=3)
    assert parse_options([], config).gc_grace_ms(config) == GRACE_MS


def test_entry_points_run_as_a_script_and_as_a_module(cli_env):
    main_py = str(REPO / "compaction_job" / "main.py")
    script = subprocess.run([sys.executable, main_py, "--max-offsets", "0"], cwd="/", env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert script.returncode == 2 and "argument --max-offsets: must be >= 1, got 0" in script.stderr, script.stderr
    # As a script (spark-submit, Databricks), the checkout becomes importable: jobs/ is not installed.
    outside = {k: v for k, v in cli_env.items() if k != "PYTHONPATH"}  # local_spark sets it
    loaded = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({main_py!r}); import jobs.local_spark"],
                            cwd="/", env=outside, capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    module = subprocess.run([sys.executable, "-m", "compaction_job", "--grace-ms", "1"], cwd=REPO, env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert module.returncode == 2 and f"below LLOG_GC_GRACE_MS={GRACE_MS}" in module.stderr, module.stderr


def _llog(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llog_tools", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_llog_compact_and_gc_commands(cli_env, config, writer, reader, objects):
    values = [b"c/%d" % i for i in range(20)]
    create_topic(writer.coordination, config.root_prefix, "cli", 2)
    for i in range(0, 20, 5):
        writer.append("cli", 0, values[i:i + 5])
    writer.append("cli", 1, [b"other"])
    orphan = objects.put(shared_wal_object(config.root_prefix), b"orphan")
    written = time.time()
    _wait_older_than_grace(written)  # past the compaction lag (docs/protocol.md section 6.1)

    done = _llog(cli_env, "compact", "cli", "0", "--max-offsets", "10")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cli[0]: 2 compaction(s), 20 record(s) and ") and "from 4 WAL entries" in done.stdout
    assert _values(reader, "cli", 0) == values
    again = _llog(cli_env, "compact", "cli", "0", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"topic": "cli", "partition": 0, "skipped_claimed": False, "recoveries": 0,
                                        "compactions": 0, "records": 0, "bytes": 0, "source_gets": 0,
                                        "source_entries": 0, "log_start_offset": 1, "retention_records": 0,
                                        "retention_entries": 0, "retention_bytes": 0,
                                        "resumed_compactions": 0}

    bad = _llog(cli_env, "compact", "cli", "0", "--max-runtime", "-1")
    assert bad.returncode == 2 and "argument --max-runtime: must be > 0" in bad.stderr
    missing = _llog(cli_env, "compact", "cli", "9")
    assert missing.returncode == 1 and "llog: error:" in missing.stderr and "cli[9]" in missing.stderr
    low = _llog(cli_env, "gc", "--grace-ms", str(GRACE_MS - 1))
    assert low.returncode == 2 and f"below LLOG_GC_GRACE_MS={GRACE_MS}" in low.stderr

    _wait_older_than_grace(written)
    # 4 blobs compacted away, cli[1]'s still referenced, the orphan; cli[0]'s 2 compacted blobs.
    dry = _llog(cli_env, "gc", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert (planned["listed"], planned["referenced"], planned["deleted"], planned["dry_run"]) == (8, 3, 5, True)
    assert orphan in planned["deleted_uris"] and orphan in _blobs(config, objects)
    gc = _llog(cli_env, "gc")
    assert gc.returncode == 0, gc.stderr
    assert gc.stdout.startswith("8 blob(s): 3 referenced, 0 younger than 3000 ms, 5 deleted")
    assert len(_blobs(config, objects)) == 1 and orphan not in _blobs(config, objects)
    assert _values(reader, "cli", 0) == values and _values(reader, "cli", 1) == [b"other"]
