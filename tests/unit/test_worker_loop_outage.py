"""Key-value store outages elsewhere in a worker's loop, and the fill check of a settled row.

A worker that meets an outage while it takes its lease, lists its requests in flight, takes
the next request, renews or retires backs off (0.1 s doubling to 2 s, on the injected
sleeper) and goes on: the user's next order is served by the same worker, exactly once,
without waiting for the host's sweep (no control loop runs in these tests). It never goes on
with a lease it may have lost: once no renewal went through for a whole time to live, it
stops and leaves everything for the next holder, here another host. The control loop logs an
outage once. A row found settled (the outcome write committed but its answer was lost, or
the process died right after it) gets its fill check scheduled, before the request is
completed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping

import pytest
from support import NO_ACCOUNTS, queued_row, request_for

from tradecore.errors import DatabaseUnavailable, KeyValueStoreUnavailable, StoreUnavailable
from tradecore.order_lifecycle import OrderChange, sources
from tradecore.orders import (
    OrderHistoryRecord,
    OrderRequest,
    OrderResult,
    OrderStatus,
)
from tradecore.ports.messaging import FillTask
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

USER, ACCOUNT = "user-1", "acct-1"
HOST_A, HOST_B, DEAD_HOST = "host-a", "host-b", "host-dead:1:x"
TTL_S = 30.0
HOST_LOG = "tradecore.services.execution.worker_host"


class Outage:
    """Fails the calls it guards while ``remaining`` > 0, one failure per call."""

    def __init__(self, error: type[StoreUnavailable] = KeyValueStoreUnavailable) -> None:
        self.error = error
        self.remaining = 0
        self.failures = 0

    def check(self) -> None:
        if self.remaining > 0:
            self.remaining -= 1
            self.failures += 1
            raise self.error("unavailable: ConnectionError")


class FailingDirectory(MemoryWorkerDirectory):
    """Leases whose calls can fail; ``control`` guards the control loop's calls. Records the
    releases."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.acquires = Outage()
        self.acquires_commit = False  # a failing acquire takes the lease: its answer was lost
        self.renewals = Outage()
        self.retires = Outage()
        self.control = Outage()
        self.released: list[tuple[str, int]] = []

    async def acquire(self, user_id: str, holder: str, ttl_s: float) -> int | None:
        if self.acquires.remaining and self.acquires_commit:
            await super().acquire(user_id, holder, ttl_s)
        self.acquires.check()
        return await super().acquire(user_id, holder, ttl_s)

    async def renew(self, user_id: str, token: int, ttl_s: float) -> bool:
        self.renewals.check()
        return await super().renew(user_id, token, ttl_s)

    async def renew_many(self, leases: Mapping[str, int], ttl_s: float) -> set[str]:
        self.control.check()
        return {
            u for u, t in leases.items() if not await MemoryWorkerDirectory.renew(self, u, t, ttl_s)
        }

    async def retire(self, user_id: str, token: int) -> bool:
        self.retires.check()
        return await super().retire(user_id, token)

    async def release(self, user_id: str, token: int) -> None:
        self.released.append((user_id, token))
        await super().release(user_id, token)

    async def next_start_request(self, timeout_s: float) -> str | None:
        self.control.check()
        return await super().next_start_request(timeout_s)

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        self.control.check()
        return await super().orphaned_users(limit)

    async def host_alive(self, holder: str, ttl_s: float) -> None:
        self.control.check()
        await super().host_alive(holder, ttl_s)

    async def lapsed_hosts(self) -> list[str]:
        self.control.check()
        return await super().lapsed_hosts()


class FailingQueue(MemoryOrderQueue):
    """Requests whose takes and in-flight listings can fail; ``lost_take_answers`` takes move
    their request to the in-flight list and then fail. Records what happened, in order."""

    def __init__(self, clock: FakeClock, directory: FailingDirectory, events: list[str]) -> None:
        super().__init__(clock, directory)
        self.takes = Outage()
        self.in_flights = Outage()
        self.lost_take_answers = 0
        self.completed: list[OrderResult] = []
        self.events = events

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        self.takes.check()
        request = await super().take(user_id, timeout_s)
        if request is not None and self.lost_take_answers > 0:
            self.lost_take_answers -= 1
            raise KeyValueStoreUnavailable("unavailable: connection lost after LMOVE")
        return request

    async def in_flight(self, user_id: str) -> list[OrderRequest]:
        self.in_flights.check()
        return await super().in_flight(user_id)

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        await super().complete(request, result)
        self.completed.append(result)
        self.events.append(f"complete {request.order_id}")


