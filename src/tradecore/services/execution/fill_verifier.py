"""Fill verification: the consumer of order-tasks (specification, "Fill verification").

Each delivery asks the order's user worker for the broker's view (``check_order_status``),
decides the next state with ``tradecore.fills.decide``, writes fill data to order history (only
what differs from the row: a check that confirms what placement recorded writes nothing), and
settles the message: delete it (final outcome), re-queue it (pending: 30 s; partial), or move
it to the dead-letter queue (retries exhausted). A check that cannot reach the broker counts
as a pending observation, so a long outage ends in the dead letter, visible to operators.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

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

_RESUMED_STATES = {
    OrderStatus.PENDING: FillState.PENDING,
    OrderStatus.PARTIALLY_FILLED: FillState.PARTIALLY_FILLED,
}


class FillVerifier:
    """Processes order-tasks deliveries one at a time."""

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
        """Receive and process at most one delivery; its decision, or None if none came."""
        delivery = await self._tasks.receive(timeout_s)
        if delivery is None:
            return None
        return await self.process(delivery)

    async def process(self, delivery: FillDelivery) -> FillDecision | None:
        """Check one order and settle its message. None when there was nothing to check.
        Every log line written meanwhile names the order, its user and its account."""
        task = delivery.task
        fields = LogFields(
            user_id=task.user_id, account_id=task.trading_account_id, order_id=task.order_id
        )
        with log_fields_bound(fields):
            decision = await self._process(delivery)
        return decision

    async def _process(self, delivery: FillDelivery) -> FillDecision | None:
        row = await self._orders.get(delivery.task.order_id)
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
        if decision.dead_letter:
            log.error("order %s: fill verification dead-lettered (%s)", row.id, decision.reason)
            await self._tasks.dead_letter(delivery, decision.reason or "retries exhausted")
        elif decision.requeue_after_s is not None:
            await self._tasks.retry(delivery, decision.requeue_after_s)
        else:
            if decision.reason:
                log.info("order %s: %s", row.id, decision.reason)
            await self._tasks.ack(delivery)
        return decision

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
