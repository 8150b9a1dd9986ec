"""A worker's next take after a complete that left nothing waiting: it spends no round trip
to find the list empty, and a request pushed at any moment after the complete still reaches
it at once (the watcher is registered before the complete is sent). A request pushed to such
an idle worker is handed over: the take returns it from the push's wake-up, with no look."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis_fixtures import order_request, order_result

from tradecore.orders import OrderRequest
from tradecore_adapters.redis import RedisConnections, RedisOrderQueue, RedisWorkerDirectory
from tradecore_adapters.redis.codec import encode_request

pytestmark = pytest.mark.redis

USER = "u1"


class CountedQueue(RedisOrderQueue):
    """Counts the looks at the request list (each an LMOVE round trip)."""

    looks = 0

    async def _move_oldest(self, user_id: str) -> OrderRequest | None:
        self.looks += 1
        return await super()._move_oldest(user_id)


@pytest.fixture
async def queue(redis_connections: RedisConnections) -> AsyncIterator[CountedQueue]:
    """A worker host's queue: its takes listen for pushes (one took already)."""
    queue = CountedQueue(redis_connections)
    assert await queue.take(USER, 0.01) is None
    assert queue._wakeups.listening
    try:
        yield queue
    finally:
        await queue.aclose()


async def _executed(queue: CountedQueue, request_id: str) -> OrderRequest:
    """``request_id`` parked (pushed, whatever the lease), taken and completed."""
    await queue.park(order_request(request_id, USER))
    taken = await queue.take(USER, 1.0)
    assert taken is not None and taken.request_id == request_id
    await queue.complete(taken, order_result(taken))
    return taken


async def test_a_take_after_a_complete_with_nothing_waiting_does_not_look_until_woken(
    queue: CountedQueue,
) -> None:
    await _executed(queue, "r1")
    queue.looks = 0

    assert await queue.take(USER, 0.05) is None
    assert queue.looks == 0  # the complete's answer said empty, and nothing was pushed

    assert await queue.take(USER, 0.01) is None
    assert queue.looks == 1  # a later take looks first, as before


async def test_a_request_pushed_after_the_complete_is_taken_with_one_look(
    queue: CountedQueue,
) -> None:
    await _executed(queue, "r1")
    await queue.park(order_request("r2", USER))  # between the complete and the take
    await asyncio.sleep(0)
    queue.looks = 0

    async with asyncio.timeout(5):
        taken = await queue.take(USER, 30.0)
    assert taken is not None and taken.request_id == "r2"
    assert queue.looks == 1  # woken (before or during the take), then one look


async def test_a_request_pushed_while_the_take_waits_wakes_it(
    queue: CountedQueue,
) -> None:
    await _executed(queue, "r1")
    take = asyncio.create_task(queue.take(USER, 30.0))
    await asyncio.sleep(0.01)
    assert not take.done()
    await queue.park(order_request("r2", USER))

    async with asyncio.timeout(5):
        taken = await take
    assert taken is not None and taken.request_id == "r2"


async def test_a_request_already_waiting_at_the_complete_is_taken_at_once(
    queue: CountedQueue,
) -> None:
    await queue.park(order_request("r1", USER))
    await queue.park(order_request("r2", USER))
    first = await queue.take(USER, 1.0)
    assert first is not None
    await queue.complete(first, order_result(first))  # r2 waits: no skipping
    queue.looks = 0

    taken = await queue.take(USER, 0.01)
    assert taken is not None and taken.request_id == "r2"
    assert queue.looks == 1


async def _held(redis_connections: RedisConnections) -> None:
    """A lease for USER, so pushes are accepted."""
    token = await RedisWorkerDirectory(redis_connections).acquire(USER, "h1", 30)
    assert token is not None


async def test_a_request_pushed_to_an_idle_worker_reaches_its_take_without_a_look(
    queue: CountedQueue, redis_connections: RedisConnections
) -> None:
    await _held(redis_connections)
    await _executed(queue, "r1")
    queue.looks = 0
    api = RedisOrderQueue(redis_connections)  # an API process's queue
    try:
        take = asyncio.create_task(queue.take(USER, 30.0))
        await asyncio.sleep(0.01)
        assert await api.push(order_request("r2", USER))
        async with asyncio.timeout(5):
            taken = await take
    finally:
        await api.aclose()
    assert taken is not None and taken.request_id == "r2"
    assert queue.looks == 0  # the push's wake-up carried it
    # its hand-over key stays until the complete: a successor's take would return it
    assert await queue.in_flight(USER) == []
    await queue.complete(taken, order_result(taken))
    assert await queue.take(USER, 0.01) is None  # its hand-over ended with the complete
    assert queue.looks == 0


async def test_a_late_wake_up_of_a_request_already_completed_is_not_taken_again(
    queue: CountedQueue, redis_connections: RedisConnections
) -> None:
    """The take found the hand-over key before the push's wake-up came (it looked as the push
    ran); the request was executed and completed, and only then does the wake-up arrive,
    caught by the watcher the complete registered. It is not executed a second time."""
    await _held(redis_connections)
    assert await queue.push(order_request("r1", USER))
    taken = await queue.take(USER, 0)  # a look: the hand-over key
    assert taken is not None and taken.request_id == "r1"
    await queue.complete(taken, order_result(taken))
    queue._wakeups._ring(USER, encode_request(taken))  # the wake-up, late

    assert await queue.take(USER, 0.05) is None
