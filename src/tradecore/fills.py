"""Fill verification of one order: the state machine behind the order-tasks queue.

Specification, "Fill verification of an order" and "Limits": the first check runs 2-3 s after
placement; a pending order is re-queued with a 30 s visibility timeout; a partial fill is
stored and re-queued; filled, cancelled and failed are final; after 3 retries the message goes
to the dead-letter queue. The queue's visibility timeout is 180 s; its message group is the
user id, so one user's checks run in sequence.

Deliveries are counted by the queue (``receive_count`` is 1 on the first check). The first
check plus 3 retries makes 4 deliveries: a 4th delivery that still finds the order open would
need a 4th retry, so it goes to the dead letter instead.

Everything here is pure: callers pass the broker's observation, the delivery count and, for
the first delay, a jitter value; the service applies the returned ``FillDecision``.
"""

from __future__ import annotations

import enum

import attrs

from tradecore.errors import IllegalTransition
from tradecore.orders import OrderStatus
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus

CHECK_GATHER_S = 0.1
"""How much later than it fell due a check may run, so that checks falling due close together
share one round of the verifier (one look at the queue, one read of their rows) instead of
each waking it: at 50 orders/s that is five checks a round instead of one."""
FIRST_CHECK_DELAY_RANGE_S = (2.0, 3.0 - CHECK_GATHER_S)
"""The first check's schedule after placement; with the gathering it runs 2-3 s after
placement, as the specification says."""
PENDING_REQUEUE_DELAY_S = 30.0
# The specification gives no delay for a partial fill's re-queue; we reuse the pending one.
PARTIAL_REQUEUE_DELAY_S = 30.0
VISIBILITY_TIMEOUT_S = 180.0
MAX_RETRIES = 3
MAX_DELIVERIES = 1 + MAX_RETRIES


class FillState(enum.StrEnum):
    """Where the verification of one order stands."""

    VERIFICATION_QUEUED = "verification_queued"
    PENDING = "pending"
    PARTIALLY_FILLED = "partially_filled"
    FILLED = "filled"
    CANCELLED = "cancelled"
    FAILED = "failed"
    DEAD_LETTER = "dead_letter"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {FillState.FILLED, FillState.CANCELLED, FillState.FAILED, FillState.DEAD_LETTER}
)

_S = FillState
_B = BrokerOrderStatus

# (state, what the broker reports) -> next state, before the retry limit is applied.
# DEAD_LETTER never appears here: it comes from the delivery count, not from the broker.
TRANSITIONS: dict[tuple[FillState, BrokerOrderStatus], FillState] = {
    # The specification's rows, from "verification queued".
    (_S.VERIFICATION_QUEUED, _B.FILLED): _S.FILLED,
    (_S.VERIFICATION_QUEUED, _B.PARTIALLY_FILLED): _S.PARTIALLY_FILLED,
    (_S.VERIFICATION_QUEUED, _B.PENDING): _S.PENDING,
    (_S.VERIFICATION_QUEUED, _B.CANCELLED): _S.CANCELLED,
    # "cancelled or failed": a broker rejection is the failure the broker can report.
    (_S.VERIFICATION_QUEUED, _B.REJECTED): _S.FAILED,
    # A re-queued check ("any re-queued state") is the same check again.
    (_S.PENDING, _B.FILLED): _S.FILLED,
    (_S.PENDING, _B.PARTIALLY_FILLED): _S.PARTIALLY_FILLED,
    (_S.PENDING, _B.PENDING): _S.PENDING,
    (_S.PENDING, _B.CANCELLED): _S.CANCELLED,
    (_S.PENDING, _B.REJECTED): _S.FAILED,
    (_S.PARTIALLY_FILLED, _B.FILLED): _S.FILLED,
    (_S.PARTIALLY_FILLED, _B.PARTIALLY_FILLED): _S.PARTIALLY_FILLED,
    # Surprising: a broker that says "pending" after a partial fill shows a stale view; a fill
    # never un-happens, so the order stays partially filled.
    (_S.PARTIALLY_FILLED, _B.PENDING): _S.PARTIALLY_FILLED,
    # The unfilled remainder was cancelled; the partial fill already stored stays recorded.
    (_S.PARTIALLY_FILLED, _B.CANCELLED): _S.CANCELLED,
    (_S.PARTIALLY_FILLED, _B.REJECTED): _S.FAILED,
}

_REQUEUE_DELAY_S = {
    FillState.PENDING: PENDING_REQUEUE_DELAY_S,
    FillState.PARTIALLY_FILLED: PARTIAL_REQUEUE_DELAY_S,
}

# The order-history status written for each state. A broker rejection is stored as
# ``rejected`` (the broker's word, as placement stores it); ``failed`` is kept for an order
# the broker does not know at all. DEAD_LETTER writes nothing: the last status stays.
_ORDER_STATUS: dict[FillState, OrderStatus] = {
    FillState.FILLED: OrderStatus.FILLED,
    FillState.PARTIALLY_FILLED: OrderStatus.PARTIALLY_FILLED,
    FillState.PENDING: OrderStatus.PENDING,
    FillState.CANCELLED: OrderStatus.CANCELLED,
}

