"""Fill verification over any sequence of broker observations."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.errors import IllegalTransition
from tradecore.fills import (
    MAX_DELIVERIES,
    FillDecision,
    FillState,
    decide,
    decide_unreachable,
)
from tradecore.orders import Side
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus

UNREACHABLE = "unreachable"

# One check's outcome: a broker status, an order the broker does not know (None), or a
# broker that could not be reached.
observations = st.one_of(st.sampled_from(list(BrokerOrderStatus)), st.none(), st.just(UNREACHABLE))


def check(
    state: FillState, observation: BrokerOrderStatus | str | None, delivery: int
) -> FillDecision:
    if observation == UNREACHABLE:
        return decide_unreachable(state, delivery)
    order = None
    if isinstance(observation, BrokerOrderStatus):
        order = BrokerOrder("b", "o", "BTCUSDT", Side.BUY, Decimal(1), observation)
    return decide(state, order, delivery)


def run(sequence: list[BrokerOrderStatus | str | None]) -> list[FillDecision]:
    """Deliver the check until its message leaves the queue (deleted or dead-lettered)."""
    decisions = []
    state = FillState.VERIFICATION_QUEUED
    for delivery, observation in enumerate(sequence, start=1):
        decision = check(state, observation, delivery)
        decisions.append(decision)
        state = decision.state
        if decision.requeue_after_s is None:
            break
    return decisions


@given(st.lists(observations, min_size=MAX_DELIVERIES, max_size=8))
def test_every_check_ends_in_a_terminal_state_within_four_deliveries(
    sequence: list[BrokerOrderStatus | str | None],
) -> None:
    decisions = run(sequence)
    assert len(decisions) <= MAX_DELIVERIES
    assert decisions[-1].state.is_terminal
    assert all(not d.state.is_terminal for d in decisions[:-1])


@given(st.lists(observations, min_size=1, max_size=8))
def test_a_decision_either_requeues_or_settles_never_both(
    sequence: list[BrokerOrderStatus | str | None],
) -> None:
    for decision in run(sequence):
        requeued = decision.requeue_after_s is not None
        assert requeued == (not decision.state.is_terminal)
        assert decision.dead_letter == (decision.state is FillState.DEAD_LETTER)
        if requeued:
            assert decision.requeue_after_s is not None and decision.requeue_after_s > 0
        if decision.state in (FillState.CANCELLED, FillState.FAILED, FillState.DEAD_LETTER):
            assert decision.reason


@given(st.lists(observations, min_size=1, max_size=8), observations)
def test_the_machine_never_leaves_a_terminal_state(
    sequence: list[BrokerOrderStatus | str | None],
    after: BrokerOrderStatus | str | None,
) -> None:
    decisions = run(sequence)
    final = decisions[-1].state
    if not final.is_terminal:
        return
    with pytest.raises(IllegalTransition):
        check(final, after, len(decisions) + 1)
