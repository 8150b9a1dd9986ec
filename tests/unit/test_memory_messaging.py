"""The in-memory order queue, worker directory and order-tasks queue, on a fake clock.

Blocking calls are given either a zero or tiny timeout (to see them give up) or a generous
one that a correct adapter never reaches (to see them wake up as soon as their event comes).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal
from typing import TypeVar

import pytest

from tradecore.orders import (
    AlertAction,
    OrderRequest,
    OrderResult,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore.ports.messaging import (
    FillTask,
    FillTaskQueue,
    OrderQueue,
    WorkerDirectory,
)
from tradecore.testing.clock import EPOCH, FakeClock
from tradecore_adapters.memory.messaging import (
    REPLY_TTL_S,
    MemoryFillTaskQueue,
    MemoryOrderQueue,
    MemoryWorkerDirectory,
)

T = TypeVar("T")

NEVER_S = 5.0  # a wait a correct adapter cuts short


async def woken(waiter: asyncio.Task[T]) -> T:
    """The waiter's value, which must be ready after a few turns of the loop: it was woken
    by the event, not by its timeout."""
    for _ in range(10):
        await asyncio.sleep(0)
    assert waiter.done(), "the waiter was not woken"
    return waiter.result()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def directory(clock: FakeClock) -> MemoryWorkerDirectory:
    return MemoryWorkerDirectory(clock)


@pytest.fixture
def queue(clock: FakeClock, directory: MemoryWorkerDirectory) -> MemoryOrderQueue:
    queue = MemoryOrderQueue(clock, directory)
    directory.attach_queue(queue)
    return queue


@pytest.fixture
def tasks(clock: FakeClock) -> MemoryFillTaskQueue:
    return MemoryFillTaskQueue(clock)


async def hold(directory: MemoryWorkerDirectory, user_id: str = "u1", ttl_s: float = 30) -> int:
    """Take the user's lease for the holder "h1" and return its fencing token."""
    token = await directory.acquire(user_id, "h1", ttl_s)
    assert token is not None
    return token


def request(request_id: str, user_id: str = "u1") -> OrderRequest:
    return OrderRequest(
        request_id=request_id,
        order_id=f"order-{request_id}",
        user_id=user_id,
        trading_account_id="acct",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        order_type=OrderType.ENTRY,
        quantity=Decimal(1),
        source=Source.WEBHOOK,
        simulation=False,
        created_at=EPOCH,
        expires_at=EPOCH + timedelta(minutes=5),
    )


def result(req: OrderRequest) -> OrderResult:
    return OrderResult(
        order_id=req.order_id,
        request_id=req.request_id,
        status=OrderStatus.FILLED,
        symbol=req.symbol,
        action=req.action,
        quantity=req.quantity,
        filled_quantity=req.quantity,
        fill_price=Decimal("100"),
    )


def test_adapters_implement_the_ports(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory, tasks: MemoryFillTaskQueue
) -> None:
    assert isinstance(queue, OrderQueue)
    assert isinstance(directory, WorkerDirectory)
    assert isinstance(tasks, FillTaskQueue)


# --- Order queue -----------------------------------------------------------------------------


