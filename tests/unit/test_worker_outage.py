"""A store outage while a worker executes an order: survived in place.

The request stays in flight and is never completed with a wrong result; the worker backs off
(0.1 s doubling to 2 s, on the injected sleeper) and executes the same request again, which
places nothing twice and sends a broker order as fresh only when the retry itself won the
claim. Its lease lives as long as the host's heartbeat keeps it: once the lease is lost or has
lapsed, the worker stops and the next holder recovers the request. One warning per outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any

import pytest
from support import NO_ACCOUNTS, queued_row, request_for

from tradecore.errors import DatabaseUnavailable, KeyValueStoreUnavailable, StoreUnavailable
from tradecore.order_lifecycle import OrderChange, sources
from tradecore.orders import (
    OrderHistoryRecord,
    OrderRequest,
    OrderResult,
    OrderStatus,
    Side,
)
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrder
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

USER, ACCOUNT, HOLDER = "user-1", "acct-1", "host-a"
FOREIGN = "host-elsewhere:1:x"
TTL_S = 30.0
HOST_LOG = "tradecore.services.execution.worker_host"
BACKOFFS = [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]


class Outage:
    """Makes the calls it guards fail while ``remaining`` > 0, one failure per call."""

    def __init__(self, error: type[StoreUnavailable] = DatabaseUnavailable) -> None:
        self.error = error
        self.remaining = 0
        self.failures = 0
        self.on_failure: Callable[[int], Awaitable[None]] | None = None

    @property
    def on(self) -> bool:
        return self.remaining > 0

    async def fail(self) -> None:
        self.remaining -= 1
        self.failures += 1
        if self.on_failure is not None:
            await self.on_failure(self.failures)
        raise self.error("unavailable: OperationalError")


class OutageOrders(MemoryOrderHistory):
    """Order history whose transitions out of ``queued`` (claims, expiries) and out of
    ``submitted`` (outcomes) can fail. With ``claims_commit`` a failing claim is applied
    before it raises: the answer, not the write, was lost."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = Outage()
        self.outcomes = Outage()
        self.claims_commit = False
        self.crash_next_claim = False
        self.applied: list[OrderStatus] = []

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        if OrderStatus.QUEUED in sources(change):
            if self.crash_next_claim:
                self.crash_next_claim = False
                raise RuntimeError("a bug, not an outage")
            if self.claims.on:
                if self.claims_commit:
                    await self._apply(order_id, change)
                await self.claims.fail()
        elif self.outcomes.on:
            await self.outcomes.fail()
        return await self._apply(order_id, change)

    async def _apply(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        updated = await super().transition(order_id, change)
        if updated is not None:
            self.applied.append(updated.status)
        return updated


class OutageDocuments(MemoryDocumentStore):
    """The paper broker's books, whose saves can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = Outage()

    async def save_many(self, documents: Mapping[str, dict[str, Any]]) -> None:
        if self.saves.on:
            await self.saves.fail()
        await super().save_many(documents)


class CountingQueue(MemoryOrderQueue):
    """Counts completions; they can fail (the key-value store)."""

    def __init__(self, clock: FakeClock, directory: MemoryWorkerDirectory) -> None:
        super().__init__(clock, directory)
        self.completions = Outage(KeyValueStoreUnavailable)
        self.completed: list[OrderResult] = []

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        if self.completions.on:
            await self.completions.fail()
        await super().complete(request, result)
        self.completed.append(result)


class RecordingBrokers:
    """Paper brokers that record every placement: (client order id, fresh)."""

    def __init__(self, inner: PersistentPaperBrokerFactory) -> None:
        self._inner = inner
        self.placements: list[tuple[str, bool]] = []

    def open(self, account: BrokerAccount, *, simulation: bool) -> Broker:
        broker = self._inner.open(account, simulation=simulation)
        original = broker.place_order

        async def place(
            client_order_id: str,
            symbol: str,
            side: Side,
            quantity: Decimal,
            *,
            reduce_only: bool = False,
            fresh: bool = False,
        ) -> BrokerOrder:
            self.placements.append((client_order_id, fresh))
            return await original(
                client_order_id, symbol, side, quantity, reduce_only=reduce_only, fresh=fresh
            )

        broker.place_order = place  # type: ignore[method-assign]
        return broker


class World:
    """One worker host (no control loop: the tests run its heartbeat and sweep) over memory
    fakes that can fail."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.sleeper = FakeSleeper(self.clock)  # the host's: the outage backoffs
        self.directory = MemoryWorkerDirectory(self.clock)
        self.queue = CountingQueue(self.clock, self.directory)
        self.directory.attach_queue(self.queue)
        self.orders = OutageOrders()
        self.documents = OutageDocuments()
        self.exchange = PaperExchange()
        self.brokers = RecordingBrokers(
            PersistentPaperBrokerFactory(self.exchange, PaperExchange(), self.documents, self.clock)
        )
        self.fill_tasks = fill_tasks = MemoryFillTaskQueue(self.clock)
        worker_sleeper = FakeSleeper(self.clock)

        def make_worker(user_id: str) -> UserWorker:
            return UserWorker(
                user_id,
                self.orders,
                self.brokers,
                fill_tasks,
                self.clock,
                worker_sleeper,
                accounts=NO_ACCOUNTS,
            )

        self.host = WorkerHost(
            self.directory,
            self.queue,
            make_worker,
            self.clock,
            self.sleeper,
            HostSettings(poll_s=60.0, mark_ttl_s=TTL_S),
            holder=HOLDER,
        )

    async def serve(self) -> int:
        """Start the user's worker; its lease token."""
        self.host.activate(USER)
        assert await self.directory.wait_active(USER, 5)
        for _ in range(5):
            await asyncio.sleep(0)  # let the worker reach its wait
        token = await self.directory.acquire(USER, HOLDER, TTL_S)  # same lease, same token
        assert token is not None
        return token

    async def order(self, order_id: str, *, expires_in_s: float = 60.0) -> OrderRequest:
        """A queued row and the request the API pushes for it (not pushed yet)."""
        row = queued_row(order_id, user_id=USER, account_id=ACCOUNT, created_at=self.clock.now())
        await self.orders.add(row)
        return request_for(row, expires_in_s=expires_in_s)

    async def submit(self, request: OrderRequest) -> OrderResult | None:
        """Push the request and wait (briefly, in real time) for its reply."""
        assert await self.queue.push(request)
        return await self.queue.wait_result(request.request_id, 5)

    async def worker_ended(self) -> None:
        for _ in range(500):
            if USER not in self.host.active_users:
                return
            await asyncio.sleep(0.002)
        raise AssertionError("the worker did not stop")

    def broker_orders(self) -> int:
        return len(self.exchange.orders(ACCOUNT))


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    try:
        yield w
    finally:
        await w.host.stop()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == HOST_LOG and r.levelno >= logging.WARNING
    ]


