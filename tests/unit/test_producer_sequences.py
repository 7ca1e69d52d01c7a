"""Section 9.4's sequence check (docs/protocol.md): Kafka's producer sequence is an int32 that
wraps to 0 after 2147483647, a batch may straddle the wrap, and ``DuplicateSequence`` (which Kafka
clients complete as delivered) is answered only for an older batch the partition knows it wrote."""

from __future__ import annotations

import pytest

from llog.errors import CorruptRecord, InvalidPayload
from llog.records import (SEQUENCE_MODULUS, SEQUENCE_WINDOW, ProducerBatch, SequenceVerdict, judge_sequence,
                          sequences_overlap)
from llog.writer import AppendGroup, check_producer

NEXT, REPEAT, OLDER, OUT_OF_ORDER = (SequenceVerdict.NEXT, SequenceVerdict.REPEAT, SequenceVerdict.OLDER,
                                     SequenceVerdict.OUT_OF_ORDER)
MAX = SEQUENCE_MODULUS - 1  # Kafka's Integer.MAX_VALUE


def _first(sequence: int, count: int) -> ProducerBatch:
    """A producer's first batch on a partition (at offsets from 1)."""
    assert judge_sequence(None, sequence, count) is NEXT
    return ProducerBatch(sequence, count, 1, count, 0)


def _then(last: ProducerBatch, sequence: int, count: int) -> ProducerBatch:
    assert last.judge(sequence, count) is NEXT
    start = last.start_offset + last.count
    return last.followed_by(sequence, count, start, start + count - 1, 0)


def test_the_sequence_after_2147483647_is_0():
    last = _first(MAX - 9, 10)  # ends at Integer.MAX_VALUE
    assert last.next_sequence == 0
    assert last.judge(0, 3) is NEXT
    assert _then(last, 0, 3).next_sequence == 3


def test_a_batch_may_straddle_the_wrap():
    last = _first(MAX - 2, 5)  # MAX-2, MAX-1, MAX, 0, 1
    assert last.next_sequence == 2
    assert last.judge(2, 1) is NEXT
    assert last.judge(MAX - 2, 5) is REPEAT
    assert last.judge(0, 2) is OUT_OF_ORDER  # inside the last batch, not it
    assert last.judge(MAX, 1) is OUT_OF_ORDER


def test_an_older_batch_just_behind_the_wrap_is_a_duplicate_sequence():
    before = _first(MAX - 9, 10)
    after = _then(_then(before, 0, 3), 3, 2)
    assert after.known_before == 13  # MAX-9..MAX and 0..2, written without a break
    assert after.judge(MAX - 9, 10) is OLDER
    assert after.judge(0, 3) is OLDER
    assert after.judge(MAX - 5, 6) is OLDER
    assert after.judge(3, 2) is REPEAT
    assert after.judge(MAX - 9, 14) is OUT_OF_ORDER  # would overlap the last batch
    assert after.judge(MAX - 10, 1) is OUT_OF_ORDER  # before what the partition knows it wrote


def test_out_of_order_across_the_wrap():
    last = _first(MAX - 9, 10)
    assert last.judge(1, 1) is OUT_OF_ORDER  # a gap of one, just past the wrap
    assert last.judge(MAX - 4, 1) is OUT_OF_ORDER  # inside the last batch
    assert last.judge(5, 3) is OUT_OF_ORDER
    # v1.2 compared unwrapped sequences: 0 < MAX-9 made the first batch after the wrap a duplicate.
    assert last.judge(0, 1) is NEXT


def test_a_batch_behind_the_first_one_the_partition_saw_is_out_of_order_not_a_duplicate():
    """A new producer's pipelined second request was accepted at sequence 10 while its first (0..9)
    was refused for backpressure: the resend of the first was never written, and "duplicate"
    would have it acknowledged and lost."""
    last = _first(10, 5)
    assert last.known_before == 0
    assert last.judge(0, 10) is OUT_OF_ORDER
    assert _then(last, 15, 5).judge(10, 5) is OLDER  # the batch it did write


