"""The in-memory order queue, worker directory and order-tasks queue, on a fake clock.

Blocking calls are given either a zero or tiny timeout (to see them give up) or a generous
one that a correct adapter never reaches (to see them wake up as soon as their event comes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tradecore.orders import (
    OrderRequest,
    OrderResult,
)
from tradecore.ports.messaging import (
    FillDelivery,
    FillTask,
    FillTaskQueue,
    OrderQueue,
    WorkerDirectory,
)
from tradecore.testing.clock import FakeClock
from tradecore.testing.orders import filled_result, order_request
from tradecore_adapters.memory import fifo
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import REPLY_TTL_S, MemoryOrderQueue
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

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
    return order_request(request_id, user_id)


def result(req: OrderRequest) -> OrderResult:
    return filled_result(req)


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


async def test_parked_messages_of_many_groups_come_in_send_order_as_they_become_visible(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    delays = {}
    for n in range(5):
        for user in range(12):
            order_id = f"u{user}-{n}"
            delays[order_id] = float((n * 7 + user * 3) % 5)
            await tasks.send(fill_task(order_id, f"u{user}"), delays[order_id])
    send_order = list(delays)
    delivered: list[str] = []
    for second in range(5):
        expected = [o for o in send_order if delays[o] <= second and o not in delivered]
        got = []
        while (delivery := await tasks.receive(0)) is not None:
            got.append(delivery.task.order_id)
            await tasks.ack(delivery)
        assert got == expected
        delivered += got
        clock.advance(1)
    assert sorted(delivered) == sorted(send_order)


async def test_send_order_holds_across_groups_when_a_group_became_visible_out_of_order(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("x"), 2)  # sent first, visible last
    await tasks.send(fill_task("y"), 0)
    await tasks.send(fill_task("p", "u2"), 0)
    await tasks.send(fill_task("z"), 0)
    clock.advance(2)
    order = []
    while (delivery := await tasks.receive(0)) is not None:
        order.append(delivery.task.order_id)
        await tasks.ack(delivery)
    assert order == ["x", "y", "p", "z"]


@pytest.mark.parametrize("settle", ["ack", "retry", "dead_letter", "visibility timeout"])
async def test_messages_parked_behind_a_busy_group_are_released_when_it_settles(
    clock: FakeClock, tasks: MemoryFillTaskQueue, settle: str
) -> None:
    await tasks.send(fill_task("o1"), 0)
    first = await tasks.receive(0)
    assert first is not None
    await tasks.send(fill_task("o2"), 0)
    await tasks.send(fill_task("o3"), 1)
    await tasks.send(fill_task("p1", "u2"), 2)
    clock.advance(2)
    other = await tasks.receive(0)
    assert other is not None and other.task.order_id == "p1"
    assert await tasks.receive(0) is None  # o2 and o3 wait for o1
    await tasks.ack(other)
    if settle == "ack":
        await tasks.ack(first)
    elif settle == "retry":
        await tasks.retry(first, 60)
    elif settle == "dead_letter":
        await tasks.dead_letter(first, "given up")
    else:
        clock.advance(180)
        again = await tasks.receive(0)  # o1 was sent first, so it comes again first
        assert again is not None
        assert (again.task.order_id, again.receive_count) == ("o1", 2)
        await tasks.ack(first)  # stale: superseded by the second delivery
        assert await tasks.receive(0) is None
        await tasks.ack(again)
    order = []
    while (delivery := await tasks.receive(0)) is not None:
        order.append(delivery.task.order_id)
        await tasks.ack(delivery)
    assert order == ["o2", "o3"]


async def test_a_late_settle_of_a_timed_out_message_frees_the_messages_behind_it(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    await tasks.send(fill_task("o1"), 0)
    slow = await tasks.receive(0)
    assert slow is not None
    await tasks.send(fill_task("o2"), 0)
    clock.advance(180)
    await tasks.send(fill_task("p1", "u2"), 0)
    first = await tasks.receive(0)  # the timed-out o1 comes again, before p1 (sent later)
    assert first is not None and (first.task.order_id, first.receive_count) == ("o1", 2)
    await tasks.retry(first, 0)
    second = await tasks.receive(0)
    assert second is not None and (second.task.order_id, second.receive_count) == ("o1", 3)
    clock.advance(180)  # timed out again, not yet delivered again: its receipt is honoured
    await tasks.dead_letter(second, "late")
    order = []
    while (delivery := await tasks.receive(0)) is not None:
        order.append(delivery.task.order_id)
        await tasks.ack(delivery)
    assert order == ["o2", "p1"]
    assert await tasks.dead_letters() == [(fill_task("o1"), "late")]


async def test_receive_only_polls_while_a_message_is_delayed_or_in_flight(
    clock: FakeClock, tasks: MemoryFillTaskQueue
) -> None:
    assert tasks._pause_s() is None  # nothing can change but by a send
    await tasks.send(fill_task("o1"), 0.01)
    assert tasks._pause_s() == pytest.approx(0.01)
    await tasks.send(fill_task("o2"), 600)
    clock.advance(0.01)
    delivery = await tasks.receive(0)
    assert delivery is not None and delivery.task.order_id == "o1"
    assert tasks._pause_s() == fifo._POLL_S  # the next change is far: capped
    await tasks.ack(delivery)
    await tasks.ack(delivery)
    assert tasks._pause_s() == fifo._POLL_S
    clock.advance(600)
    delivery = await tasks.receive(0)
    assert delivery is not None
    await tasks.ack(delivery)
    assert tasks._pause_s() is None  # the settled deliveries' timeouts no longer count


# --- Waits -----------------------------------------------------------------------------------


def finished_at_once(call: Coroutine[Any, Any, T]) -> T:
    """The result of ``call``, which must return without suspending even once."""
    try:
        call.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    call.close()
    raise AssertionError("the call waited")


async def test_a_zero_timeout_checks_once_without_waiting(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory, tasks: MemoryFillTaskQueue
) -> None:
    assert finished_at_once(queue.take("u1", 0)) is None
    assert finished_at_once(queue.wait_result("r1", -1)) is None
    assert finished_at_once(directory.wait_active("u1", 0)) is False
    assert finished_at_once(directory.next_start_request(0)) is None
    assert finished_at_once(tasks.receive(0)) is None
    await hold(directory, "u1", 30)
    await queue.push(request("r1"))
    taken = finished_at_once(queue.take("u1", 0))
    assert taken is not None and taken.request_id == "r1"


def waiters(queue: MemoryOrderQueue) -> dict[str, int]:
    """How many waits are listed per key, on both of the queue's doorbells."""
    bells = [queue._requests_bell._waiting, queue._replies_bell._waiting]
    return {key: len(listed) for bell in bells for key, listed in bell.items()}


