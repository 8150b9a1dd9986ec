"""The dashboard order flow: ``POST /trading/order`` with a session or an API key.

The caller is already authenticated (and CSRF-checked for cookie sessions) by the HTTP layer.
The account must be the caller's own (404 otherwise, revealing nothing), the allowed-IP list
applies to trading requests as to webhooks, then the additional checks and the hand-off to the
worker, waiting up to ``order_wait_s`` (30 s) before answering 202. Every request leaves one
audit entry; the success entry is written while the worker executes the order.
"""

from __future__ import annotations

from decimal import Decimal

import attrs

from tradecore.attacks import ip_blocked_metadata
from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import User
from tradecore.instruments import resolve_symbol
from tradecore.netaddr import ip_allowed
from tradecore.orders import AlertAction, OrderType, Source
from tradecore.ports.repositories import AllowedIpRepository, TradingAccountRepository
from tradecore.ports.runtime import Clock
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.orders.dispatch import OrderDispatcher, OrderIntent
from tradecore.services.orders.order_checks import IP_NOT_ALLOWED, OrderChecks
from tradecore.services.orders.outcomes import OrderOutcome
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import ACCOUNT_NOT_FOUND, Rejected, refuses_outages


@attrs.frozen
class DashboardOrder:
    """A validated dashboard order body."""

    trading_account_id: str
    symbol: str
    action: AlertAction
    quantity: Decimal
    order_type: OrderType = OrderType.ENTRY


class DashboardOrders:
    """Places manual orders for an authenticated user."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        allowed_ips: AllowedIpRepository,
        checks: OrderChecks,
        dispatcher: OrderDispatcher,
        events: SecurityEvents,
        clock: Clock,
        settings: OrderSettings,
    ) -> None:
        self._accounts = accounts
        self._allowed_ips = allowed_ips
        self._checks = checks
        self._dispatcher = dispatcher
        self._events = events
        self._clock = clock
        self._settings = settings

    @refuses_outages
    async def place(
        self, user: User, order: DashboardOrder, *, simulation: bool, context: RequestContext
    ) -> OrderOutcome:
        """Check and dispatch one order; 503 when a store is down."""
        now = self._clock.now()
        account = await self._accounts.get(order.trading_account_id)
        if account is None or account.user_id != user.id:
            await self._events.record(
                AuditAction.DASHBOARD_ORDER,
                context,
                user_id=user.id,
                success=False,
                error_message="unknown trading account",
            )
            return ACCOUNT_NOT_FOUND
        entries = await self._allowed_ips.list_for_user(user.id)
        if entries and not ip_allowed(context.ip_address, [e.ip_address for e in entries]):
            await self._events.record(
                AuditAction.WEBHOOK_IP_BLOCKED,
                context,
                user_id=user.id,
                success=False,
                error_message="source IP not in the allowed list",
                resource_type="trading_account",
                resource_id=account.id,
                metadata=ip_blocked_metadata(account.id, context.ip_address),
                account_name=account.name,
            )
            return IP_NOT_ALLOWED

        async def audit(success: bool, error: str | None, order_id: str | None = None) -> None:
            await self._events.record(
                AuditAction.DASHBOARD_ORDER,
                context,
                user_id=user.id,
                success=success,
                error_message=error,
                resource_type="order" if order_id else "trading_account",
                resource_id=order_id or account.id,
                metadata={"trading_account_id": account.id, "simulation": simulation},
            )

        symbol = resolve_symbol(order.symbol, account.symbol_map)
        refusal = await self._checks.check(
            user,
            account,
            symbol=symbol,
            quantity=order.quantity,
            simulation=simulation,
            source=Source.DASHBOARD,
            now=now,
        )
        if refusal is not None:
            await audit(False, refusal.detail)
            return refusal
        intent = OrderIntent(
            user=user,
            account=account,
            symbol=symbol,
            action=order.action,
            order_type=order.order_type,
            quantity=order.quantity,
            source=Source.DASHBOARD,
            simulation=simulation,
            admitted_at=self._clock.now(),
        )

        async def record_order(order_id: str) -> None:
            await audit(True, None, order_id)

        dispatched = await self._dispatcher.dispatch(
            intent, now=now, wait_s=self._settings.order_wait_s, on_committed=record_order
        )
        outcome = dispatched.outcome
        if isinstance(outcome, Rejected):
            await audit(False, outcome.detail)
        # a success's entry was written by record_order, while the worker had the order
        return outcome
