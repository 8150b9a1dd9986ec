"""Audit log entries (table audit_logs) and the action vocabulary.

An entry never holds a secret: no API key, webhook token or secret, password, JWT or CSRF
token, in any field or in ``metadata``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs


class AuditAction(enum.StrEnum):
    """Event types written to the audit log. The first block are the attack classes."""

    WEBHOOK_IP_BLOCKED = "webhook_ip_blocked"
    WEBHOOK_TIMESTAMP_EXPIRED = "webhook_timestamp_expired"
    WEBHOOK_CREDENTIAL_ATTACK = "webhook_credential_attack"
    WEBHOOK_REPLAY_ATTACK = "webhook_replay_attack"
    WEBHOOK_PAYLOAD_INVALID = "webhook_payload_invalid"
    CSRF_VALIDATION_FAILED = "csrf_validation_failed"
    LOGIN_CREDENTIAL_ATTACK = "login_credential_attack"

    WEBHOOK_ORDER = "webhook_order"
    DASHBOARD_ORDER = "dashboard_order"
    LOGIN = "login"
    LOGOUT = "logout"
    REGISTER = "register"
    TOKEN_REFRESH = "token_refresh"
    REFRESH_TOKEN_REUSE = "refresh_token_reuse"
    SESSION_REVOKED = "session_revoked"
    PASSWORD_RESET_REQUESTED = "password_reset_requested"
    PASSWORD_RESET = "password_reset"
    API_KEY_CREATED = "api_key_created"
    API_KEY_REVOKED = "api_key_revoked"
    ALLOWED_IP_ADDED = "allowed_ip_added"
    ALLOWED_IP_REMOVED = "allowed_ip_removed"
    ACCOUNT_CREATED = "account_created"
    ACCOUNT_UPDATED = "account_updated"
    ACCOUNT_DELETED = "account_deleted"
    WEBHOOK_SECRET_REGENERATED = "webhook_secret_regenerated"
    WEBHOOK_TOKEN_ROTATED = "webhook_token_rotated"
    TERMS_ACCEPTED = "terms_accepted"
    SETUP_ADMIN_CREATED = "setup_admin_created"
    ORDER_EXPIRED = "order_expired"  # a queued order found past its expires_at by the worker


@attrs.frozen
class RequestContext:
    """Who asked, from where: the request facts every audit entry carries."""

    ip_address: str
    user_agent: str
    request_path: str
    request_method: str


WORKER_CONTEXT = RequestContext(
    ip_address="127.0.0.1",
    user_agent="tradecore-worker",
    request_path="worker",
    request_method="WORKER",
)
"""The context of entries a worker host writes on its own (no HTTP request behind them)."""


@attrs.frozen
class AuditEntry:
    """One audit_logs row before it is stored (the store assigns ``id``)."""

    user_id: str | None
    action: AuditAction
    success: bool
    context: RequestContext
    created_at: datetime
    error_message: str | None = None
    resource_type: str | None = None
    resource_id: str | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class StoredAuditEntry:
    """An audit entry as read back, with its id."""

    id: int
    entry: AuditEntry


@attrs.frozen
class AuditSummary:
    """Counts of a user's entries by action, and the trading accounts they name (metadata
    ``trading_account_id``), most recently named first."""

    counts: Mapping[AuditAction, int]
    trading_account_ids: tuple[str, ...]
