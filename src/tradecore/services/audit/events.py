"""Recording security events: the audit entry, then, for attack classes, a throttled e-mail.

The audit entry is written before the request is answered. The alert is sent in the
background and is best effort: every exception is caught and logged, and a failure never
changes the request. The throttle slot (one mail per user per 30 minutes) is claimed
atomically and given back when the mail was not handed to the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from tradecore.attack_alerts import ALERT_PERIOD, alert_mail
from tradecore.attacks import policy_for
from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.ports.identity import Mailer
from tradecore.ports.protection import AlertThrottle
from tradecore.ports.repositories import AuditLog, UserRepository
from tradecore.ports.runtime import Clock

log = logging.getLogger(__name__)

MAIL_TIMEOUT_S = 10.0


class SecurityEvents:
    """Writes audit entries and sends attack alerts."""

    def __init__(
        self,
        audit: AuditLog,
        users: UserRepository,
        throttle: AlertThrottle,
        mailer: Mailer,
        clock: Clock,
        *,
        mail_timeout_s: float = MAIL_TIMEOUT_S,
    ) -> None:
        self._audit = audit
        self._users = users
        self._throttle = throttle
        self._mailer = mailer
        self._clock = clock
        self._mail_timeout_s = mail_timeout_s
        self._pending: set[asyncio.Task[None]] = set()

    async def record(
        self,
        action: AuditAction,
        context: RequestContext,
        *,
        user_id: str | None,
        success: bool,
        error_message: str | None = None,
        resource_type: str | None = None,
        resource_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        account_name: str | None = None,
    ) -> int:
        """Append one audit entry (durably, before returning its id); for an attack class with
        a known target user, schedule the alert mail."""
        now = self._clock.now()
        entry = AuditEntry(
            user_id=user_id,
            action=action,
            success=success,
            context=context,
            created_at=now,
            error_message=error_message,
            resource_type=resource_type,
            resource_id=resource_id,
            metadata=dict(metadata or {}),
        )
        entry_id = await self._audit.append(entry)
        policy = policy_for(action)
        if policy is not None and policy.send_alert and user_id is not None:
            task = asyncio.create_task(self._alert(user_id, entry, account_name))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        return entry_id

    async def drain(self) -> None:
        """Wait for the alerts in flight (shutdown and tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def _alert(self, user_id: str, entry: AuditEntry, account_name: str | None) -> None:
        claimed = False
        try:
            claimed = await self._throttle.try_claim(user_id, int(ALERT_PERIOD.total_seconds()))
            if not claimed:
                return
            user = await self._users.get(user_id)
            if user is None:
                await self._throttle.release(user_id)
                return
            message = alert_mail(
                user.email,
                entry.action,
                entry.context.ip_address,
                entry.created_at,
                account_name,
            )
            await asyncio.wait_for(self._mailer.send(message), self._mail_timeout_s)
        except Exception:
            log.exception("security alert for user %s (%s) not sent", user_id, entry.action)
            if claimed:
                try:
                    await self._throttle.release(user_id)
                except Exception:
                    log.exception("alert throttle slot of user %s not released", user_id)
