"""Adopting the keys of a release older than the per-user hash tags (single server only)."""

from __future__ import annotations

import pytest
from redis_fixtures import fill_task, order_request

from tradecore_adapters.redis import (
    RedisConnections,
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisWorkerDirectory,
    codec,
)
from tradecore_adapters.redis.legacy import adopt_legacy_keys

pytestmark = pytest.mark.redis


async def test_old_lists_fences_and_fill_checks_move_under_the_new_names(
    redis_connections: RedisConnections,
) -> None:
    client = redis_connections.commands
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    tasks = RedisFillTaskQueue(client)
    try:
        old = [codec.encode_request(order_request(r)) for r in ("r1", "r2", "r3")]
        await client.rpush("trading:user:u1:requests", old[0], old[1])
        await client.rpush("trading:user:u1:processing", old[2])
        await client.set("worker:fence:u1", 41)
        await client.hset(
            "order-tasks.fifo:msg:7",
            mapping={"body": codec.encode_task(fill_task("o1")), "group": "u1", "count": 0},
        )
        await queue.park(order_request("r4"))  # a newer request under the new name

        assert await adopt_legacy_keys(redis_connections, tasks) == 3
        assert await adopt_legacy_keys(redis_connections, tasks) == 0  # once only

        assert await queue.in_flight("u1") == [order_request("r3")]
        taken = [await queue.take("u1", 0) for _ in range(3)]
        assert taken == [order_request(r) for r in ("r1", "r2", "r4")]
        assert await directory.acquire("u1", "h1", 30) == 42  # tokens never go back
        delivery = await tasks.receive(0)
        assert delivery is not None and delivery.task == fill_task("o1")
        assert not [k async for k in client.scan_iter(match="trading:user:u1:*")]
        assert not await client.exists("worker:fence:u1", "order-tasks.fifo:msg:7")
    finally:
        await queue.aclose()
        await directory.aclose()
        await tasks.aclose()