async def test_an_outage_after_the_placement_is_waited_out_and_the_order_completes_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=HOST_LOG)
    await world.serve()
    request = await world.order("ord-1")
    world.orders.outcomes.remaining = len(BACKOFFS)  # the outcome cannot be written

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.sleeper.slept == BACKOFFS  # bounded exponential backoff, no busy loop
    assert world.orders.applied == [OrderStatus.SUBMITTED, OrderStatus.FILLED]
    # Placed once, fresh after the won claim; every retry looked for it (not fresh).
    assert world.brokers.placements == [("ord-1-entry", True)] + [("ord-1-entry", False)] * 8
    assert world.broker_orders() == 1
    assert world.queue.completed == [result]
    assert await world.queue.in_flight(USER) == []
    assert USER in world.host.active_users  # served in place, not restarted
    [warning] = warnings_of(caplog)
    assert "ord-1" in warning and "retrying" in warning
    assert any("after 8 retries" in r.getMessage() for r in caplog.records)


async def test_the_fill_check_sent_beside_a_result_that_could_not_be_written_is_the_only_one(
    world: World,
) -> None:
    """The first fill check goes out while the result commits; the retries of a result the
    store refused send it again, and the queue keeps one check for the order."""
    await world.serve()
    request = await world.order("ord-1")
    world.orders.outcomes.remaining = 3
    checks_while_refused: list[int] = []

    async def count_checks(_: int) -> None:
        await asyncio.sleep(0)  # the send runs beside the refused write
        checks_while_refused.append(await world.fill_tasks.pending_count())

    world.orders.outcomes.on_failure = count_checks

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert checks_while_refused == [1, 1, 1]
    assert await world.fill_tasks.pending_count() == 1
    world.clock.advance(3)
    delivery = await world.fill_tasks.receive(0)
    assert delivery is not None and delivery.task.order_id == "ord-1"
    assert delivery.receive_count == 1


