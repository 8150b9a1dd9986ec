"""Auto-reversal: the pure planner of broker steps and the executor that sends them.

``plan(position, instruction, quantity)`` turns a signed position and a worker instruction into
the broker orders to send (specification, "Auto-reversal for entries"):

* entry, no opposite position held: one ENTRY of ``quantity``, on top of any same-direction
  position;
* entry, opposite position held: a reduce-only CLOSE of the whole opposite position, then the
  ENTRY of ``quantity``;
* exit (PLACE_EXIT_ORDER): one reduce-only EXIT of ``min(quantity, held)`` on that side, or
  nothing when nothing is held there;
* close (CLOSE_POSITION): one reduce-only EXIT of the whole position on that side, if any.

``execute`` sends a plan through the Broker port one step at a time, each under
``client_order_id(order_id, step)``. After a CLOSE it polls the close's fill REVERSAL_POLLS
times, REVERSAL_POLL_INTERVAL_S apart; a close not filled by then aborts with
``reversal_timeout`` and the entry is never placed.
"""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import TypeVar

import attrs

from tradecore.errors import IllegalTransition
from tradecore.orders import (
    Direction,
    Instruction,
    Operation,
    OrderError,
    OrderStatus,
    RejectionCode,
    Side,
)
from tradecore.ports.broker import Broker, BrokerOrder, BrokerOrderStatus
from tradecore.ports.runtime import Sleeper

REVERSAL_POLLS = 10
REVERSAL_POLL_INTERVAL_S = 0.5
RATE_LIMIT_RETRIES = 2
RATE_LIMIT_MAX_WAIT_S = 5.0

ZERO = Decimal(0)

_T = TypeVar("_T")


class StepRole(enum.StrEnum):
    """CLOSE: the automatic close before a reversed entry; ENTRY: the entry; EXIT: an exit or
    a close of the whole position requested by the signal itself."""

    CLOSE = "close"
    ENTRY = "entry"
    EXIT = "exit"


@attrs.frozen
class BrokerStep:
    """One market order to send. ``reduce_only`` steps never increase the absolute position."""

    role: StepRole
    side: Side
    quantity: Decimal
    reduce_only: bool


@attrs.frozen
class ExecutionPlan:
    """The broker steps for one order, in order; no steps means nothing to do."""

    steps: tuple[BrokerStep, ...]
    position_before: Decimal

    @property
    def auto_exit(self) -> bool:
        """True when an automatic close precedes the entry (a reversal)."""
        roles = [step.role for step in self.steps]
        return StepRole.CLOSE in roles and StepRole.ENTRY in roles

    @property
    def exit_quantity(self) -> Decimal:
        """The quantity the automatic reversal closes (0 when none)."""
        return sum((s.quantity for s in self.steps if s.role is StepRole.CLOSE), ZERO)

    @property
    def position_after(self) -> Decimal:
        """The position once every step has filled in full."""
        return self.position_before + sum((s.side.sign * s.quantity for s in self.steps), ZERO)


def held(position: Decimal, direction: Direction) -> Decimal:
    """The size held on ``direction`` (0 when flat or on the other side)."""
    size = position if direction is Direction.LONG else -position
    return max(size, ZERO)


def plan(position: Decimal, instruction: Instruction, quantity: Decimal) -> ExecutionPlan:
    """The broker steps that carry out ``instruction`` from ``position`` (see the module doc);
    ``quantity`` must be positive and finite for entries and exits (ValueError), a close
    ignores it."""
    operation = instruction.operation
    steps: list[BrokerStep] = []
    if operation is Operation.PLACE_ENTRY_ORDER:
        side = _required(instruction.side, "an entry needs a side")
        _check_quantity(quantity)
        if position * side.sign < 0:
            steps.append(BrokerStep(StepRole.CLOSE, side, abs(position), reduce_only=True))
        steps.append(BrokerStep(StepRole.ENTRY, side, quantity, reduce_only=False))
    elif operation is Operation.PLACE_EXIT_ORDER:
        direction = _required(instruction.direction, "an exit needs a direction")
        _check_quantity(quantity)
        size = held(position, direction)
        if size > 0:
            steps.append(
                BrokerStep(StepRole.EXIT, direction.closing_side, min(quantity, size), True)
            )
    else:
        direction = _required(instruction.direction, "a close needs a direction")
        size = held(position, direction)
        if size > 0:
            steps.append(BrokerStep(StepRole.EXIT, direction.closing_side, size, True))
    return ExecutionPlan(tuple(steps), position)


