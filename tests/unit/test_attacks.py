"""Attack classification, audit metadata and the alert mail."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.audit import AuditAction
from tradecore.security import (
    ALERT_PERIOD,
    ATTACK_POLICIES,
    alert_mail,
    credential_attack_metadata,
    csrf_metadata,
    expired_metadata,
    ip_blocked_metadata,
    is_attack,
    payload_invalid_metadata,
    policy_for,
    replay_metadata,
)

SPEC_TABLE = {
    AuditAction.WEBHOOK_IP_BLOCKED: (403, True),
    AuditAction.WEBHOOK_TIMESTAMP_EXPIRED: (401, True),
    AuditAction.WEBHOOK_CREDENTIAL_ATTACK: (401, True),
    AuditAction.WEBHOOK_REPLAY_ATTACK: (409, True),
    AuditAction.WEBHOOK_PAYLOAD_INVALID: (400, False),
    AuditAction.CSRF_VALIDATION_FAILED: (403, False),
}

AT = datetime(2026, 1, 5, 14, 30, 7, tzinfo=UTC)


@pytest.mark.parametrize(("action", "expected"), SPEC_TABLE.items())
def test_policies_follow_the_specification_table(
    action: AuditAction, expected: tuple[int, bool]
) -> None:
    policy = policy_for(action)
    assert policy is not None
    assert policy.action is action
    assert (policy.http_status, policy.send_alert) == expected
    assert policy.title and policy.description
    assert is_attack(action)


def test_only_the_six_attack_classes_are_attacks() -> None:
    assert set(ATTACK_POLICIES) == set(SPEC_TABLE)
    for action in AuditAction:
        if action not in SPEC_TABLE:
            assert policy_for(action) is None
            assert not is_attack(action)


def test_alert_period_is_thirty_minutes() -> None:
    assert timedelta(minutes=30) == ALERT_PERIOD


# --- Metadata -------------------------------------------------------------------------------


def test_credential_attack_metadata_has_the_specified_keys() -> None:
    assert credential_attack_metadata("acc-1") == {
        "attack_type": "wrong_secret",
        "trading_account_id": "acc-1",
    }


def test_replay_metadata_has_the_payload_hash() -> None:
    assert replay_metadata("acc-1", "0123456789abcdef0123456789abcdef") == {
        "attack_type": "replay",
        "payload_hash": "0123456789abcdef0123456789abcdef",
        "trading_account_id": "acc-1",
    }


def test_expired_metadata_has_the_request_age() -> None:
    assert expired_metadata("acc-1", 412.123456, 300) == {
        "attack_type": "timestamp_expired",
        "trading_account_id": "acc-1",
        "request_age_s": 412.123,
        "max_request_age": 300,
    }


@pytest.mark.parametrize("age", [float("inf"), float("nan"), float("-inf")])
def test_expired_metadata_stays_valid_json(age: float) -> None:
    metadata = expired_metadata("acc-1", age, 300)
    assert metadata["request_age_s"] is None
    json.dumps(metadata, allow_nan=False)


def test_ip_blocked_and_payload_metadata_allow_an_unknown_account() -> None:
    assert ip_blocked_metadata(None, "198.51.100.66") == {
        "attack_type": "ip_blocked",
        "trading_account_id": None,
        "ip": "198.51.100.66",
    }
    metadata = payload_invalid_metadata(None, "quantity: must be a finite number")
    assert metadata == {
        "attack_type": "payload_invalid",
        "trading_account_id": None,
        "reason": "quantity: must be a finite number",
    }


def test_payload_reason_is_bounded() -> None:
    assert len(payload_invalid_metadata("a", "x" * 10_000)["reason"]) == 200


@pytest.mark.parametrize("reason", ["missing", "mismatch"])
def test_csrf_metadata(reason: str) -> None:
    assert csrf_metadata(reason) == {"attack_type": "csrf", "reason": reason}  # type: ignore[arg-type]


def test_csrf_metadata_refuses_free_text() -> None:
    with pytest.raises(ValueError, match="reason"):
        csrf_metadata("the token was abc123")  # type: ignore[arg-type]


# --- The alert mail -------------------------------------------------------------------------


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
    for action in SPEC_TABLE:
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
