"""What counts as an attack, how each class is answered, and what its audit entry records.

The classification is the specification's table (Events): each attack class has its HTTP
status and whether it sends an alert. Metadata builders fix the keys written to
``audit_logs.metadata``; none of them takes a secret. The alert e-mail itself is in
``tradecore.attack_alerts``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from tradecore.audit import AuditAction


@attrs.frozen
class AttackPolicy:
    """How one attack class is answered: status, whether it mails, and its wording."""

    action: AuditAction
    http_status: int
    send_alert: bool
    title: str
    description: str


_POLICIES = (
    AttackPolicy(
        AuditAction.WEBHOOK_IP_BLOCKED,
        403,
        True,
        "Webhook request from a blocked IP address",
        "A webhook or trading request came from an IP address that is not in your allowed-IP "
        "list. It was refused.",
    ),
    AttackPolicy(
        AuditAction.WEBHOOK_TIMESTAMP_EXPIRED,
        401,
        True,
        "Expired webhook request",
        "A webhook request carried a timestamp outside the account's allowed window. It may be "
        "an old alert being replayed. It was refused.",
    ),
    AttackPolicy(
        AuditAction.WEBHOOK_CREDENTIAL_ATTACK,
        401,
        True,
        "Wrong webhook secret",
        "A webhook request reached your webhook URL with a wrong secret. Someone may know the "
        "URL; consider rotating it. The request was refused.",
    ),
    AttackPolicy(
        AuditAction.WEBHOOK_REPLAY_ATTACK,
        409,
        True,
        "Replayed webhook request",
        "A webhook request identical to one already processed was sent again. It was refused "
        "and no second order was placed.",
    ),
    AttackPolicy(
        AuditAction.WEBHOOK_PAYLOAD_INVALID,
        400,
        False,
        "Invalid webhook payload",
        "A webhook request had a malformed body or lacked required fields.",
    ),
    AttackPolicy(
        AuditAction.CSRF_VALIDATION_FAILED,
        403,
        False,
        "CSRF validation failed",
        "A request with your session cookie lacked a valid CSRF token.",
    ),
    # Beyond the specification's six (issue 16, 2): failed logins or password grants for
    # the account beyond the throttle's window; the owner is told, as for a wrong secret.
    AttackPolicy(
        AuditAction.LOGIN_CREDENTIAL_ATTACK,
        429,
        True,
        "Repeated failed logins",
        "Someone tried many wrong passwords for your account. Further attempts from that "
        "address are held back for a while; your own logins from your usual address are not. "
        "If it was not you, make sure your password is long and used nowhere else.",
    ),
)

ATTACK_POLICIES: Mapping[AuditAction, AttackPolicy] = {p.action: p for p in _POLICIES}


def policy_for(action: AuditAction) -> AttackPolicy | None:
    """The policy of an attack class; None for an action that is not one."""
    return ATTACK_POLICIES.get(action)


def is_attack(action: AuditAction) -> bool:
    return action in ATTACK_POLICIES


# --- Audit metadata -------------------------------------------------------------------------

_MAX_REASON = 200


def credential_attack_metadata(trading_account_id: str) -> dict[str, Any]:
    return {"attack_type": "wrong_secret", "trading_account_id": trading_account_id}


def replay_metadata(trading_account_id: str, payload_hash: str) -> dict[str, Any]:
    """``payload_hash`` is the truncated replay fingerprint (it does not reveal the secret)."""
    return {
        "attack_type": "replay",
        "payload_hash": payload_hash,
        "trading_account_id": trading_account_id,
    }


def expired_metadata(
    trading_account_id: str, request_age_s: float, max_request_age: int
) -> dict[str, Any]:
    """``request_age_s`` is |server time - timestamp| rounded to milliseconds (None if not
    finite, so the metadata stays valid JSON)."""
    age = round(request_age_s, 3) if math.isfinite(request_age_s) else None
    return {
        "attack_type": "timestamp_expired",
        "trading_account_id": trading_account_id,
        "request_age_s": age,
        "max_request_age": max_request_age,
    }


def ip_blocked_metadata(trading_account_id: str | None, ip: str) -> dict[str, Any]:
    return {"attack_type": "ip_blocked", "trading_account_id": trading_account_id, "ip": ip}


def payload_invalid_metadata(trading_account_id: str | None, reason: str) -> dict[str, Any]:
    """``reason`` is the parser's explanation, cut to 200 characters."""
    return {
        "attack_type": "payload_invalid",
        "trading_account_id": trading_account_id,
        "reason": reason[:_MAX_REASON],
    }


def csrf_metadata(reason: Literal["missing", "mismatch"]) -> dict[str, Any]:
    if reason not in ("missing", "mismatch"):
        raise ValueError(f"unknown CSRF failure reason {reason!r}")
    return {"attack_type": "csrf", "reason": reason}


def throttled_metadata(attack_type: str, rule: str) -> dict[str, Any]:
    """A request refused by a sign-in throttle (``tradecore.services.identity.throttling``):
    ``attack_type`` names the flow's attack (``credential_attack`` for logins), ``rule`` the
    full window (``ip``, ``account_ip``, ``account``)."""
    return {"attack_type": attack_type, "throttle": rule}
