"""The paper broker in real mode: books survive a worker restart and a move to another host;
simulated network conditions (latency, dropped lines)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import pytest
from support import WaitingSave

from tradecore.errors import BrokerDisconnected, DatabaseUnavailable
from tradecore.orders import Side
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrderStatus
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperBroker, PaperConditions, PaperExchange
from tradecore_adapters.brokers.persistent import FINISHED_IN_MEMORY, PersistentPaperBrokerFactory
from tradecore_adapters.memory.documents import MemoryDocumentStore

ACCOUNT = "acct-1"


def host(
    store: MemoryDocumentStore, clock: FakeClock
) -> tuple[PaperExchange, PersistentPaperBrokerFactory]:
    """A fresh process: its own exchanges in memory, the shared document store."""
    exchange = PaperExchange()
    return exchange, PersistentPaperBrokerFactory(exchange, PaperExchange(), store, clock)


async def test_a_restarted_host_sees_the_same_book_and_never_doubles_an_order() -> None:
    store, clock = MemoryDocumentStore(), FakeClock()
    _, first = host(store, clock)
    broker = first.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    placed = await broker.place_order("ord-1-entry", "BTCUSDT", Side.BUY, Decimal(2))

    exchange, second = host(store, clock)  # the worker host restarted
    again = second.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await again.connect()
    repeated = await again.place_order("ord-1-entry", "BTCUSDT", Side.BUY, Decimal(2))

    assert repeated == placed
    assert await again.positions() == {"BTCUSDT": Decimal(2)}
    assert exchange.balance(ACCOUNT) == PaperExchange().balance(ACCOUNT)


async def test_an_open_order_placed_on_one_host_fills_when_polled_on_another() -> None:
    store, clock = MemoryDocumentStore(), FakeClock()
    exchange_a, first = host(store, clock)
    exchange_a.delay_next_fill(2)
    broker = first.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    pending = await broker.place_order("ord-2-entry", "BTCUSDT", Side.SELL, Decimal(1))
    assert pending.status is BrokerOrderStatus.PENDING

    _, second = host(store, clock)
    moved = second.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await moved.connect()
    polls = [await moved.order_status("ord-2-entry", "BTCUSDT") for _ in range(2)]

    assert [p.status for p in polls if p] == [
        BrokerOrderStatus.PENDING,
        BrokerOrderStatus.FILLED,
    ]
    assert await moved.positions() == {"BTCUSDT": Decimal(-1)}


async def test_simulated_orders_keep_their_own_persistent_book() -> None:
    store, clock = MemoryDocumentStore(), FakeClock()
    _, first = host(store, clock)
    simulated = first.open(BrokerAccount(ACCOUNT, "paper"), simulation=True)
    await simulated.connect()
    await simulated.place_order("ord-3-entry", "BTCUSDT", Side.BUY, Decimal(1))

    _, second = host(store, clock)
    live = second.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await live.connect()
    replayed_simulation = second.open(BrokerAccount(ACCOUNT, "paper"), simulation=True)
    await replayed_simulation.connect()

    assert await live.positions() == {}
    assert await replayed_simulation.positions() == {"BTCUSDT": Decimal(1)}


async def test_simulated_conditions_delay_every_call_and_drop_the_line() -> None:
    clock = FakeClock()
    sleeper = FakeSleeper(clock)
    broker = PaperBroker(
        PaperExchange(),
        ACCOUNT,
        clock,
        conditions=PaperConditions(latency_s=0.05, disconnect_every=3),
        sleeper=sleeper,
    )
    await broker.connect()
    await broker.positions()
    await broker.positions()

    with pytest.raises(BrokerDisconnected):
        await broker.positions()  # the third call finds the line dropped
    await broker.connect()
    assert await broker.positions() == {}
    assert sleeper.slept == [0.05] * 6


class CountingStore(MemoryDocumentStore):
    """Counts writes; ``fail_next`` makes the next write fail (a database outage)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.fail_next = False

    async def save_many(self, documents: Mapping[str, dict[str, Any]]) -> None:
        self.writes += 1
        if self.fail_next:
            self.fail_next = False
            raise DatabaseUnavailable("database unavailable: test")
        await super().save_many(documents)

    async def save(self, name: str, document: dict[str, Any]) -> None:
        await self.save_many({name: document})


