"""Properties of the reversal rules over every position, instruction and signal sequence."""

from __future__ import annotations

import asyncio
import functools
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.orders import (
    AlertAction,
    Instruction,
    Operation,
    OrderType,
    Side,
    to_instruction,
)
from tradecore.reversal import BrokerStep, StepRole, client_order_id, execute, order_of, plan
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore.testing.positions import (
    ALL_INSTRUCTIONS,
    instructions,
    positions,
    quantities,
    reference_position,
    reference_signal_position,
    signals,
)
from tradecore_adapters.brokers.paper import PaperBroker, PaperExchange

ACCOUNT = "acct-1"
SYMBOL = "BTCUSDT"


def test_instructions_cover_every_row_of_the_mapping() -> None:
    assert {i.internal_action for i in ALL_INSTRUCTIONS} == {
        to_instruction(a, t).internal_action for a in AlertAction for t in OrderType
    }
    assert len(ALL_INSTRUCTIONS) == 6  # 4 buy/sell rows + close_long + close_short


@given(positions(), instructions(), quantities())
def test_plan_reaches_the_reference_position(
    position: Decimal, instruction: Instruction, quantity: Decimal
) -> None:
    assert plan(position, instruction, quantity).position_after == reference_position(
        position, instruction, quantity
    )


@given(positions(), instructions(), quantities())
def test_exits_never_increase_the_position_at_any_step(
    position: Decimal, instruction: Instruction, quantity: Decimal
) -> None:
    p = plan(position, instruction, quantity)
    if instruction.operation is Operation.PLACE_ENTRY_ORDER:
        return
    assert all(s.reduce_only and s.role is StepRole.EXIT for s in p.steps)
    current = position
    for step in p.steps:
        after = current + step.side.sign * step.quantity
        assert abs(after) <= abs(current)
        assert after * current >= 0  # never crosses to the other side
        current = after
    if position == 0:
        assert p.steps == ()


@given(positions(), instructions(), quantities())
def test_a_reversal_closes_exactly_the_opposite_position_first(
    position: Decimal, instruction: Instruction, quantity: Decimal
) -> None:
    p = plan(position, instruction, quantity)
    closes = [s for s in p.steps if s.role is StepRole.CLOSE]
    assert p.auto_exit == bool(closes)
    if closes:
        [close] = closes
        assert p.steps[0] is close and p.steps[-1].role is StepRole.ENTRY
        assert position + close.side.sign * close.quantity == 0
        assert p.exit_quantity == abs(position)
    else:
        assert p.exit_quantity == 0
    ids = [client_order_id("ord", s) for s in p.steps]
    assert len(set(ids)) == len(ids)


@given(positions(), st.lists(signals(), max_size=8))
def test_paper_broker_ends_where_the_reference_model_does(
    start: Decimal, sequence: list[tuple[AlertAction, OrderType, Decimal]]
) -> None:
    expected = functools.reduce(reference_signal_position, sequence, start)
    assert asyncio.run(_trade(start, sequence)) == expected


async def _trade(start: Decimal, sequence: list[tuple[AlertAction, OrderType, Decimal]]) -> Decimal:
    clock = FakeClock()
    exchange = PaperExchange()
    exchange.fund(ACCOUNT, Decimal(10) ** 12)
    exchange.set_position(ACCOUNT, SYMBOL, start)
    broker = PaperBroker(exchange, ACCOUNT, clock)
    await broker.connect()
    for n, (action, order_type, quantity) in enumerate(sequence):
        position = (await broker.positions()).get(SYMBOL, Decimal(0))
        steps = plan(position, to_instruction(action, order_type), quantity)
        await execute(broker, FakeSleeper(clock), f"ord-{n}", SYMBOL, steps)
    return exchange.position(ACCOUNT, SYMBOL)


@given(st.text(min_size=1), st.sampled_from(StepRole), st.sampled_from(Side))
def test_a_client_order_id_names_its_order(order_id: str, role: StepRole, side: Side) -> None:
    """The paper broker finds the order a placement belongs to from its client order id."""
    step = BrokerStep(role, side, Decimal(1), reduce_only=False)
    assert order_of(client_order_id(order_id, step)) == order_id


@pytest.mark.parametrize("text", ["", "entry", "-entry", "o-1", "o-1-open"])
def test_an_id_not_made_for_a_step_names_no_order(text: str) -> None:
    assert order_of(text) is None
