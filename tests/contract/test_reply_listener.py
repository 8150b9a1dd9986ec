"""The reply listener of the Redis order queue: one pub/sub connection per queue instance (one
per API process) carries the notifications of every waiting ``wait_result``, each with its
reply, and the reply list stays the record a waiter reads when it may have missed one, so a
lost notification costs time, never a reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import attrs
import pytest
from redis.asyncio import Redis
from redis_fixtures import order_request, order_result, pubsub_listeners

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.orders import OrderRequest, OrderResult
from tradecore_adapters.redis import (
    RedisConnections,
    RedisOrderQueue,
    RedisWorkerDirectory,
    codec,
    open_connections,
)
from tradecore_adapters.redis.messaging import processing_key, response_key

pytestmark = pytest.mark.redis

POOL_SIZE = 4
"""Command connections of the queue under test: far fewer than the waiters."""
WAITERS = 200
LONG_WAIT_S = 30.0
"""Longer than any test: a waiter that returns did so on a notification or a look."""
_ROUNDS = 300
_ROUND_S = 0.01


@pytest.fixture
async def small_pool(redis_url: str, redis_client: Redis) -> AsyncIterator[RedisConnections]:
    """Clients on the flushed test database with ``POOL_SIZE`` command connections."""
    connections = open_connections(redis_url, max_connections=POOL_SIZE)
    yield connections
    await connections.aclose()


async def _until(condition: object, what: str) -> None:
    """Wait a bounded number of rounds for ``condition()`` to hold."""
    assert callable(condition)
    for _ in range(_ROUNDS):
        if condition():
            return
        await asyncio.sleep(_ROUND_S)
    raise AssertionError(f"never happened: {what}")


async def _waiter(
    queue: RedisOrderQueue, request_id: str, timeout_s: float = LONG_WAIT_S
) -> asyncio.Task[OrderResult | None]:
    """``queue.wait_result`` for ``request_id`` in a task, once it is registered."""
    before = queue.waiting_replies
    waiter = asyncio.create_task(queue.wait_result(request_id, timeout_s))
    await _until(lambda: queue.waiting_replies == before + 1, f"the waiter of {request_id}")
    return waiter


async def _database_clients(client: Redis) -> int:
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    return sum(1 for c in await client.client_list() if int(c["db"]) == db)


async def _handed_over(
    queue: RedisOrderQueue, directory: RedisWorkerDirectory, request_ids: list[str]
) -> list[OrderRequest]:
    """Push the requests through ``queue`` and take them as a worker would: what the worker
    holds carries the queue's reply address."""
    assert await directory.acquire("u1", "h1", 30) is not None
    for rid in request_ids:
        assert await queue.push(order_request(rid))
    taken = [await queue.take("u1", 0) for _ in request_ids]
    assert all(t is not None for t in taken)
    return [t for t in taken if t is not None]


async def test_many_waiters_share_one_listener_connection(
    small_pool: RedisConnections, redis_client: Redis
) -> None:
    queue = RedisOrderQueue(small_pool)
    directory = RedisWorkerDirectory(small_pool)
    rids = [f"r{i}" for i in range(WAITERS)]
    taken = await _handed_over(queue, directory, rids)
    before = await _database_clients(redis_client)

    waiters = [asyncio.create_task(queue.wait_result(rid, LONG_WAIT_S)) for rid in rids]
    await _until(lambda: queue.waiting_replies == WAITERS, "every waiter registered")
    await pubsub_listeners(redis_client)
    during = await _database_clients(redis_client)

    # The pool (of which the listener holds one) bounds the connections, not the waiters.
    assert during <= before + POOL_SIZE
    assert during < before + WAITERS
    for request in reversed(taken):
        await queue.complete(request, order_result(request))
    results = await asyncio.gather(*waiters)
    assert results == [order_result(t) for t in taken]
    assert queue.waiting_replies == 0
    await queue.aclose()


async def test_a_reply_written_before_the_wait_is_found_at_once(
    redis_connections: RedisConnections,
) -> None:
    queue = RedisOrderQueue(redis_connections)
    request = order_request("r1")  # no reply_to: as from an API older than the listener
    await queue.complete(request, order_result(request))
    assert await queue.wait_result("r1", 0) is None  # not handed over here: whose is it?
    await queue.park(request)
    assert await queue.wait_result("r1", LONG_WAIT_S) == order_result(request)
    assert queue.waiting_replies == 0
    await queue.aclose()


async def test_a_lost_notification_still_delivers_the_reply_at_the_timeout(
    redis_connections: RedisConnections, redis_client: Redis
) -> None:
    queue = RedisOrderQueue(redis_connections)
    # Announced on a channel nobody hears: the waiter learns nothing before its timeout.
    request = attrs.evolve(order_request("r1"), reply_to="trading:replies:nobody")
    await queue.park(request)
    waiter = await _waiter(queue, "r1", 1.0)
    assert await pubsub_listeners(redis_client)
    await asyncio.sleep(0.05)  # past the waiter's first look and the subscription's wake-up
    await queue.complete(request, order_result(request))
    assert await waiter == order_result(request)
    assert queue.waiting_replies == 0
    await queue.aclose()


async def test_a_killed_listener_reconnects_and_the_waiter_still_gets_its_reply(
    redis_connections: RedisConnections, redis_client: Redis
) -> None:
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    others = frozenset(await pubsub_listeners(redis_client, rounds=1))
    first, second = await _handed_over(queue, directory, ["r1", "r2"])
    waiter = asyncio.create_task(queue.wait_result("r1", LONG_WAIT_S))
    (listener,) = await pubsub_listeners(redis_client, exclude=others)
    assert await redis_client.client_kill_filter(_id=listener) == 1
    # Published while the listener may be away: the reconnection makes the waiter look.
    await queue.complete(first, order_result(first))
    async with asyncio.timeout(10):
        assert await waiter == order_result(first)

    assert len(await pubsub_listeners(redis_client, exclude=others | {listener})) == 1
    waiter = await _waiter(queue, "r2")
    await queue.complete(second, order_result(second))
    async with asyncio.timeout(10):
        assert await waiter == order_result(second)
    assert queue.waiting_replies == 0
    await queue.aclose()


