"""Hypothesis strategies for positions and signals, and the reference model of the position rules.

Another service that builds on tradecore can check its own order handling against the same
rules::

    from hypothesis import given
    from tradecore.testing.positions import positions, quantities, instructions, reference_position

    @given(positions(), instructions(), quantities())
    def test_my_broker_follows_the_rules(position, instruction, quantity):
        assert run_my_broker(position, instruction, quantity) == reference_position(
            position, instruction, quantity
        )

Quantities and positions are ``Decimal`` with at most three decimal places, so sums stay exact.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

from tradecore.orders import (
    AlertAction,
    Direction,
    Instruction,
    Operation,
    OrderType,
    to_instruction,
)

MAX_SIZE = 50


def quantities(max_value: int = MAX_SIZE) -> st.SearchStrategy[Decimal]:
    """Positive quantities: mostly whole contracts, sometimes fractional lots."""
    whole = st.integers(min_value=1, max_value=max_value).map(Decimal)
    fractional = st.decimals(
        min_value=Decimal("0.001"),
        max_value=Decimal(max_value),
        places=3,
        allow_nan=False,
        allow_infinity=False,
    )
    return st.one_of(whole, fractional)


def positions(max_size: int = MAX_SIZE) -> st.SearchStrategy[Decimal]:
    """Signed positions (positive long, negative short), flat included and favoured."""
    signed = st.tuples(st.sampled_from((1, -1)), quantities(max_size)).map(lambda t: t[0] * t[1])
    return st.one_of(st.just(Decimal(0)), signed)


ALL_INSTRUCTIONS: tuple[Instruction, ...] = tuple(
    dict.fromkeys(
        to_instruction(action, order_type) for action in AlertAction for order_type in OrderType
    )
)


def instructions() -> st.SearchStrategy[Instruction]:
    """Every instruction the webhook action mapping can produce."""
    return st.sampled_from(ALL_INSTRUCTIONS)


def signals(
    max_quantity: int = MAX_SIZE,
) -> st.SearchStrategy[tuple[AlertAction, OrderType, Decimal]]:
    """(alert action, order type, quantity) as a webhook or the dashboard would send them."""
    return st.tuples(
        st.sampled_from(list(AlertAction)),
        st.sampled_from(list(OrderType)),
        quantities(max_quantity),
    )


def reference_position(position: Decimal, instruction: Instruction, quantity: Decimal) -> Decimal:
    """The position after ``instruction`` fills in full: the rules stated as plainly as possible.

    * Entry on a side: an opposite position is closed first, then ``quantity`` is added.
    * Exit of a direction: reduces that side by ``quantity`` but never past flat; nothing held
      on that side changes nothing.
    * Close of a direction: that side goes flat; nothing held on that side changes nothing.
    """
    long_held = position > 0
    short_held = position < 0
    if instruction.operation is Operation.PLACE_ENTRY_ORDER:
        if instruction.side is not None and instruction.side.sign > 0:
            return (Decimal(0) if short_held else position) + quantity
        return (Decimal(0) if long_held else position) - quantity
    if instruction.direction is Direction.LONG and long_held:
        if instruction.operation is Operation.CLOSE_POSITION:
            return Decimal(0)
        return max(position - quantity, Decimal(0))
    if instruction.direction is Direction.SHORT and short_held:
        if instruction.operation is Operation.CLOSE_POSITION:
            return Decimal(0)
        return min(position + quantity, Decimal(0))
    return position


def reference_signal_position(
    position: Decimal, signal: tuple[AlertAction, OrderType, Decimal]
) -> Decimal:
    """``reference_position`` for a signal drawn from ``signals()``."""
    action, order_type, quantity = signal
    return reference_position(position, to_instruction(action, order_type), quantity)
