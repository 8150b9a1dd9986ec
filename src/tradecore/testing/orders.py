"""Order requests and results for tests and benchmarks of the order queues.

``order_request`` is a webhook BTCUSDT buy entry as the API pushes it (order id
``order-<request id>``, 5 minutes to live from ``EPOCH``); ``filled_result`` the worker's
answer that fills all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal

from tradecore.orders import (
    AlertAction,
    OrderRequest,
    OrderResult,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore.testing.clock import EPOCH


def order_request(
    request_id: str,
    user_id: str = "u1",
    *,
    quantity: Decimal = Decimal(1),
    simulation: bool = False,
) -> OrderRequest:
    return OrderRequest(
        request_id=request_id,
        order_id=f"order-{request_id}",
        user_id=user_id,
        trading_account_id="acct",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        order_type=OrderType.ENTRY,
        quantity=quantity,
        source=Source.WEBHOOK,
        simulation=simulation,
        created_at=EPOCH,
        expires_at=EPOCH + timedelta(minutes=5),
    )


def filled_result(
    request: OrderRequest,
    *,
    fill_price: Decimal = Decimal(100),
    broker_refs: Sequence[str] = (),
) -> OrderResult:
    return OrderResult(
        order_id=request.order_id,
        request_id=request.request_id,
        status=OrderStatus.FILLED,
        symbol=request.symbol,
        action=request.action,
        quantity=request.quantity,
        filled_quantity=request.quantity,
        fill_price=fill_price,
        broker_refs=tuple(broker_refs),
    )
