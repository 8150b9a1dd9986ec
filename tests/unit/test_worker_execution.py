"""The worker's per-order path against real-mode paper books: what it reads and writes.

A request that names its broker is claimed without reading its row; a fresh claim places
without looking for earlier placements; everything that is not a fresh claim (a recovered
order, a duplicate, a payload from before ``broker_name``) reads the row and stays
idempotent across a process restart.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import attrs
import pytest
from support import NO_ACCOUNTS, AfterPlacing, queued_row, request_for, worker_over

from tradecore.errors import BrokerDisconnected
from tradecore.order_lifecycle import OrderChange, Submitted
from tradecore.orders import (
    OrderHistoryRecord,
    OrderRequest,
    OrderStatus,
    RejectionCode,
    Side,
)
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrder
from tradecore.services.execution.worker import FRESH_CLAIM_S, UserWorker
from tradecore.testing.clock import EPOCH, FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory

USER, ACCOUNT = "user-1", "acct-1"
BOOK = f"paper:live:{ACCOUNT}"


class CountingStore(MemoryDocumentStore):
    """Records the names every ``load`` asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []

    async def load(self, name: str) -> dict[str, Any] | None:
        self.loads.append(name)
        return await super().load(name)

    def order_loads(self) -> list[str]:
        return [name for name in self.loads if ":order:" in name]


