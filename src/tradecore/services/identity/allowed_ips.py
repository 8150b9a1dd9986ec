"""Allowed IPs: ``/settings/allowed-ips``, the addresses and CIDR blocks a user's requests
may come from (an empty list allows every address).

Entries are credentials: they are managed from a browser session only (a request made with an
API key is refused with 403). Each call that changes something leaves one audit entry
(``IdentityAudit``), refusals included. An unreachable store is 503.
"""

from __future__ import annotations

from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import AllowedIp
from tradecore.netaddr import parse_allowed_entry
from tradecore.ports.repositories import AllowedIpRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.vocabulary import (
    BROWSER_SESSION_REQUIRED,
    NOT_FOUND,
    Principal,
    Rejected,
    bad_request,
    refuses_outages,
)

DUPLICATE = Rejected(409, "duplicate_allowed_ip", "This address is already listed")


class AllowedIps:
    """Add, list and remove the caller's allowed-IP entries; at most ``max_entries``."""

    def __init__(
        self,
        allowed_ips: AllowedIpRepository,
        audit: IdentityAudit,
        clock: Clock,
        random: RandomSource,
        *,
        max_entries: int = 100,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self._allowed_ips = allowed_ips
        self._audit = audit
        self._clock = clock
        self._random = random
        self._max_entries = max_entries

    @refuses_outages
    async def add_allowed_ip(
        self, principal: Principal, text: object, context: RequestContext
    ) -> AllowedIp | Rejected:
        """``POST /settings/allowed-ips``: an address or CIDR block, stored normalized. 400 for
        anything else (host bits set included), 409 when already listed or the list is full,
        403 for an API-key principal."""
        action = AuditAction.ALLOWED_IP_ADDED
        record = self._audit.record
        refusal = await self._audit.browser_session_required(principal, action, context)
        if refusal is not None:
            return refusal
        entry = parse_allowed_entry(text)
        if entry is None:
            await record(action, context, principal.user_id, "invalid address")
            return bad_request("ip_address must be an IP address or a CIDR block")
        listed = await self._allowed_ips.list_for_user(principal.user_id)
        if len(listed) >= self._max_entries:
            await record(action, context, principal.user_id, "list full")
            return Rejected(
                409, "too_many_allowed_ips", f"At most {self._max_entries} allowed IP entries"
            )
        allowed = AllowedIp(
            id=self._random.new_id(),
            user_id=principal.user_id,
            ip_address=entry,
            created_at=self._clock.now(),
        )
        if not await self._allowed_ips.add(allowed):
            await record(action, context, principal.user_id, "duplicate", metadata={"ip": entry})
            return DUPLICATE
        await record(
            action,
            context,
            principal.user_id,
            resource=("allowed_ip", allowed.id),
            metadata={"ip": entry},
        )
        return allowed

    @refuses_outages
    async def list_allowed_ips(self, principal: Principal) -> list[AllowedIp] | Rejected:
        """``GET /settings/allowed-ips``: oldest first. 403 for an API-key principal."""
        if not principal.has_browser_session:
            return BROWSER_SESSION_REQUIRED
        return await self._allowed_ips.list_for_user(principal.user_id)

    @refuses_outages
    async def remove_allowed_ip(
        self, principal: Principal, entry_id: object, context: RequestContext
    ) -> Rejected | None:
        """``DELETE /settings/allowed-ips/{id}``. 404 when the user has no such entry, 403 for
        an API-key principal. Removing the last entry lifts the restriction."""
        action = AuditAction.ALLOWED_IP_REMOVED
        record = self._audit.record
        refusal = await self._audit.browser_session_required(principal, action, context)
        if refusal is not None:
            return refusal
        if not isinstance(entry_id, str) or not entry_id:
            await record(action, context, principal.user_id, "not found")
            return NOT_FOUND
        resource = ("allowed_ip", entry_id)
        if not await self._allowed_ips.remove(entry_id, principal.user_id):
            await record(action, context, principal.user_id, "not found", resource=resource)
            return NOT_FOUND
        await record(action, context, principal.user_id, resource=resource)
        return None
