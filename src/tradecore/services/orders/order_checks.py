"""The checks every order passes after authentication, before anything is queued.

Order (specification, "Additional checks"): per-user rate limit (429), plan (403: the free
plan trades in simulation only), daily order cap (429), verified broker credentials (400 on the
webhook path, 403 on the dashboard path), latest terms accepted (403); then the order itself:
the symbol must be allowed for the account (400) and the quantity within its limit (400).

The daily cap is a counter taken before the order row is written (``daily_orders``): a request
the cap admits holds a slot, which the checks give back themselves when a later check refuses
it (or fails), so a refused request leaves the count as the order history leaves it.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from tradecore.accounts import TradingAccount
from tradecore.identity import User
from tradecore.limits import real_orders_allowed
from tradecore.orders import Source
from tradecore.ports.broker import InstrumentDirectory
from tradecore.ports.protection import DailyCount, RateDecision, RateLimiter
from tradecore.services.orders.daily_orders import DailyOrders, daily_quota
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.webhooks.checks import symbol_allowed

IP_NOT_ALLOWED = Rejected(403, "ip_not_allowed", "Source IP not allowed")
"""The request came from an address outside the user's allowed-IP list (both order paths)."""
DAILY_CAP_REACHED = Rejected(429, "daily_cap_reached", "Daily order limit of your plan reached")


class OrderChecks:
    """Runs the additional checks; the first failure decides."""

    def __init__(
        self,
        limiter: RateLimiter,
        daily: DailyOrders,
        instruments: InstrumentDirectory,
        settings: OrderSettings,
    ) -> None:
        self._limiter = limiter
        self._daily = daily
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
        rate: RateDecision | None = None,
        daily: DailyCount | None = None,
    ) -> Rejected | None:
        """None when the order may go ahead, its daily slot taken (the caller gives it back
        with ``DailyOrders.release`` if no order row is written); otherwise the refusal, and
        no slot is held for this request.

        ``rate`` is this request's rate-limit decision when the caller has already counted it
        against ``settings.rate_limit_per_minute`` and ``rate_window_s`` (the webhook path
        counts it with its replay claim, ``WebhookAdmission``); without it the limiter is hit
        here, first. ``daily`` is this request's daily count (COUNTED or CAP_REACHED) when the
        caller has already taken it with the quota ``daily_quota(user, now, plan_caps)`` (the
        webhook's admission does); without it the count is taken here, in the cap's turn.
        A slot counted for this request, here or by the caller, is given back here when a
        later check refuses or raises."""
        settings = self._settings
        if rate is None:
            rate = await self._limiter.hit(
                user.id, settings.rate_limit_per_minute, settings.rate_window_s
            )
        if not rate.allowed:
            return Rejected(429, "rate_limited", "Too many requests", rate.retry_after_s)
        quota = daily_quota(user, now, settings.plan_caps)
        try:
            plan = user.effective_plan(now)
            if not simulation and not real_orders_allowed(plan):
                simulation_only = Rejected(
                    403, "plan_simulation_only", "Your plan allows simulation orders only"
                )
                return await self._give_back(simulation_only, user, quota.day, daily)
            if daily is None:
                daily = await self._daily.take(user.id, quota)
            if daily is DailyCount.CAP_REACHED:
                return DAILY_CAP_REACHED
            refusal = await self._order_checks(account, symbol, quantity, simulation, source, user)
        except BaseException:
            if daily is DailyCount.COUNTED:
                await self._daily.release(user.id, quota.day)
            raise
        if refusal is not None:
            return await self._give_back(refusal, user, quota.day, daily)
        return None

    async def _give_back(
        self, refusal: Rejected, user: User, day: date, daily: DailyCount | None
    ) -> Rejected:
        if daily is DailyCount.COUNTED:
            await self._daily.release(user.id, day)
        return refusal

    async def _order_checks(
        self,
        account: TradingAccount,
        symbol: str,
        quantity: Decimal,
        simulation: bool,
        source: Source,
        user: User,
    ) -> Rejected | None:
        """The checks after the daily cap, in the specification's order."""
        settings = self._settings
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
