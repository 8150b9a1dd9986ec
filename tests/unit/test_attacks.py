"""Attack classification and audit metadata."""

from __future__ import annotations

import json

import pytest

from tradecore.attacks import (
    ATTACK_POLICIES,
    credential_attack_metadata,
    csrf_metadata,
    expired_metadata,
    ip_blocked_metadata,
    is_attack,
    payload_invalid_metadata,
    policy_for,
    replay_metadata,
)
from tradecore.audit import AuditAction

SPEC_TABLE = {
    AuditAction.WEBHOOK_IP_BLOCKED: (403, True),
    AuditAction.WEBHOOK_TIMESTAMP_EXPIRED: (401, True),
    AuditAction.WEBHOOK_CREDENTIAL_ATTACK: (401, True),
    AuditAction.WEBHOOK_REPLAY_ATTACK: (409, True),
    AuditAction.WEBHOOK_PAYLOAD_INVALID: (400, False),
    AuditAction.CSRF_VALIDATION_FAILED: (403, False),
    # beyond the specification's table: throttled failed logins (issue 16, 2)
    AuditAction.LOGIN_CREDENTIAL_ATTACK: (429, True),
}


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


def test_only_the_listed_attack_classes_are_attacks() -> None:
    assert set(ATTACK_POLICIES) == set(SPEC_TABLE)
    for action in AuditAction:
        if action not in SPEC_TABLE:
            assert policy_for(action) is None
            assert not is_attack(action)


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
