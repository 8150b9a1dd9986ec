"""The audit entries of the identity flows: login, refresh, logout and revocation of sessions,
registration and terms, password reset, API keys and allowed IPs. No entry holds a password,
a token, a key or a reset token."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tradecore.audit import AuditAction, RequestContext
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.vocabulary import BROWSER_SESSION_REQUIRED, Principal, Rejected


class IdentityAudit:
    """Writes the identity flows' entries through ``SecurityEvents``."""

    def __init__(self, events: SecurityEvents) -> None:
        self._events = events

    async def record(
        self,
        action: AuditAction,
        context: RequestContext,
        user_id: str | None,
        error: str | None = None,
        *,
        resource: tuple[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """One entry; ``error`` None means success, anything else is the refusal's reason;
        ``resource`` is (type, id), e.g. ``("session", session.id)``. May raise
        StoreUnavailable."""
        await self._events.record(
            action,
            context,
            user_id=user_id,
            success=error is None,
            error_message=error,
            resource_type=None if resource is None else resource[0],
            resource_id=None if resource is None else resource[1],
            metadata=metadata,
        )

    async def browser_session_required(
        self, principal: Principal, action: AuditAction, context: RequestContext
    ) -> Rejected | None:
        """None for a browser session; for an API key (which may not manage credentials) the
        403 refusal, with its entry written. May raise StoreUnavailable."""
        if principal.has_browser_session:
            return None
        await self.record(action, context, principal.user_id, "browser session required")
        return BROWSER_SESSION_REQUIRED
