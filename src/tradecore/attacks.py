"""Attack classification, audit metadata and the alert e-mail.

The classification is the specification's table (Events): each attack class has its HTTP
status and whether it sends an alert. Metadata builders fix the keys written to
``audit_logs.metadata``; none of them takes a secret. The alert mail escapes every field that
an attacker or a user controls.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import attrs

from tradecore.audit import AuditAction
from tradecore.ports.identity import MailMessage

ALERT_PERIOD = timedelta(minutes=30)


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


# --- The alert mail -------------------------------------------------------------------------

_MAX_FIELD = 200
_THROTTLE_NOTE = (
    f"You receive at most one such e-mail every {int(ALERT_PERIOD.total_seconds() // 60)} minutes."
)


def _one_line(value: str) -> str:
    """Control characters (CR and LF included) become spaces; long values are cut."""
    cleaned = "".join(" " if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in value)
    cleaned = cleaned.replace("\u2028", " ").replace("\u2029", " ")
    return cleaned[:_MAX_FIELD]


def _utc_text(at: datetime) -> str:
    aware = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return aware.strftime("%Y-%m-%d %H:%M:%S UTC")


def alert_mail(
    to: str,
    action: AuditAction,
    source_ip: str,
    at: datetime,
    account_name: str | None,
    *,
    user_agent: str | None = None,
) -> MailMessage:
    """The alert for one attack event: attack type, source IP, time, account name and a
    description, in a text and an HTML part.

    Every field not written by us is cleaned of control characters (so the subject stays one
    header line and the text part cannot gain forged lines) and HTML-escaped in the HTML part.
    Raises ValueError when ``to`` holds a line break (it becomes a mail header).
    """
    if any(c in to for c in "\r\n\x00"):
        raise ValueError("recipient address contains control characters")
    policy = policy_for(action)
    title = policy.title if policy is not None else "Security event"
    description = policy.description if policy is not None else "A security event was logged."
    account = _one_line(account_name) if account_name else None
    rows: list[tuple[str, str]] = [
        ("Attack type", str(action)),
        ("Source IP", _one_line(source_ip)),
        ("Time", _utc_text(at)),
        ("Trading account", account if account is not None else "(unknown)"),
    ]
    if user_agent:
        rows.append(("User agent", _one_line(user_agent)))

    subject = f"Security alert: {title}"
    if account is not None:
        subject += f" ({account})"
    subject = _one_line(subject)

    text_lines = [title, "", description, ""]
    text_lines += [f"{label}: {value}" for label, value in rows]
    text_lines += [
        "",
        "Review your security events in the dashboard under Settings > Security.",
        _THROTTLE_NOTE,
    ]

    cells = "".join(
        f'<tr><th align="left">{html.escape(label)}</th><td>{html.escape(value)}</td></tr>'
        for label, value in rows
    )
    html_part = (
        "<!DOCTYPE html><html><body>"
        f"<h2>{html.escape(title)}</h2>"
        f"<p>{html.escape(description)}</p>"
        f"<table>{cells}</table>"
        "<p>Review your security events in the dashboard under Settings &gt; Security. "
        f"{html.escape(_THROTTLE_NOTE)}</p>"
        "</body></html>"
    )
    return MailMessage(to=to, subject=subject, text="\n".join(text_lines) + "\n", html=html_part)