async def test_no_waiter_is_left_behind_after_timeouts_cancellations_and_outages(
    redis_connections: RedisConnections,
) -> None:
    queue = RedisOrderQueue(redis_connections)
    for i in range(20):
        await queue.park(order_request(f"t{i}"))
    await queue.park(order_request("c1"))
    timed_out = await asyncio.gather(*(queue.wait_result(f"t{i}", 0.05) for i in range(20)))
    assert timed_out == [None] * 20
    assert queue.waiting_replies == 0

    cancelled = await _waiter(queue, "c1")
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert queue.waiting_replies == 0
    await queue.aclose()

    down = open_connections("redis://127.0.0.1:1/0", socket_timeout_s=0.2)
    unreachable = RedisOrderQueue(down)
    with pytest.raises(KeyValueStoreUnavailable):
        await unreachable.wait_result("r1", 1.0, user_id="u1")
    assert unreachable.waiting_replies == 0
    await unreachable.aclose()
    await down.aclose()


async def test_two_processes_each_hear_only_their_own_replies(
    redis_connections: RedisConnections,
) -> None:
    api_a = RedisOrderQueue(redis_connections)
    api_b = RedisOrderQueue(redis_connections)
    worker = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    assert await directory.acquire("u1", "h1", 30) is not None
    assert await api_a.push(order_request("ra"))
    assert await api_b.push(order_request("rb"))
    waiters = [
        asyncio.create_task(api_a.wait_result("ra", LONG_WAIT_S)),
        asyncio.create_task(api_b.wait_result("rb", LONG_WAIT_S)),
    ]
    await _until(
        lambda: api_a.waiting_replies == api_b.waiting_replies == 1, "both waiters registered"
    )
    for _ in range(2):
        taken = await worker.take("u1", 0)
        assert taken is not None
        await worker.complete(taken, order_result(taken))
    ra, rb = await asyncio.gather(*waiters)
    assert (ra, rb) == (order_result(order_request("ra")), order_result(order_request("rb")))
    for queue in (api_a, api_b, worker):
        await queue.aclose()


async def test_complete_clears_an_addressed_entry_given_an_unaddressed_copy(
    redis_connections: RedisConnections, redis_client: Redis
) -> None:
    """The address is not part of the request: completing an equal request without it (as
    built again from its row) still clears the in-flight entry and notifies the waiter."""
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    (taken,) = await _handed_over(queue, directory, ["r1"])
    bare = order_request("r1")
    assert taken.reply_to is not None and bare.reply_to is None and taken == bare
    waiter = await _waiter(queue, "r1")
    await queue.complete(bare, order_result(bare))
    assert await redis_client.llen(processing_key("u1")) == 0
    async with asyncio.timeout(10):
        assert await waiter == order_result(bare)
    await queue.aclose()


async def test_the_notification_carries_the_reply_so_the_waiter_reads_no_list(
    redis_connections: RedisConnections, redis_client: Redis
) -> None:
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    (earliest,) = await _handed_over(queue, directory, ["r0"])
    await queue.complete(earliest, order_result(earliest))
    assert await queue.wait_result("r0", LONG_WAIT_S) == order_result(earliest)  # listens
    await _until(lambda: queue.replies_subscribed, "the reply listener subscribed")
    first, second = await _handed_over(queue, directory, ["r1", "r2"])
    # Completed before anyone waits (the push opened the slot), and completed while waiting.
    await queue.complete(first, order_result(first))
    waiter = await _waiter(queue, "r2")
    await queue.complete(second, order_result(second))
    async with asyncio.timeout(10):
        assert await waiter == order_result(second)
        assert await queue.wait_result("r1", LONG_WAIT_S) == order_result(first)
    # Neither waiter read its reply list: both replies are still there until they lapse.
    for request in (first, second):
        assert await redis_client.llen(response_key("u1", request.request_id)) == 1
    assert queue.waiting_replies == 0
    await queue.aclose()


async def test_a_bare_notification_from_an_earlier_release_makes_the_waiter_read_the_list(
    redis_connections: RedisConnections, redis_client: Redis
) -> None:
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    (taken,) = await _handed_over(queue, directory, ["r1"])
    waiter = await _waiter(queue, "r1")
    await _until(lambda: queue.replies_subscribed, "the reply listener subscribed")
    await asyncio.sleep(0.05)  # past the waiter's look at the subscription
    # An earlier worker wrote the reply and published the request id alone.
    await redis_client.rpush(response_key("u1", "r1"), codec.encode_result(order_result(taken)))
    assert taken.reply_to is not None
    await redis_client.publish(taken.reply_to, "r1")
    async with asyncio.timeout(10):
        assert await waiter == order_result(taken)
    assert await redis_client.llen(response_key("u1", "r1")) == 0  # read from the list
    await queue.aclose()


def test_the_reply_address_travels_only_when_set() -> None:
    bare = order_request("r1")
    assert "reply_to" not in codec.encode_request(bare)
    addressed = attrs.evolve(bare, reply_to="trading:replies:p1")
    raw = codec.encode_request(addressed)
    assert raw.endswith(',"reply_to":"trading:replies:p1"}')  # the complete script relies on it
    assert codec.decode_request(raw).reply_to == "trading:replies:p1"
    assert codec.encode_request(codec.decode_request(raw)) == raw
