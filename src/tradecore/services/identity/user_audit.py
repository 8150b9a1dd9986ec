"""The audit entries of a user's own account flows: registration, password reset, terms,
API keys and allowed IPs. Each call of those flows leaves one entry, refusals included; no
entry holds a password, a key or a reset token."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tradecore.audit import AuditAction, RequestContext
from tradecore.services.audit.events import SecurityEvents


class UserAudit:
    """Writes those entries through ``SecurityEvents``."""

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
        """One entry; ``error`` None means success; ``resource`` is (type, id). May raise
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
