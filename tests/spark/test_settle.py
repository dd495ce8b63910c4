"""The streaming source's settles: what a background settle commits, spares and aborts, and when the
reader lets a micro-batch's commit run during the next one instead of before it.

The first test drives :class:`rcq.spark.settle.Settler` against the test cluster, without Spark's
JVM; the second is the reader's decision alone, with no server.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from rcq.client import RcqClient
from rcq.spark.options import parse_options
from rcq.spark.settle import Settler, label_prefix
from rcq.spark.stream_reader import RcqStreamReader
from tests.spark.helpers import enqueue_values, open_transactions, queue_info, unique_queue


def _hold_one_item_per_batch(urls: str, token: str, queue: str, consumer: str, batches: list[int]) -> None:
    """For each batch, an open transaction labelled as the source's task 0 of that batch, holding one item."""

    async def main() -> None:
        async with RcqClient(urls.split(","), token=token) as client:
            for batch in batches:
                transaction = await client.begin(60, f"{label_prefix(consumer)}{batch}:0")
                assert len(await transaction.dequeue_items(queue, 1)) == 1

    asyncio.run(main())


def _open_batches(urls: str, token: str, consumer: str) -> list[int]:
    prefix = label_prefix(consumer)
    return sorted(int(t["label"][len(prefix):].split(":")[0]) for t in open_transactions(urls, token, prefix))


@pytest.mark.spark
def test_a_background_settle_commits_done_batches_spares_the_running_one_and_aborts_later_ones(
        urls: str, token: str) -> None:
    queue, consumer = unique_queue("settle"), unique_queue("consumer")
    enqueue_values(urls, token, queue, [str(i) for i in range(4)])
    _hold_one_item_per_batch(urls, token, queue, consumer, [1, 2, 3])
    settler = Settler(parse_options({"url": urls, "queue": queue, "token": token}), consumer)
    try:
        settler.later(1, spare_through=2)  # batch 2 is being read; batch 3 is a dead run's
        assert settler.wait()
        assert (settler.take_committed(), settler.counted_through, settler.settled_through) == (1, 1, 1)
        assert _open_batches(urls, token, consumer) == [2]
        info = queue_info(urls, token, queue)
        assert (info["count"], info["locked"]) == (3, 1), info  # batch 3's item is back, batch 2's still held

        settler.now(2)
        assert (settler.take_committed(), settler.counted_through) == (1, 2)
        assert _open_batches(urls, token, consumer) == []
        assert queue_info(urls, token, queue)["count"] == 2
    finally:
        settler.close()


def _reader(budget_items: int | None, offered: set[int], counted_through: int) -> Any:
    reader = RcqStreamReader(parse_options({"url": "http://127.0.0.1:1", "queue": "q", "numPartitions": "2",
                                            "maxItemsPerPartition": "10"}), "consumer")
    reader.budget_items = budget_items
    reader.offered = offered
    reader.settler.counted_through = counted_through
    return reader


def test_a_batch_is_committed_during_the_next_one_only_if_this_run_offered_it_and_the_budget_outlasts_it() -> None:
    # a stream (no budget): every batch this run offered; never the first one nor a replayed one
    assert _reader(None, {1, 2}, 1)._may_settle_later(2)
    assert not _reader(None, set(), -1)._may_settle_later(0)
    assert not _reader(None, {5}, -1)._may_settle_later(4)  # batch 4 came from the offset log
    # availableNow: the uncounted batches (here 1 and 2, 20 items each at most) must leave budget over
    assert _reader(41, {1, 2}, 0)._may_settle_later(2)
    assert not _reader(40, {1, 2}, 0)._may_settle_later(2)
    assert not _reader(20, {1, 2}, 1)._may_settle_later(2)
    # and the reader pickles to the tasks without its settler

    reader = pickle.loads(pickle.dumps(_reader(None, {1}, 0)))
    assert reader._settler is None and reader.offered == {1}
