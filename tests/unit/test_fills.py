"""Fill verification: the specification's state table, the retry limit and the first delay."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tradecore import fills
from tradecore.errors import IllegalTransition
from tradecore.fills import (
    FillDecision,
    FillState,
    decide,
    decide_unreachable,
    decide_unsettled,
    next_state,
)
from tradecore.orders import OrderError, OrderStatus, RejectionCode, Side
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus

OPEN_STATES = [FillState.VERIFICATION_QUEUED, FillState.PENDING, FillState.PARTIALLY_FILLED]


def broker_order(
    status: BrokerOrderStatus,
    filled: str = "0",
    price: str | None = None,
    rejection: OrderError | None = None,
) -> BrokerOrder:
    return BrokerOrder(
        broker_order_id="b-1",
        client_order_id="o-1",
        symbol="BTCUSDT",
        side=Side.BUY,
        quantity=Decimal(2),
        status=status,
        filled_quantity=Decimal(filled),
        average_price=None if price is None else Decimal(price),
        rejection=rejection,
    )


def test_limits_match_the_specification() -> None:
    # first check 2-3 s after placement: scheduled 2.0-2.9 s, run up to CHECK_GATHER_S later
    low, high = fills.FIRST_CHECK_DELAY_RANGE_S
    assert low == 2.0
    assert high + fills.CHECK_GATHER_S == pytest.approx(3.0)
    assert fills.PENDING_REQUEUE_DELAY_S == 30.0
    assert fills.VISIBILITY_TIMEOUT_S == 180.0
    assert fills.MAX_RETRIES == 3


# --- The specification's rows, through decide() ----------------------------------------------


def test_filled_is_final_and_writes_filled() -> None:
    decision = decide(
        FillState.VERIFICATION_QUEUED, broker_order(BrokerOrderStatus.FILLED, "2", "100.5"), 1
    )
    assert decision == FillDecision(
        FillState.FILLED, OrderStatus.FILLED, None, dead_letter=False, reason=None
    )


def test_partial_fill_is_stored_and_requeued() -> None:
    decision = decide(
        FillState.VERIFICATION_QUEUED,
        broker_order(BrokerOrderStatus.PARTIALLY_FILLED, "1", "100"),
        1,
    )
    assert decision.state is FillState.PARTIALLY_FILLED
    assert decision.order_status is OrderStatus.PARTIALLY_FILLED
    assert decision.requeue_after_s == fills.PARTIAL_REQUEUE_DELAY_S
    assert not decision.dead_letter


def test_pending_is_requeued_after_30_s() -> None:
    decision = decide(FillState.VERIFICATION_QUEUED, broker_order(BrokerOrderStatus.PENDING), 1)
    assert decision == FillDecision(
        FillState.PENDING, OrderStatus.PENDING, 30.0, dead_letter=False, reason=None
    )


def test_cancelled_is_final_and_logs_the_reason() -> None:
    plain = decide(FillState.VERIFICATION_QUEUED, broker_order(BrokerOrderStatus.CANCELLED), 1)
    assert plain.state is FillState.CANCELLED
    assert plain.order_status is OrderStatus.CANCELLED
    assert plain.requeue_after_s is None
    assert not plain.dead_letter
    assert plain.reason == "cancelled by the broker"

    closed = OrderError(RejectionCode.MARKET_CLOSED, "session ended")
    with_reason = decide(
        FillState.PENDING, broker_order(BrokerOrderStatus.CANCELLED, rejection=closed), 2
    )
    assert with_reason.reason == "market_closed: session ended"


def test_broker_rejection_fails_the_check_and_stores_rejected() -> None:
    margin = OrderError(RejectionCode.INSUFFICIENT_MARGIN, "not enough margin")
    decision = decide(
        FillState.VERIFICATION_QUEUED,
        broker_order(BrokerOrderStatus.REJECTED, rejection=margin),
        1,
    )
    assert decision.state is FillState.FAILED
    assert decision.order_status is OrderStatus.REJECTED
    assert decision.requeue_after_s is None
    assert not decision.dead_letter
    assert decision.reason == "insufficient_margin: not enough margin"


def test_an_order_the_broker_does_not_know_fails() -> None:
    decision = decide(FillState.VERIFICATION_QUEUED, None, 1)
    assert decision.state is FillState.FAILED
    assert decision.order_status is OrderStatus.FAILED
    assert decision.requeue_after_s is None
    assert not decision.dead_letter
    assert decision.reason


@pytest.mark.parametrize("state", OPEN_STATES)
@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (BrokerOrderStatus.FILLED, FillState.FILLED),
        (BrokerOrderStatus.CANCELLED, FillState.CANCELLED),
        (BrokerOrderStatus.REJECTED, FillState.FAILED),
        (BrokerOrderStatus.PARTIALLY_FILLED, FillState.PARTIALLY_FILLED),
    ],
)
def test_every_requeued_state_checks_again_like_the_first(
    state: FillState, observed: BrokerOrderStatus, expected: FillState
) -> None:
    assert next_state(state, observed, 2) is expected


def test_pending_stays_pending_but_a_partial_fill_never_goes_back_to_pending() -> None:
    assert next_state(FillState.PENDING, BrokerOrderStatus.PENDING, 2) is FillState.PENDING
    assert (
        next_state(FillState.PARTIALLY_FILLED, BrokerOrderStatus.PENDING, 2)
        is FillState.PARTIALLY_FILLED
    )


def test_the_table_covers_every_open_state_and_broker_status() -> None:
    expected = {(s, b) for s in OPEN_STATES for b in BrokerOrderStatus}
    assert set(fills.TRANSITIONS) == expected


# --- Retries and the dead letter -------------------------------------------------------------


@pytest.mark.parametrize(
    "observed", [BrokerOrderStatus.PENDING, BrokerOrderStatus.PARTIALLY_FILLED]
)
def test_dead_letter_exactly_at_the_fourth_delivery(observed: BrokerOrderStatus) -> None:
    state = FillState.VERIFICATION_QUEUED
    for delivery in (1, 2, 3):
        decision = decide(state, broker_order(observed, "1"), delivery)
        assert not decision.dead_letter
        assert decision.requeue_after_s == 30.0
        state = decision.state
    last = decide(state, broker_order(observed, "1"), 4)
    assert last.state is FillState.DEAD_LETTER
    assert last.dead_letter
    assert last.requeue_after_s is None
    assert last.order_status is None
    assert last.reason == f"still {observed} after 3 retries"


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (BrokerOrderStatus.FILLED, FillState.FILLED),
        (BrokerOrderStatus.CANCELLED, FillState.CANCELLED),
        (BrokerOrderStatus.REJECTED, FillState.FAILED),
    ],
)
def test_a_final_status_at_the_last_delivery_wins_over_the_dead_letter(
    observed: BrokerOrderStatus, expected: FillState
) -> None:
    decision = decide(FillState.PENDING, broker_order(observed), 4)
    assert decision.state is expected
    assert not decision.dead_letter


def test_an_unreachable_broker_counts_as_pending_and_keeps_the_status() -> None:
    first = decide_unreachable(FillState.VERIFICATION_QUEUED, 1)
    assert first.state is FillState.PENDING
    assert first.order_status is None
    assert first.requeue_after_s == 30.0
    assert not first.dead_letter
    assert decide_unreachable(FillState.PARTIALLY_FILLED, 3).state is FillState.PARTIALLY_FILLED
    last = decide_unreachable(FillState.PENDING, 4)
    assert last.dead_letter
    assert last.state is FillState.DEAD_LETTER
    assert last.reason == "broker unreachable after 3 retries"


def test_a_check_before_the_placement_result_writes_nothing_and_looks_again() -> None:
    for count in (1, 2, 3):
        early = decide_unsettled(count)
        assert early.order_status is None  # nothing learned, nothing written
        assert early.requeue_after_s == 30.0
        assert not early.dead_letter
    last = decide_unsettled(4)  # a result that never comes ends in front of operators
    assert last.dead_letter
    assert last.state is FillState.DEAD_LETTER
    assert last.reason == "placement result not recorded yet after 3 retries"


# --- Illegal transitions ---------------------------------------------------------------------


@pytest.mark.parametrize("state", sorted(fills.TERMINAL_STATES))
@pytest.mark.parametrize("observed", list(BrokerOrderStatus))
def test_nothing_leaves_a_terminal_state(state: FillState, observed: BrokerOrderStatus) -> None:
    with pytest.raises(IllegalTransition) as raised:
        next_state(state, observed, 2)
    assert raised.value.state is state
    assert raised.value.trigger is observed
    with pytest.raises(IllegalTransition):
        decide(state, broker_order(observed), 2)


@pytest.mark.parametrize("state", sorted(fills.TERMINAL_STATES))
def test_terminal_states_refuse_unknown_and_unreachable_checks(state: FillState) -> None:
    with pytest.raises(IllegalTransition):
        decide(state, None, 1)
    with pytest.raises(IllegalTransition):
        decide_unreachable(state, 1)


@pytest.mark.parametrize("count", [0, -1])
def test_receive_count_starts_at_one(count: int) -> None:
    with pytest.raises(ValueError, match="receive_count"):
        decide(FillState.VERIFICATION_QUEUED, broker_order(BrokerOrderStatus.PENDING), count)
    with pytest.raises(ValueError, match="receive_count"):
        next_state(FillState.PENDING, BrokerOrderStatus.PENDING, count)


# --- First check delay -----------------------------------------------------------------------


def test_first_check_is_scheduled_to_run_two_to_three_seconds_after_placement() -> None:
    assert fills.first_check_delay(0.0) == 2.0
    assert fills.first_check_delay(0.5) == pytest.approx(2.45)
    assert 2.0 < fills.first_check_delay(0.999999) < 2.9


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 1.5, float("nan")])
def test_first_check_delay_refuses_jitter_outside_the_unit_interval(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        fills.first_check_delay(jitter)
