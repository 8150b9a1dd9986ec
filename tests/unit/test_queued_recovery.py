"""Recovery of order intents never handed to a worker (``QueuedRecovery`` in a worker host).

An API that died between writing an intent and pushing it leaves a ``queued`` row nothing
pushes. The host's scan finds rows ``queued`` for longer than the grace period whose user has
nothing waiting or in flight, rebuilds their requests, and hands them over as the API would:
the order executes once, or expires when it waited past its queue age. A second delivery of a
recovered order (another host's scan, a slow API's own push) changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import attrs
import pytest
from support import NO_ACCOUNTS, queued_row, request_for

from tradecore.accounts import TradingAccount
from tradecore.errors import StoreUnavailable
from tradecore.orders import OrderHistoryRecord, OrderStatus, RejectionCode
from tradecore.services.execution.queued_recovery import QueuedRecovery
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.repositories import (
    MemoryAllowedIpRepository,
    MemoryOrderHistory,
    MemoryTradingAccountRepository,
    MemoryUserRepository,
)
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

GRACE_S = 30.0
MAX_QUEUE_AGE_S = 60.0
USER, ACCOUNT = "user-1", "acct-1"


class World:
    """A worker host with the recovery, on memory stores and the paper broker."""

    def __init__(self, orders: MemoryOrderHistory | None = None) -> None:
        self.clock = FakeClock()
        self.directory = MemoryWorkerDirectory(self.clock)
        self.queue = MemoryOrderQueue(self.clock, self.directory)
        self.directory.attach_queue(self.queue)
        self.orders = orders or MemoryOrderHistory()
        self.accounts = MemoryTradingAccountRepository(
            MemoryUserRepository(), MemoryAllowedIpRepository(), self.orders
        )
        self.exchange = PaperExchange()
        brokers = PaperBrokerFactory(self.exchange, PaperExchange(), self.clock)
        tasks = MemoryFillTaskQueue(self.clock)
        sleeper = FakeSleeper(self.clock)
        self.started: list[str] = []
        self.recovery = QueuedRecovery(
            self.orders,
            self.accounts,
            self.queue,
            self.clock,
            grace_s=GRACE_S,
            max_queue_age_s=MAX_QUEUE_AGE_S,
        )

        def make_worker(user_id: str) -> UserWorker:
            return UserWorker(
                user_id, self.orders, brokers, tasks, self.clock, sleeper, accounts=NO_ACCOUNTS
            )

        self.host = WorkerHost(
            self.directory,
            self.queue,
            make_worker,
            self.clock,
            sleeper,
            HostSettings(poll_s=60.0, recovery_grace_s=GRACE_S),
            holder="host-a",
            recovery=self.recovery,
        )

    async def lost_intent(
        self, order_id: str, *, age_s: float, **changes: object
    ) -> OrderHistoryRecord:
        """A row its API wrote ``age_s`` ago and never pushed."""
        row = queued_row(
            order_id,
            user_id=USER,
            account_id=ACCOUNT,
            created_at=self.clock.now() - timedelta(seconds=age_s),
        )
        row = attrs.evolve(row, **changes)
        await self.orders.add(row)
        return row

    async def scan(self) -> list[str]:
        """One scan that records the users it would start, starting none."""
        return await self.recovery.scan(self.started.append)

    async def waiting(self) -> dict[str, tuple[int, int]]:
        return {d.user_id: (d.waiting, d.in_flight) for d in await self.queue.depths()}


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    try:
        yield w
    finally:
        await w.host.stop()


async def test_a_lost_intent_past_the_grace_is_parked_and_its_worker_started(
    world: World,
) -> None:
    row = await world.lost_intent("o-1", age_s=GRACE_S + 1)

    assert await world.scan() == ["o-1"]

    assert world.started == [USER]  # no lease: parked, and a worker started here
    assert await world.waiting() == {USER: (1, 0)}
    [request] = [await world.queue.take(USER, 0)]
    assert request == attrs.evolve(
        request_for(row, expires_in_s=MAX_QUEUE_AGE_S), credentials_ref=None
    )


async def test_an_intent_younger_than_the_grace_is_left_to_its_api(world: World) -> None:
    await world.lost_intent("o-1", age_s=GRACE_S - 1)
    assert await world.scan() == []
    assert await world.waiting() == {}


async def test_a_user_with_requests_waiting_or_in_flight_is_left_for_a_later_scan(
    world: World,
) -> None:
    row = await world.lost_intent("o-1", age_s=GRACE_S + 1)
    await world.queue.park(request_for(row))  # pushed after all: it waits in the list

    assert await world.scan() == []
    taken = await world.queue.take(USER, 0)
    assert taken is not None
    assert await world.scan() == []  # in flight: a worker is on it

    await world.queue.complete(taken, row.to_result())  # a worker that died before the claim
    assert await world.scan() == ["o-1"]


async def test_with_a_live_worker_the_request_is_pushed_to_it(world: World) -> None:
    assert await world.directory.acquire(USER, "host-b", 30.0) is not None
    await world.lost_intent("o-1", age_s=GRACE_S + 1)

    assert await world.scan() == ["o-1"]
    assert world.started == []  # the lease holder takes it
    assert await world.waiting() == {USER: (1, 0)}


async def test_the_request_names_the_accounts_current_credentials(world: World) -> None:
    account = TradingAccount(
        id=ACCOUNT,
        user_id=USER,
        name="Main",
        broker_name="paper",
        webhook_token_hash="h" * 64,
        webhook_secret_hash="s" * 64,
        created_at=world.clock.now(),
        encrypted_credentials=b"sealed credentials, version 2",
    )
    await world.accounts.add(account)
    await world.lost_intent("o-real", age_s=GRACE_S + 1)
    await world.lost_intent("o-sim", age_s=GRACE_S + 2, simulation=True)

    assert await world.scan() == ["o-sim", "o-real"]

    sim, real = await world.queue.take(USER, 0), await world.queue.take(USER, 0)
    assert sim is not None and real is not None
    assert sim.credentials_ref is None
    assert real.credentials_ref == account.credentials_ref != ""


async def test_the_host_executes_a_recovered_order_once_even_when_delivered_twice(
    world: World,
) -> None:
    row = await world.lost_intent("o-1", age_s=GRACE_S + 1)

    assert await world.host.recover_lost() == ["o-1"]  # starts the user's worker itself
    result = await world.queue.wait_result(row.request_id, 5)
    assert result is not None and result.status is OrderStatus.FILLED

    # another host's scan, or the API's own late push: a second delivery of the same request
    again = request_for(row, expires_in_s=MAX_QUEUE_AGE_S)
    assert await world.queue.push(again)
    second = await world.queue.wait_result(row.request_id, 5)
    assert second is not None and second.status is OrderStatus.FILLED
    assert len(world.exchange.orders(ACCOUNT)) == 1
    stored = await world.orders.get("o-1")
    assert stored is not None and stored.status is OrderStatus.FILLED
    assert await world.host.recover_lost() == []  # nothing queued is left


async def test_a_lost_intent_past_its_queue_age_is_expired_by_the_worker(world: World) -> None:
    row = await world.lost_intent("o-old", age_s=MAX_QUEUE_AGE_S + 1)

    assert await world.host.recover_lost() == ["o-old"]
    result = await world.queue.wait_result(row.request_id, 5)

    assert result is not None and result.status is OrderStatus.EXPIRED
    stored = await world.orders.get("o-old")
    assert stored is not None and stored.status is OrderStatus.EXPIRED
    assert stored.error is not None and stored.error.code is RejectionCode.ORDER_EXPIRED
    assert world.exchange.orders(ACCOUNT) == []


class DownOrders(MemoryOrderHistory):
    async def stale_queued(self, before: object, limit: int) -> list[OrderHistoryRecord]:
        raise StoreUnavailable("order history down")


async def test_a_failed_scan_leaves_the_control_loop_running() -> None:
    world = World(DownOrders())
    try:
        with pytest.raises(StoreUnavailable):
            await world.host.recover_lost()
        await world.host.start()  # its first sweep begins a scan, which fails
        await world.directory.request_start(USER)

        assert await world.directory.wait_active(USER, 5)  # start requests are still served
    finally:
        await world.host.stop()


def test_the_grace_must_be_positive(world: World) -> None:
    with pytest.raises(ValueError, match="grace"):
        QueuedRecovery(
            world.orders, world.accounts, world.queue, world.clock, grace_s=0, max_queue_age_s=60
        )
