"""Fill verification in batches (``FillVerifier.run_batch``): one receive, one row read, the
checks of several users at once; a failing check leaves only its own delivery in flight; the
decisions are those of ``process`` taking the deliveries one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from log_capture import captured_logs
from tradecore.errors import BrokerDisconnected, DatabaseUnavailable, KeyValueStoreUnavailable
from tradecore.fills import VISIBILITY_TIMEOUT_S, FillDecision
from tradecore.order_lifecycle import OrderChange
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    Side,
    Source,
)
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus
from tradecore.ports.messaging import FillDelivery, FillTask
from tradecore.services.execution.fill_verifier import FillVerifier
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory

PLACED = datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)
ROUND_S = 61.0
"""Clock time between two rounds: every re-queued check (30 s) is due again."""

Seen = BrokerOrder | None | Exception
"""What the broker answers a check of one order: its view, None (unknown) or an error."""


class History(MemoryOrderHistory):
    """Counts the reads; a write of an order in ``failing_writes`` raises."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.get_manys: list[list[str]] = []
        self.failing_writes: set[str] = set()
        self.reads_fail = False

    async def get(self, order_id: str) -> OrderHistoryRecord | None:
        self.gets += 1
        return await super().get(order_id)

    async def get_many(self, order_ids: Sequence[str]) -> dict[str, OrderHistoryRecord]:
        if self.reads_fail:
            raise DatabaseUnavailable("unavailable: connection refused")
        self.get_manys.append(list(order_ids))
        return await super().get_many(order_ids)

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        if order_id in self.failing_writes:
            raise DatabaseUnavailable("unavailable: connection lost")
        return await super().transition(order_id, change)