async def test_the_request_stays_in_flight_and_unanswered_while_the_store_is_down(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-2")
    seen: list[tuple[list[OrderRequest], int]] = []

    async def look(failures: int) -> None:
        seen.append((await world.queue.in_flight(USER), len(world.queue.completed)))

    world.orders.outcomes.remaining = 3
    world.orders.outcomes.on_failure = look

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert seen == [([request], 0)] * 3


async def test_a_claim_that_never_landed_is_claimed_by_the_retry_which_is_then_fresh(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-3")
    world.orders.claims.remaining = 2

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.sleeper.slept == [0.1, 0.2]
    assert world.brokers.placements == [("ord-3-entry", True)]  # nothing was placed before
    assert world.broker_orders() == 1


async def test_a_claim_whose_answer_was_lost_is_reconciled_not_sent_fresh(world: World) -> None:
    await world.serve()
    request = await world.order("ord-4")
    world.orders.claims.remaining = 1
    world.orders.claims_commit = True  # the claim landed; its answer did not

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.orders.applied == [OrderStatus.SUBMITTED, OrderStatus.FILLED]
    assert world.brokers.placements == [("ord-4-entry", False)]
    assert world.broker_orders() == 1


async def test_a_placement_the_broker_could_not_save_is_retried_without_placing_twice(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-5")
    world.documents.saves.remaining = 2  # the paper broker's books are in the database too

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.brokers.placements == [
        ("ord-5-entry", True),
        ("ord-5-entry", False),
        ("ord-5-entry", False),
    ]
    assert world.broker_orders() == 1
    assert await world.documents.load(f"paper:live:{ACCOUNT}:order:ord-5-entry") is not None


async def test_a_result_that_could_not_be_published_is_published_without_executing_again(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await world.serve()
    request = await world.order("ord-6")
    world.queue.completions.remaining = 2  # the key-value store

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.sleeper.slept == [0.1, 0.2]
    assert world.orders.applied == [OrderStatus.SUBMITTED, OrderStatus.FILLED]  # executed once
    assert world.brokers.placements == [("ord-6-entry", True)]
    assert world.queue.completed == [result]
    assert len(warnings_of(caplog)) == 1


async def test_an_order_that_expired_during_the_outage_is_expired_not_placed(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-7", expires_in_s=1.0)
    world.orders.claims.remaining = 4  # 0.1 + 0.2 + 0.4 + 0.8 s: past its expiry

    result = await world.submit(request)

    assert result is not None and result.status is OrderStatus.EXPIRED
    assert world.orders.applied == [OrderStatus.EXPIRED]
    assert world.brokers.placements == []
    assert world.broker_orders() == 0


async def test_an_order_claimed_before_the_outage_is_reconciled_even_past_its_expiry(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-8", expires_in_s=1.0)
    world.orders.outcomes.remaining = 5  # 3.1 s of outage after the claim

    result = await world.submit(request)

    assert world.clock.now() > request.expires_at
    assert result is not None and result.status is OrderStatus.FILLED
    assert world.brokers.placements[0] == ("ord-8-entry", True)
    assert {fresh for _, fresh in world.brokers.placements[1:]} == {False}
    assert world.broker_orders() == 1


async def test_the_heartbeat_keeps_the_lease_through_an_outage_longer_than_its_ttl(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-9")

    async def heartbeat(failures: int) -> None:
        assert await world.host.heartbeat() == set()

    world.orders.outcomes.remaining = 23  # 3.1 s + 18 x 2 s = 39.1 s
    world.orders.outcomes.on_failure = heartbeat

    result = await world.submit(request)

    assert sum(world.sleeper.slept) > TTL_S
    assert result is not None and result.status is OrderStatus.FILLED
    assert world.broker_orders() == 1
    assert USER in world.host.active_users


async def test_a_lease_lost_during_the_outage_stops_the_worker_and_leaves_the_request(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    token = await world.serve()
    request = await world.order("ord-10")
    intruder: list[int] = []

    async def lease_taken(failures: int) -> None:
        if failures == 2:  # the lease vanished and another host took the user
            await world.directory.release(USER, token)
            taken = await world.directory.acquire(USER, FOREIGN, 3600)
            assert taken is not None
            intruder.append(taken)
            world.clock.advance(6)  # its renewal is due
            assert await world.host.heartbeat() == {USER}

    world.orders.claims.remaining = 10**6  # down until the end of the test
    world.orders.claims.on_failure = lease_taken

    assert await world.queue.push(request)
    await world.worker_ended()

    assert world.orders.claims.failures == 2  # no attempt after the lease was lost
    assert await world.queue.in_flight(USER) == [request]  # left to the new holder
    assert world.queue.completed == []
    assert await world.queue.wait_result(request.request_id, 0.01) is None
    assert await world.directory.renew(USER, intruder[0], 3600)  # the intruder's lease stands
    assert world.brokers.placements == []
    assert any("left to the next holder" in m for m in warnings_of(caplog))


async def test_a_lease_the_heartbeat_stopped_renewing_lapses_and_the_next_holder_recovers(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-11", expires_in_s=120.0)
    world.orders.claims.remaining = 10**6  # no heartbeat runs: the lease lapses meanwhile

    assert await world.queue.push(request)
    await world.worker_ended()

    # It gave up once a whole time to live passed since the last renewal, not before.
    assert sum(world.sleeper.slept) >= TTL_S > sum(world.sleeper.slept[:-1])
    assert world.orders.claims.failures == len(world.sleeper.slept)
    assert await world.queue.in_flight(USER) == [request]
    assert not await world.directory.is_active(USER)

    world.orders.claims.remaining = 0  # the store is back
    assert await world.host.sweep() == [USER]  # an orphan now: a new worker recovers it
    result = await world.queue.wait_result(request.request_id, 5)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.brokers.placements == [("ord-11-entry", True)]
    assert world.queue.completed == [result]


async def test_a_worker_that_dies_on_a_bug_releases_its_lease_and_the_sweep_recovers_once(
    world: World,
) -> None:
    await world.serve()
    request = await world.order("ord-12")
    world.orders.crash_next_claim = True

    assert await world.queue.push(request)
    await world.worker_ended()

    assert world.sleeper.slept == []  # not an outage: no retry in place
    assert not await world.directory.is_active(USER)  # released: it serves nothing
    assert await world.queue.in_flight(USER) == [request]  # not lost
    assert await world.host.sweep() == [USER]
    result = await world.queue.wait_result(request.request_id, 5)

    assert result is not None and result.status is OrderStatus.FILLED
    assert world.broker_orders() == 1
    assert world.queue.completed == [result]
