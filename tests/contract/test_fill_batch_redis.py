"""The Redis order-tasks queue's batches, beyond the port's contract (``test_kv_fifo``): the
round trips of a look and of a batch's settles, a look whose asks another receiver beat,
and a look one of whose shards failed. On the single server, where calls share pipelines."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.typing import KeyT
from redis_fixtures import fill_task

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.ports.messaging import FillDelivery
from tradecore_adapters.redis import RedisFillTaskQueue, connect
from tradecore_adapters.redis.batching import Arg, RedisBatcher
from tradecore_adapters.redis.keys import DEFAULT_SHARDS, shard_of

pytestmark = pytest.mark.redis


class Watched(RedisBatcher):
    """A batcher that records each round trip's size, runs ``before[n]`` (if any) before
    writing its n-th round trip (from 0), and fails the calls of ``failing`` on the keys in
    ``failing_keys`` with a lost connection, unsent."""

    def __init__(self, client: Redis) -> None:
        super().__init__(client)
        self.sizes: list[int] = []
        self.before: dict[int, Callable[[], Awaitable[None]]] = {}
        self.failing: AsyncScript | None = None
        self.failing_keys: set[str] = set()

    async def script(self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[Arg]) -> Any:
        if script is self.failing and str(keys[0]) in self.failing_keys:
            raise rx.ConnectionError("connection lost")
        return await super().script(script, keys, args)

    async def _send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        hook = self.before.pop(len(self.sizes), None)
        self.sizes.append(len(commands))
        if hook is not None:
            await hook()
        return await super()._send(commands)


def watched(tasks: RedisFillTaskQueue, client: Redis) -> Watched:
    """Put a ``Watched`` batcher under ``tasks`` (every call of the queue goes through it)."""
    batcher = Watched(client)
    tasks._batch = batcher
    return batcher


async def warmed(tasks: RedisFillTaskQueue) -> None:
    """Run every script of the queue once, so none is loaded (a round trip more) later."""
    await tasks.send(fill_task("warm-1", "warm-a"), 0)
    await tasks.send(fill_task("warm-2", "warm-b"), 0)
    first, second = await tasks.receive_many(2, 0)
    await tasks.retry(first, 0)
    await tasks.dead_letter(second, "warming up")
    (again,) = await tasks.receive_many(2, 0)
    await tasks.ack(again)
    await tasks._client.delete(*[f"{shard}:dead" for shard in tasks.shard_prefixes])


def in_shard_order(*users: str) -> list[str]:
    """``users`` ordered by their shard (a look from shard 0 asks them in that order)."""
    shards = {user: shard_of(user, DEFAULT_SHARDS) for user in users}
    assert len(set(shards.values())) == len(users), "the users must be of different shards"
    return sorted(users, key=shards.__getitem__)


def ids(deliveries: list[FillDelivery]) -> list[tuple[str, int]]:
    return [(d.task.order_id, d.receive_count) for d in deliveries]


async def test_a_look_costs_two_round_trips_and_a_batch_settles_in_one(
    redis_client: Redis,
) -> None:
    tasks = RedisFillTaskQueue(redis_client)
    batcher = watched(tasks, redis_client)
    await warmed(tasks)
    users = [f"u{n}" for n in range(40)]  # every shard of 16 has some
    for user in users:
        await tasks.send(fill_task(f"{user}-0", user), 0)
    batcher.sizes.clear()

    batch = await tasks.receive_many(64, 0)
    assert len(batch) == 40
    assert batcher.sizes == [DEFAULT_SHARDS, DEFAULT_SHARDS]  # the peeks, then the asks

    batcher.sizes.clear()
    await asyncio.gather(  # issued together, as the concurrent checks of a batch settle
        *(tasks.ack(d) for d in batch[:20]), *(tasks.retry(d, 60) for d in batch[20:])
    )
    assert batcher.sizes == [40]
    assert await tasks.pending_count() == 20


async def test_due_shards_the_limit_left_out_are_asked_when_another_receiver_was_first(
    redis_client: Redis, redis_url: str
) -> None:
    tasks = RedisFillTaskQueue(redis_client)
    batcher = watched(tasks, redis_client)
    await warmed(tasks)
    other_client = connect(redis_url, socket_timeout_s=2.0)
    other = RedisFillTaskQueue(other_client)
    try:
        first_user, second_user = in_shard_order("u1", "u2")
        await tasks.send(fill_task("x1", first_user), 0)
        await tasks.send(fill_task("y1", second_user), 0)
        taken: list[FillDelivery | None] = []

        async def the_other_receiver_takes_one() -> None:
            taken.append(await other.receive(0))

        batcher.sizes.clear()
        batcher.before[1] = the_other_receiver_takes_one  # between the peeks and the asks

        got = await tasks.receive_many(1, 0)

        assert [d.task.order_id for d in taken if d is not None] == ["x1"]
        assert ids(got) == [("y1", 1)]
        assert batcher.sizes == [DEFAULT_SHARDS, 1, 1]  # the peeks; x1's shard; y1's shard
    finally:
        await other.aclose()
        await other_client.aclose()


async def test_a_shard_that_failed_leaves_the_others_deliveries_and_its_own_messages(
    redis_client: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = RedisFillTaskQueue(redis_client)
    batcher = watched(tasks, redis_client)
    await warmed(tasks)
    first_user, second_user = in_shard_order("u1", "u2")
    await tasks.send(fill_task("x1", first_user), 0)
    await tasks.send(fill_task("y1", second_user), 0)
    batcher.failing = tasks._receive
    batcher.failing_keys = {tasks.shard_prefixes[shard_of(first_user, DEFAULT_SHARDS)]}

    assert ids(await tasks.receive_many(10, 0)) == [("y1", 1)]
    assert "fill task receive failed on a shard" in caplog.text

    batcher.failing_keys.add(tasks.shard_prefixes[shard_of(second_user, DEFAULT_SHARDS)])
    await tasks.send(fill_task("y2", second_user), 0)  # behind y1, in flight
    await tasks.send(fill_task("z1", "u3"), 0)
    batcher.failing_keys.add(tasks.shard_prefixes[shard_of("u3", DEFAULT_SHARDS)])
    with pytest.raises(KeyValueStoreUnavailable):
        await tasks.receive_many(10, 0)  # every due shard failed: nothing came

    batcher.failing = None
    assert sorted(ids(await tasks.receive_many(10, 0))) == [("x1", 1), ("z1", 1)]