class Tasks(MemoryFillTaskQueue):
    """A settle of an order in ``failing_settles`` raises (the key-value store)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.failing_settles: set[str] = set()

    def _settling(self, delivery: FillDelivery) -> None:
        if delivery.task.order_id in self.failing_settles:
            raise KeyValueStoreUnavailable("unavailable: connection lost")

    async def ack(self, delivery: FillDelivery) -> None:
        self._settling(delivery)
        await super().ack(delivery)

    async def retry(self, delivery: FillDelivery, delay_s: float) -> None:
        self._settling(delivery)
        await super().retry(delivery, delay_s)

    async def dead_letter(self, delivery: FillDelivery, reason: str) -> None:
        self._settling(delivery)
        await super().dead_letter(delivery, reason)


def row(
    order_id: str, user_id: str, status: OrderStatus = OrderStatus.SUBMITTED
) -> OrderHistoryRecord:
    filled = status is OrderStatus.FILLED
    return OrderHistoryRecord(
        id=order_id,
        user_id=user_id,
        trading_account_id=f"acct-{user_id}",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal(2),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=status,
        created_at=PLACED,
        request_id=f"req-{order_id}",
        client_order_id=f"{order_id}-entry",
        order_id=f"paper-{order_id}",
        fill_quantity=Decimal(2) if filled else Decimal(0),
        fill_price=Decimal("50000.0") if filled else None,
        filled_at=PLACED if filled else None,
    )


def view(order_id: str, status: BrokerOrderStatus, filled: Decimal = Decimal(0)) -> BrokerOrder:
    return BrokerOrder(
        broker_order_id=f"paper-{order_id}",
        client_order_id=f"{order_id}-entry",
        symbol="BTCUSDT",
        side=Side.BUY,
        quantity=Decimal(2),
        status=status,
        filled_quantity=filled,
        average_price=Decimal("50000") if filled else None,
    )


class World:
    """One order-tasks queue, order history and broker; ``check`` answers from ``broker`` and
    records how many checks were under way at once."""

    def __init__(self) -> None:
        self.clock = FakeClock(PLACED)
        self.history = History()
        self.tasks = Tasks(self.clock)
        self.broker: dict[str, Seen] = {}
        self.verifier = FillVerifier(self.tasks, self.history, self.check, self.clock)
        self.checking = 0
        self.most_at_once = 0

    async def check(self, checked: OrderHistoryRecord) -> BrokerOrder | None:
        self.checking += 1
        self.most_at_once = max(self.most_at_once, self.checking)
        try:
            for _ in range(3):  # turns of the loop, no time: the batch's others start
                await asyncio.sleep(0)
            seen = self.broker[checked.id]
            if isinstance(seen, Exception):
                raise seen
            return seen
        finally:
            self.checking -= 1

    async def place(self, order: OrderHistoryRecord | None, task: FillTask, seen: Seen) -> None:
        """Store ``order`` (None: no row), queue the check ``task``, visible at once."""
        if order is not None:
            await self.history.add(order)
        self.broker[task.order_id] = seen
        await self.tasks.send(task, 0)

    async def one_by_one(self) -> list[FillDecision | None]:
        """``process`` each delivery visible now, one after another."""
        decisions = []
        while (delivery := await self.tasks.receive(0)) is not None:
            decisions.append(await self.verifier.process(delivery))
        return decisions

    async def rows(self) -> list[OrderHistoryRecord | None]:
        return [await self.history.get(order_id) for order_id in sorted(self.broker)]


def task(order_id: str, user_id: str) -> FillTask:
    return FillTask(order_id, user_id, f"acct-{user_id}")


async def three_users(world: World) -> None:
    """Users u1, u2, u3 with one submitted order each (o1, o2, o3), filled at the broker."""
    for n in (1, 2, 3):
        order_id, user_id = f"o{n}", f"u{n}"
        filled = view(order_id, BrokerOrderStatus.FILLED, Decimal(2))
        await world.place(row(order_id, user_id), task(order_id, user_id), filled)
    world.clock.advance(3)


async def test_a_batch_checks_several_users_orders_at_once_and_settles_them() -> None:
    world = World()
    await three_users(world)
    batch = await world.verifier.run_batch(64, 0)
    assert batch.received == 3 and batch.failed == 0
    assert [d.order_status if d else None for d in batch.decisions] == [OrderStatus.FILLED] * 3
    assert world.most_at_once == 3  # processed concurrently, not one after another
    assert world.history.get_manys == [["o1", "o2", "o3"]] and world.history.gets == 0
    for order in await world.rows():
        assert order is not None and order.status is OrderStatus.FILLED
    assert await world.tasks.pending_count() == 0  # every message acknowledged


async def test_a_batch_takes_at_most_its_limit() -> None:
    world = World()
    await three_users(world)
    first = await world.verifier.run_batch(2, 0)
    assert first.received == 2 and world.history.get_manys == [["o1", "o2"]]
    rest = await world.verifier.run_batch(2, 0)
    assert rest.received == 1 and world.history.get_manys[-1] == ["o3"]


async def test_an_empty_queue_gives_an_empty_batch_without_reading_rows() -> None:
    world = World()
    batch = await world.verifier.run_batch(64, 0)
    assert (batch.received, batch.decisions, batch.failed) == (0, (), 0)
    assert world.history.get_manys == []


@pytest.mark.parametrize("failing", ["check", "write", "settle"])
async def test_a_failing_delivery_leaves_the_others_settled_and_itself_in_flight(
    failing: str,
) -> None:
    world = World()
    await three_users(world)
    if failing == "check":
        world.broker["o2"] = RuntimeError("the broker client fell over")
    elif failing == "write":
        world.history.failing_writes.add("o2")
    else:
        world.tasks.failing_settles.add("o2")

    with captured_logs("json") as logs:
        batch = await world.verifier.run_batch(64, 0)

    assert batch.received == 3 and batch.failed == 1 and len(batch.decisions) == 2
    assert await world.tasks.pending_count() == 1  # o1 and o3 acknowledged, o2 not settled
    assert await world.tasks.receive(0) is None  # o2 is in flight: invisible, not re-queued
    (error,) = [e for e in logs.entries() if e["level"] == "error"]
    assert "fill verification of order o2 failed" in error["message"]
    assert (error["order_id"], error["user_id"], error["account_id"]) == ("o2", "u2", "acct-u2")
    assert "Traceback" in error.get("exception", "")

    world.clock.advance(VISIBILITY_TIMEOUT_S)
    again = await world.tasks.receive(0)
    assert again is not None and (again.task, again.receive_count) == (task("o2", "u2"), 2)


async def test_a_failed_row_read_fails_the_batch_and_leaves_every_delivery_in_flight() -> None:
    world = World()
    await three_users(world)
    world.history.reads_fail = True
    with pytest.raises(DatabaseUnavailable):
        await world.verifier.run_batch(64, 0)
    assert world.most_at_once == 0  # no broker was asked
    assert await world.tasks.pending_count() == 3
    assert await world.tasks.receive(0) is None
    world.clock.advance(VISIBILITY_TIMEOUT_S)
    again = await world.tasks.receive_many(64, 0)
    assert [(d.task.order_id, d.receive_count) for d in again] == [("o1", 2), ("o2", 2), ("o3", 2)]


async def test_every_log_line_of_a_batch_names_its_own_order() -> None:
    world = World()
    await three_users(world)
    with captured_logs("json") as logs:
        await world.verifier.run_batch(64, 0)
    for n in (1, 2, 3):
        (line,) = logs.matching(message=f"order o{n}: fill check 1: filled")
        assert (line["order_id"], line["user_id"], line["account_id"]) == (
            f"o{n}",
            f"u{n}",
            f"acct-u{n}",
        )


async def varied_orders(world: World) -> None:
    """One order per user, each check heading elsewhere: filled, partly filled, pending
    until dead-lettered, unknown to the broker, a broker out of reach until dead-lettered,
    already recorded as filled, and a check of an order without a row."""
    orders: list[tuple[str, OrderStatus | None, Seen]] = [
        ("filled", OrderStatus.SUBMITTED, view("filled", BrokerOrderStatus.FILLED, Decimal(2))),
        (
            "partial",
            OrderStatus.SUBMITTED,
            view("partial", BrokerOrderStatus.PARTIALLY_FILLED, Decimal(1)),
        ),
        ("pending", OrderStatus.SUBMITTED, view("pending", BrokerOrderStatus.PENDING)),
        ("unknown", OrderStatus.SUBMITTED, None),
        ("unreachable", OrderStatus.SUBMITTED, BrokerDisconnected("connection reset")),
        ("recorded", OrderStatus.FILLED, view("recorded", BrokerOrderStatus.FILLED, Decimal(2))),
        ("rowless", None, view("rowless", BrokerOrderStatus.FILLED, Decimal(2))),
        ("rejected", OrderStatus.SUBMITTED, view("rejected", BrokerOrderStatus.REJECTED)),
    ]
    for n, (order_id, status, seen) in enumerate(orders):
        user_id = f"user-{n}"
        stored = None if status is None else row(order_id, user_id, status)
        await world.place(stored, task(order_id, user_id), seen)
    world.clock.advance(3)


async def test_a_batch_decides_what_process_decides_one_by_one() -> None:
    batched, single = World(), World()
    await varied_orders(batched)
    await varied_orders(single)
    for _ in range(5):  # the pending and unreachable checks are dead-lettered by the 4th
        batch = await batched.verifier.run_batch(64, 0)
        assert batch.failed == 0
        assert list(batch.decisions) == await single.one_by_one()
        batched.clock.advance(ROUND_S)
        single.clock.advance(ROUND_S)
    assert batched.most_at_once > 1
    assert await batched.rows() == await single.rows()
    assert await batched.tasks.dead_letters() == await single.tasks.dead_letters()
    assert len(await batched.tasks.dead_letters()) == 2
    assert await batched.tasks.pending_count() == await single.tasks.pending_count() == 0
