"""One user's trading worker: executes that user's requests, one at a time, at the broker.

Execution of a request is crash-safe and idempotent:

1. The order-history row must be ``queued``. An order that waited past its ``expires_at`` is
   marked ``expired`` and never sent late; the worker that expired it writes an
   ``order_expired`` audit entry (the owner finds it in the history and the audit log).
2. The worker reads the position, and claims the row with a compare-and-set
   ``queued -> submitted`` that records ``position_before``. If the API withdrew the intent
   first, nothing is sent. A request that names its broker (``OrderRequest.broker_name``)
   is claimed without reading the row first; when that compare-and-set finds the row no
   longer ``queued`` (a duplicate delivery, a recovered or settled row, no row at all), the
   worker reads the row and goes on from its status as below. A broker that keeps nothing
   of a placement until the order's outcome commits with it
   (``Broker.placements_wait_for_outcome``: the paper broker in real mode) needs no claim
   for a plan of one step (or none: an exit with nothing to close): the worker places it
   and writes claim and outcome in one compare-and-set from ``queued``
   (``ClaimedAndExecuted``), one commit fewer. If that
   write does not take (withdrawn, another execution recorded the order) or fails, the
   order history tells the broker, which drops the placement; the worker goes on as for a
   lost claim. A broker call that fails for good leaves the row ``failed`` as a failed
   claim does. A plan of two steps (a reversal) is claimed first: its close is stored
   before the entry is placed, so the row must say where the plan started.
3. The broker steps are ``reversal.plan(position_before, ...)``, each sent with the client
   order id ``reversal.client_order_id(order_id, step)``. A row found ``submitted`` (the
   previous worker died mid-order) is re-planned from its recorded position and re-executed:
   the broker returns the orders it already has instead of placing them again. Only when this
   call won the claim (promptly: ``FRESH_CLAIM_S``), on its first attempt, are the steps sent
   as ``fresh``: the broker may skip looking for earlier placements, since placing only
   follows a claim and one claim wins.
4. The outcome is written with ``submitted -> <status>``, and whenever a broker order was
   placed a fill check is scheduled on order-tasks 2-3 s later, sent while the outcome
   commits (one round trip off the answer's path). ``execute`` returns only once both are
   done (it raises ``StoreUnavailable`` otherwise), so the worker host completes the request
   only after them. A check that gets there before the outcome (a crash or an outage between
   the two) finds the row still ``submitted``, asks nothing and looks again later
   (``fills.decide_unsettled``). A row found settled (a retry after the outcome write committed
   but its answer was lost, a recovery after a crash right after that write, a duplicate
   delivery) gets its fill check scheduled again when it has broker orders: the call that
   settled it may have ended before scheduling it. A duplicate check is harmless: the fill
   verifier writes only what differs from the row (nothing, once a check recorded the fill)
   and settles its own message.

The broker connections are the worker's ``BrokerSessions``: opened with the account's
credentials, re-opened when an order names newer credentials, and re-opened up to 3 times
after a drop (specification: "automatic reconnect, up to 3 retries") before the order fails
with ``broker_unavailable``. Credentials the venue refuses fail the order with
``credentials_rejected``.

A store that cannot be reached (the order history, the books a broker keeps in it, or the
order-tasks queue) makes ``execute`` raise ``StoreUnavailable`` and returns no result; calling
it again with the same request is safe (the worker host does, after a backoff). A row the
interrupted call had claimed is found ``submitted`` and reconciled as in 3 (its steps are not
fresh); a row still ``queued`` is claimed by the new call, which sends its steps as fresh only
if it wins that claim; a row it had settled is found settled, as in 4.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

import attrs

from tradecore import reversal
from tradecore.audit import WORKER_CONTEXT, AuditAction, AuditEntry
from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.fills import first_check_delay
from tradecore.log_fields import LogFields, log_fields_bound
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    ClaimFailed,
    Executed,
    Expired,
    Interrupted,
    Submitted,
)
from tradecore.orders import (
    Instruction,
    OrderError,
    OrderHistoryRecord,
    OrderRequest,
    OrderResult,
    OrderStatus,
    RejectionCode,
    to_instruction,
)
from tradecore.ports.broker import Broker, BrokerAccountSource, BrokerFactory, BrokerOrder
from tradecore.ports.messaging import FillTask, FillTaskQueue
from tradecore.ports.repositories import AuditLog, OrderHistory
from tradecore.ports.runtime import Clock, Sleeper
from tradecore.services.alongside import alongside
from tradecore.services.execution.broker_sessions import BrokerSessions, Route

log = logging.getLogger(__name__)

FRESH_CLAIM_S = 1.0
"""A claim won within this long of the start of ``execute`` is fresh (a healthy one takes a
millisecond). A slower one (a stall, a partition) may have outlived the worker's lease while a
successor recovered the row and placed its orders, so its steps are sent as not fresh."""


def fill_check_jitter(order_id: str) -> float:
    """A number in [0, 1) derived from the order id, spreading first checks over 2-3 s."""
    digest = hashlib.sha256(order_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _route_of(row: OrderHistoryRecord) -> Route:
    """The connection a stored order goes through (the credentials the worker has)."""
    return Route(row.trading_account_id, row.broker_name, row.simulation)


class UserWorker:
    """Executes one user's order requests and fill checks through that user's brokers."""

    def __init__(
        self,
        user_id: str,
        orders: OrderHistory,
        brokers: BrokerFactory,
        fill_tasks: FillTaskQueue,
        clock: Clock,
        sleeper: Sleeper,
        *,
        accounts: BrokerAccountSource,
        audit: AuditLog | None = None,
    ) -> None:
        self.user_id = user_id
        self._orders = orders
        self._audit = audit
        self._sessions = BrokerSessions(brokers, accounts, sleeper)
        self._fill_tasks = fill_tasks
        self._clock = clock
        self._sleeper = sleeper

    async def close(self) -> None:
        """Close the worker's broker connections (it serves no more requests)."""
        await self._sessions.close()

    async def execute(self, request: OrderRequest) -> OrderResult:
        """Carry out ``request`` exactly once and return its result (see the module doc).
        Raises ``StoreUnavailable`` when a store could not be reached; the same request may
        then be executed again. Every log line written meanwhile names the order, its user,
        its account and the API request that queued it."""
        fields = LogFields(
            request_id=request.log_request_id,
            user_id=request.user_id,
            account_id=request.trading_account_id,
            order_id=request.order_id,
        )
        with log_fields_bound(fields):
            result = await self._execute(request)
            log.info("order %s executed: %s", request.order_id, result.status.value)
        return result

    async def _execute(self, request: OrderRequest) -> OrderResult:
        started = self._clock.now()
        if request.broker_name is not None:
            route = Route(
                request.trading_account_id,
                request.broker_name,
                request.simulation,
                request.credentials_ref,
            )
            claimed = await self._claim(request, route, request.instruction, request.quantity)
            if claimed is not None:
                return await self._proceed(claimed, started)
            # Not queued: a duplicate delivery, a recovered or settled row, or no row.
        row = await self._orders.get(request.order_id)
        if row is None:
            log.error("order %s has no order-history row; not executed", request.order_id)
            return _orphan_result(request)
        if row.status is OrderStatus.QUEUED:
            route = attrs.evolve(_route_of(row), credentials_ref=request.credentials_ref)
            instruction = to_instruction(row.action, row.order_type)
            claimed = await self._claim(request, route, instruction, row.quantity)
            if claimed is None:
                return await self._current(row)
            return await self._proceed(claimed, started)
        if row.status is not OrderStatus.SUBMITTED:
            return await self._settled(row)  # a duplicate delivery, a retry or a recovery
        return await self._run(row, fresh=False)  # recovered: earlier placements may exist

    async def check_order_status(self, row: OrderHistoryRecord) -> BrokerOrder | None:
        """The broker's current view of the row's main order (fill verification)."""
        client_order_id = row.client_order_id
        if client_order_id is None:
            return None
        return await self._sessions.call(
            _route_of(row), lambda broker: broker.order_status(client_order_id, row.symbol)
        )

    async def _proceed(self, claimed: OrderHistoryRecord, started: datetime) -> OrderResult:
        """Go on with a row this call, begun at ``started``, moved out of ``queued``."""
        if claimed.status is not OrderStatus.SUBMITTED:
            # expired while queued, the broker unreachable, or settled unclaimed
            return claimed.to_result()
        fresh = (self._clock.now() - started).total_seconds() < FRESH_CLAIM_S
        return await self._run(claimed, fresh=fresh)

    async def _claim(
        self, request: OrderRequest, route: Route, instruction: Instruction, quantity: Decimal
    ) -> OrderHistoryRecord | None:
        """Move the row out of ``queued`` (compare-and-set): to ``expired`` past
        ``request.expires_at``, ``failed`` when the broker is unreachable, else ``submitted``
        with ``position_before``; or, when the broker keeps nothing of a placement until its
        outcome is written and the plan has at most one step, straight to the outcome
        (``_execute_unclaimed``).
        None when the row is not ``queued`` (or missing)."""
        order_id = request.order_id
        now = self._clock.now()
        if now >= request.expires_at:
            expired = OrderError(RejectionCode.ORDER_EXPIRED, "Order expired before execution")
            row = await self._orders.transition(order_id, Expired(expired))
            if row is not None:
                await self._audit_expiry(row, now)
            return row
        try:
            positions, waits = await self._sessions.call(route, _positions_and_kind)
        except (BrokerDisconnected, CredentialsRejected) as e:
            return await self._orders.transition(order_id, ClaimFailed(_call_error(e)))
        position_before = positions.get(request.symbol, Decimal(0))
        claim = Submitted(now, position_before)
        if waits:  # the plan is made here only then: a claimed row is planned by ``_run``
            plan = reversal.plan(position_before, instruction, quantity)
            if len(plan.steps) <= 1:
                return await self._execute_unclaimed(request, route, plan, claim)
        return await self._orders.transition(order_id, claim)

    async def _execute_unclaimed(
        self, request: OrderRequest, route: Route, plan: reversal.ExecutionPlan, claim: Submitted
    ) -> OrderHistoryRecord | None:
        """Place the ``plan`` (one step or none) of the queued order without claiming it
        first, then write the claim and the outcome in one compare-and-set from ``queued``
        (module doc, 2). The step goes out as fresh: a placement stored earlier would have
        moved the row out of ``queued`` with its outcome, so this write would not take and
        this placement would be dropped with it. None when the write did not take."""
        try:
            executed = await self._execute_plan(
                request.order_id, request.symbol, route, plan, fresh=True
            )
        except (BrokerDisconnected, CredentialsRejected) as e:
            # Nothing kept at the broker: the failure leaves queued as a failed claim does.
            return await self._orders.transition(request.order_id, ClaimFailed(_call_error(e)))
        task = FillTask(request.order_id, request.user_id, request.trading_account_id)
        return await self._settle(ClaimedAndExecuted(claim, executed), task)

    async def _audit_expiry(self, row: OrderHistoryRecord, now: datetime) -> None:
        """One audit entry for an order this worker expired (only the winner of the
        compare-and-set writes it). An order that waited for a worker until it was too old
        is something its owner must be able to find, beside the history row."""
        if self._audit is None:
            return
        await self._audit.append(
            AuditEntry(
                user_id=row.user_id,
                action=AuditAction.ORDER_EXPIRED,
                success=False,
                context=WORKER_CONTEXT,
                created_at=now,
                error_message="Order expired before execution",
                resource_type="order",
                resource_id=row.id,
                metadata={
                    "trading_account_id": row.trading_account_id,
                    "source": row.source.value,
                    "queued_s": round((now - row.created_at).total_seconds(), 3),
                },
            )
        )

    async def _run(self, row: OrderHistoryRecord, *, fresh: bool) -> OrderResult:
        """Execute the submitted ``row``. ``fresh``: this call won the row's claim, so no
        broker order of it can exist yet; only the first attempt sends its steps as fresh
        (one cut off by a disconnect may have reached the broker)."""
        position = row.position_before if row.position_before is not None else Decimal(0)
        plan = reversal.plan(position, to_instruction(row.action, row.order_type), row.quantity)
        try:
            executed = await self._execute_plan(
                row.id, row.symbol, _route_of(row), plan, fresh=fresh
            )
        except (BrokerDisconnected, CredentialsRejected) as e:
            failed = await self._orders.transition(row.id, Interrupted(_call_error(e)))
            return failed.to_result() if failed is not None else await self._current(row)
        updated = await self._settle(executed, _fill_task(row))
        if updated is None:
            return await self._current(row)
        return updated.to_result()

    async def _execute_plan(
        self,
        order_id: str,
        symbol: str,
        route: Route,
        plan: reversal.ExecutionPlan,
        *,
        fresh: bool,
    ) -> Executed:
        """Send ``plan``'s steps through the route's connection (only the first attempt as
        ``fresh``) and say what the outcome writes. Raises ``BrokerDisconnected`` after the
        last reconnect and ``CredentialsRejected``."""
        attempts = 0

        async def execute_plan(broker: Broker) -> reversal.ExecutionOutcome:
            nonlocal attempts
            attempts += 1
            first = attempts == 1
            return await reversal.execute(
                broker, self._sleeper, order_id, symbol, plan, fresh=fresh and first
            )

        outcome = await self._sessions.call(route, execute_plan)
        broker_order_id = outcome.broker_refs[-1] if outcome.broker_refs else None
        now = self._clock.now()
        return Executed(
            status=outcome.status,
            order_id=broker_order_id,
            client_order_id=outcome.main_client_order_id,
            broker_refs=outcome.broker_refs,
            fill_price=outcome.fill_price,
            fill_quantity=outcome.filled_quantity,
            filled_at=now if outcome.status is OrderStatus.FILLED else None,
            auto_exit=outcome.auto_exit,
            exit_quantity=outcome.exit_quantity,
            exit_order_result=outcome.exit_order_result,
            error=outcome.error,
            placed_at=now if outcome.broker_refs else None,
        )

    async def _settle(
        self, change: Executed | ClaimedAndExecuted, task: FillTask
    ) -> OrderHistoryRecord | None:
        """Write the execution's outcome; when it placed broker orders, the fill check goes
        out while it commits (module doc, 4). None when the compare-and-set did not take."""
        executed = change if isinstance(change, Executed) else change.execution
        if _placed(executed):
            return await alongside(
                self._orders.transition(task.order_id, change), self._send_fill_check(task)
            )
        return await self._orders.transition(task.order_id, change)

    async def _settled(self, row: OrderHistoryRecord) -> OrderResult:
        """The result of ``row``, found settled by this call. Schedules its fill check when it
        has broker orders, since whoever settled it may not have (module doc, 4). Raises
        ``StoreUnavailable`` when the task could not be sent."""
        if _placed(row):
            await self._send_fill_check(_fill_task(row))
        return row.to_result()

    async def _send_fill_check(self, task: FillTask) -> None:
        """Send the order's first fill check. Raises ``StoreUnavailable`` when it could not
        be sent. A repeated send for the same order (a send whose answer was lost, or a retry
        or recovery that finds the row settled) is deduplicated by the queue by order id,
        within its deduplication window, so the order gets one check series."""
        await self._fill_tasks.send(task, first_check_delay(fill_check_jitter(task.order_id)))

    async def _current(self, row: OrderHistoryRecord) -> OrderResult:
        """The result of ``row`` as another call left it (through ``_settled`` once settled)."""
        latest = await self._orders.get(row.id) or row
        if not latest.status.is_settled:
            return latest.to_result()
        return await self._settled(latest)