async def test_a_placement_saves_the_order_and_the_book_in_one_write() -> None:
    store, clock = CountingStore(), FakeClock()
    _, factory = host(store, clock)
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()

    await broker.place_order("ord-4-entry", "BTCUSDT", Side.BUY, Decimal(1))

    assert store.writes == 1
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-4-entry") is not None


async def test_calls_that_change_nothing_write_nothing() -> None:
    store, clock = CountingStore(), FakeClock()
    _, factory = host(store, clock)
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    placed = await broker.place_order("ord-5-entry", "BTCUSDT", Side.BUY, Decimal(1))
    writes = store.writes

    again = await broker.place_order("ord-5-entry", "BTCUSDT", Side.BUY, Decimal(1))
    status = await broker.order_status(
        "ord-5-entry", "BTCUSDT"
    )  # filled at placement: nothing moves
    unknown = await broker.order_status("never-placed", "BTCUSDT")

    assert again == placed == status and unknown is None
    assert store.writes == writes


async def test_a_poll_that_moves_an_open_order_is_saved() -> None:
    store, clock = CountingStore(), FakeClock()
    exchange, factory = host(store, clock)
    exchange.delay_next_fill(2)
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    await broker.place_order("ord-6-entry", "BTCUSDT", Side.BUY, Decimal(1))

    await broker.order_status(
        "ord-6-entry", "BTCUSDT"
    )  # one poll of two: still pending, but counted
    _, restarted = host(store, clock)
    moved = restarted.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await moved.connect()
    filled = await moved.order_status("ord-6-entry", "BTCUSDT")

    assert filled is not None and filled.status is BrokerOrderStatus.FILLED


async def save_failed(
    client_order_id: str,
) -> tuple[CountingStore, FakeClock, PersistentPaperBrokerFactory, Broker]:
    """A host whose broker placed ``client_order_id`` (a buy of 1) but could not save it."""
    store, clock = CountingStore(), FakeClock()
    _, factory = host(store, clock)
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    store.fail_next = True
    with pytest.raises(DatabaseUnavailable):
        await broker.place_order(client_order_id, "BTCUSDT", Side.BUY, Decimal(1))
    return store, clock, factory, broker


async def test_a_failed_save_is_made_good_by_the_next_call() -> None:
    store, _, _, broker = await save_failed("ord-7-entry")

    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-7-entry") is None

    # the worker runs the order again: the broker has it, the store catches up
    await broker.place_order("ord-7-entry", "BTCUSDT", Side.BUY, Decimal(1))

    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-7-entry") is not None
    book = await store.load(f"paper:live:{ACCOUNT}")
    assert book is not None and book["holdings"]["BTCUSDT"]["quantity"] == "1"


class LoadCountingStore(MemoryDocumentStore):
    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    async def load(self, name: str) -> dict[str, Any] | None:
        self.loaded.append(name)
        return await super().load(name)


async def test_a_fresh_placement_skips_the_look_up_and_a_repeat_still_finds_the_order() -> None:
    store, clock = LoadCountingStore(), FakeClock()
    _, first = host(store, clock)
    broker = first.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    store.loaded.clear()

    placed = await broker.place_order("ord-8-entry", "BTCUSDT", Side.BUY, Decimal(1), fresh=True)
    assert store.loaded == []  # the caller vouched that nothing was placed before

    _, second = host(store, clock)  # restarted: the next attempt is not fresh
    again = second.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await again.connect()
    repeated = await again.place_order("ord-8-entry", "BTCUSDT", Side.BUY, Decimal(1))

    assert repeated == placed
    assert f"paper:live:{ACCOUNT}:order:ord-8-entry" in store.loaded
    assert await again.positions() == {"BTCUSDT": Decimal(1)}


def finished_in_memory(exchange: PaperExchange) -> set[str]:
    snapshot = exchange.snapshot()
    orders = snapshot["accounts"][ACCOUNT]["orders"]
    return {cid for cid, order in orders.items() if order["status"] != "pending"}


