"""The sink ids of foreachBatch writes (llog_sink.foreach_batch; docs/protocol.md section 9.1)."""

from llog_sink.foreach_batch import _count_write, _ordinal, write_sink_id


def test_a_write_that_raised_is_not_counted_so_its_retry_is_a_replay():
    first = write_sink_id("q-retry", "t", _ordinal("q-retry", "run-1", 9, "t"))
    retry = write_sink_id("q-retry", "t", _ordinal("q-retry", "run-1", 9, "t"))  # the first save() raised
    assert retry == first == "q-retry.t.0"
    _count_write("q-retry", "run-1", 9, "t")
    assert _ordinal("q-retry", "run-1", 9, "t") == 1  # the function's second write of the label
    assert _ordinal("q-retry", "run-1", 9, "other") == 0
    assert _ordinal("q-retry", "run-1", 10, "t") == 0  # the next micro-batch starts again
    assert _ordinal("q-retry", "run-2", 9, "t") == 0  # and so does a replay in a new run
