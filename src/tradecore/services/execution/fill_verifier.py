"""Fill verification: the consumer of order-tasks (specification, "Fill verification").

Each delivery asks the order's user worker for the broker's view (``check_order_status``),
decides the next state with ``tradecore.fills.decide``, writes fill data to order history (only
what differs from the row: a check that confirms what placement recorded writes nothing), and
settles the message: delete it (final outcome), re-queue it (pending: 30 s; partial), or move
it to the dead-letter queue (retries exhausted). A check that cannot reach the broker counts
as a pending observation, so a long outage ends in the dead letter, visible to operators.

The worker host's loop takes deliveries in batches (``run_batch``): one receive, one read of
every row, then the checks run concurrently, so their writes share a group commit and their
settles share Redis pipelines. Checks of one user never run together: a user's group has one
message in flight at a time, so a batch holds at most one delivery per user.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import attrs

from tradecore import fills
from tradecore.errors import BrokerDisconnected
from tradecore.fills import FillDecision, FillState
from tradecore.log_fields import LogFields, log_fields_bound
from tradecore.order_lifecycle import FillChecked, FillRecorded, ReportedFill
from tradecore.orders import OrderHistoryRecord, OrderStatus
from tradecore.ports.broker import BrokerOrder
from tradecore.ports.messaging import FillDelivery, FillTaskQueue
from tradecore.ports.repositories import OrderHistory
from tradecore.ports.runtime import Clock

log = logging.getLogger(__name__)

StatusCheck = Callable[[OrderHistoryRecord], Awaitable[BrokerOrder | None]]


def _unsettled(row: OrderHistoryRecord) -> bool:
    """The row's placement result is not recorded yet (``fills.decide_unsettled``): it is
    not settled and names no broker order to ask about."""
    return not row.status.is_settled and row.client_order_id is None


_RESUMED_STATES = {
    OrderStatus.PENDING: FillState.PENDING,
    OrderStatus.PARTIALLY_FILLED: FillState.PARTIALLY_FILLED,
}


@attrs.frozen
class FillBatch:
    """What one ``run_batch`` did: the decision of each delivery processed to its end (None:
    nothing to check), in delivery order, and the number of deliveries whose processing
    raised (logged, left in flight: redelivered after the visibility timeout)."""

    decisions: tuple[FillDecision | None, ...] = ()
    failed: int = 0

    @property
    def received(self) -> int:
        """Deliveries the batch received; 0 when none came."""
        return len(self.decisions) + self.failed


class _Failed:
    """A delivery whose processing raised (the marker among the batch's outcomes)."""


_FAILED = _Failed()


def _log_fields(delivery: FillDelivery) -> LogFields:
    """The ids every log line about ``delivery`` carries: its order, user and account."""
    task = delivery.task
    return LogFields(
        user_id=task.user_id, account_id=task.trading_account_id, order_id=task.order_id
    )


class FillVerifier:
    """Processes order-tasks deliveries: in batches (``run_batch``) or one at a time."""

    def __init__(
        self,
        tasks: FillTaskQueue,
        orders: OrderHistory,
        check: StatusCheck,
        clock: Clock,
    ) -> None:
        self._tasks = tasks
        self._orders = orders
        self._check = check
        self._clock = clock

    async def run_once(self, timeout_s: float) -> FillDecision | None:
        """Receive and process at most one delivery; its decision, or None if none came.
        Raises what the processing raised (the delivery stays in flight)."""
        delivery = await self._tasks.receive(timeout_s)
        if delivery is None:
            return None
        return await self.process(delivery)

    async def run_batch(self, limit: int, timeout_s: float) -> FillBatch:
        """Receive up to ``limit`` deliveries (``FillTaskQueue.receive_many``: waiting up to
        ``timeout_s`` only while none is deliverable), read their rows with one
        ``get_many``, and process them concurrently, each as ``process`` would.

        A delivery whose processing raises (its check, write or settle) is logged with its
        order's ids and left in flight, redelivered after the visibility timeout, as after a
        ``run_once`` that raised; the others are processed and settled all the same. A
        failed receive or row read raises (every delivery received stays in flight)."""
        deliveries = await self._tasks.receive_many(limit, timeout_s)
        if not deliveries:
            return FillBatch()
        rows = await self._orders.get_many([d.task.order_id for d in deliveries])
        # One task per delivery (gather wraps each): each binds its own log fields in its
        # own copy of the context, so concurrent checks never log each other's ids.
        outcomes = await asyncio.gather(
            *(self._process_logged(d, rows.get(d.task.order_id)) for d in deliveries)
        )
        decisions = tuple(o for o in outcomes if not isinstance(o, _Failed))
        return FillBatch(decisions, len(outcomes) - len(decisions))

    async def process(self, delivery: FillDelivery) -> FillDecision | None:
        """Check one order and settle its message. None when there was nothing to check.
        Every log line written meanwhile names the order, its user and its account."""
        with log_fields_bound(_log_fields(delivery)):
            row = await self._orders.get(delivery.task.order_id)
            return await self._process(delivery, row)

    async def _process_logged(
        self, delivery: FillDelivery, row: OrderHistoryRecord | None
    ) -> FillDecision | _Failed | None:
        """``_process`` under the delivery's log fields; a failure is logged, not raised."""
        with log_fields_bound(_log_fields(delivery)):
            try:
                return await self._process(delivery, row)
            except Exception:
                log.exception(
                    "fill verification of order %s failed; it is checked again after the"
                    " visibility timeout",
                    delivery.task.order_id,
                )
                return _FAILED

    async def _process(
        self, delivery: FillDelivery, row: OrderHistoryRecord | None
    ) -> FillDecision | None:
        """Check the order of ``delivery``, whose row (None: none) was just read, and settle
        the message."""
        if row is not None and _unsettled(row):
            decision = fills.decide_unsettled(delivery.receive_count)
            log.info("order %s: fill check %d: %s", row.id, delivery.receive_count, decision.reason)
            await self._settle(row, delivery, decision)
            return decision
        state = self._state(row, delivery)
        if row is None or state is None:
            await self._tasks.ack(delivery)
            return None
        try:
            observed = await self._check(row)
            decision = fills.decide(state, observed, delivery.receive_count)
        except BrokerDisconnected:
            observed = None
            decision = fills.decide_unreachable(state, delivery.receive_count)
        await self._write(row, decision, observed)
        log.info(
            "order %s: fill check %d: %s", row.id, delivery.receive_count, decision.state.value
        )
        await self._settle(row, delivery, decision)
        return decision

    async def _settle(
        self, row: OrderHistoryRecord, delivery: FillDelivery, decision: FillDecision
    ) -> None:
        """Apply ``decision`` to the message: dead letter, re-queue or delete."""
        if decision.dead_letter:
            log.error("order %s: fill verification dead-lettered (%s)", row.id, decision.reason)
            await self._tasks.dead_letter(delivery, decision.reason or "retries exhausted")
        elif decision.requeue_after_s is not None:
            await self._tasks.retry(delivery, decision.requeue_after_s)
        else:
            if decision.reason:
                log.info("order %s: %s", row.id, decision.reason)
            await self._tasks.ack(delivery)

    @staticmethod
    def _state(row: OrderHistoryRecord | None, delivery: FillDelivery) -> FillState | None:
        if row is None:
            return None
        if delivery.receive_count == 1:
            return FillState.VERIFICATION_QUEUED
        return _RESUMED_STATES.get(row.status)

    async def _write(
        self, row: OrderHistoryRecord, decision: FillDecision, observed: BrokerOrder | None
    ) -> None:
        change = self._change(row, decision, observed)
        if change is None:
            return
        if any(getattr(row, field) != value for field, value in change.fields().items()):
            await self._orders.transition(row.id, change)

    def _change(
        self, row: OrderHistoryRecord, decision: FillDecision, observed: BrokerOrder | None
    ) -> FillChecked | FillRecorded | None:
        """What the check learned, as an order change; None when it learned nothing."""
        fill = None
        if observed is not None:
            fill = ReportedFill(observed.filled_quantity, observed.average_price)
        status = decision.order_status
        if status is None:
            return None if fill is None else FillRecorded(fill)
        filled_at = None
        if fill is not None and status is OrderStatus.FILLED:
            filled_at = row.filled_at or self._clock.now()
        return FillChecked(status, fill, filled_at)