async def test_push_needs_the_active_mark(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    assert not await queue.push(request("r1"))
    assert await queue.take("u1", 0) is None
    await hold(directory, "u1", 30)
    assert await queue.push(request("r1"))
    taken = await queue.take("u1", 0)
    assert taken is not None
    assert taken.request_id == "r1"


async def test_requests_are_taken_in_push_order_per_user(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    await hold(directory, "u2", 30)
    for req in [request("a1"), request("b1", "u2"), request("a2"), request("b2", "u2")]:
        assert await queue.push(req)

    async def ids(user_id: str) -> list[str]:
        taken = [await queue.take(user_id, 0) for _ in range(3)]
        return [t.request_id if t else "-" for t in taken]

    assert await ids("u2") == ["b1", "b2", "-"]
    assert await ids("u1") == ["a1", "a2", "-"]


async def test_take_waits_for_a_push(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    taker = asyncio.create_task(queue.take("u1", NEVER_S))
    await asyncio.sleep(0)
    assert not taker.done()
    await queue.push(request("r1"))
    taken = await woken(taker)
    assert taken is not None
    assert taken.request_id == "r1"


async def test_take_gives_up_after_its_timeout(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    assert await queue.take("u1", 0.01) is None


async def test_a_crashed_workers_requests_stay_in_flight_oldest_first(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    for rid in ("r1", "r2", "r3"):
        await queue.push(request(rid))
    first = await queue.take("u1", 0)
    second = await queue.take("u1", 0)
    assert first is not None and second is not None
    # The worker dies here: nothing completes. A new worker finds both, oldest first.
    assert [r.request_id for r in await queue.in_flight("u1")] == ["r1", "r2"]
    assert await queue.in_flight("u2") == []

    await queue.complete(first, result(first))
    assert [r.request_id for r in await queue.in_flight("u1")] == ["r2"]
    await queue.complete(second, result(second))
    assert await queue.in_flight("u1") == []
    third = await queue.take("u1", 0)
    assert third is not None and third.request_id == "r3"


async def test_a_reply_that_came_before_the_wait_is_returned_once(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    await queue.push(request("r1"))
    taken = await queue.take("u1", 0)
    assert taken is not None
    await queue.complete(taken, result(taken))
    assert await queue.wait_result("r1", 0) == result(taken)
    assert await queue.wait_result("r1", 0) is None


async def test_wait_result_wakes_on_the_reply(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    await queue.push(request("r1"))
    waiter = asyncio.create_task(queue.wait_result("r1", NEVER_S))
    await asyncio.sleep(0)
    taken = await queue.take("u1", 0)
    assert taken is not None
    await queue.complete(taken, result(taken))
    assert await woken(waiter) == result(taken)


async def test_wait_result_returns_none_after_its_timeout(queue: MemoryOrderQueue) -> None:
    assert await queue.wait_result("nobody", 0.01) is None
    assert await queue.wait_result("nobody", 0) is None


async def test_uncollected_replies_expire(
    clock: FakeClock, queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 3600)
    for rid in ("r1", "r2"):
        await queue.push(request(rid))
    r1 = await queue.take("u1", 0)
    assert r1 is not None
    await queue.complete(r1, result(r1))
    clock.advance(REPLY_TTL_S)
    r2 = await queue.take("u1", 0)
    assert r2 is not None
    await queue.complete(r2, result(r2))
    assert await queue.wait_result("r1", 0) is None
    assert await queue.wait_result("r2", 0) == result(r2)


# --- Worker directory ------------------------------------------------------------------------


async def test_the_lease_expires_with_its_ttl_and_renew_extends_it(
    clock: FakeClock, directory: MemoryWorkerDirectory
) -> None:
    assert not await directory.is_active("u1")
    token = await hold(directory, "u1", 30)
    clock.advance(29.9)
    assert await directory.is_active("u1")
    assert await directory.renew("u1", token, 30)
    clock.advance(29.9)
    assert await directory.is_active("u1")
    clock.advance(0.1)
    assert not await directory.is_active("u1")
    assert not await directory.renew("u1", token, 30)  # lost: renewing does not revive it
    assert not await directory.is_active("u1")


async def test_re_acquiring_refreshes_the_ttl_and_keeps_the_token(
    clock: FakeClock, directory: MemoryWorkerDirectory
) -> None:
    token = await hold(directory, "u1", 30)
    clock.advance(20)
    assert await directory.acquire("u1", "h1", 30) == token
    clock.advance(29.9)
    assert await directory.is_active("u1")
    assert await directory.acquire("u1", "h2", 30) is None
    clock.advance(0.1)
    assert await directory.acquire("u1", "h2", 30) == token + 1


async def test_fencing_tokens_are_counted_per_user(directory: MemoryWorkerDirectory) -> None:
    first = await hold(directory, "u1")
    assert await hold(directory, "u2") == 1
    await directory.release("u1", first)
    assert await hold(directory, "u1") == first + 1


async def test_release_removes_the_mark(directory: MemoryWorkerDirectory) -> None:
    token = await hold(directory, "u1")
    await directory.release("u1", token)
    await directory.release("u1", token)
    assert not await directory.is_active("u1")


async def test_start_requests_are_fifo_and_deduplicated_while_pending(
    directory: MemoryWorkerDirectory,
) -> None:
    await directory.request_start("u1")
    await directory.request_start("u2")
    await directory.request_start("u1")
    assert await directory.next_start_request(0) == "u1"
    await directory.request_start("u1")  # no longer pending: a new request
    assert await directory.next_start_request(0) == "u2"
    assert await directory.next_start_request(0) == "u1"
    assert await directory.next_start_request(0.01) is None


async def test_next_start_request_wakes_on_a_request(directory: MemoryWorkerDirectory) -> None:
    waiter = asyncio.create_task(directory.next_start_request(NEVER_S))
    await asyncio.sleep(0)
    await directory.request_start("u1")
    assert await woken(waiter) == "u1"


async def test_wait_active_wakes_on_the_mark(directory: MemoryWorkerDirectory) -> None:
    waiter = asyncio.create_task(directory.wait_active("u1", NEVER_S))
    other = asyncio.create_task(directory.wait_active("u1", NEVER_S))
    await asyncio.sleep(0)
    assert not waiter.done()
    await hold(directory, "u1", 30)
    assert await woken(waiter)
    assert await woken(other)


async def test_wait_active_is_immediate_when_marked_and_false_after_timeout(
    directory: MemoryWorkerDirectory,
) -> None:
    assert not await directory.wait_active("u1", 0.01)
    await hold(directory, "u2", 30)
    assert not await directory.wait_active("u1", 0)
    assert await directory.wait_active("u2", 0)


async def test_retire_keeps_the_mark_while_a_request_waits(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    token = await hold(directory, "u1", 30)
    await queue.push(request("r1"))
    assert not await directory.retire("u1", token)
    assert await directory.is_active("u1")
    assert await queue.take("u1", 0) is not None
    assert not await directory.retire("u1", token + 1)
    assert await directory.is_active("u1")
    assert await directory.retire("u1", token)
    assert not await directory.is_active("u1")
    assert not await queue.push(request("r2"))


# --- Order-tasks FIFO queue ------------------------------------------------------------------


def fill_task(order_id: str, user_id: str = "u1") -> FillTask:
    return FillTask(order_id=order_id, user_id=user_id, trading_account_id="acct")


async def test_a_group_delivers_nothing_while_a_message_is_in_flight(
    tasks: MemoryFillTaskQueue,
) -> None:
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    await tasks.send(fill_task("p1", "u2"), 0)
    first = await tasks.receive(0)
    assert first is not None
    assert (first.task.order_id, first.receive_count) == ("o1", 1)
    other = await tasks.receive(0)
    assert other is not None and other.task.order_id == "p1"
    assert await tasks.receive(0) is None  # o2 waits for o1
    await tasks.ack(first)
    second = await tasks.receive(0)
    assert second is not None and second.task.order_id == "o2"


async def test_a_delayed_message_becomes_visible_on_time(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("o1"), 2.5)
    clock.advance(2.4)
    assert await tasks.receive(0) is None
    clock.advance(0.1)
    delivery = await tasks.receive(0)
    assert delivery is not None and delivery.task.order_id == "o1"


async def test_receive_waits_for_a_send(tasks: MemoryFillTaskQueue) -> None:
    waiter = asyncio.create_task(tasks.receive(NEVER_S))
    await asyncio.sleep(0)
    await tasks.send(fill_task("o1"), 0)
    delivery = await woken(waiter)
    assert delivery is not None and delivery.task.order_id == "o1"


async def test_ack_deletes_the_message(clock: FakeClock, tasks: MemoryFillTaskQueue) -> None:
    await tasks.send(fill_task("o1"), 0)
    delivery = await tasks.receive(0)
    assert delivery is not None
    await tasks.ack(delivery)
    clock.advance(1000)
    assert await tasks.receive(0) is None
    assert await tasks.dead_letters() == []


async def test_retry_redelivers_after_its_delay_and_frees_the_group(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    first = await tasks.receive(0)
    assert first is not None and first.task.order_id == "o1"
    await tasks.retry(first, 30)
    behind = await tasks.receive(0)
    assert behind is not None and behind.task.order_id == "o2"
    await tasks.ack(behind)
    clock.advance(29.9)
    assert await tasks.receive(0) is None
    clock.advance(0.1)
    again = await tasks.receive(0)
    assert again is not None
    assert (again.task.order_id, again.receive_count) == ("o1", 2)
    assert again.receipt != first.receipt


async def test_an_unsettled_message_is_redelivered_after_the_visibility_timeout(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("o1"), 0)
    lost = await tasks.receive(0)
    assert lost is not None
    clock.advance(179.9)
    assert await tasks.receive(0) is None
    clock.advance(0.1)
    again = await tasks.receive(0)
    assert again is not None
    assert (again.task.order_id, again.receive_count) == ("o1", 2)
    # The first receipt is stale now: settling with it changes nothing.
    await tasks.ack(lost)
    clock.advance(180)
    third = await tasks.receive(0)
    assert third is not None and third.receive_count == 3


async def test_the_visibility_timeout_is_configurable(clock: FakeClock) -> None:
    tasks = MemoryFillTaskQueue(clock, visibility_timeout_s=10)
    await tasks.send(fill_task("o1"), 0)
    assert await tasks.receive(0) is not None
    clock.advance(10)
    again = await tasks.receive(0)
    assert again is not None and again.receive_count == 2


async def test_a_settled_delivery_cannot_be_settled_again(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("o1"), 0)
    delivery = await tasks.receive(0)
    assert delivery is not None
    await tasks.retry(delivery, 5)
    await tasks.ack(delivery)
    await tasks.dead_letter(delivery, "late")
    clock.advance(5)
    again = await tasks.receive(0)
    assert again is not None and again.task.order_id == "o1"
    assert await tasks.dead_letters() == []


async def test_dead_letters_are_listed_with_their_reasons_oldest_first(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("p1", "u2"), 0)
    first = await tasks.receive(0)
    second = await tasks.receive(0)
    assert first is not None and second is not None
    await tasks.dead_letter(first, "still pending after 3 retries")
    await tasks.dead_letter(second, "broker unreachable after 3 retries")
    assert await tasks.dead_letters() == [
        (fill_task("o1"), "still pending after 3 retries"),
        (fill_task("p1", "u2"), "broker unreachable after 3 retries"),
    ]
    clock.advance(1000)
    assert await tasks.receive(0) is None
