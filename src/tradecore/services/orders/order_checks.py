"""The checks every order passes after authentication, before anything is queued.

Order (specification, "Additional checks"): per-user rate limit (429), plan (403: the free
plan trades in simulation only), daily order cap (429), verified broker credentials (400 on the
webhook path, 403 on the dashboard path), latest terms accepted (403); then the order itself:
the symbol must be allowed for the account (400) and the quantity within its limit (400).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from tradecore.accounts import TradingAccount
from tradecore.identity import User
from tradecore.limits import daily_cap_reached, real_orders_allowed, start_of_utc_day
from tradecore.orders import Source
from tradecore.ports.broker import InstrumentDirectory
from tradecore.ports.protection import RateDecision, RateLimiter
from tradecore.ports.repositories import OrderHistory
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.webhooks.checks import symbol_allowed

IP_NOT_ALLOWED = Rejected(403, "ip_not_allowed", "Source IP not allowed")
"""The request came from an address outside the user's allowed-IP list (both order paths)."""


class OrderChecks:
    """Runs the additional checks; the first failure decides."""

    def __init__(
        self,
        limiter: RateLimiter,
        orders: OrderHistory,
        instruments: InstrumentDirectory,
        settings: OrderSettings,
    ) -> None:
        self._limiter = limiter
        self._orders = orders
        self._instruments = instruments
        self._settings = settings

    async def check(
        self,
        user: User,
        account: TradingAccount,
        *,
        symbol: str,
        quantity: Decimal,
        simulation: bool,
        source: Source,
        now: datetime,
        orders_today: int | None = None,
        rate: RateDecision | None = None,
    ) -> Rejected | None:
        """None when the order may go ahead; otherwise the refusal.

        ``orders_today`` is the user's order count since the start of ``now``'s UTC day
        (``OrderHistory.count_since``) when the caller has already read it (the webhook path
        reads it with the token lookup); without it the count is read here, in its turn.
        ``rate`` is this request's rate-limit decision when the caller has already counted it
        against ``settings.rate_limit_per_minute`` and ``rate_window_s`` (the webhook path
        counts it with its replay claim, ``WebhookAdmission``); without it the limiter is hit
        here, first."""
        settings = self._settings
        if rate is None:
            rate = await self._limiter.hit(
                user.id, settings.rate_limit_per_minute, settings.rate_window_s
            )
        if not rate.allowed:
            return Rejected(429, "rate_limited", "Too many requests", rate.retry_after_s)
        plan = user.effective_plan(now)
        if not simulation and not real_orders_allowed(plan):
            return Rejected(403, "plan_simulation_only", "Your plan allows simulation orders only")
        if orders_today is None:
            orders_today = await self._orders.count_since(user.id, start_of_utc_day(now))
        if daily_cap_reached(plan, orders_today, settings.plan_caps):
            return Rejected(429, "daily_cap_reached", "Daily order limit of your plan reached")
        if not simulation and not account.credentials_verified:
            status = 400 if source is Source.WEBHOOK else 403
            return Rejected(status, "credentials_unverified", "Broker credentials not verified")
        if user.accepted_terms_version != settings.terms_version:
            return Rejected(403, "terms_not_accepted", "Accept the latest terms of service")
        # The venue's list only when the account allows every symbol: a venue's list may have
        # to be loaded (a round trip) and the webhook path has a 3 s caller budget.
        listed: frozenset[str] = frozenset()
        if not account.allowed_symbols:
            listed = await self._instruments.symbols(account.broker_name, testnet=account.testnet)
        if not symbol_allowed(symbol, account.allowed_symbols, listed):
            return Rejected(400, "symbol_not_allowed", f"Symbol {symbol} is not allowed")
        if quantity > account.max_quantity:
            return Rejected(400, "quantity_too_large", "Quantity exceeds the account's limit")
        return None