def test_the_known_run_is_at_most_half_the_sequence_space_so_a_gap_is_never_taken_for_a_batch_behind():
    last = ProducerBatch(0, 1 << 20, 1, 1 << 20, 0)
    for _ in range(SEQUENCE_MODULUS // (1 << 20) + 3):  # more than a full cycle of the sequence space
        last = _then(last, last.next_sequence, 1 << 20)
    assert last.known_before == SEQUENCE_WINDOW
    assert last.judge((last.sequence - SEQUENCE_WINDOW) % SEQUENCE_MODULUS, 1) is OLDER
    assert last.judge((last.sequence - SEQUENCE_WINDOW - 1) % SEQUENCE_MODULUS, 1) is OUT_OF_ORDER
    gap = (last.next_sequence + SEQUENCE_WINDOW - (1 << 20) - 1) % SEQUENCE_MODULUS  # far ahead, yet a gap
    assert last.judge(gap, 1) is OUT_OF_ORDER


def test_a_gap_is_taken_for_a_batch_behind_only_from_last_count_plus_gap_of_2_to_the_30():
    """Section 9.4's bound: with the known run full, a batch ahead of the last is a gap while
    ``last.count + gap < 2^30``; at ``2^30`` it lies in the run behind (DuplicateSequence)."""
    last = ProducerBatch(0, 1 << 20, 1, 1 << 20, 0)
    for _ in range(SEQUENCE_MODULUS // (1 << 20) + 3):
        last = _then(last, last.next_sequence, 1 << 20)
    largest_gap = SEQUENCE_WINDOW - last.count - 1
    assert last.judge((last.next_sequence + largest_gap) % SEQUENCE_MODULUS, 1) is OUT_OF_ORDER
    assert last.judge((last.next_sequence + largest_gap + 1) % SEQUENCE_MODULUS, 1) is OLDER


@pytest.mark.parametrize("a, n, b, m, shared", [
    (0, 2, 2, 2, False), (0, 2, 1, 2, True), (2, 2, 0, 3, True), (0, 1, 0, 1, True),
    (MAX, 2, 0, 1, True), (MAX, 1, 0, 1, False), (MAX - 1, 3, 1, 5, False), (5, 1, MAX, 7, True),
])
def test_batches_share_a_sequence_across_the_wrap(a, n, b, m, shared):
    assert sequences_overlap(a, n, b, m) is shared
    assert sequences_overlap(b, m, a, n) is shared


def test_an_entry_written_without_known_before_knows_no_run():
    entry = {"sequence": 5, "count": 2, "start_offset": 3, "entry_end_offset": 4, "written_at_ms": 1}
    last = ProducerBatch.from_dict(entry, "k")  # as v1.2 wrote it
    assert last.known_before == 0 and last.judge(3, 2) is OUT_OF_ORDER
    assert ProducerBatch.from_dict(_then(last, 7, 1).to_dict(), "k").known_before == 2
    with pytest.raises(CorruptRecord, match="does not add up"):
        ProducerBatch.from_dict({**entry, "known_before": SEQUENCE_WINDOW + 1}, "k")
    with pytest.raises(CorruptRecord, match="ints"):
        ProducerBatch.from_dict({**entry, "known_before": "2"}, "k")


@pytest.mark.parametrize("sequence", [0, MAX])
def test_a_sequence_is_kafkas_int32_base_sequence(sequence):
    check_producer(AppendGroup("t", 0, [b"x"], producer_id="p", sequence=sequence), "g")


@pytest.mark.parametrize("sequence", [-1, SEQUENCE_MODULUS, 2 ** 40])
def test_a_sequence_past_the_int32_range_is_refused(sequence):
    with pytest.raises(InvalidPayload, match=r"0\.\.2147483647"):
        check_producer(AppendGroup("t", 0, [b"x"], producer_id="p", sequence=sequence), "g")