async def test_a_long_running_host_keeps_only_its_latest_finished_orders_in_memory() -> None:
    store, clock = LoadCountingStore(), FakeClock()
    exchange, factory = host(store, clock)
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    placed = []
    for n in range(2 * FINISHED_IN_MEMORY + 40):  # entries and exits in turn
        side = Side.BUY if n % 2 == 0 else Side.SELL
        placed.append(await broker.place_order(f"ord-{n}", "BTCUSDT", side, Decimal(1)))
    balance = exchange.balance(ACCOUNT)

    kept = finished_in_memory(exchange)
    latest = {f"ord-{n}" for n in range(FINISHED_IN_MEMORY + 40, 2 * FINISHED_IN_MEMORY + 40)}
    assert latest <= kept and len(kept) <= 2 * FINISHED_IN_MEMORY
    assert {"ord-0", "ord-1"}.isdisjoint(kept)

    # an order no longer in memory is still answered, from the store, and never placed again
    store.loaded.clear()
    assert await broker.order_status("ord-0", "BTCUSDT") == placed[0]
    assert await broker.place_order("ord-1", "BTCUSDT", Side.SELL, Decimal(1)) == placed[1]
    assert store.loaded == [f"paper:live:{ACCOUNT}:order:ord-{n}" for n in (0, 1)]
    assert exchange.balance(ACCOUNT) == balance
    assert await broker.positions() == {}


async def test_an_open_order_stays_in_memory_however_old() -> None:
    store, clock = MemoryDocumentStore(), FakeClock()
    exchange, factory = host(store, clock)
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await broker.connect()
    exchange.delay_next_fill(None)  # rests until cancelled
    await broker.place_order("resting", "BTCUSDT", Side.BUY, Decimal(1))
    for n in range(3 * FINISHED_IN_MEMORY):
        side = Side.SELL if n % 2 == 0 else Side.BUY
        await broker.place_order(f"ord-{n}", "BTCUSDT", side, Decimal(1))

    assert exchange.knows_order(ACCOUNT, "resting")
    assert len(finished_in_memory(exchange)) <= 2 * FINISHED_IN_MEMORY


async def test_a_save_one_connection_failed_is_made_good_by_another_of_the_account() -> None:
    store, clock, factory, _ = await save_failed("ord-9-entry")

    # the worker re-opened its connection (say, with new credentials) and goes on
    second = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await second.connect()
    await second.place_order("ord-10-entry", "BTCUSDT", Side.BUY, Decimal(1))

    _, restarted = host(store, clock)
    after = restarted.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await after.connect()
    earlier = await after.order_status("ord-9-entry", "BTCUSDT")
    assert earlier is not None and earlier.status is BrokerOrderStatus.FILLED
    assert await after.positions() == {"BTCUSDT": Decimal(2)}


class Outcomes:
    """A ``SavesWithOrder`` over a memory store: each order's waiting save is written when the
    test says its outcome committed, dropped when it says the outcome's write failed, and
    discarded when it says an unclaimed placement's outcome did not take."""

    def __init__(self, store: MemoryDocumentStore) -> None:
        self.store = store
        self.waiting: dict[str, WaitingSave] = {}

    def save_with_order(
        self,
        order_id: str,
        documents: Callable[[], Mapping[str, dict[str, Any]]],
        saved: Callable[[], None],
        discarded: Callable[[], None],
    ) -> None:
        self.waiting[order_id] = WaitingSave(documents, saved, discarded)

    async def committed(self, order_id: str) -> None:
        waiting = self.waiting.pop(order_id)
        await self.store.save_many(waiting.documents())
        waiting.saved()

    def failed(self, order_id: str) -> None:
        del self.waiting[order_id]

    def not_taken(self, order_id: str) -> None:
        self.waiting.pop(order_id).discarded()


def host_saving_with_orders(
    store: MemoryDocumentStore, clock: FakeClock
) -> tuple[Outcomes, Broker]:
    """A fresh process whose placements' saves wait for their orders' outcomes."""
    outcomes = Outcomes(store)
    factory = PersistentPaperBrokerFactory(
        PaperExchange(), PaperExchange(), store, clock, with_order=outcomes
    )
    return outcomes, factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)


async def test_a_placement_is_stored_with_its_orders_outcome_and_placed_afresh_without() -> None:
    store, clock = CountingStore(), FakeClock()
    outcomes, broker = host_saving_with_orders(store, clock)
    await broker.connect()

    placed = await broker.place_order("ord-20-entry", "BTCUSDT", Side.BUY, Decimal(1), fresh=True)

    assert store.writes == 0 and list(outcomes.waiting) == ["ord-20"]
    # The host dies before the outcome commits: nothing of the order is stored, so the next
    # host's execution places it afresh, once.
    outcomes_b, again = host_saving_with_orders(store, clock)
    await again.connect()
    replaced = await again.place_order("ord-20-entry", "BTCUSDT", Side.BUY, Decimal(1))
    await outcomes_b.committed("ord-20")

    assert replaced.status is placed.status is BrokerOrderStatus.FILLED
    assert store.writes == 1  # the order and the book, with the outcome
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-20-entry") is not None
    book = await store.load(f"paper:live:{ACCOUNT}")
    assert book is not None and book["holdings"]["BTCUSDT"]["quantity"] == "1"