UNKNOWN_ORDER = "unknown order"
UNREACHABLE = "broker unreachable"
UNSETTLED = "placement result not recorded yet"


def _check_count(receive_count: int) -> None:
    if receive_count < 1:
        raise ValueError(f"receive_count starts at 1, got {receive_count}")


def next_state(state: FillState, observed: BrokerOrderStatus, receive_count: int) -> FillState:
    """The state after the ``receive_count``-th check observed ``observed``.

    A final broker status always wins; an order still open at the last allowed delivery goes
    to DEAD_LETTER. Raises IllegalTransition from a terminal state, ValueError for a
    ``receive_count`` below 1.
    """
    _check_count(receive_count)
    following = TRANSITIONS.get((state, observed))
    if following is None:
        raise IllegalTransition(state, observed)
    if not following.is_terminal and receive_count >= MAX_DELIVERIES:
        return FillState.DEAD_LETTER
    return following


@attrs.frozen
class FillDecision:
    """What to do after one check.

    ``order_status`` is the order-history status to write (None: keep the current one).
    ``requeue_after_s`` is set exactly when the message goes back on the queue; ``dead_letter``
    exactly when it moves to the dead-letter queue; otherwise the message is deleted.
    ``reason`` explains a cancellation, failure or dead letter (for the log and operators).
    """

    state: FillState
    order_status: OrderStatus | None
    requeue_after_s: float | None
    dead_letter: bool
    reason: str | None


def decide(state: FillState, observed: BrokerOrder | None, receive_count: int) -> FillDecision:
    """The decision for the ``receive_count``-th check of an order in ``state``.

    ``observed`` is the broker's view of the order; None means the broker does not know it,
    which fails the order. Raises IllegalTransition from a terminal state.
    """
    _check_count(receive_count)
    if observed is None:
        if state.is_terminal:
            raise IllegalTransition(state, UNKNOWN_ORDER)
        return FillDecision(
            FillState.FAILED,
            OrderStatus.FAILED,
            None,
            dead_letter=False,
            reason="the broker does not know the order",
        )
    following = next_state(state, observed.status, receive_count)
    if following is FillState.DEAD_LETTER:
        return _dead_letter(f"still {observed.status} after {MAX_RETRIES} retries")
    if following is FillState.FAILED:
        return FillDecision(
            following,
            OrderStatus.REJECTED,
            None,
            dead_letter=False,
            reason=_broker_reason(observed, "rejected by the broker"),
        )
    reason = None
    if following is FillState.CANCELLED:
        reason = _broker_reason(observed, "cancelled by the broker")
    return FillDecision(
        following,
        _ORDER_STATUS[following],
        _REQUEUE_DELAY_S.get(following),
        dead_letter=False,
        reason=reason,
    )


def decide_unreachable(state: FillState, receive_count: int) -> FillDecision:
    """The decision for a check that could not reach the broker.

    Nothing was learned, so the order-history status is kept; the check is re-queued like a
    pending one and, at the last allowed delivery, dead-lettered. Raises IllegalTransition
    from a terminal state.
    """
    _check_count(receive_count)
    if state.is_terminal:
        raise IllegalTransition(state, UNREACHABLE)
    if receive_count >= MAX_DELIVERIES:
        return _dead_letter(f"{UNREACHABLE} after {MAX_RETRIES} retries")
    waiting = FillState.PENDING if state is FillState.VERIFICATION_QUEUED else state
    return FillDecision(
        waiting, None, PENDING_REQUEUE_DELAY_S, dead_letter=False, reason=UNREACHABLE
    )


def decide_unsettled(receive_count: int) -> FillDecision:
    """The decision for a check that found the order's placement result not yet recorded (its
    row still ``queued`` or ``submitted``, naming no broker order).

    The worker sends the first check while the placement's result commits, so a check can only
    get there first when a crash or an outage came between the two and the row waits for the
    worker's retry or its successor (within a lease's lifetime). Nothing is asked of the broker
    (the row does not yet say which order to ask about) and nothing is written; the check is
    re-queued like a pending one and, at the last allowed delivery, dead-lettered, so a row
    whose result never comes is in front of operators. Once the row is settled, a later
    delivery resumes from its status as any re-queued check does.
    """
    _check_count(receive_count)
    if receive_count >= MAX_DELIVERIES:
        return _dead_letter(f"{UNSETTLED} after {MAX_RETRIES} retries")
    return FillDecision(
        FillState.VERIFICATION_QUEUED,
        None,
        PENDING_REQUEUE_DELAY_S,
        dead_letter=False,
        reason=UNSETTLED,
    )


def first_check_delay(jitter: float) -> float:
    """Seconds from placement to the first check, 2.0 to 3.0, for a ``jitter`` in [0, 1)
    supplied by the caller (it spreads the checks of a burst of orders)."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    low, high = FIRST_CHECK_DELAY_RANGE_S
    return low + jitter * (high - low)


def _dead_letter(reason: str) -> FillDecision:
    return FillDecision(FillState.DEAD_LETTER, None, None, dead_letter=True, reason=reason)


def _broker_reason(observed: BrokerOrder, default: str) -> str:
    if observed.rejection is None:
        return default
    return f"{observed.rejection.code}: {observed.rejection.message}"
