"""Users, sessions, API keys and allowed IPs: the stored identity records.

Secrets are never stored in clear: API keys, refresh-token ids and reset tokens are kept as
SHA-256 hex digests; passwords as Argon2id hashes produced by the PasswordHasher port.
"""

from __future__ import annotations

import enum
from datetime import datetime

import attrs


class Plan(enum.StrEnum):
    """Subscription plan. Free users may only trade in simulation."""

    FREE = "free"
    PRO = "pro"


@attrs.frozen
class User:
    """A user account.

    ``subscription_expires_at`` None means the plan does not expire. ``accepted_terms_version``
    is the latest terms-of-service version the user accepted (None: never). ``is_admin``: an
    administrator of the deployment (the operator endpoints ``/setup/*`` and ``/deployment/*``);
    set by the first-run setup or ``tradecore admin create-user --admin``, never by a request
    of the user.
    """

    id: str
    email: str
    password_hash: str = attrs.field(repr=False)
    plan: Plan
    created_at: datetime
    disabled: bool = False
    subscription_expires_at: datetime | None = None
    accepted_terms_version: str | None = None
    is_admin: bool = False

    def effective_plan(self, now: datetime) -> Plan:
        """The plan in force at ``now``: an expired subscription loses premium features."""
        if self.subscription_expires_at is not None and now >= self.subscription_expires_at:
            return Plan.FREE
        return self.plan


@attrs.frozen
class Session:
    """A row of user_sessions. ``refresh_jti`` is the SHA-256 hex digest of the id of the one
    valid refresh token. Neither it nor the CSRF token appears in the repr."""

    id: str
    user_id: str
    csrf_token: str = attrs.field(repr=False)
    ip_address: str
    user_agent: str
    created_at: datetime
    is_active: bool = True
    refresh_jti: str | None = attrs.field(default=None, repr=False)
    revoked_at: datetime | None = None


@attrs.frozen
class ApiKey:
    """A row of api_keys; only ``key_hash`` (SHA-256 hex of the key) is stored."""

    id: str
    user_id: str
    name: str
    key_hash: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    def is_usable(self, now: datetime) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or now < self.expires_at


@attrs.frozen
class AllowedIp:
    """A row of user_allowed_ips; ``ip_address`` is normalized (IPv4-mapped IPv6 unwrapped)."""

    id: str
    user_id: str
    ip_address: str
    created_at: datetime