async def test_a_reversals_close_is_stored_before_its_entry_is_placed() -> None:
    """What is stored never holds the entry without the close before it."""
    store, clock = CountingStore(), FakeClock()
    outcomes, broker = host_saving_with_orders(store, clock)
    await broker.connect()

    await broker.place_order("ord-21-close", "BTCUSDT", Side.SELL, Decimal(1))
    await broker.place_order("ord-21-entry", "BTCUSDT", Side.SELL, Decimal(1))

    assert store.writes == 1  # the close, in a write of its own before the entry
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-21-close") is not None
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-21-entry") is None
    await outcomes.committed("ord-21")
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-21-entry") is not None
    book = await store.load(f"paper:live:{ACCOUNT}")
    assert book is not None and book["holdings"]["BTCUSDT"]["quantity"] == "-2"


async def test_a_placement_whose_outcome_failed_is_stored_by_the_next_call() -> None:
    store, clock = CountingStore(), FakeClock()
    outcomes, broker = host_saving_with_orders(store, clock)
    await broker.connect()
    await broker.place_order("ord-22-entry", "BTCUSDT", Side.BUY, Decimal(1))

    outcomes.failed("ord-22")
    await broker.order_status("ord-22-entry", "BTCUSDT")  # the fill check, say

    assert store.writes == 1
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-22-entry") is not None
    assert outcomes.waiting == {}


async def test_a_placement_whose_unclaimed_outcome_did_not_take_is_dropped() -> None:
    """The order was recorded by another execution (or withdrawn): this host's placement
    belongs to no recorded order. Its state goes back to what is stored, and nothing of the
    dropped placement is ever saved."""
    store, clock = CountingStore(), FakeClock()
    outcomes, broker = host_saving_with_orders(store, clock)
    assert broker.placements_wait_for_outcome
    await broker.connect()
    await broker.place_order("ord-23-entry", "BTCUSDT", Side.BUY, Decimal(1), fresh=True)
    await outcomes.committed("ord-23")
    await broker.place_order("ord-24-entry", "BTCUSDT", Side.BUY, Decimal(2), fresh=True)
    assert await broker.positions() == {"BTCUSDT": Decimal(3)}

    outcomes.not_taken("ord-24")

    assert await broker.positions() == {"BTCUSDT": Decimal(1)}  # the stored book again
    assert await broker.order_status("ord-24-entry", "BTCUSDT") is None
    await broker.place_order("ord-25-entry", "BTCUSDT", Side.SELL, Decimal(1), fresh=True)
    await outcomes.committed("ord-25")
    assert await store.load(f"paper:live:{ACCOUNT}:order:ord-24-entry") is None
    book = await store.load(f"paper:live:{ACCOUNT}")
    assert book is not None and "BTCUSDT" not in book["holdings"]


def test_without_the_order_history_the_worker_claims_before_placing() -> None:
    """A save of its own follows each placement: the worker must claim the order first."""
    _, factory = host(MemoryDocumentStore(), FakeClock())
    broker = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    assert not broker.placements_wait_for_outcome


async def test_a_dropped_placement_makes_every_connection_of_the_account_reload() -> None:
    """The exchange in memory is the process's: once a placement is dropped there, another
    connection to the same account (a worker that replaced one, say) reads the stored book
    again instead of an account the exchange no longer holds."""
    store, clock = CountingStore(), FakeClock()
    outcomes = Outcomes(store)
    factory = PersistentPaperBrokerFactory(
        PaperExchange(), PaperExchange(), store, clock, with_order=outcomes
    )
    first = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    other = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    await first.connect()
    await other.connect()
    await first.place_order("ord-27-entry", "BTCUSDT", Side.BUY, Decimal(1), fresh=True)
    await outcomes.committed("ord-27")
    await first.place_order("ord-28-entry", "BTCUSDT", Side.BUY, Decimal(1), fresh=True)

    outcomes.not_taken("ord-28")

    assert await other.positions() == {"BTCUSDT": Decimal(1)}
    status = await other.order_status("ord-27-entry", "BTCUSDT")
    assert status is not None and status.status is BrokerOrderStatus.FILLED
