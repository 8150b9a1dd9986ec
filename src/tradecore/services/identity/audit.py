"""The audit entries of the identity flows: login, refresh, logout and revocation of sessions,
registration and terms, password reset, API keys and allowed IPs. No entry holds a password,
a token, a key or a reset token."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tradecore.audit import AuditAction, RequestContext
from tradecore.services.audit.events import SecurityEvents


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
