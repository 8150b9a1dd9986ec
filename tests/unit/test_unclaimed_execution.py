"""The worker with a broker whose placements wait for the order's outcome (the paper broker
in real mode): a one-step order is placed unclaimed and settled in one write; a placement
whose write does not take is dropped, never stored; a two-step plan is claimed first.

The order history here is the memory one, also the ``SavesWithOrder`` of the paper books,
keeping that port's rules (the Postgres adapter's are checked in the contract suite).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import attrs
import pytest
from support import AfterPlacing, WaitingSave, queued_row, request_for, worker_over

from tradecore.errors import BrokerDisconnected
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    OrderChange,
    PlacementKept,
    Withdrawn,
    placement_kept,
)
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderRequest,
    OrderStatus,
    OrderType,
    RejectionCode,
)
from tradecore.ports.broker import BrokerFactory
from tradecore.services.execution.worker import UserWorker
from tradecore.testing.clock import EPOCH, FakeClock
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_adapters.memory.repositories import MemoryOrderHistory

USER, ACCOUNT = "user-1", "acct-1"
BOOK = f"paper:live:{ACCOUNT}"


class SavingOrders(MemoryOrderHistory):
    """Order history and ``SavesWithOrder`` over ``store``: a waiting save is written with the
    order's next transition; after a placement made unclaimed (a transition that leaves
    ``queued``) only if that transition is its execution and takes, else discarded: the
    rule of ``placement_kept``, as in the Postgres adapter. ``before_outcome`` runs just
    before an unclaimed outcome is written (a racing writer)."""

    def __init__(self, store: MemoryDocumentStore) -> None:
        super().__init__()
        self.store = store
        self.waiting: dict[str, WaitingSave] = {}
        self.changes: list[OrderChange] = []
        self.before_outcome: Callable[[str], Any] | None = None

    def save_with_order(
        self,
        order_id: str,
        documents: Callable[[], Mapping[str, dict[str, Any]]],
        saved: Callable[[], None],
        discarded: Callable[[], None],
    ) -> None:
        self.waiting[order_id] = WaitingSave(documents, saved, discarded)

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        self.changes.append(change)
        if isinstance(change, ClaimedAndExecuted) and self.before_outcome is not None:
            await self.before_outcome(order_id)
        waiting = self.waiting.pop(order_id, None)
        kept = placement_kept(change)
        if waiting is not None and kept is PlacementKept.NEVER:
            waiting.discarded()
            waiting = None
        row = await super().transition(order_id, change)
        if waiting is not None:
            if row is not None or kept is PlacementKept.ALWAYS:
                await self.store.save_many(waiting.documents())
                waiting.saved()
            else:
                waiting.discarded()
        return row


@attrs.frozen
class Host:
    """One worker host process: its own exchange in memory; store and history shared."""

    exchange: PaperExchange
    worker: UserWorker


def host(
    store: MemoryDocumentStore,
    orders: SavingOrders,
    clock: FakeClock,
    wrap: Callable[[PersistentPaperBrokerFactory, PaperExchange], BrokerFactory] | None = None,
) -> Host:
    """A worker host whose paper books save with their orders' outcomes; ``wrap`` puts the
    test's brokers around them."""
    exchange = PaperExchange()
    brokers = PersistentPaperBrokerFactory(
        exchange, PaperExchange(), store, clock, with_order=orders
    )
    opened = brokers if wrap is None else wrap(brokers, exchange)
    return Host(exchange, worker_over(USER, orders, opened, clock))


async def queued(orders: SavingOrders, order_id: str) -> OrderRequest:
    row = queued_row(order_id, user_id=USER, account_id=ACCOUNT, created_at=EPOCH)
    await orders.add(row)
    return request_for(row)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_a_one_step_order_is_settled_in_one_write_with_its_book(clock: FakeClock) -> None:
    store = MemoryDocumentStore()
    orders = SavingOrders(store)
    request = await queued(orders, "ord-1")

    result = await host(store, orders, clock).worker.execute(request)

    assert result.status is OrderStatus.FILLED
    assert [type(c) for c in orders.changes] == [ClaimedAndExecuted]  # no claim of its own
    row = await orders.get("ord-1")
    assert row is not None and row.submitted_at == EPOCH and row.position_before == 0
    assert row.client_order_id == "ord-1-entry" and row.fill_quantity == 1
    book = await store.load(BOOK)
    assert book is not None and book["holdings"]["BTCUSDT"]["quantity"] == "1"
    assert await store.load(f"{BOOK}:order:ord-1-entry") is not None