class OutcomeLosingOrders(MemoryOrderHistory):
    """Order history whose next ``lose_outcomes`` outcome writes (out of ``submitted``)
    commit and then raise ``outcome_error``: the answer, not the write, was lost. Records
    the statuses applied."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_outcomes = 0
        self.outcome_error: Exception = DatabaseUnavailable("unavailable: connection lost")
        self.applied: list[OrderStatus] = []

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        updated = await super().transition(order_id, change)
        if updated is not None:
            self.applied.append(updated.status)
        if OrderStatus.SUBMITTED in sources(change) and updated is not None and self.lose_outcomes:
            self.lose_outcomes -= 1
            raise self.outcome_error
        return updated


class RecordingFillTasks(MemoryFillTaskQueue):
    """Records every fill task sent; sends can fail (the key-value store)."""

    def __init__(self, clock: FakeClock, events: list[str]) -> None:
        super().__init__(clock)
        self.sends = Outage()
        self.sent: list[FillTask] = []
        self.events = events

    async def send(self, task: FillTask, delay_s: float) -> None:
        self.sends.check()
        await super().send(task, delay_s)
        self.sent.append(task)
        self.events.append(f"fill check {task.order_id}")


class World:
    """Worker hosts sharing one directory, queue, order history and exchange (no control loop
    runs unless a test starts one: the tests never sweep)."""

    def __init__(self, *, poll_s: float = 60.0, idle_timeout_s: float = 12 * 3600.0) -> None:
        self.clock = FakeClock()
        self.events: list[str] = []
        self.directory = FailingDirectory(self.clock)
        self.queue = FailingQueue(self.clock, self.directory, self.events)
        self.directory.attach_queue(self.queue)
        self.orders = OutcomeLosingOrders()
        self.exchange = PaperExchange()
        self.brokers = PaperBrokerFactory(self.exchange, PaperExchange(), self.clock)
        self.fill_tasks = RecordingFillTasks(self.clock, self.events)
        self.settings = HostSettings(poll_s=poll_s, mark_ttl_s=TTL_S, idle_timeout_s=idle_timeout_s)
        self.sleepers: dict[str, FakeSleeper] = {}
        self.hosts: dict[str, WorkerHost] = {}
        self.host = self.add_host(HOST_A)

    @property
    def sleeper(self) -> FakeSleeper:
        """Host A's sleeper: its backoffs."""
        return self.sleepers[HOST_A]

    def add_host(self, holder: str) -> WorkerHost:
        self.sleepers[holder] = FakeSleeper(self.clock)
        self.hosts[holder] = WorkerHost(
            self.directory,
            self.queue,
            self.make_worker,
            self.clock,
            self.sleepers[holder],
            self.settings,
            holder=holder,
        )
        return self.hosts[holder]

    def make_worker(self, user_id: str) -> UserWorker:
        return UserWorker(
            user_id,
            self.orders,
            self.brokers,
            self.fill_tasks,
            self.clock,
            FakeSleeper(self.clock),
            accounts=NO_ACCOUNTS,
        )

    async def serve(self, host: WorkerHost | None = None) -> None:
        """Start the user's worker on ``host`` (A) and let it reach its wait."""
        (host or self.host).activate(USER)
        assert await self.directory.wait_active(USER, 5)
        await settle()

    async def order(self, order_id: str) -> OrderRequest:
        """A queued row and the request the API pushes for it (not pushed yet)."""
        row = queued_row(order_id, user_id=USER, account_id=ACCOUNT, created_at=self.clock.now())
        await self.orders.add(row)
        return request_for(row, expires_in_s=3600)

    async def submit(self, request: OrderRequest) -> OrderResult | None:
        """Push the request and wait (briefly, in real time) for its reply."""
        assert await self.queue.push(request)
        return await self.queue.wait_result(request.request_id, 5)

    async def worker_ended(self, host: WorkerHost | None = None) -> None:
        for _ in range(500):
            if USER not in (host or self.host).active_users:
                return
            await asyncio.sleep(0.002)
        raise AssertionError("the worker did not stop")

    def broker_orders(self) -> int:
        return len(self.exchange.orders(ACCOUNT))

    async def stop(self) -> None:
        for host in self.hosts.values():
            await host.stop()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    try:
        yield w
    finally:
        await w.stop()


def host_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == HOST_LOG and r.levelno == level]


