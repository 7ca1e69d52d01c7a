"""A streaming micro-batch's small splits share Spark tasks (llog_source.planning.pack)."""

from llog_source.planning import LlogSplit, LlogSplits, pack


def _split(partition: int, count: int) -> LlogSplit:
    return LlogSplit("t", partition, 1, count)


def test_small_splits_share_a_task_up_to_the_limit_in_order_and_big_ones_keep_theirs():
    splits = [_split(0, 3), _split(1, 4), _split(2, 50), _split(3, 2), _split(4, 6), _split(5, 5)]
    packed = pack(splits, limit=10)
    assert packed == [LlogSplits((splits[0], splits[1])), splits[2], LlogSplits((splits[3], splits[4])), splits[5]]
    assert [s.count for s in packed] == [7, 50, 8, 5]
    # Every split read once, in order.
    assert [s for p in packed for s in (p.splits if isinstance(p, LlogSplits) else (p,))] == splits


def test_one_small_split_stays_itself_and_nothing_packs_to_nothing():
    assert pack([_split(0, 3)], limit=10) == [_split(0, 3)]
    assert pack([], limit=10) == []