async def test_a_placement_whose_order_was_withdrawn_meanwhile_is_dropped(
    clock: FakeClock,
) -> None:
    """The API withdrew the intent while the worker placed it (its push answer was lost):
    the outcome does not take, and the book keeps nothing of the placement."""
    store = MemoryDocumentStore()
    orders = SavingOrders(store)
    request = await queued(orders, "ord-2")
    worker_host = host(store, orders, clock)

    async def withdraw(order_id: str) -> None:
        await MemoryOrderHistory.transition(orders, order_id, Withdrawn())

    orders.before_outcome = withdraw

    result = await worker_host.worker.execute(request)

    assert result.status is OrderStatus.CANCELLED
    assert await store.load(BOOK) is None and await store.load(f"{BOOK}:order:ord-2-entry") is None
    assert worker_host.exchange.positions(ACCOUNT) == {}  # the placement was dropped in memory


async def test_a_second_host_executing_a_settled_order_places_nothing_that_lasts(
    clock: FakeClock,
) -> None:
    """A duplicate delivery to another host, whose book knows nothing of the order in memory:
    it places it there unclaimed, its write does not take, and it drops that placement."""
    store = MemoryDocumentStore()
    orders = SavingOrders(store)
    request = await queued(orders, "ord-3")
    first = await host(store, orders, clock).worker.execute(request)
    second = host(store, orders, clock)

    again = await second.worker.execute(request)

    assert again == first
    assert second.exchange.positions(ACCOUNT) == {}  # dropped, to be loaded when next used
    stored = await store.load(BOOK)
    assert stored is not None and stored["holdings"]["BTCUSDT"]["quantity"] == "1"
    follow_up = await queued(orders, "ord-4")
    assert (await second.worker.execute(follow_up)).status is OrderStatus.FILLED
    assert second.exchange.positions(ACCOUNT) == {"BTCUSDT": Decimal(2)}  # one each, no more


async def test_an_exit_with_nothing_to_close_is_settled_in_one_write(clock: FakeClock) -> None:
    store = MemoryDocumentStore()
    orders = SavingOrders(store)
    row = queued_row("ord-7", user_id=USER, account_id=ACCOUNT, created_at=EPOCH)
    row = attrs.evolve(row, action=AlertAction.SELL, order_type=OrderType.EXIT)
    await orders.add(row)

    result = await host(store, orders, clock).worker.execute(request_for(row))

    assert result.status is OrderStatus.NO_POSITION
    assert [c.step for c in orders.changes] == ["claim_and_execute"]
    assert await store.load(BOOK) is None  # nothing placed, nothing saved


async def test_a_reversal_is_claimed_before_its_close_is_placed(clock: FakeClock) -> None:
    store = MemoryDocumentStore()
    exchange = PaperExchange()
    exchange.set_position(ACCOUNT, "BTCUSDT", Decimal(-2))
    await store.save(BOOK, exchange.export_book(ACCOUNT))
    orders = SavingOrders(store)
    request = await queued(orders, "ord-5")

    result = await host(store, orders, clock).worker.execute(request)

    assert result.status is OrderStatus.FILLED and result.auto_exit
    assert [c.step for c in orders.changes] == ["claim", "execute"]
    book = await store.load(BOOK)
    assert book is not None and book["holdings"]["BTCUSDT"]["quantity"] == "1"


def line_drops_after_placing(
    brokers: PersistentPaperBrokerFactory, exchange: PaperExchange
) -> AfterPlacing:
    """Brokers whose line drops for good right after a placement went out: its answer is
    lost and every reconnect is refused."""

    def drop(_: str) -> None:
        exchange.disconnect(ACCOUNT, refuse_reconnects=100)
        raise BrokerDisconnected("line dropped after the order went out")

    return AfterPlacing(brokers, drop)


async def test_a_broker_lost_after_an_unclaimed_placement_fails_the_order_keeping_nothing(
    clock: FakeClock,
) -> None:
    store = MemoryDocumentStore()
    orders = SavingOrders(store)
    request = await queued(orders, "ord-6")
    worker_host = host(store, orders, clock, line_drops_after_placing)

    result = await worker_host.worker.execute(request)

    assert result.status is OrderStatus.FAILED
    assert result.error is not None and result.error.code is RejectionCode.BROKER_UNAVAILABLE
    assert [c.step for c in orders.changes] == ["fail_claim"]
    assert await store.load(f"{BOOK}:order:ord-6-entry") is None
    assert worker_host.exchange.positions(ACCOUNT) == {}  # the placement was dropped
