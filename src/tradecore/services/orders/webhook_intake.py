"""The webhook order flow: ``POST /webhook/{token}/order`` (docs/architecture.md, "The flows").

1. strict parse (400 ``webhook_payload_invalid``);
2. layer 1: the URL token resolves to account and user in one lookup (404 / 403 disabled),
   which also reads the user's allowed IPs;
3. the allowed-IP list (403 ``webhook_ip_blocked``), before anything of the user's is spent;
4. layer 2 timestamp (401 ``webhook_timestamp_expired``, detail ``Request expired``), layer 3
   secret (401 ``webhook_credential_attack``) - both skipped in simulation - and layer 4
   replay (409 ``webhook_replay_attack``), over the symbol resolved to the venue's id
   (``tradecore.instruments``: ``BINANCE:BTCUSDT`` and ``BTCUSDT.P`` are one order);
5. the additional checks (rate limit, plan, daily cap, credentials, terms, symbol);
6. the durable intent and the hand-off to the worker (OrderDispatcher).

Layer 4, the rate-limit hit and the daily count are one step (``WebhookAdmission``, one round
trip to the key-value store): a replay spends no rate-limit slot and a request refused by the
rate limit (429) stores no replay key and no daily slot; the 409 still comes before the 429,
the 429 before the rest. The daily slot is decided there and refused in its turn by the
checks, which give it back when a later check refuses (``daily_orders``); a day's counter the
store does not hold is seeded from the order history first (a second round trip, once per user
and day or after the store lost its data).

Every request leaves exactly one audit entry; the success entry is written while the worker
executes the order, and the answer waits for both. A 5xx before the intent is durable releases
the replay key and the daily slot, so the sender's retry of the same body is not refused as a
replay and the count stays the order history's.
"""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

from tradecore.attacks import (
    credential_attack_metadata,
    expired_metadata,
    ip_blocked_metadata,
    payload_invalid_metadata,
    replay_metadata,
)
from tradecore.audit import AuditAction, RequestContext
from tradecore.errors import KeyValueStoreUnavailable, StoreUnavailable
from tradecore.identity import User
from tradecore.instruments import resolve_symbol
from tradecore.netaddr import ip_allowed
from tradecore.orders import Source
from tradecore.ports.protection import (
    Admission,
    DailyCount,
    DailyQuota,
    ReplayStore,
    WebhookAdmission,
)
from tradecore.ports.repositories import TradingAccountRepository
from tradecore.ports.runtime import Clock
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.orders.daily_orders import SEED_ATTEMPTS, DailyOrders, daily_quota
from tradecore.services.orders.dispatch import Duplicate, OrderDispatcher, OrderIntent
from tradecore.services.orders.order_checks import IP_NOT_ALLOWED, OrderChecks
from tradecore.services.orders.outcomes import OrderOutcome
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import NOT_FOUND, UNAVAILABLE, Rejected
from tradecore.webhooks.checks import (
    hash_secret,
    replay_fingerprint,
    replay_ttl_seconds,
    request_age_seconds,
    secret_matches,
    timestamp_within_window,
)
from tradecore.webhooks.payload import PayloadInvalid, parse_webhook_body

log = logging.getLogger(__name__)


class _Held:
    """What this request holds in the key-value store and must give back if it fails before
    its intent is durable: the replay claim and the daily slot (user id, fingerprint, day)."""

    def __init__(self) -> None:
        self.fingerprint: tuple[str, str] | None = None
        self.daily: tuple[str, date] | None = None


