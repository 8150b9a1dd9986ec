"""The alert mail for an attack and the alert period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.attack_alerts import ALERT_PERIOD, alert_mail
from tradecore.attacks import ATTACK_POLICIES, policy_for
from tradecore.audit import AuditAction

AT = datetime(2026, 1, 5, 14, 30, 7, tzinfo=UTC)


def test_alert_period_is_thirty_minutes() -> None:
    assert timedelta(minutes=30) == ALERT_PERIOD


def test_alert_mail_carries_the_specified_content() -> None:
    mail = alert_mail(
        "alice@example.com",
        AuditAction.WEBHOOK_CREDENTIAL_ATTACK,
        "198.51.100.66",
        AT,
        "Main BTC account",
    )
    policy = policy_for(AuditAction.WEBHOOK_CREDENTIAL_ATTACK)
    assert policy is not None
    assert mail.to == "alice@example.com"
    assert policy.title in mail.subject
    for part in (mail.text, mail.html):
        assert "webhook_credential_attack" in part
        assert "198.51.100.66" in part
        assert "2026-01-05 14:30:07 UTC" in part
        assert "Main BTC account" in part
        assert "wrong secret" in part


def test_alert_time_is_shown_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    mail = alert_mail(
        "a@b.co", AuditAction.WEBHOOK_REPLAY_ATTACK, "1.2.3.4", AT.astimezone(plus_two), None
    )
    assert "2026-01-05 14:30:07 UTC" in mail.text
    assert "(unknown)" in mail.text


def test_alert_mail_names_the_optional_user_agent() -> None:
    mail = alert_mail(
        "a@b.co", AuditAction.WEBHOOK_IP_BLOCKED, "1.2.3.4", AT, "acct", user_agent="curl/8.5"
    )
    assert "curl/8.5" in mail.text and "curl/8.5" in mail.html


SCRIPT = "<script>alert(1)</script>"


def test_script_in_any_field_is_escaped_in_html() -> None:
    mail = alert_mail(
        "a@b.co",
        AuditAction.WEBHOOK_IP_BLOCKED,
        SCRIPT,
        AT,
        SCRIPT,
        user_agent=SCRIPT,
    )
    assert "<script" not in mail.html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in mail.html


def test_header_injection_through_the_account_name_is_defused() -> None:
    mail = alert_mail(
        "a@b.co",
        AuditAction.WEBHOOK_REPLAY_ATTACK,
        "1.2.3.4",
        AT,
        "acct\r\nBcc: everyone@example.com",
    )
    assert "\r" not in mail.subject and "\n" not in mail.subject
    assert "\nBcc:" not in mail.text


def test_recipient_with_line_breaks_is_refused() -> None:
    with pytest.raises(ValueError, match="recipient"):
        alert_mail("a@b.co\r\nBcc: x@y.z", AuditAction.WEBHOOK_REPLAY_ATTACK, "1.2.3.4", AT, None)


OUR_TAGS: tuple[str, ...] = ("!DOCTYPE", "html", "/html", "body", "/body", "h2", "/h2", "p>")
OUR_TAGS += ("/p>", "table", "/table", "tr>", "/tr>", "th ", "/th>", "td>", "/td>")
hostile = st.text(alphabet=st.sampled_from(list("<>&\"'\r\n\x00\u2028 /ascript=")), max_size=60)


@given(ip=hostile, account=st.one_of(st.none(), hostile), agent=st.one_of(st.none(), hostile))
def test_hostile_fields_never_break_out(ip: str, account: str | None, agent: str | None) -> None:
    for action in ATTACK_POLICIES:
        mail = alert_mail("a@b.co", action, ip, AT, account, user_agent=agent)
        assert not any(c in mail.subject for c in "\r\n\x00\u2028")
        # Every '<' in the HTML part opens one of our own tags.
        for piece in mail.html.split("<")[1:]:
            assert piece.startswith(OUR_TAGS)
        assert "\x00" not in mail.text
        # The text part has our fixed number of lines: no field adds one.
        assert mail.text.count("\n") == alert_mail(
            "a@b.co", action, "x", AT, account and "y", user_agent=agent and "z"
        ).text.count("\n")
