"""The webhook order flow: ``POST /webhook/{token}/order`` (architecture.md §4).

1. strict parse (400 ``webhook_payload_invalid``);
2. layer 1: the URL token resolves to account and user in one lookup (404 / 403 disabled);
3. the allowed-IP list (403 ``webhook_ip_blocked``), before anything of the user's is spent;
4. layer 2 timestamp (401 ``webhook_timestamp_expired``, detail ``Request expired``), layer 3
   secret (401 ``webhook_credential_attack``) - both skipped in simulation - and layer 4
   replay (409 ``webhook_replay_attack``);
5. the additional checks (rate limit, plan, daily cap, credentials, terms, symbol);
6. the durable intent and the hand-off to the worker (OrderDispatcher).

Every request leaves exactly one audit entry. A 5xx before the intent is durable releases the
replay key, so the sender's retry of the same body is not refused as a replay.
"""

from __future__ import annotations

import logging
from typing import Any

from tradecore.audit import AuditAction, RequestContext
from tradecore.errors import StoreUnavailable
from tradecore.identity import User
from tradecore.netaddr import ip_allowed
from tradecore.orders import Source
from tradecore.ports.protection import ReplayStore
from tradecore.ports.repositories import AllowedIpRepository, TradingAccountRepository
from tradecore.ports.runtime import Clock
from tradecore.security import (
    credential_attack_metadata,
    expired_metadata,
    ip_blocked_metadata,
    payload_invalid_metadata,
    replay_metadata,
)
from tradecore.services.dispatch import Duplicate, OrderDispatcher, OrderIntent
from tradecore.services.order_checks import OrderChecks
from tradecore.services.outcomes import OrderOutcome, Rejected
from tradecore.services.security_events import SecurityEvents
from tradecore.services.settings import OrderSettings
from tradecore.webhooks import (
    PayloadInvalid,
    hash_secret,
    parse_webhook_body,
    replay_fingerprint,
    replay_ttl_seconds,
    request_age_seconds,
    secret_matches,
    timestamp_within_window,
)

log = logging.getLogger(__name__)

NOT_FOUND = Rejected(404, "not_found", "Not found")
UNAVAILABLE = Rejected(503, "unavailable", "Service temporarily unavailable")


class WebhookIntake:
    """Validates a webhook and hands the order to the user's worker."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        allowed_ips: AllowedIpRepository,
        replay: ReplayStore,
        checks: OrderChecks,
        dispatcher: OrderDispatcher,
        events: SecurityEvents,
        clock: Clock,
        settings: OrderSettings,
    ) -> None:
        self._accounts = accounts
        self._allowed_ips = allowed_ips
        self._replay = replay
        self._checks = checks
        self._dispatcher = dispatcher
        self._events = events
        self._clock = clock
        self._settings = settings

    async def handle(
        self, token: str, body: bytes, *, simulation: bool, context: RequestContext
    ) -> OrderOutcome:
        """Run the flow for one request; never raises for bad input or a store outage (503)."""
        claimed: list[str] = []
        try:
            return await self._handle(token, body, simulation, context, claimed)
        except StoreUnavailable:
            log.warning("webhook answered 503: a store is unavailable")
            for fingerprint in claimed:
                await self._release(fingerprint)
            return UNAVAILABLE

    async def _handle(
        self,
        token: str,
        body: bytes,
        simulation: bool,
        context: RequestContext,
        claimed: list[str],
    ) -> OrderOutcome:
        now = self._clock.now()
        payload = parse_webhook_body(body, simulation=simulation)
        found = await self._accounts.by_webhook_token_hash(hash_secret(token))

        async def audit(
            action: AuditAction,
            success: bool,
            *,
            resource_type: str = "trading_account",
            resource_id: str | None = None if found is None else found[0].id,
            **fields: Any,
        ) -> None:
            await self._events.record(
                action,
                context,
                user_id=None if found is None else found[1].id,
                success=success,
                resource_type=resource_type,
                resource_id=resource_id,
                account_name=None if found is None else found[0].name,
                **fields,
            )

        if isinstance(payload, PayloadInvalid):
            account_id = None if found is None else found[0].id
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
        account, user = found
        if user.disabled:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message="user disabled")
            return Rejected(403, "forbidden", "Forbidden")

        if not await self._ip_permitted(user, context.ip_address):
            await audit(
                AuditAction.WEBHOOK_IP_BLOCKED,
                False,
                error_message="source IP not in the allowed list",
                metadata=ip_blocked_metadata(account.id, context.ip_address),
            )
            return Rejected(403, "ip_not_allowed", "Source IP not allowed")

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

        fingerprint = replay_fingerprint(
            user.id,
            payload.action,
            payload.symbol,
            payload.quantity,
            payload.timestamp,
            payload.secret,
        )
        ttl = replay_ttl_seconds(now, payload.timestamp, account.max_request_age)
        try:
            fresh = await self._replay.claim(fingerprint, ttl)
        except StoreUnavailable:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message="key-value store down")
            return UNAVAILABLE
        replay_refusal = Rejected(409, "replay", "Duplicate request")
        if not fresh:
            await audit(
                AuditAction.WEBHOOK_REPLAY_ATTACK,
                False,
                error_message="duplicate request",
                metadata=replay_metadata(account.id, fingerprint),
            )
            return replay_refusal
        claimed.append(fingerprint)

        refusal = await self._checks.check(
            user,
            account,
            symbol=payload.symbol,
            quantity=payload.quantity,
            simulation=simulation,
            source=Source.WEBHOOK,
            now=now,
        )
        if refusal is not None:
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message=refusal.detail)
            return refusal

        intent = OrderIntent(
            user=user,
            account=account,
            symbol=payload.symbol,
            action=payload.action,
            order_type=payload.order_type,
            quantity=payload.quantity,
            source=Source.WEBHOOK,
            simulation=simulation,
            fingerprint=fingerprint,
        )
        try:
            dispatched = await self._dispatcher.dispatch(
                intent, now=now, wait_s=self._settings.webhook_wait_s
            )
        except Duplicate:
            await audit(
                AuditAction.WEBHOOK_REPLAY_ATTACK,
                False,
                error_message="duplicate request (order history)",
                metadata=replay_metadata(account.id, fingerprint),
            )
            return replay_refusal
        outcome = dispatched.outcome
        if dispatched.durable:
            claimed.clear()  # from here on the order exists: the key must stay
        if isinstance(outcome, Rejected):
            if not dispatched.durable:
                await self._release(fingerprint)
            await audit(AuditAction.WEBHOOK_ORDER, False, error_message=outcome.detail)
            return outcome
        await audit(
            AuditAction.WEBHOOK_ORDER,
            True,
            resource_type="order",
            resource_id=dispatched.order_id,
            metadata={
                "trading_account_id": account.id,
                "simulation": simulation,
                "payload_hash": fingerprint,
            },
        )
        return outcome

    async def _ip_permitted(self, user: User, ip: str) -> bool:
        entries = await self._allowed_ips.list_for_user(user.id)
        return not entries or ip_allowed(ip, [e.ip_address for e in entries])

    async def _release(self, fingerprint: str) -> None:
        try:
            await self._replay.release(fingerprint)
        except StoreUnavailable:
            log.warning("replay key could not be released; the sender's retry may see 409")