def client_order_id(order_id: str, step: BrokerStep) -> str:
    """The client order id of ``step`` of order ``order_id``: deterministic, and distinct for
    the steps of one plan (each role occurs at most once)."""
    return f"{order_id}-{step.role.value}"


def order_of(client_order_id: str) -> str | None:
    """The order id a ``client_order_id`` was made from, or None for an id not made by it."""
    order_id, dash, role = client_order_id.rpartition("-")
    if not dash or not order_id or role not in StepRole.__members__.values():
        return None
    return order_id


def _required(value: _T | None, message: str) -> _T:
    if value is None:
        raise ValueError(message)
    return value


def _check_quantity(quantity: Decimal) -> None:
    if not quantity.is_finite() or quantity <= 0:
        raise ValueError("quantity must be a positive, finite number")


# -- the executor ------------------------------------------------------------------------------


class ExecutorState(enum.StrEnum):
    READY = "ready"
    CLOSING = "closing"  # placing the automatic close
    AWAITING_CLOSE_FILL = "awaiting_close_fill"
    PLACING = "placing"  # placing the entry, or the exit
    DONE = "done"
    ABORTED = "aborted"


class Trigger(enum.StrEnum):
    NOTHING_TO_DO = "nothing_to_do"
    BEGIN_CLOSE = "begin_close"
    BEGIN_PLACING = "begin_placing"
    RATE_LIMITED = "rate_limited"  # the broker refused the request and named a short wait
    REFUSED = "refused"  # rejected, cancelled, or rate limited beyond the retry budget
    ACCEPTED = "accepted"
    CLOSE_FILLED = "close_filled"
    STILL_OPEN = "still_open"
    CLOSE_ENDED = "close_ended"  # the close was cancelled or rejected while we polled it
    TIMED_OUT = "timed_out"


_S = ExecutorState
TRANSITIONS: dict[tuple[ExecutorState, Trigger], ExecutorState] = {
    (_S.READY, Trigger.NOTHING_TO_DO): _S.DONE,
    (_S.READY, Trigger.BEGIN_CLOSE): _S.CLOSING,
    (_S.READY, Trigger.BEGIN_PLACING): _S.PLACING,
    # A rate-limited request placed nothing: wait and send the same step again.
    (_S.CLOSING, Trigger.RATE_LIMITED): _S.CLOSING,
    (_S.CLOSING, Trigger.REFUSED): _S.ABORTED,
    (_S.CLOSING, Trigger.ACCEPTED): _S.AWAITING_CLOSE_FILL,
    # The placement answer already reports the close filled: enter without polling.
    (_S.CLOSING, Trigger.CLOSE_FILLED): _S.PLACING,
    (_S.AWAITING_CLOSE_FILL, Trigger.STILL_OPEN): _S.AWAITING_CLOSE_FILL,
    (_S.AWAITING_CLOSE_FILL, Trigger.CLOSE_FILLED): _S.PLACING,
    (_S.AWAITING_CLOSE_FILL, Trigger.CLOSE_ENDED): _S.ABORTED,
    # The close is left at the broker as it is: manual intervention (specification).
    (_S.AWAITING_CLOSE_FILL, Trigger.TIMED_OUT): _S.ABORTED,
    (_S.PLACING, Trigger.RATE_LIMITED): _S.PLACING,
    (_S.PLACING, Trigger.REFUSED): _S.ABORTED,
    # Accepted is done even if not yet filled: fill verification follows the order from here.
    (_S.PLACING, Trigger.ACCEPTED): _S.DONE,
}


def next_state(state: ExecutorState, trigger: Trigger) -> ExecutorState:
    """The executor's next state; raises IllegalTransition for a pair the table lacks."""
    try:
        return TRANSITIONS[(state, trigger)]
    except KeyError:
        raise IllegalTransition(state, trigger) from None


