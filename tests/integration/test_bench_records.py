"""``python -m bench records``' Spark sink cases check what landed: how many records each query
wrote (``landed``) and a sample of them (:func:`bench.records.check_sink_sample`), and a wrong
record fails the bench line loudly. The sink cases run at a tiny size, on the test stack."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from bench import records as bench_records
from bench.records import HEADER, KEY_BYTES, PARTITIONS, VALUE_BYTES, check_sink_sample
from llog.partitioner import kafka_partitions
from llog.reader import LogReader
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter


def _value(seq: int) -> bytes:
    return str(seq).rjust(VALUE_BYTES, "x").encode()


def _v1(writer: LogWriter, topic: str, seqs: range) -> None:
    writer.append_shared([AppendGroup(topic, p, [_value(s) for s in seqs if s % PARTITIONS == p])
                          for p in range(PARTITIONS)])


def _v2(writer: LogWriter, topic: str, seqs: range, header=HEADER) -> None:
    keys = [str(s).rjust(KEY_BYTES, "k").encode() for s in seqs]
    placed = kafka_partitions(pa.array(keys, pa.binary()), PARTITIONS)
    for p in range(PARTITIONS):
        mine = [i for i, q in enumerate(placed) if q == p]
        if mine:
            writer.append(topic, p, [_value(seqs[i]) for i in mine], keys=[keys[i] for i in mine],
                          headers=[[header] for _ in mine])


def test_the_sample_check_passes_what_the_sink_writes_and_names_a_wrong_record(config):
    with LogWriter(config, auto_initialize=True, compression="none") as writer, LogReader(config) as reader:
        for topic in ("v1", "v2"):
            create_topic(writer.coordination, config.root_prefix, topic, PARTITIONS)
        _v1(writer, "v1", range(100))
        _v2(writer, "v2", range(100))
        assert check_sink_sample(reader, "v1", "v1") is None
        assert check_sink_sample(reader, "v2", "v2-none") is None
        assert check_sink_sample(reader, "v1", "v2-none").startswith("partition 0 offset 1: seq 0 with key None")

        writer.append("v1", 3, [_value(4)])  # seq 4 belongs in partition 4
        assert check_sink_sample(reader, "v1", "v1") == (
            "partition 3 offset 14: seq 4 with key None, headers None: expected partition 4, no key, no headers")
        _v2(writer, "v2", range(100, 101), header=("source", b"other"))
        problem = check_sink_sample(reader, "v2", "v2-none")
        assert problem is not None and "seq 100 with key b'kkkkkkkkkkkkk100', headers [('source', b'other')]" in problem
        writer.append("v1", 0, [b"x" * 99 + b"?"])
        assert check_sink_sample(reader, "v1", "v1").startswith("partition 0 offset 14: value b'xxx")


def test_the_sink_cases_check_what_landed_and_a_wrong_record_fails_the_line(config, tmp_path, monkeypatch, capsys):
    """Every case, one round of one timed micro-batch of 2,000 rows: the counts reconcile and the
    sample is right (else run_sink raises). Then a sink that puts records in the wrong partitions
    (on a root prefix of its own): its line says failed, and run_sink raises."""
    from pyspark.sql import functions as F

    from llog_sink.commit import METRICS_FILE_ENV

    metrics_file = tmp_path / "commits.jsonl"  # one for both runs: Spark's JVM keeps the first environment
    metrics_file.touch()
    monkeypatch.setenv(METRICS_FILE_ENV, str(metrics_file))
    out = bench_records.run_sink(config, rows=2000, batches=1, rounds=1, metrics_file=metrics_file)
    assert set(out) == set(bench_records.SINK_CASES)
    assert all(row["records_per_s"] > 0 and row["batches"] == 1 for row in out.values())
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [line["format"] for line in lines] == list(bench_records.SINK_CASES)

    right = bench_records._sink_columns

    def misplaced(case: str):
        columns = right(case)
        return columns if case != "v1" else [columns[0], ((F.col("value") + 1) % PARTITIONS).cast("int").alias("partition")]

    monkeypatch.setattr(bench_records, "_sink_columns", misplaced)
    monkeypatch.setattr(bench_records, "SINK_CASES", {"v1": bench_records.SINK_CASES["v1"]})
    with pytest.raises(RuntimeError, match=r"records sink v1: partition \d offset 1: seq \d+ with key None"):
        bench_records.run_sink(config.replace(root_prefix=f"{config.root_prefix}w"), rows=500, batches=1, rounds=1,
                               metrics_file=metrics_file)
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert (line["status"], line["format"]) == ("failed", "v1")