def assert_filled_once(world: World, result: OrderResult | None) -> None:
    assert result is not None and result.status is OrderStatus.FILLED
    assert world.broker_orders() == 1
    assert world.queue.completed == [result]


# --- outages in the worker's loop -------------------------------------------------------------


async def test_takes_that_fail_are_retried_and_the_next_order_is_served_once_in_place(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=HOST_LOG)
    world.queue.takes.remaining = 3  # Redis is down when the worker first looks for a request
    await world.serve()

    assert world.queue.takes.failures == 3
    assert world.sleeper.slept == [0.1, 0.2, 0.4]
    assert USER in world.host.active_users  # survived, not ended and left to a sweep

    result = await world.submit(await world.order("ord-1"))

    assert_filled_once(world, result)
    assert await world.queue.in_flight(USER) == []
    [warning] = host_records(caplog, logging.WARNING)  # one warning for the outage
    assert "taking a request" in warning and "retrying" in warning
    assert len(host_records(caplog, logging.DEBUG)) == 2  # one debug line per retry
    assert any("after 3 retries" in m for m in host_records(caplog, logging.INFO))


async def test_a_take_whose_answer_was_lost_has_its_request_executed_first_and_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await world.serve()
    first, second = await world.order("ord-1"), await world.order("ord-2")
    world.queue.lost_take_answers = 1  # the request moved to the in-flight list, unanswered

    assert await world.queue.push(first)
    assert await world.queue.push(second)
    replies = [await world.queue.wait_result(r.request_id, 5) for r in (first, second)]

    assert [r.status if r else None for r in replies] == [OrderStatus.FILLED] * 2
    assert world.events == [  # in push order, each once, each completed after its fill check
        "fill check ord-1",
        "complete ord-1",
        "fill check ord-2",
        "complete ord-2",
    ]
    assert world.broker_orders() == 2
    assert await world.queue.in_flight(USER) == []
    assert world.sleeper.slept == [0.1]
    assert any("recovering order ord-1" in m for m in host_records(caplog, logging.WARNING))


async def test_an_in_flight_listing_that_fails_at_start_is_retried_and_recovers_the_order(
    world: World,
) -> None:
    # A dead host took a request and never completed it; its lease has run out since.
    stranded = await world.order("ord-1")
    assert await world.directory.acquire(USER, DEAD_HOST, TTL_S) is not None
    assert await world.queue.push(stranded)
    assert await world.queue.take(USER, 0) == stranded
    world.clock.advance(TTL_S)
    world.queue.in_flights.remaining = 2

    world.host.activate(USER)
    result = await world.queue.wait_result(stranded.request_id, 5)

    assert_filled_once(world, result)
    assert world.queue.in_flights.failures == 2
    assert world.sleeper.slept == [0.1, 0.2]
    assert await world.queue.in_flight(USER) == []
    # The same worker goes on serving the user.
    assert (await world.submit(await world.order("ord-2"))) is not None
    assert world.broker_orders() == 2


async def test_an_acquire_that_fails_is_retried_and_its_lease_serves_the_next_order_once(
    world: World,
) -> None:
    world.directory.acquires.remaining = 3
    world.directory.acquires_commit = True  # the first one took the lease; its answer was lost

    await world.serve()

    assert world.directory.acquires.failures == 3
    assert world.sleeper.slept == [0.1, 0.2, 0.4]
    # Re-acquiring is idempotent: the retry got the lease the lost answer carried.
    assert await world.directory.acquire(USER, HOST_A, TTL_S) == 1
    result = await world.submit(await world.order("ord-1"))
    assert_filled_once(world, result)


async def test_a_renewal_that_fails_is_retried_before_the_next_request_is_taken(
    world: World,
) -> None:
    await world.serve()
    world.clock.advance(TTL_S / 3)  # no heartbeat runs: the worker's own renewal is due
    world.directory.renewals.remaining = 2

    first = await world.submit(await world.order("ord-1"))  # taken, then the renewal is due
    await settle()
    second = await world.submit(await world.order("ord-2"))

    assert first is not None and second is not None
    assert world.directory.renewals.failures == 2
    assert world.sleeper.slept == [0.1, 0.2]
    assert world.broker_orders() == 2
    assert USER in world.host.active_users


