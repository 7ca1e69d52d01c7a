"""The load test's reconciliation (loadtest.run, loadtest.brokers): counts that do not match fail
it, and so does a counter a broker does not report: what cannot be checked is not checked."""

from __future__ import annotations

from loadtest.brokers import counter, counter_delta
from loadtest.run import _reconciliation, reconcile_consume, reconcile_produce, summarize


def _metrics(consume_records: int | None = None, puts: int = 0, gets: int | None = None) -> dict:
    """A broker's ``GET /metrics`` with the counters the reconciliation reads (None: not reported)."""
    http = {} if consume_records is None else {"consume_records_returned_total": consume_records}
    operations = {"put": puts, **({} if gets is None else {"get": gets})}
    return {"http": http, "s3": {"put_requests": puts, "operations": operations}}


def test_a_counter_a_broker_does_not_report_is_missing_but_an_s3_operation_not_seen_counts_0():
    assert counter(_metrics(consume_records=5), "consume_records") == 5
    assert counter(_metrics(), "consume_records") is None
    assert counter(None, "consume_records") is None
    assert counter(_metrics(gets=None), "s3_get") == 0
    assert counter_delta([_metrics(consume_records=1), _metrics()], [_metrics(consume_records=4), _metrics()],
                         "consume_records") is None
    assert counter_delta([_metrics(consume_records=1)], [_metrics(consume_records=4)], "consume_records") == 3


def test_a_consume_phase_without_the_records_counter_does_not_reconcile():
    missing = counter_delta([_metrics()], [_metrics()], "consume_records")
    phase = _reconciliation(reconcile_consume(400, missing))
    assert phase["reconciled"] is False
    assert phase["unreconciled"] == ["a broker's /metrics has no http.consume_records_returned_total: "
                                     "the records returned not checked"]
    assert reconcile_consume(400, 400) == []
    assert reconcile_consume(400, 300) == ["the brokers counted 300 records returned, the bodies hold 400"]


def test_a_produce_phase_reconciles_the_log_and_the_puts_and_fails_without_the_put_counter():
    assert reconcile_produce(100, 100, 0, 3, 4) == []
    assert reconcile_produce(100, 110, 2, 3, 4) == []  # timed-out requests may have been written
    assert reconcile_produce(100, 90, 0, 3, 4) == ["the log gained 90 records, the acks say 100"]
    assert reconcile_produce(100, 100, 0, 3, None) == [
        "a broker's /metrics has no s3.put_requests: S3 PUTs not checked"]
    assert reconcile_produce(100, 100, 0, 3, 2) == ["the brokers counted 2 S3 PUTs, the acks name 3 blobs"]


def test_the_summary_is_reconciled_only_when_every_counting_phase_is():
    good = {"records": 10, **_reconciliation([])}
    bad = {"records": 10, **_reconciliation(reconcile_consume(10, None))}
    probe = {"probes": 10, "delivered": 10}  # the long-poll probe counts no records
    assert summarize({"produce-max": good, "long-poll": probe})["reconciled"] is True
    summary = summarize({"produce-max": good, "consume-hit": bad, "long-poll": probe})
    assert summary["reconciled"] is False and list(summary["unreconciled"]) == ["consume-hit"]