async def test_a_cancelled_take_leaves_no_waiter_and_takes_nothing(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    cancelled = asyncio.create_task(queue.take("u1", NEVER_S))
    kept = asyncio.create_task(queue.take("u1", NEVER_S))
    await asyncio.sleep(0)
    assert waiters(queue) == {"u1": 2}
    cancelled.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    assert waiters(queue) == {"u1": 1}
    await queue.push(request("r1"))
    taken = await woken(kept)
    assert taken is not None and taken.request_id == "r1"
    assert waiters(queue) == {}
    assert [r.request_id for r in await queue.in_flight("u1")] == ["r1"]


async def test_a_cancelled_wait_result_leaves_no_waiter_and_the_reply_stays(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    await queue.push(request("r1"))
    waiter = asyncio.create_task(queue.wait_result("r1", NEVER_S))
    await asyncio.sleep(0)
    assert waiters(queue) == {"r1": 1}
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert waiters(queue) == {}
    taken = await queue.take("u1", 0)
    assert taken is not None
    await queue.complete(taken, result(taken))
    assert await queue.wait_result("r1", 0) == result(taken)


async def test_waits_that_time_out_leave_no_waiter(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    taken, reply = await asyncio.gather(queue.take("u1", 0.01), queue.wait_result("r1", 0.01))
    assert taken is None and reply is None
    assert waiters(queue) == {}
    assert directory._marks_bell._waiting == {}
    assert not await directory.wait_active("u2", 0.01)
    assert directory._marks_bell._waiting == {}


async def test_a_ring_wakes_every_waiter_of_its_key_only(
    queue: MemoryOrderQueue, directory: MemoryWorkerDirectory
) -> None:
    await hold(directory, "u1", 30)
    await hold(directory, "u2", 30)
    for rid in ("r1", "r2"):
        await queue.push(request(rid))
    first, second = await queue.take("u1", 0), await queue.take("u1", 0)
    assert first is not None and second is not None
    on_r1 = [asyncio.create_task(queue.wait_result("r1", NEVER_S)) for _ in range(2)]
    on_r2 = asyncio.create_task(queue.wait_result("r2", NEVER_S))
    await asyncio.sleep(0)
    await queue.complete(first, result(first))
    for _ in range(10):
        await asyncio.sleep(0)
    done = [waiter for waiter in on_r1 if waiter.done()]
    assert len(done) == 1  # the reply is collected once: the other waiter waits again
    assert done[0].result() == result(first)
    assert not on_r2.done()
    assert waiters(queue) == {"r1": 1, "r2": 1}
    await queue.complete(second, result(second))
    assert await woken(on_r2) == result(second)
    assert waiters(queue) == {"r1": 1}
    for waiter in on_r1:
        waiter.cancel()
    await asyncio.gather(*on_r1, return_exceptions=True)
    assert waiters(queue) == {}


# --- The order-tasks queue against a reference ---------------------------------------------


@attrs.define
class ReferenceMessage:
    id: int
    task: FillTask
    visible_at: datetime
    receive_count: int = 0
    in_flight_until: datetime | None = None


class FifoReference:
    """The order-tasks queue's rules, applied by scanning every message in send order."""

    def __init__(self, clock: FakeClock, visibility_s: float, window_s: float) -> None:
        self.clock = clock
        self.visibility = timedelta(seconds=visibility_s)
        self.window = timedelta(seconds=window_s)
        self.messages: dict[int, ReferenceMessage] = {}
        self.windows: dict[str, datetime] = {}
        self.dead: list[tuple[FillTask, str]] = []
        self.sent = 0

    def send(self, task: FillTask, delay_s: float) -> None:
        now = self.clock.now()
        if self.windows.get(task.order_id, now) > now:
            return
        self.windows[task.order_id] = now + self.window
        self.sent += 1
        visible_at = now + timedelta(seconds=delay_s)
        self.messages[self.sent] = ReferenceMessage(self.sent, task, visible_at)

    def receive(self) -> tuple[int, int] | None:
        """The delivered message's id and receive count."""
        now = self.clock.now()
        busy = {
            m.task.user_id
            for m in self.messages.values()
            if m.in_flight_until is not None and m.in_flight_until > now
        }
        for m in self.messages.values():
            if m.task.user_id not in busy and m.visible_at <= now:
                m.receive_count += 1
                m.in_flight_until = now + self.visibility
                return m.id, m.receive_count
        return None

    def settle(self, delivered: tuple[int, int], how: str, delay_s: float) -> None:
        m = self.messages.get(delivered[0])
        if m is None or m.in_flight_until is None or m.receive_count != delivered[1]:
            return
        if how == "retry":
            m.in_flight_until = None
            m.visible_at = self.clock.now() + timedelta(seconds=delay_s)
            return
        del self.messages[m.id]
        if how == "dead_letter":
            self.dead.append((m.task, "given up"))


class FifoAgainstReference(RuleBasedStateMachine):
    """The adapter and the reference take the same calls, on one clock that moves."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.queue = MemoryFillTaskQueue(self.clock, visibility_timeout_s=60, dedup_window_s=120)
        self.reference = FifoReference(self.clock, visibility_s=60, window_s=120)
        self.orders = 0
        self.deliveries: list[tuple[FillDelivery, tuple[int, int]]] = []

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(call)

    def teardown(self) -> None:
        self.loop.close()

    @rule(user=st.sampled_from(["u1", "u2", "u3"]), delay=st.sampled_from([0, 1, 2.5, 30]))
    def send(self, user: str, delay: float) -> None:
        self.orders += 1
        task = fill_task(f"o{self.orders}", user)
        self.run(self.queue.send(task, delay))
        self.reference.send(task, delay)

    @rule(pick=st.integers(0, 40), user=st.sampled_from(["u1", "u2"]))
    def send_again(self, pick: int, user: str) -> None:
        if self.orders:
            task = fill_task(f"o{pick % self.orders + 1}", user)
            self.run(self.queue.send(task, 0))
            self.reference.send(task, 0)

    @rule()
    def receive(self) -> None:
        delivery = self.run(self.queue.receive(0))
        expected = self.reference.receive()
        if expected is None:
            assert delivery is None
            return
        assert delivery is not None
        message = self.reference.messages[expected[0]]
        assert (delivery.task, delivery.receive_count) == (message.task, expected[1])
        self.deliveries.append((delivery, expected))

    @rule(
        pick=st.integers(0, 40),
        how=st.sampled_from(["ack", "retry", "dead_letter"]),
        delay=st.sampled_from([0, 1, 30]),
    )
    def settle(self, pick: int, how: str, delay: float) -> None:
        if not self.deliveries:
            return
        delivery, delivered = self.deliveries[pick % len(self.deliveries)]
        if how == "ack":
            self.run(self.queue.ack(delivery))
        elif how == "retry":
            self.run(self.queue.retry(delivery, delay))
        else:
            self.run(self.queue.dead_letter(delivery, "given up"))
        self.reference.settle(delivered, how, delay)

    @rule(seconds=st.sampled_from([0.5, 1, 2.5, 30, 60]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def same_dead_letters(self) -> None:
        assert self.run(self.queue.dead_letters()) == self.reference.dead


def test_the_order_tasks_queue_follows_the_reference_as_time_passes() -> None:
    run_state_machine_as_test(
        FifoAgainstReference, settings=settings(settings.default, stateful_step_count=60)
    )