class CountingOrders(MemoryOrderHistory):
    """Counts reads of single rows."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.transitions = 0

    async def get(self, order_id: str) -> OrderHistoryRecord | None:
        self.gets += 1
        return await super().get(order_id)

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        self.transitions += 1
        return await super().transition(order_id, change)


class Crash(Exception):
    """Stands for the worker process dying."""


def crash_if(dies: bool) -> None:
    if dies:
        raise Crash


@attrs.frozen
class Process:
    """One worker host process: its own paper exchange in memory; the store is shared."""

    exchange: PaperExchange
    worker: UserWorker


def process(store: CountingStore, orders: CountingOrders, clock: FakeClock) -> Process:
    exchange = PaperExchange()
    brokers = PersistentPaperBrokerFactory(exchange, PaperExchange(), store, clock)
    worker = worker_over(USER, orders, brokers, clock)
    return Process(exchange, worker)


async def queued(
    orders: CountingOrders,
    order_id: str,
    *,
    broker_name: str | None = "paper",
) -> OrderRequest:
    """A queued row and the request the API pushes for it."""
    row = queued_row(order_id, user_id=USER, account_id=ACCOUNT, created_at=EPOCH)
    await orders.add(row)
    orders.gets = orders.transitions = 0
    return request_for(row, broker_name=broker_name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_a_fresh_order_is_claimed_without_a_read_and_placed_without_a_recall(
    clock: FakeClock,
) -> None:
    store, orders = CountingStore(), CountingOrders()
    host = process(store, orders, clock)
    request = await queued(orders, "ord-1")

    result = await host.worker.execute(request)

    assert result.status is OrderStatus.FILLED
    assert orders.gets == 0 and orders.transitions == 2  # the claim and the outcome
    assert store.order_loads() == []  # no look-up of earlier placements
    assert store.loads == [BOOK]  # the book, once, when the connection opened
    assert await store.load(f"{BOOK}:order:ord-1-entry") is not None  # still persisted


@pytest.mark.parametrize("crash_on", ["ord-2-close", "ord-2-entry"])
async def test_an_order_recovered_on_another_host_is_recalled_and_not_placed_twice(
    clock: FakeClock, crash_on: str
) -> None:
    store, orders = CountingStore(), CountingOrders()
    exchange = PaperExchange()
    exchange.set_position(ACCOUNT, "BTCUSDT", Decimal(-2))  # a close, then the entry
    await store.save(BOOK, exchange.export_book(ACCOUNT))
    factory = PersistentPaperBrokerFactory(exchange, PaperExchange(), store, clock)
    dying = UserWorker(
        USER,
        orders,
        AfterPlacing(factory, lambda placed: crash_if(placed == crash_on)),
        MemoryFillTaskQueue(clock),
        clock,
        FakeSleeper(clock),
        accounts=NO_ACCOUNTS,
    )
    request = await queued(orders, "ord-2")
    with pytest.raises(Crash):
        await dying.execute(request)
    assert store.order_loads() == []  # the claim was its own: placed without recalls
    row = await orders.get(request.order_id)
    assert row is not None and row.status is OrderStatus.SUBMITTED

    second = process(store, orders, clock)  # the order is recovered on another host
    store.loads.clear()
    result = await second.worker.execute(request)

    assert result.status is OrderStatus.FILLED
    assert result.auto_exit and result.position_before == Decimal(-2)
    assert sorted(store.order_loads()) == [f"{BOOK}:order:ord-2-close", f"{BOOK}:order:ord-2-entry"]
    assert second.exchange.positions(ACCOUNT) == {"BTCUSDT": Decimal(1)}  # nothing doubled
    assert len(second.exchange.orders(ACCOUNT)) == 2
    book = await store.load(BOOK)
    assert book is not None and book["holdings"]["BTCUSDT"]["quantity"] == "1"


async def test_a_duplicate_delivery_returns_the_settled_result_and_places_nothing(
    clock: FakeClock,
) -> None:
    store, orders = CountingStore(), CountingOrders()
    host = process(store, orders, clock)
    request = await queued(orders, "ord-3")
    first = await host.worker.execute(request)

    again = await host.worker.execute(request)

    assert again == first
    assert len(host.exchange.orders(ACCOUNT)) == 1


async def test_a_request_without_its_broker_reads_the_row_first(clock: FakeClock) -> None:
    store, orders = CountingStore(), CountingOrders()
    host = process(store, orders, clock)
    request = await queued(orders, "ord-4", broker_name=None)  # queued before the field

    result = await host.worker.execute(request)

    assert result.status is OrderStatus.FILLED
    assert orders.gets == 1 and orders.transitions == 2
    assert store.order_loads() == []  # it won the claim: still fresh


async def test_a_request_without_a_row_is_an_orphan_and_places_nothing(clock: FakeClock) -> None:
    store, orders = CountingStore(), CountingOrders()
    host = process(store, orders, clock)
    request = attrs.evolve(await queued(orders, "ord-5"), order_id="never-written")

    result = await host.worker.execute(request)

    assert result.status is OrderStatus.FAILED
    assert result.error is not None and result.error.code is RejectionCode.BROKER_UNAVAILABLE
    assert host.exchange.orders(ACCOUNT) == []


async def test_an_expired_request_is_expired_before_anything_reaches_the_broker(
    clock: FakeClock,
) -> None:
    store, orders = CountingStore(), CountingOrders()
    host = process(store, orders, clock)
    request = await queued(orders, "ord-6")
    clock.advance(61)

    result = await host.worker.execute(request)

    assert result.status is OrderStatus.EXPIRED
    assert orders.gets == 0 and orders.transitions == 1
    assert store.loads == []  # no broker connection was even opened
    assert host.exchange.orders(ACCOUNT) == []


class FlakyBroker:
    """A broker whose first placement reaches the book but whose answer is lost."""

    def __init__(self, inner: Broker) -> None:
        self.inner = inner
        self.fresh_flags: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def place_order(
        self, client_order_id: str, symbol: str, side: Side, quantity: Decimal, **kwargs: Any
    ) -> BrokerOrder:
        self.fresh_flags.append(kwargs.get("fresh", False))
        placed = await self.inner.place_order(client_order_id, symbol, side, quantity, **kwargs)
        if len(self.fresh_flags) == 1:
            raise BrokerDisconnected("line dropped after the order went out")
        return placed


async def test_a_retry_after_a_disconnect_is_not_sent_as_fresh(clock: FakeClock) -> None:
    store, orders = CountingStore(), CountingOrders()
    exchange = PaperExchange()
    inner = PersistentPaperBrokerFactory(exchange, PaperExchange(), store, clock)
    flaky: list[FlakyBroker] = []

    class Factory:
        def open(self, account: BrokerAccount, *, simulation: bool) -> Any:
            flaky.append(FlakyBroker(inner.open(account, simulation=simulation)))
            return flaky[-1]

    worker = worker_over(USER, orders, Factory(), clock)
    request = await queued(orders, "ord-7")

    result = await worker.execute(request)

    assert result.status is OrderStatus.FILLED
    assert flaky[0].fresh_flags == [True, False]
    assert len(exchange.orders(ACCOUNT)) == 1


class SlowOrders(CountingOrders):
    """Its claims come back late (a stall, a partition): time passes while they travel."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self._clock = clock
        self._seconds = seconds

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        updated = await super().transition(order_id, change)
        if isinstance(change, Submitted):
            self._clock.advance(self._seconds)
        return updated


async def test_a_claim_that_came_back_late_still_looks_for_earlier_placements(
    clock: FakeClock,
) -> None:
    """A successor may have recovered the row while the claim's answer was on its way."""
    store, orders = CountingStore(), SlowOrders(clock, FRESH_CLAIM_S)
    host = process(store, orders, clock)
    request = await queued(orders, "ord-8")

    result = await host.worker.execute(request)

    assert result.status is OrderStatus.FILLED
    assert store.order_loads() == [f"{BOOK}:order:ord-8-entry"]