class WebhookIntake:
    """Validates a webhook and hands the order to the user's worker."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        admission: WebhookAdmission,
        replay: ReplayStore,
        daily: DailyOrders,
        checks: OrderChecks,
        dispatcher: OrderDispatcher,
        events: SecurityEvents,
        clock: Clock,
        settings: OrderSettings,
    ) -> None:
        self._accounts = accounts
        self._admission = admission
        self._replay = replay
        self._daily = daily
        self._checks = checks
        self._dispatcher = dispatcher
        self._events = events
        self._clock = clock
        self._settings = settings

    async def handle(
        self, token: str, body: bytes, *, simulation: bool, context: RequestContext
    ) -> OrderOutcome:
        """Run the flow for one request; never raises for bad input or a store outage (503)."""
        # Not @refuses_outages: an outage must first give back what this request holds.
        held = _Held()
        try:
            return await self._handle(token, body, simulation, context, held)
        except StoreUnavailable:
            log.warning("webhook answered 503: a store is unavailable")
            await self._release(held)
            return UNAVAILABLE

    async def _handle(
        self,
        token: str,
        body: bytes,
        simulation: bool,
        context: RequestContext,
        held: _Held,
    ) -> OrderOutcome:
        now = self._clock.now()
        payload = parse_webhook_body(body, simulation=simulation)
        found = await self._accounts.webhook_owner(hash_secret(token))

        async def audit(
            action: AuditAction,
            success: bool,
            *,
            resource_type: str = "trading_account",
            resource_id: str | None = None if found is None else found.account.id,
            **fields: Any,
        ) -> None:
            await self._events.record(
                action,
                context,
                user_id=None if found is None else found.user.id,
                success=success,
                resource_type=resource_type,
                resource_id=resource_id,
                account_name=None if found is None else found.account.name,
                **fields,
            )

        if isinstance(payload, PayloadInvalid):
            account_id = None if found is None else found.account.id
            await audit(
                AuditAction.WEBHOOK_PAYLOAD_INVALID,
                False,
                error_message=payload.reason,
                metadata=payload_invalid_metadata(account_id, payload.reason),
            )
            return Rejected(400, "webhook_payload_invalid", payload.reason)
        if found is None:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message="unknown webhook token")
            return NOT_FOUND
        account, user = found.account, found.user
        if user.disabled:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message="user disabled")
            return Rejected(403, "forbidden", "Forbidden")

        if found.allowed_ips and not ip_allowed(context.ip_address, found.allowed_ips):
            await audit(
                AuditAction.WEBHOOK_IP_BLOCKED,
                False,
                error_message="source IP not in the allowed list",
                metadata=ip_blocked_metadata(account.id, context.ip_address),
            )
            return IP_NOT_ALLOWED

        if not simulation:
            assert payload.timestamp is not None  # required for real orders by the parser
            if not timestamp_within_window(now, payload.timestamp, account.max_request_age):
                age = request_age_seconds(now, payload.timestamp)
                await audit(
                    AuditAction.WEBHOOK_TIMESTAMP_EXPIRED,
                    False,
                    error_message="Request expired",
                    metadata=expired_metadata(account.id, age, account.max_request_age),
                )
                return Rejected(401, "request_expired", "Request expired")
            if not secret_matches(payload.secret, account.webhook_secret_hash):
                await audit(
                    AuditAction.WEBHOOK_CREDENTIAL_ATTACK,
                    False,
                    error_message="wrong webhook secret",
                    metadata=credential_attack_metadata(account.id),
                )
                return Rejected(401, "unauthorized", "Unauthorized")

        symbol = resolve_symbol(payload.symbol, account.symbol_map)
        fingerprint = replay_fingerprint(
            user.id,
            payload.action,
            symbol,
            payload.quantity,
            payload.timestamp,
            payload.secret,
        )
        ttl = replay_ttl_seconds(now, payload.timestamp, account.max_request_age)
        quota = daily_quota(user, now, self._settings.plan_caps)
        try:  # handled here: a key-value store outage is this request's one audit entry
            admission = await self._admit(fingerprint, ttl, user, quota)
        except StoreUnavailable:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message="key-value store down")
            return UNAVAILABLE
        replay_refusal = Rejected(409, "replay", "Duplicate request")
        if not admission.fresh:
            await audit(
                AuditAction.WEBHOOK_REPLAY_ATTACK,
                False,
                error_message="duplicate request",
                metadata=replay_metadata(account.id, fingerprint),
            )
            return replay_refusal
        if admission.claimed:
            held.fingerprint = (user.id, fingerprint)

        # the checks give the daily slot back themselves when they refuse or fail
        refusal = await self._checks.check(
            user,
            account,
            symbol=symbol,
            quantity=payload.quantity,
            simulation=simulation,
            source=Source.WEBHOOK,
            now=now,
            rate=admission.rate,
            daily=admission.daily,
        )
        if refusal is None and admission.daily is DailyCount.COUNTED:
            held.daily = (user.id, quota.day)
        if refusal is not None:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message=refusal.detail)
            return refusal

        intent = OrderIntent(
            user=user,
            account=account,
            symbol=symbol,
            action=payload.action,
            order_type=payload.order_type,
            quantity=payload.quantity,
            source=Source.WEBHOOK,
            simulation=simulation,
            fingerprint=fingerprint,
            admitted_at=self._clock.now(),
        )

        async def record_order(order_id: str) -> None:
            held.fingerprint = None  # from here on the order exists: the key must stay
            await audit(
                AuditAction.WEBHOOK_ORDER,
                True,
                resource_type="order",
                resource_id=order_id,
                metadata={
                    "trading_account_id": account.id,
                    "simulation": simulation,
                    "payload_hash": fingerprint,
                },
            )

        # From the write on, the order row may exist: the slot stays counted unless the order
        # history refuses the row outright (a duplicate), as count_since counts every row.
        daily_slot, held.daily = held.daily, None
        try:
            dispatched = await self._dispatcher.dispatch(
                intent,
                now=now,
                wait_s=self._settings.webhook_wait_s,
                on_committed=record_order,
            )
        except Duplicate:
            if daily_slot is not None:
                await self._daily.release(*daily_slot)
            await audit(
                AuditAction.WEBHOOK_REPLAY_ATTACK,
                False,
                error_message="duplicate request (order history)",
                metadata=replay_metadata(account.id, fingerprint),
            )
            return replay_refusal
        outcome = dispatched.outcome
        if isinstance(outcome, Rejected):
            # refused before the intent was durable (a success ran record_order, which keeps
            # the key): the sender's retry of the same body must not be a replay
            await self._release(held)
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message=outcome.detail)
        return outcome

    async def _admit(self, fingerprint: str, ttl: int, user: User, quota: DailyQuota) -> Admission:
        """The admission step, seeding the day's counter first when the store lacks it."""
        settings = self._settings
        for _ in range(SEED_ATTEMPTS):
            admission = await self._admission.admit(
                fingerprint,
                ttl,
                user.id,
                settings.rate_limit_per_minute,
                settings.rate_window_s,
                quota,
            )
            if not admission.unseeded:
                return admission
            await self._daily.seed(user.id, quota)
        raise KeyValueStoreUnavailable("the daily order counter could not be seeded")

    async def _release(self, held: _Held) -> None:
        """Give back what the request holds (each at most once)."""
        daily, held.daily = held.daily, None
        if daily is not None:
            await self._daily.release(*daily)
        fingerprint, held.fingerprint = held.fingerprint, None
        if fingerprint is None:
            return
        try:
            await self._replay.release(*fingerprint)
        except StoreUnavailable:
            log.warning("replay key could not be released; the sender's retry may see 409")
