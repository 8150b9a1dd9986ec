"""Fill verification writes to order history only what the check changes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import attrs
import pytest

from tradecore.fills import FillState
from tradecore.order_lifecycle import Executed, OrderChange
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    Side,
    Source,
)
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus
from tradecore.ports.messaging import FillTask
from tradecore.services.execution.fill_verifier import FillVerifier
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory

PLACED = datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)


class CountingHistory(MemoryOrderHistory):
    def __init__(self) -> None:
        super().__init__()
        self.transitions: list[OrderChange] = []

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        self.transitions.append(change)
        return await super().transition(order_id, change)


def placed_row(status: OrderStatus, filled: Decimal) -> OrderHistoryRecord:
    return OrderHistoryRecord(
        id="ord-1",
        user_id="user-1",
        trading_account_id="acct-1",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal(2),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=status,
        created_at=PLACED,
        request_id="req-1",
        client_order_id="ord-1-entry",
        order_id="paper-1",
        fill_quantity=filled if filled else None,
        fill_price=Decimal("50000.0") if filled else None,
        filled_at=PLACED if status is OrderStatus.FILLED else None,
    )


def broker_view(status: BrokerOrderStatus, filled: Decimal) -> BrokerOrder:
    return BrokerOrder(
        broker_order_id="paper-1",
        client_order_id="ord-1-entry",
        symbol="BTCUSDT",
        side=Side.BUY,
        quantity=Decimal(2),
        status=status,
        filled_quantity=filled,
        average_price=Decimal("50000") if filled else None,
    )


async def verify_once(
    row: OrderHistoryRecord, observed: BrokerOrder
) -> tuple[CountingHistory, OrderHistoryRecord | None]:
    clock = FakeClock(PLACED)
    history, tasks = CountingHistory(), MemoryFillTaskQueue(clock)
    await history.add(row)

    async def check(_: OrderHistoryRecord) -> BrokerOrder | None:
        return observed

    await tasks.send(FillTask(row.id, row.user_id, row.trading_account_id), 0)
    clock.advance(3)
    decision = await FillVerifier(tasks, history, check, clock).run_once(0)
    assert decision is not None
    return history, await history.get(row.id)


async def test_a_check_that_confirms_the_recorded_fill_writes_nothing() -> None:
    row = placed_row(OrderStatus.FILLED, Decimal(2))
    history, after = await verify_once(row, broker_view(BrokerOrderStatus.FILLED, Decimal(2)))
    assert history.transitions == []
    assert after == row


@pytest.mark.parametrize(
    ("status", "filled", "observed", "expected"),
    [
        (OrderStatus.PARTIALLY_FILLED, Decimal(1), BrokerOrderStatus.FILLED, OrderStatus.FILLED),
        (OrderStatus.PENDING, Decimal(0), BrokerOrderStatus.FILLED, OrderStatus.FILLED),
        (OrderStatus.PENDING, Decimal(0), BrokerOrderStatus.PARTIALLY_FILLED, None),
    ],
)
async def test_a_check_that_learns_something_writes_it(
    status: OrderStatus,
    filled: Decimal,
    observed: BrokerOrderStatus,
    expected: OrderStatus | None,
) -> None:
    seen = Decimal(2) if observed is BrokerOrderStatus.FILLED else Decimal(1)
    row = placed_row(status, filled)
    history, after = await verify_once(row, broker_view(observed, seen))
    assert len(history.transitions) == 1
    assert after is not None and after.fill_quantity == seen
    if expected is not None:
        assert after.status is expected


async def test_a_check_that_comes_before_the_placement_result_asks_nothing_and_looks_again() -> (
    None
):
    """The worker sends the first check while the result commits; after a crash between the
    two, the check can find the row still ``submitted``: it neither asks the broker (the row
    does not name the order yet) nor writes, and looks again once the row is settled."""
    clock = FakeClock(PLACED)
    history, tasks = CountingHistory(), MemoryFillTaskQueue(clock)
    settled = placed_row(OrderStatus.PENDING, Decimal(0))
    submitted = attrs.evolve(
        settled, status=OrderStatus.SUBMITTED, client_order_id=None, order_id=None
    )
    await history.add(submitted)
    asked: list[str] = []

    async def check(row: OrderHistoryRecord) -> BrokerOrder | None:
        asked.append(row.id)
        return broker_view(BrokerOrderStatus.FILLED, Decimal(2))

    verifier = FillVerifier(tasks, history, check, clock)
    await tasks.send(FillTask(settled.id, settled.user_id, settled.trading_account_id), 0)
    clock.advance(3)

    early = await verifier.run_once(0)
    assert early is not None and early.reason == "placement result not recorded yet"
    assert asked == [] and history.transitions == []
    assert await tasks.pending_count() == 1  # re-queued, not dropped
    assert await verifier.run_once(0) is None  # not before the pending delay

    placement = Executed(  # the worker's retry records the placement: pending at the broker
        status=OrderStatus.PENDING,
        order_id="paper-1",
        client_order_id="ord-1-entry",
        broker_refs=("paper-1",),
        fill_price=None,
        fill_quantity=Decimal(0),
        filled_at=None,
        auto_exit=False,
        exit_quantity=Decimal(0),
        exit_order_result=None,
        error=None,
        placed_at=PLACED,
    )
    assert await history.transition(settled.id, placement) is not None
    history.transitions.clear()
    clock.advance(30)
    resumed = await verifier.run_once(0)
    assert resumed is not None and resumed.state is FillState.FILLED
    assert asked == [settled.id]
    after = await history.get(settled.id)
    assert after is not None and after.status is OrderStatus.FILLED
    assert await tasks.pending_count() == 0


async def test_a_placement_result_that_never_comes_is_dead_lettered_at_the_fourth_delivery() -> (
    None
):
    clock = FakeClock(PLACED)
    history, tasks = CountingHistory(), MemoryFillTaskQueue(clock)
    row = attrs.evolve(
        placed_row(OrderStatus.PENDING, Decimal(0)),
        status=OrderStatus.SUBMITTED,
        client_order_id=None,
        order_id=None,
    )
    await history.add(row)

    async def check(_: OrderHistoryRecord) -> BrokerOrder | None:
        raise AssertionError("the broker is not asked about an order the row does not name")

    verifier = FillVerifier(tasks, history, check, clock)
    await tasks.send(FillTask(row.id, row.user_id, row.trading_account_id), 0)
    decisions = []
    for _ in range(4):
        clock.advance(30)
        decisions.append(await verifier.run_once(0))
    assert [d.dead_letter for d in decisions if d is not None] == [False, False, False, True]
    assert [task.order_id for task, _ in await tasks.dead_letters()] == [row.id]
    assert history.transitions == []
