"""Handing an order to the user's worker (specification, Endpoints note 5).

1. Write the order intent (status ``queued``) to order history, durably.
2. Push the request on the user's request list if the ``worker:active`` mark exists (one
   atomic step, so the check and the push cannot be split by a worker retiring). Without the
   mark, put a start request on worker-control and wait for the mark, for at most half the
   caller's wait (and the start timeout), then push again. When no worker came in that time
   (no worker host runs, or all are busy starting), the request is parked on the user's list
   anyway: the order is durable, the caller gets 202 within its wait instead of a 503 long
   after the alert's sender gave up, and the first worker host that runs serves it (its
   orphan sweep finds the list), or the worker marks it expired past ``expires_at``.
3. Wait, bounded, for the reply (the rest of the caller's wait): 200 with the OrderResult, or
   202 with the order id. The caller's ``on_committed`` step (its success audit entry) runs
   during this wait, since once the order is handed over the outcome can only be one of
   those two.

Nothing is acknowledged without the durable intent (invariant I1). If the order cannot be
handed over, the API cancels the intent with a compare-and-set; if the worker claimed it first,
the order is on its way and the caller gets 202 instead of a 5xx, so a retry never doubles it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from decimal import Decimal

import attrs

from tradecore.accounts import TradingAccount
from tradecore.errors import DuplicateOrder, StoreUnavailable
from tradecore.identity import User
from tradecore.log_fields import bind_log_fields, current_log_fields
from tradecore.order_lifecycle import Withdrawn
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderRequest,
    OrderStatus,
    OrderType,
    Source,
    recorded_order_type,
)
from tradecore.ports.messaging import OrderQueue, WorkerDirectory
from tradecore.ports.repositories import OrderHistory
from tradecore.ports.runtime import RandomSource
from tradecore.services.alongside import alongside
from tradecore.services.orders.outcomes import Accepted, Queued
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import UNAVAILABLE, Rejected

log = logging.getLogger(__name__)


@attrs.frozen
class OrderIntent:
    """A checked order, ready to be made durable and handed to the worker."""

    user: User
    account: TradingAccount
    symbol: str
    action: AlertAction
    order_type: OrderType
    quantity: Decimal
    source: Source
    simulation: bool
    fingerprint: str | None = None
    admitted_at: datetime | None = None  # when its checks passed (None: not measured)


@attrs.frozen
class Dispatched:
    """The dispatch outcome. The intent row exists exactly when the outcome is not a refusal
    (``durable``); a refusal spent nothing, so the caller may release its replay key."""

    outcome: Rejected | Accepted | Queued
    order_id: str | None = None

    @property
    def durable(self) -> bool:
        return not isinstance(self.outcome, Rejected)


class Duplicate(Exception):
    """The order history already holds this fingerprint: the request is a replay."""


class OrderDispatcher:
    """Steps 1-3 above, shared by the webhook and dashboard paths."""

    def __init__(
        self,
        orders: OrderHistory,
        queue: OrderQueue,
        workers: WorkerDirectory,
        random: RandomSource,
        settings: OrderSettings,
    ) -> None:
        self._orders = orders
        self._queue = queue
        self._workers = workers
        self._random = random
        self._settings = settings

    async def dispatch(
        self,
        intent: OrderIntent,
        *,
        now: datetime,
        wait_s: float,
        on_committed: Callable[[str], Awaitable[object]] | None = None,
    ) -> Dispatched:
        """Run the three steps. Raises ``Duplicate`` when the store refuses the fingerprint.

        ``on_committed`` is awaited with the order id exactly when the outcome is a success
        (``Accepted`` or ``Queued``: the intent is durable and the order on its way), once,
        before this returns; never for a ``Rejected`` outcome. Once the order is handed over
        it runs concurrently with the wait for the worker's reply, and this returns when both
        are done. Its exception is raised here after the wait (the order is on its way all
        the same); an unexpected exception of the wait is raised after it has finished.
        """
        # Outages are handled step by step, not by @refuses_outages: once the intent is durable
        # an outage must withdraw it, or answer 202 when the order is already on its way.
        order_id = self._random.new_id()
        request_id = self._random.new_id()
        # the rest of the request's log lines name the order, its user and its account
        bind_log_fields(user_id=intent.user.id, account_id=intent.account.id, order_id=order_id)
        order_type = recorded_order_type(intent.action, intent.order_type)
        record = OrderHistoryRecord(
            id=order_id,
            user_id=intent.user.id,
            trading_account_id=intent.account.id,
            broker_name="paper" if intent.simulation else intent.account.broker_name,
            symbol=intent.symbol,
            action=intent.action,
            quantity=intent.quantity,
            order_type=order_type,
            source=intent.source,
            simulation=intent.simulation,
            status=OrderStatus.QUEUED,
            created_at=now,
            request_id=request_id,
            fingerprint=intent.fingerprint,
            admitted_at=intent.admitted_at,
        )
        try:
            await self._orders.add(record)
        except DuplicateOrder as e:
            raise Duplicate(intent.fingerprint) from e
        except StoreUnavailable:
            return Dispatched(UNAVAILABLE)

        request = record.to_request(
            expires_at=now + timedelta(seconds=self._settings.max_queue_age_s),
            credentials_ref=None if intent.simulation else intent.account.credentials_ref,
            log_request_id=current_log_fields().request_id,
        )
        try:
            start_wait_s = await self._hand_over(request, wait_s / 2)
        except StoreUnavailable:
            withdrawn = await self._withdraw(order_id, request_id, UNAVAILABLE)
            if on_committed is not None and withdrawn.durable:
                await on_committed(order_id)
            return withdrawn

        reply = self._reply(order_id, request_id, wait_s - start_wait_s)
        if on_committed is None:
            return await reply
        return await alongside(reply, on_committed(order_id))

    async def _reply(self, order_id: str, request_id: str, wait_s: float) -> Dispatched:
        """Step 3: the handed-over order's outcome, Accepted or Queued."""
        try:
            result = await self._queue.wait_result(request_id, wait_s)
        except StoreUnavailable:
            log.warning("reply of order %s not readable; answering 202", order_id)
            result = None
        if result is None:
            return Dispatched(Queued(order_id, request_id), order_id=order_id)
        return Dispatched(Accepted(result), order_id=order_id)

    async def _hand_over(self, request: OrderRequest, budget_s: float) -> float:
        """Step 2; the time it allowed itself to wait for a worker to start (0 when one was
        active)."""
        if await self._queue.push(request):
            return 0.0
        await self._workers.request_start(request.user_id)
        start_wait_s = min(self._settings.worker_start_timeout_s, budget_s)
        started = await self._workers.wait_active(request.user_id, start_wait_s)
        if not (started and await self._queue.push(request)):
            log.warning(
                "user %s: no worker started within %.1f s; order %s waits for one",
                request.user_id,
                start_wait_s,
                request.order_id,
            )
            await self._queue.park(request)
        return start_wait_s

    async def _withdraw(self, order_id: str, request_id: str, refusal: Rejected) -> Dispatched:
        """The push failed: cancel the intent unless the worker already claimed it."""
        try:
            cancelled = await self._orders.transition(order_id, Withdrawn())
        except StoreUnavailable:
            log.error("order %s: push failed and the intent could not be withdrawn", order_id)
            return Dispatched(Queued(order_id, request_id), order_id=order_id)
        if cancelled is None:
            return Dispatched(Queued(order_id, request_id), order_id=order_id)
        return Dispatched(refusal, order_id=order_id)