async def test_a_retirement_that_fails_is_retried_and_then_retires() -> None:
    world = World(poll_s=0.005, idle_timeout_s=5.0)
    try:
        await world.serve()
        world.directory.retires.remaining = 2
        world.clock.advance(5)  # idle that long; its lease has 25 s left

        await world.worker_ended()

        assert world.directory.retires.failures == 2
        assert world.sleeper.slept == [0.1, 0.2]
        assert not await world.directory.is_active(USER)  # retired, not merely abandoned
        assert world.directory.released == []
    finally:
        await world.stop()


async def test_an_outage_longer_than_the_lease_stops_the_worker_and_another_host_serves_the_user(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.queue.takes.remaining = 10**6  # down until the test says otherwise
    world.host.activate(USER)

    await world.worker_ended()

    # It gave up once a whole time to live passed since its lease was taken, not before.
    slept = world.sleeper.slept
    assert sum(slept) >= TTL_S > sum(slept[:-1])
    assert world.queue.takes.failures == len(slept)
    assert world.directory.released == []  # nothing touched: it may not be ours any more
    assert any("left to the next holder" in m for m in host_records(caplog, logging.WARNING))

    world.queue.takes.remaining = 0  # Redis is back; the user's next start lands elsewhere
    other = world.add_host(HOST_B)
    await world.serve(other)
    result = await world.submit(await world.order("ord-1"))

    assert_filled_once(world, result)
    assert USER in other.active_users and USER not in world.host.active_users
    assert world.sleepers[HOST_B].slept == []


async def test_the_control_loop_logs_an_outage_once_and_goes_on_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=HOST_LOG)
    world = World(poll_s=0.005)
    world.directory.control.remaining = 6  # sweep, heartbeat and start requests all fail
    try:
        await world.host.start()
        for _ in range(500):
            if world.directory.control.remaining == 0 and host_records(caplog, logging.INFO):
                break
            await asyncio.sleep(0.002)

        assert host_records(caplog, logging.WARNING) == [
            "worker-control unreachable (unavailable: ConnectionError); retrying"
        ]
        assert len([m for m in host_records(caplog, logging.DEBUG) if "worker-control" in m]) == 5
        assert host_records(caplog, logging.INFO) == [
            "worker-control reachable again after 6 retries"
        ]
        assert world.sleeper.slept == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]

        await world.directory.request_start(USER)  # the loop serves start requests again
        assert await world.directory.wait_active(USER, 5)
    finally:
        await world.stop()


# --- the fill check of a row found settled ----------------------------------------------------


async def test_an_outcome_whose_answer_was_lost_gets_one_fill_check_before_completion(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await world.serve()
    request = await world.order("ord-1")
    world.orders.lose_outcomes = 1  # filled in the database; the worker never heard

    result = await world.submit(request)

    assert_filled_once(world, result)
    assert world.sleeper.slept == [0.1]
    # sent beside the write, and again by the retry that finds the row settled: the queue
    # keeps one check for the order
    assert [t.order_id for t in world.fill_tasks.sent] == ["ord-1", "ord-1"]
    assert await world.fill_tasks.pending_count() == 1
    assert world.events == ["fill check ord-1", "fill check ord-1", "complete ord-1"]
    [warning] = host_records(caplog, logging.WARNING)
    assert "order ord-1 interrupted" in warning


async def test_a_fill_check_that_cannot_be_sent_holds_the_completion_until_it_is(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-1")
    world.fill_tasks.sends.remaining = 3  # the outcome is written; the task cannot be sent

    result = await world.submit(request)

    assert_filled_once(world, result)
    assert world.sleeper.slept == [0.1, 0.2, 0.4]
    assert world.events == ["fill check ord-1", "complete ord-1"]
    assert world.orders.applied == [OrderStatus.SUBMITTED, OrderStatus.FILLED]  # executed once


async def test_a_worker_that_died_after_the_outcome_write_leaves_one_fill_check_for_the_order(
    world: World,
) -> None:
    request = await world.order("ord-1")
    world.orders.lose_outcomes = 1
    world.orders.outcome_error = RuntimeError("the process died")
    crashed = world.make_worker(USER)
    with pytest.raises(RuntimeError):
        await crashed.execute(request)
    assert [t.order_id for t in world.fill_tasks.sent] == ["ord-1"]  # beside the write

    recovered = await world.make_worker(USER).execute(request)  # the next holder's

    assert recovered.status is OrderStatus.FILLED
    assert [t.order_id for t in world.fill_tasks.sent] == ["ord-1", "ord-1"]
    assert await world.fill_tasks.pending_count() == 1  # one check for the order
    assert world.broker_orders() == 1
