"""The sink ids of foreachBatch writes (llog_sink.foreach_batch; docs/protocol.md section 9.1)."""

from llog_sink.foreach_batch import _begin_write, _end_write, write_sink_id


def test_a_write_that_raised_is_not_counted_so_its_retry_is_a_replay():
    first = write_sink_id("q-retry", "t", _begin_write("q-retry", "run-1", 9, "t"))
    _end_write("q-retry", "run-1", 9, "t", returned=False)  # the first save() raised
    retry = write_sink_id("q-retry", "t", _begin_write("q-retry", "run-1", 9, "t"))
    assert retry == first == "q-retry.t.0"
    _end_write("q-retry", "run-1", 9, "t", returned=True)
    assert _begin_write("q-retry", "run-1", 9, "t") == 1  # the function's second write of the label
    assert _begin_write("q-retry", "run-1", 9, "other") == 0
    assert _begin_write("q-retry", "run-1", 10, "t") == 0  # the next micro-batch starts again
    assert _begin_write("q-retry", "run-2", 9, "t") == 0  # and so does a replay in a new run


def test_a_second_write_of_a_label_while_one_is_in_flight_is_refused_naming_the_label(monkeypatch):
    """Two threads of one foreachBatch function writing with one label at once would both take
    ordinal 0, one sink id for two writes: the second is refused before anything is written; once
    the first returned, the next write of the label takes the next ordinal."""
    import threading

    import pytest

    from llog.errors import SinkWriteInFlight
    from llog_sink import foreach_batch

    monkeypatch.setattr(foreach_batch, "_query_and_run", lambda df: ("q-flight", "run-1"))
    saving, release, seen = threading.Event(), threading.Event(), []

    class Writer:
        def format(self, _):
            return self

        def mode(self, _):
            return self

        def options(self, **_):
            return self

        def option(self, key, value):
            if key == foreach_batch.SINK_ID_OPTION:
                seen.append(value)
            return self

        def save(self):
            saving.set()
            assert release.wait(10)

    class Df:
        write = Writer()

    write = foreach_batch.write_batch(topic="t")
    first = threading.Thread(target=write, args=(Df(), 3))
    first.start()
    assert saving.wait(10)
    with pytest.raises(SinkWriteInFlight, match=r"label 't'.*name="):
        write(Df(), 3)
    release.set()
    first.join(10)
    write(Df(), 3)
    assert seen == ["q-flight.t.0", "q-flight.t.1"]
