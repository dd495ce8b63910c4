"""Helpers of the Spark tests: fill and read back a queue, look at open transactions, and the stream
sink's replay check that local mode and the standalone cluster both run.

Each takes the cluster's URLs (comma-separated, as the Spark option ``url``) and its token (the
``token`` fixture: the test cluster requires one, as a production cluster does).

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcq.client import RcqClient
from tests.helpers import LEADER_TIMEOUT_S


def unique_queue(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _run(urls: str, token: str | None, work: Callable[[RcqClient], Any]) -> Any:
    async def main() -> Any:
        async with RcqClient(urls.split(","), retry_timeout_s=30.0, token=token) as client:
            return await work(client)

    return asyncio.run(main())


def take_all(urls: str, token: str | None, queue: str) -> list[bytes]:
    """Every item of ``queue``, dequeued and committed (the queue is empty afterwards)."""

    async def work(client: RcqClient) -> list[bytes]:
        values: list[bytes] = []
        while True:
            got = await client.dequeue(queue, 5000)
            if not got:
                return values
            values.extend(got)

    return _run(urls, token, work)


def take_some(urls: str, token: str | None, queue: str, count: int) -> list[bytes]:
    """Up to ``count`` items of ``queue``, dequeued and committed (another consumer's share)."""
    return _run(urls, token, lambda client: client.dequeue(queue, count))


def abort_open_transactions(urls: str, token: str | None, label_prefix: str) -> int:
    """Abort the open transactions labelled ``label_prefix``...: what a leader failover does to them."""

    async def work(client: RcqClient) -> int:
        open_ones = await client.transactions(label_prefix=label_prefix)
        for described in open_ones:
            await client.attach(described["transaction_id"]).abort()
        return len(open_ones)

    return _run(urls, token, work)


def enqueue_values(urls: str, token: str | None, queue: str, values: list[str]) -> None:
    async def work(client: RcqClient) -> None:
        for start in range(0, len(values), 1000):
            await client.enqueue(queue, *values[start:start + 1000])

    _run(urls, token, work)


def queue_info(urls: str, token: str | None, queue: str) -> dict[str, Any]:
    """The leader's view: ``count`` and ``locked`` (followers do not know what is locked)."""

    async def work(client: RcqClient) -> dict[str, Any]:
        await client.wait_for_leader(LEADER_TIMEOUT_S)
        return await client.queue_info(queue)

    return _run(urls, token, work)


def open_transactions(urls: str, token: str | None, label_prefix: str) -> list[dict[str, Any]]:
    return _run(urls, token, lambda client: client.transactions(label_prefix=label_prefix))


def duplicates(values: list[Any]) -> dict[Any, int]:
    return {v: n for v, n in collections.Counter(values).items() if n > 1}


def check_stream_sink_replay_adds_nothing_twice(spark: Any, urls: str, token: str, tmp_path: Path,
                                                timeout_s: float = 180) -> None:
    """Three micro-batches into a queue; the last one's commit file removed (as after a driver crash),
    the query re-run: Spark replays it and the sink's idempotency key makes the replay add nothing.
    Run in local mode (test_sink) and on the standalone cluster (test_standalone)."""
    queue = unique_queue("stream-sink")
    source = tmp_path / "in"
    source.mkdir()
    for number in range(3):
        lines = [json.dumps({"n": number * 100 + i}) for i in range(100)]
        (source / f"part-{number}.json").write_text("\n".join(lines) + "\n")
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        stream = spark.readStream.format("json").schema("n BIGINT").option("maxFilesPerTrigger", 1).load(str(source))
        query = (stream.selectExpr("cast(n as string) AS value").writeStream.format("rcq")
                 .option("url", urls).option("token", token).option("queue", queue).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(timeout_s), f"the stream did not finish within {timeout_s} s"
            assert query.exception() is None
        finally:
            query.stop()

    run()
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits == [0, 1, 2]
    # Forget that the last batch was committed: Spark replays it on restart, as after a crash.
    (checkpoint / "commits" / "2").unlink()
    for crc in (checkpoint / "commits").glob(".2.crc"):
        crc.unlink()
    run()
    values = [int(v) for v in take_all(urls, token, queue)]
    assert duplicates(values) == {}
    assert sorted(values) == list(range(300))
    shutil.rmtree(checkpoint)
