"""Fill verification writes to order history only what the check changes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

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
        (OrderStatus.SUBMITTED, Decimal(0), BrokerOrderStatus.FILLED, OrderStatus.FILLED),
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
