"""API keys: ``/settings/api-keys``.

A key is shown once, when it is created, and stored only as its SHA-256 digest. Keys are
credentials: they are managed from a browser session only (a request made with an API key is
refused with 403). Each call that changes something leaves one audit entry (``IdentityAudit``),
refusals included; none holds a key. An unreachable store is 503.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import ApiKey
from tradecore.ports.repositories import ApiKeyRepository
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
from tradecore.sessions import new_api_key

MAX_NAME_CHARS = 100


class ApiKeys:
    """Create, list and revoke the caller's API keys; at most ``max_keys`` usable ones (not
    revoked, not expired) per user."""

    def __init__(
        self,
        api_keys: ApiKeyRepository,
        audit: IdentityAudit,
        clock: Clock,
        random: RandomSource,
        *,
        max_keys: int = 20,
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self._api_keys = api_keys
        self._audit = audit
        self._clock = clock
        self._random = random
        self._max_keys = max_keys

    @refuses_outages
    async def create_api_key(
        self, principal: Principal, name: object, expires_at: object, context: RequestContext
    ) -> tuple[ApiKey, str] | Rejected:
        """``POST /settings/api-keys``: a new key and its plaintext, which is shown this once
        and stored only as its SHA-256 digest. ``expires_at`` is None (no expiry) or a time in
        the future (without a zone: UTC). 400 bad input, 403 API-key principal, 409 when the
        user already has ``max_keys`` usable keys."""
        action = AuditAction.API_KEY_CREATED
        record = self._audit.record
        refusal = await self._audit.browser_session_required(principal, action, context)
        if refusal is not None:
            return refusal
        now = self._clock.now()
        clean_name = _clean_name(name)
        if clean_name is None:
            await record(action, context, principal.user_id, "invalid name")
            return bad_request(f"name must be 1 to {MAX_NAME_CHARS} printable characters")
        if expires_at is not None and not isinstance(expires_at, datetime):
            await record(action, context, principal.user_id, "invalid expiry")
            return bad_request("expires_at must be a time or null")
        expiry = _aware(expires_at)
        if expiry is not None and expiry <= now:
            await record(action, context, principal.user_id, "invalid expiry")
            return bad_request("expires_at must be in the future")
        listed = await self._api_keys.list_for_user(principal.user_id)
        if sum(1 for k in listed if k.is_usable(now)) >= self._max_keys:
            await record(action, context, principal.user_id, "too many keys")
            return Rejected(409, "too_many_api_keys", f"At most {self._max_keys} active API keys")
        plaintext, prefix, digest = new_api_key(self._random)
        key = ApiKey(
            id=self._random.new_id(),
            user_id=principal.user_id,
            name=clean_name,
            key_hash=digest,
            prefix=prefix,
            created_at=now,
            expires_at=expiry,
        )
        await self._api_keys.add(key)
        await record(
            action,
            context,
            principal.user_id,
            resource=("api_key", key.id),
            metadata={
                "name": clean_name,
                "expires_at": None if expiry is None else expiry.isoformat(),
            },
        )
        return key, plaintext

    @refuses_outages
    async def list_api_keys(self, principal: Principal) -> list[ApiKey] | Rejected:
        """``GET /settings/api-keys``: the user's keys, revoked and expired ones included,
        oldest first (digests only). 403 for an API-key principal."""
        if not principal.has_browser_session:
            return BROWSER_SESSION_REQUIRED
        return await self._api_keys.list_for_user(principal.user_id)

    @refuses_outages
    async def revoke_api_key(
        self, principal: Principal, key_id: object, context: RequestContext
    ) -> Rejected | None:
        """``DELETE /settings/api-keys/{id}``: the key stops working at once. 404 when the
        user has no such unrevoked key, 403 for an API-key principal."""
        action = AuditAction.API_KEY_REVOKED
        record = self._audit.record
        refusal = await self._audit.browser_session_required(principal, action, context)
        if refusal is not None:
            return refusal
        if not isinstance(key_id, str) or not key_id:
            await record(action, context, principal.user_id, "not found")
            return NOT_FOUND
        resource = ("api_key", key_id)
        if not await self._api_keys.revoke(key_id, principal.user_id, self._clock.now()):
            await record(action, context, principal.user_id, "not found", resource=resource)
            return NOT_FOUND
        await record(action, context, principal.user_id, resource=resource)
        return None


def _clean_name(name: object) -> str | None:
    """The key's name trimmed, when it is 1 to MAX_NAME_CHARS printable characters."""
    if not isinstance(name, str):
        return None
    clean = name.strip()
    if not 1 <= len(clean) <= MAX_NAME_CHARS or not clean.isprintable():
        return None
    return clean


def _aware(value: datetime | None) -> datetime | None:
    """A zone-less time is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
