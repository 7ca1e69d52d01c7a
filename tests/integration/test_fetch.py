"""``LogReader.fetch``: a consumer's fetch bounded in bytes, per partition and per call, each
partition with its own outcome; bodies within the budget or under a MiB fetched whole (one GET
per blob for the call), larger or compacted ones read in part."""

from __future__ import annotations

from llog.compactor import Compactor
from llog.errors import OffsetOutOfRange, PartitionNotInitialized
from llog.reader import FetchRequest, Fetched
from llog.writer import AppendGroup
from tests.helpers.clocks import past_the_lag


def records(prefix: str, n: int, size: int = 100) -> list[bytes]:
    return [f"{prefix}-{i}-".encode().ljust(size, b"x") for i in range(n)]


def values(fetched: Fetched) -> list[bytes]:
    return [v for b in fetched.batches for v in b.column(1).to_pylist()]


def offsets(fetched: Fetched) -> list[int]:
    return [o for b in fetched.batches for o in b.column(0).to_pylist()]


def test_a_fetch_returns_the_records_that_fit_each_partitions_budget(writer, reader):
    written = {p: [] for p in range(3)}
    for batch in range(4):
        groups = [AppendGroup("f", p, records(f"{batch}.{p}", 50)) for p in range(3)]
        writer.append_shared(groups)
        for g in groups:
            written[g.partition] += g.records

    got = reader.fetch([FetchRequest("f", 0, 1, 1_000), FetchRequest("f", 1, 40, 5_050), FetchRequest("f", 2, 199, 10**6)])

    assert offsets(got[0]) == list(range(1, 11)) and values(got[0]) == written[0][:10]  # 10 x 100 bytes
    assert offsets(got[1]) == list(range(40, 90)) and values(got[1]) == written[1][39:89]  # across entries
    assert offsets(got[2]) == [199, 200] and got[2].high_watermark == 200
    assert got[0].nbytes == 1_000 and got[1].count == 50


def test_the_first_record_comes_back_even_when_larger_than_the_budget(writer, reader):
    writer.append("big", 0, [b"y" * 5_000, b"z"])
    got, = reader.fetch([FetchRequest("big", 0, 1, 10)])
    assert values(got) == [b"y" * 5_000]


def test_the_calls_budget_is_spent_in_request_order(writer, reader):
    writer.append_shared([AppendGroup("o", p, records(str(p), 30)) for p in range(3)])
    got = reader.fetch([FetchRequest("o", p, 1, 10**6) for p in range(3)], max_bytes=4_500)
    assert [g.count for g in got] == [30, 15, 0]
    assert got[2].high_watermark == 30  # the partition is there, the budget was spent


def test_every_blob_is_fetched_once_for_all_partitions_in_a_call(writer, reader):
    for batch in range(3):
        writer.append_shared([AppendGroup("s", p, records(f"{batch}.{p}", 20)) for p in range(4)])
    before = reader.objects.stats.copy()
    got = reader.fetch([FetchRequest("s", p, 1, 10**6) for p in range(4)])
    fetched = reader.objects.stats - before
    assert fetched["range_get"] + fetched["get"] == 3
    assert [g.count for g in got] == [60] * 4


def test_each_partition_gets_its_own_outcome(writer, reader):
    writer.append("mixed", 0, [b"a", b"b"])
    got = reader.fetch([FetchRequest("mixed", 0, 3, 100), FetchRequest("mixed", 0, 5, 100),
                        FetchRequest("mixed", 70, 1, 100), FetchRequest("mixed", 0, 2, 100)])
    assert isinstance(got[0], Fetched) and got[0].count == 0 and got[0].high_watermark == 2  # caught up
    assert isinstance(got[1], OffsetOutOfRange) and got[1].high_watermark == 2
    assert isinstance(got[2], PartitionNotInitialized)
    assert values(got[3]) == [b"b"]


def test_a_large_body_is_read_in_part_with_range_gets(writer, reader):
    written = records("wide", 12_000)  # one 1.2 MB entry: more than PARTIAL_READ_MIN_BYTES
    writer.append("wide", 0, written)
    before = reader.objects.stats.copy()
    got, = reader.fetch([FetchRequest("wide", 0, 1_001, 1_000)])
    fetched = reader.objects.stats - before
    assert values(got) == written[1_000:1_010]
    assert fetched["get"] == 0 and fetched["range_get"] == 2 and fetched["get_bytes"] < 6_000  # not 1.2 MB


def test_a_body_under_a_mib_is_fetched_whole_with_one_get(writer, reader):
    written = records("mid", 2_000)  # one 200 KB entry: two hundred times the budget, under a MiB
    writer.append("mid", 0, written)
    before = reader.objects.stats.copy()
    got, = reader.fetch([FetchRequest("mid", 0, 1_001, 1_000)])
    fetched = reader.objects.stats - before
    assert values(got) == written[1_000:1_010]
    assert fetched["get"] + fetched["range_get"] == 1 and fetched["get_bytes"] > 200_000


def test_a_compacted_object_is_read_in_part(config, writer, reader):
    written = []
    for batch in range(10):
        written += records(f"c{batch}", 100)
        writer.append("compacted", 0, written[-100:])
    with Compactor(config, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition("compacted", 0).compactions >= 1
    for start in (1, 3, 555, 998):  # from the body's start (header checked) and from its middle
        before = reader.objects.stats.copy()
        got, = reader.fetch([FetchRequest("compacted", 0, start, 2_000)])
        fetched = reader.objects.stats - before
        assert offsets(got) == list(range(start, min(1_000, start + 19) + 1))
        assert values(got) == written[start - 1:start + 19]
        assert fetched["get"] == 0 and fetched["get_bytes"] < 10_000


def test_a_body_read_in_part_ends_the_fetch_where_it_ends(writer, reader):
    """Tiny records: the tail of a large entry looks cheap enough to read on into the next
    entry, but a partial read returns at most budget / 64 records; the fetch must stop there,
    not leave a gap before the next entry's records."""
    first = [f"{i:06d}".encode() for i in range(150_000)]  # one ~1.5 MB entry of 6-byte records
    writer.append("tiny", 0, first)
    writer.append("tiny", 0, [b"next"])
    got, = reader.fetch([FetchRequest("tiny", 0, 149_900, 1_000)])
    assert offsets(got) == list(range(149_900, 149_900 + got.count))  # no gap
    assert values(got) == first[149_899:149_899 + got.count] and 0 < got.count < 101