@attrs.frozen
class ExecutionOutcome:
    """What executing a plan did.

    ``status`` comes from the main (last) order: filled, partially_filled, pending, or
    rejected/cancelled with the broker's error; ``no_position`` when the plan was empty;
    ``failed`` with ``reversal_timeout`` when the close did not fill in time (the entry was
    not placed). ``broker_refs`` are the broker ids of every order the broker recorded, in
    order. ``main_client_order_id`` is the client order id of the main order when it is live
    or filled (the one fill verification checks), else None. ``auto_exit`` is true when the
    automatic close filled and the entry was sent; ``exit_quantity`` is what the close filled;
    ``exit_order_result`` summarises the close order whenever the broker accepted one.
    """

    status: OrderStatus
    position_before: Decimal
    filled_quantity: Decimal = ZERO
    fill_price: Decimal | None = None
    broker_refs: tuple[str, ...] = ()
    main_client_order_id: str | None = None
    auto_exit: bool = False
    exit_quantity: Decimal = ZERO
    exit_order_result: dict[str, str] | None = None
    error: OrderError | None = None


_STATUS: dict[BrokerOrderStatus, OrderStatus] = {
    BrokerOrderStatus.PENDING: OrderStatus.PENDING,
    BrokerOrderStatus.PARTIALLY_FILLED: OrderStatus.PARTIALLY_FILLED,
    BrokerOrderStatus.FILLED: OrderStatus.FILLED,
    BrokerOrderStatus.CANCELLED: OrderStatus.CANCELLED,
    BrokerOrderStatus.REJECTED: OrderStatus.REJECTED,
}

REVERSAL_TIMEOUT_MESSAGE = (
    "the close of the opposite position did not fill within "
    f"{REVERSAL_POLLS * REVERSAL_POLL_INTERVAL_S:g} s; the entry was not placed. "
    "Manual intervention needed: check the position and the close order at the broker"
)


async def execute(
    broker: Broker,
    sleeper: Sleeper,
    order_id: str,
    symbol: str,
    plan: ExecutionPlan,
    *,
    fresh: bool = False,
) -> ExecutionOutcome:
    """Carry out ``plan`` through ``broker`` (see the module doc).

    Rejections are results. ``BrokerDisconnected`` propagates: re-executing the same plan with
    the same ``order_id`` is safe, the broker returns the orders it already recorded - but
    only with ``fresh`` False: ``fresh`` True is the caller's guarantee that no order of
    ``order_id`` was ever placed before this call (``Broker.place_order``), which a
    re-execution after a disconnect cannot give.
    """
    return await _Execution(broker, sleeper, order_id, symbol, plan, fresh).run()


