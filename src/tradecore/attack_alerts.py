"""The alert e-mail for one attack, and how often a user may receive one.

Every field that an attacker or a user controls is cleaned of control characters and
HTML-escaped, so neither the headers nor the parts can be forged through it.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

from tradecore.attacks import policy_for
from tradecore.audit import AuditAction
from tradecore.ports.identity import MailMessage

ALERT_PERIOD = timedelta(minutes=30)
"""At most one alert e-mail per user in this period (claimed through ``AlertThrottle``)."""

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
