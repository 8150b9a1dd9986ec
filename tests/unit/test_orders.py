"""The specification's mapping tables and the order-flow limits."""

from __future__ import annotations

import pytest

from tradecore.orders import (
    AlertAction,
    BrokerMethod,
    Direction,
    InternalAction,
    Operation,
    OrderType,
    Side,
    to_instruction,
)
from tradecore.services.execution.broker_sessions import BROKER_RECONNECT_RETRIES
from tradecore.services.execution.worker_host import DEFAULT_IDLE_TIMEOUT_S
from tradecore.services.orders.settings import OrderSettings

# Specification, "Webhook action mapping": (alert action, order_type) -> operation.
WEBHOOK_MAPPING = [
    ("buy", "entry", Operation.PLACE_ENTRY_ORDER, Side.BUY, None),
    ("sell", "entry", Operation.PLACE_ENTRY_ORDER, Side.SELL, None),
    ("buy", "exit", Operation.PLACE_EXIT_ORDER, None, Direction.SHORT),
    ("sell", "exit", Operation.PLACE_EXIT_ORDER, None, Direction.LONG),
    ("close_long", "entry", Operation.CLOSE_POSITION, None, Direction.LONG),
    ("close_long", "exit", Operation.CLOSE_POSITION, None, Direction.LONG),
    ("close_short", "entry", Operation.CLOSE_POSITION, None, Direction.SHORT),
    ("close_short", "exit", Operation.CLOSE_POSITION, None, Direction.SHORT),
]

# Specification, "Internal actions": action -> (queue operation, broker method).
INTERNAL_ACTIONS = [
    ("buy", "entry", InternalAction.LONG_ENTRY, BrokerMethod.PLACE_ENTRY_ORDER_WITH_REVERSAL),
    ("sell", "exit", InternalAction.LONG_EXIT, BrokerMethod.PLACE_EXIT_ORDER),
    ("sell", "entry", InternalAction.SHORT_ENTRY, BrokerMethod.PLACE_ENTRY_ORDER_WITH_REVERSAL),
    ("buy", "exit", InternalAction.SHORT_EXIT, BrokerMethod.PLACE_EXIT_ORDER),
]


@pytest.mark.parametrize(
    ("action", "order_type", "operation", "side", "direction"), WEBHOOK_MAPPING
)
def test_webhook_action_mapping_table(
    action: str,
    order_type: str,
    operation: Operation,
    side: Side | None,
    direction: Direction | None,
) -> None:
    instruction = to_instruction(AlertAction(action), OrderType(order_type))

    assert instruction.operation is operation
    assert instruction.side is side
    assert instruction.direction is direction


@pytest.mark.parametrize(("action", "order_type", "internal", "method"), INTERNAL_ACTIONS)
def test_internal_actions_table(
    action: str, order_type: str, internal: InternalAction, method: BrokerMethod
) -> None:
    instruction = to_instruction(AlertAction(action), OrderType(order_type))

    assert instruction.internal_action is internal
    assert instruction.broker_method is method


def test_exits_close_the_opposite_side_of_their_alert_action() -> None:
    # the surprising rows: "buy" + exit covers a short, "sell" + exit sells a long
    assert to_instruction(AlertAction.BUY, OrderType.EXIT).direction is Direction.SHORT
    assert Direction.SHORT.closing_side is Side.BUY
    assert to_instruction(AlertAction.SELL, OrderType.EXIT).direction is Direction.LONG
    assert Direction.LONG.closing_side is Side.SELL


def test_limits_of_the_order_flows() -> None:
    settings = OrderSettings()

    assert settings.order_wait_s == 30.0  # response wait, then 202
    assert settings.worker_start_timeout_s == 60.0  # worker start timeout, then 503
    assert settings.rate_limit_per_minute == 60 and settings.rate_window_s == 60.0
    assert settings.webhook_wait_s < 3.0  # TradingView gives a webhook 3 s (docs/configuration.md)
    assert settings.plan_caps.render() == "free=100,pro=1000"
    assert DEFAULT_IDLE_TIMEOUT_S == 12 * 3600
    assert BROKER_RECONNECT_RETRIES == 3