@attrs.define
class _Execution:
    broker: Broker
    sleeper: Sleeper
    order_id: str
    symbol: str
    plan: ExecutionPlan
    fresh: bool = False
    state: ExecutorState = ExecutorState.READY
    refs: list[str] = attrs.field(factory=list)
    close: BrokerOrder | None = None

    def fire(self, trigger: Trigger) -> None:
        self.state = next_state(self.state, trigger)

    async def run(self) -> ExecutionOutcome:
        steps = self.plan.steps
        if not steps:
            self.fire(Trigger.NOTHING_TO_DO)
            return ExecutionOutcome(OrderStatus.NO_POSITION, self.plan.position_before)
        if steps[0].role is StepRole.CLOSE:
            self.fire(Trigger.BEGIN_CLOSE)
            aborted = await self._close(steps[0])
            if aborted is not None:
                return aborted
            steps = steps[1:]
        else:
            self.fire(Trigger.BEGIN_PLACING)
        return await self._place_main(steps[-1])

    async def _close(self, step: BrokerStep) -> ExecutionOutcome | None:
        """None when the close filled (the state is then PLACING), else the outcome."""
        order = await self._place(step)
        if _refused(order):
            self.fire(Trigger.REFUSED)
            return self._outcome(_STATUS[order.status], _close_error(order))
        self.close = order
        if order.status is BrokerOrderStatus.FILLED:
            self.fire(Trigger.CLOSE_FILLED)
            return None
        self.fire(Trigger.ACCEPTED)
        cid = client_order_id(self.order_id, step)
        for _ in range(REVERSAL_POLLS):
            await self.sleeper.sleep(REVERSAL_POLL_INTERVAL_S)
            polled = await self.broker.order_status(cid, self.symbol)
            if polled is None:
                self.fire(Trigger.STILL_OPEN)
                continue
            self.close = polled
            if polled.status is BrokerOrderStatus.FILLED:
                self.fire(Trigger.CLOSE_FILLED)
                return None
            if polled.status.is_final:
                self.fire(Trigger.CLOSE_ENDED)
                return self._outcome(_STATUS[polled.status], _close_error(polled))
            self.fire(Trigger.STILL_OPEN)
        self.fire(Trigger.TIMED_OUT)
        error = OrderError(RejectionCode.REVERSAL_TIMEOUT, REVERSAL_TIMEOUT_MESSAGE)
        return self._outcome(OrderStatus.FAILED, error)

    async def _place_main(self, step: BrokerStep) -> ExecutionOutcome:
        order = await self._place(step)
        if _refused(order):
            self.fire(Trigger.REFUSED)
            return self._outcome(_STATUS[order.status], order.rejection)
        self.fire(Trigger.ACCEPTED)
        return self._outcome(
            _STATUS[order.status],
            None,
            main=order,
            main_client_order_id=client_order_id(self.order_id, step),
        )

    async def _place(self, step: BrokerStep) -> BrokerOrder:
        """Place ``step``, waiting out short broker rate limits (at most RATE_LIMIT_RETRIES)."""
        cid = client_order_id(self.order_id, step)
        retries = 0
        while True:
            # A rate-limited refusal recorded nothing, so a retry is still fresh.
            order = await self.broker.place_order(
                cid,
                self.symbol,
                step.side,
                step.quantity,
                reduce_only=step.reduce_only,
                fresh=self.fresh,
            )
            wait = _rate_limit_wait(order)
            if wait is None:
                self.refs.append(order.broker_order_id)
                return order
            if retries >= RATE_LIMIT_RETRIES or wait > RATE_LIMIT_MAX_WAIT_S or wait < 0:
                return order  # refused: the broker recorded nothing
            self.fire(Trigger.RATE_LIMITED)
            await self.sleeper.sleep(wait)
            retries += 1

    def _outcome(
        self,
        status: OrderStatus,
        error: OrderError | None,
        *,
        main: BrokerOrder | None = None,
        main_client_order_id: str | None = None,
    ) -> ExecutionOutcome:
        close = self.close
        live = main is not None and main.status not in _DEAD
        return ExecutionOutcome(
            status=status,
            position_before=self.plan.position_before,
            filled_quantity=main.filled_quantity if main is not None else ZERO,
            fill_price=main.average_price if main is not None else None,
            broker_refs=tuple(self.refs),
            main_client_order_id=main_client_order_id if live else None,
            auto_exit=close is not None and close.status is BrokerOrderStatus.FILLED,
            exit_quantity=close.filled_quantity if close is not None else ZERO,
            exit_order_result=summary(close) if close is not None else None,
            error=error if error is not None else (main.rejection if main else None),
        )


_DEAD = (BrokerOrderStatus.CANCELLED, BrokerOrderStatus.REJECTED)


def _refused(order: BrokerOrder) -> bool:
    return order.status in _DEAD


def _rate_limit_wait(order: BrokerOrder) -> float | None:
    """The wait a rate-limited refusal asks for; None when ``order`` is not one. A refusal
    without a wait counts as a wait too long to retry."""
    rejection = order.rejection
    if rejection is None or rejection.code is not RejectionCode.BROKER_RATE_LIMITED:
        return None
    if order.status is not BrokerOrderStatus.REJECTED:
        return None
    return rejection.retry_after if rejection.retry_after is not None else float("inf")


def summary(order: BrokerOrder) -> dict[str, str]:
    """A broker order as the string map stored in ``exit_order_result``."""
    result = {
        "broker_order_id": order.broker_order_id,
        "client_order_id": order.client_order_id,
        "side": order.side.value,
        "quantity": str(order.quantity),
        "status": order.status.value,
        "filled_quantity": str(order.filled_quantity),
    }
    if order.average_price is not None:
        result["average_price"] = str(order.average_price)
    return result


def _close_error(order: BrokerOrder) -> OrderError:
    """Why a reversal stopped at its close: the broker's reason, or a code that says so."""
    return order.rejection or OrderError(
        RejectionCode.REVERSAL_CLOSE_FAILED,
        f"The closing order ended {order.status} at the broker; the entry was not placed",
    )
