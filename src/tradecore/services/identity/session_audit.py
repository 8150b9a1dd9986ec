"""The audit entries of the session flows: login, refresh, logout and revocation each leave
one, with the session as its resource when there is one. No entry holds a password or a
token."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tradecore.audit import AuditAction, RequestContext
from tradecore.services.audit.events import SecurityEvents


class SessionAudit:
    """Writes the session flows' entries through ``SecurityEvents``."""

    def __init__(self, events: SecurityEvents) -> None:
        self._events = events

    async def record(
        self,
        action: AuditAction,
        context: RequestContext,
        user_id: str | None,
        success: bool,
        error: str | None = None,
        *,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """One entry; its resource is the session when ``session_id`` is given. May raise
        StoreUnavailable."""
        await self._events.record(
            action,
            context,
            user_id=user_id,
            success=success,
            error_message=error,
            resource_type="session" if session_id is not None else None,
            resource_id=session_id,
            metadata=metadata,
        )

    async def login_failed(
        self, user_id: str | None, context: RequestContext, reason: str, metadata: dict[str, Any]
    ) -> None:
        """A refused login or password grant (``user_id`` None when no user was found)."""
        await self.record(AuditAction.LOGIN, context, user_id, False, reason, metadata=metadata)
