"""``python -m bench kafka-front-door`` at tiny sizes, so it cannot rot: a real Kafka 4.4 broker
and an llog broker process with a Kafka listener on the test stack, every measure on both, Spark's
real-time mode included. Nothing here is timed: the numbers only have to be there."""

from __future__ import annotations

import json

from bench import kafka_front_door

TINY = {"BENCH_FRONT_DOOR_RECORDS": "3000", "BENCH_FRONT_DOOR_PARTITIONS": "3", "BENCH_FRONT_DOOR_PRODUCERS": "2",
        "BENCH_FRONT_DOOR_ACK_RATE": "200", "BENCH_FRONT_DOOR_ACK_SECONDS": "1", "BENCH_FRONT_DOOR_POLL_RECORDS": "10",
        "BENCH_FRONT_DOOR_POLL_RATE": "50", "BENCH_FRONT_DOOR_SPARK_RECORDS": "5", "BENCH_FRONT_DOOR_SPARK_RATE": "10"}
MEASURES = ("produce_records_per_s", "consume_records_per_s", "ack_p50_ms", "ack_p99_ms", "poll_p50_ms", "poll_p99_ms",
            "spark_p50_ms", "spark_p99_ms")


def test_the_bench_measures_llog_and_kafka_side_by_side(stack, monkeypatch, capsys):
    for name, value in TINY.items():
        monkeypatch.setenv(name, value)
    summary = kafka_front_door.run(stack)

    (line,) = [json.loads(out) for out in capsys.readouterr().out.splitlines() if out.startswith("{")]
    assert line == summary and summary["bench"] == "kafka-front-door"
    assert summary["sizes"]["records"] == 3000 and summary["sizes"]["spark"] is True
    for measure in MEASURES:
        llog, kafka = summary[measure]["llog"], summary[measure]["kafka"]
        assert llog > 0 and kafka > 0, (measure, summary[measure])
        assert summary[measure]["llog_over_kafka"] == round(llog / kafka, 3)
    assert set(summary["targets"]) == {measure for measure, _, _ in kafka_front_door.TARGETS}
    commit = summary["llog_produce_group_commit"]  # llog's produce phase as its broker's /metrics saw it
    assert commit["produce_requests"] >= commit["flushes"] >= 1 and commit["s3"]["put"]["calls"] >= 1
    assert summary["produce_cpu_s"]["llog"]["llog_broker"] >= 0