async def _positions_and_kind(broker: Broker) -> tuple[Mapping[str, Decimal], bool]:
    """The account's positions, and whether the broker keeps its placements only with their
    outcome (``Broker.placements_wait_for_outcome``)."""
    return await broker.positions(), broker.placements_wait_for_outcome


def _fill_task(row: OrderHistoryRecord) -> FillTask:
    return FillTask(row.id, row.user_id, row.trading_account_id)


def _placed(row: OrderHistoryRecord | Executed) -> bool:
    """The settled row (or the execution about to settle it) has broker orders: it gets a fill
    check."""
    return row.client_order_id is not None and bool(row.broker_refs)


def _call_error(e: BrokerDisconnected | CredentialsRejected) -> OrderError:
    """The order's error when its broker call failed for good."""
    if isinstance(e, CredentialsRejected):
        return OrderError(
            RejectionCode.CREDENTIALS_REJECTED,
            "The broker refused the account's credentials; update and verify them",
            broker_message=str(e) or None,
        )
    return OrderError(RejectionCode.BROKER_UNAVAILABLE, "Broker unreachable after 3 reconnects")


def _orphan_result(request: OrderRequest) -> OrderResult:
    return OrderResult(
        order_id=request.order_id,
        request_id=request.request_id,
        status=OrderStatus.FAILED,
        symbol=request.symbol,
        action=request.action,
        quantity=request.quantity,
        simulation=request.simulation,
        error=OrderError(RejectionCode.BROKER_UNAVAILABLE, "Order record missing"),
    )
