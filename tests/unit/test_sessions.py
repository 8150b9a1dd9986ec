"""Session rules: CSRF exemptions and comparison, the lifecycle, claims, rotation, API keys,
passwords and e-mail addresses."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.audit import AuditAction
from tradecore.errors import IllegalTransition, InvalidToken
from tradecore.identity import Session
from tradecore.sessions import (
    API_KEY_PREFIX,
    CSRF_PROTECTED_METHODS,
    LAST_USED_TOUCH_INTERVAL,
    REQUIRED_CLAIMS,
    SESSION_TRANSITIONS,
    RefreshOutcome,
    SessionState,
    SessionTrigger,
    TokenLifetimes,
    TokenType,
    access_claims,
    csrf_matches,
    csrf_required,
    decide_refresh,
    hash_token,
    is_csrf_exempt,
    looks_like_api_key,
    new_api_key,
    next_session_state,
    normalize_email,
    parse_claims,
    refresh_claims,
    session_state,
    should_touch,
    validate_password,
)
from tradecore.testing.clock import EPOCH, SeededRandom

# --- CSRF exemptions ------------------------------------------------------------------------

EXEMPT = [
    "/webhook/abcDEF_123-xyz/order",
    "/webhook/tok",
    "/auth/login",
    "/auth/register",
    "/auth/token",
    "/auth/forgot-password",
    "/auth/reset-password",
    "/auth/silent-refresh",
    "/auth/public-key",
    "/public/pricing",
    "/public/a/b.json",
    "/health",
    "/docs",
    "/openapi.json",
]

NOT_EXEMPT = [
    "/webhookX",
    "/webhookX/tok/order",
    "/webhook",
    "/webhook/",
    "/webhook//order",
    "/webhook/../auth/logout",
    "/webhook/./x",
    "/webhook/tok/../../trading/order",
    "/webhook/%2e%2e/trading/order",
    "/webhook/tok\\..\\x",
    "/public/../auth/logout",
    "/publicx",
    "/auth/login/../x",
    "/auth/login/",
    "/auth/login?x=1",
    "/auth/loginx",
    "/AUTH/LOGIN",
    "/auth/logout",
    "/auth/accept-terms",
    "/healthz",
    "/health/",
    "/health/ready/../../trading/order",
    "/docs/../settings/api-keys",
    "/openapi.jsonx",
    "/trading/order",
    "/settings/api-keys",
    "",
    "auth/login",
    "//auth/login",
]


@pytest.mark.parametrize("path", EXEMPT)
def test_listed_paths_are_exempt(path: str) -> None:
    assert is_csrf_exempt(path)
    assert not csrf_required("POST", path)


@pytest.mark.parametrize("path", NOT_EXEMPT)
def test_tricky_paths_are_not_exempt(path: str) -> None:
    assert not is_csrf_exempt(path)
    assert csrf_required("POST", path)


@given(st.text())
def test_exempt_paths_never_contain_dot_segments_or_escape_their_prefix(path: str) -> None:
    if is_csrf_exempt(path):
        segments = path.split("/")
        assert ".." not in segments and "." not in segments
        assert "%" not in path and "\\" not in path and "?" not in path
        assert path.startswith(("/webhook/", "/public/", "/auth/", "/health", "/docs", "/open"))


@given(
    st.sampled_from(["/webhook/", "/public/"]),
    st.lists(st.sampled_from(["..", ".", "", "a", "%2e", "b"]), min_size=1, max_size=5),
)
def test_prefix_routes_with_traversal_need_the_token(prefix: str, segments: list[str]) -> None:
    path = prefix + "/".join(segments)
    has_trick = any(s in ("..", ".", "", "%2e") for s in segments)
    assert is_csrf_exempt(path) is (not has_trick)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "post", "Patch"])
def test_unsafe_methods_need_the_token(method: str) -> None:
    assert csrf_required(method, "/auth/logout")


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_safe_methods_need_no_token(method: str) -> None:
    assert not csrf_required(method, "/trading/order")


def test_protected_methods_are_the_specified_four() -> None:
    assert frozenset({"POST", "PUT", "DELETE", "PATCH"}) == CSRF_PROTECTED_METHODS


# --- CSRF comparison ------------------------------------------------------------------------

TOKEN = "q1w2e3r4t5y6u7i8o9p0AsDfGhJkLzXcVbNm-_12345"


def test_csrf_matches_only_the_exact_token() -> None:
    assert csrf_matches(TOKEN, TOKEN)
    assert not csrf_matches(TOKEN[:-1], TOKEN)
    assert not csrf_matches(TOKEN + "x", TOKEN)
    assert not csrf_matches(TOKEN.upper(), TOKEN)


@pytest.mark.parametrize(
    "presented", [None, "", 0, 1.5, b"bytes", ["list"], {"a": 1}, "é" * 43, "\ud800", TOKEN + "é"]
)
def test_csrf_rejects_missing_and_odd_values(presented: object) -> None:
    assert csrf_matches(presented, TOKEN) is False


def test_csrf_rejects_everything_against_an_empty_expected_token() -> None:
    assert not csrf_matches("", "")


@given(
    st.one_of(st.none(), st.text(), st.binary(), st.integers(), st.floats(), st.lists(st.text()))
)
def test_csrf_compare_never_raises_and_only_accepts_the_token(presented: object) -> None:
    assert csrf_matches(presented, TOKEN) is (presented == TOKEN)


@given(st.text(min_size=1))
def test_csrf_accepts_any_nonempty_text_against_itself(token: str) -> None:
    assert csrf_matches(token, token)


# --- Session lifecycle ----------------------------------------------------------------------


@pytest.mark.parametrize("trigger", list(SessionTrigger))
def test_every_trigger_ends_an_active_session(trigger: SessionTrigger) -> None:
    assert next_session_state(SessionState.ACTIVE, trigger) is SessionState.INACTIVE


@pytest.mark.parametrize("trigger", list(SessionTrigger))
def test_an_inactive_session_never_comes_back(trigger: SessionTrigger) -> None:
    with pytest.raises(IllegalTransition) as info:
        next_session_state(SessionState.INACTIVE, trigger)
    assert info.value.state is SessionState.INACTIVE
    assert info.value.trigger is trigger
    assert all(target is SessionState.INACTIVE for target in SESSION_TRANSITIONS.values())


def _session(**changes: Any) -> Session:
    base = Session(
        id="s1",
        user_id="u1",
        csrf_token=TOKEN,
        ip_address="203.0.113.7",
        user_agent="ua",
        created_at=EPOCH,
        refresh_jti="jti-current",
    )
    return attrs.evolve(base, **changes)


def test_session_state_follows_is_active() -> None:
    assert session_state(_session()) is SessionState.ACTIVE
    assert session_state(_session(is_active=False)) is SessionState.INACTIVE


# --- Claims ---------------------------------------------------------------------------------


def test_lifetimes_default_to_the_specification() -> None:
    lifetimes = TokenLifetimes()
    assert lifetimes.access == timedelta(minutes=30)
    assert lifetimes.refresh == timedelta(days=30)
    assert TokenLifetimes.from_settings(15, 7) == TokenLifetimes(
        timedelta(minutes=15), timedelta(days=7)
    )


@pytest.mark.parametrize(("minutes", "days"), [(0, 30), (30, 0), (-1, 30)])
def test_lifetimes_must_be_positive(minutes: int, days: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenLifetimes.from_settings(minutes, days)


def test_access_claims_carry_every_required_claim() -> None:
    claims = access_claims("u1", "s1", "j1", EPOCH, timedelta(minutes=30))
    assert set(REQUIRED_CLAIMS) <= claims.keys()
    assert claims["typ"] == "access"
    assert (claims["sub"], claims["sid"], claims["jti"]) == ("u1", "s1", "j1")
    assert claims["iat"] == int(EPOCH.timestamp())
    assert claims["exp"] - claims["iat"] == 30 * 60


def test_refresh_claims_are_typed_refresh() -> None:
    claims = refresh_claims("u1", "s1", "j2", EPOCH, timedelta(days=30))
    assert claims["typ"] == "refresh"
    assert claims["exp"] - claims["iat"] == 30 * 86400


def test_claims_refuse_naive_times_and_empty_lifetimes() -> None:
    with pytest.raises(ValueError, match="timezone"):
        access_claims("u", "s", "j", datetime(2026, 1, 1), timedelta(minutes=1))
    with pytest.raises(ValueError, match="positive"):
        access_claims("u", "s", "j", EPOCH, timedelta(0))


def test_parse_claims_round_trips() -> None:
    claims = refresh_claims("u1", "s1", "j2", EPOCH, timedelta(days=1))
    parsed = parse_claims(claims, TokenType.REFRESH)
    assert (parsed.sub, parsed.sid, parsed.jti, parsed.typ) == ("u1", "s1", "j2", TokenType.REFRESH)


def test_parse_claims_tells_access_from_refresh() -> None:
    claims = access_claims("u1", "s1", "j1", EPOCH, timedelta(minutes=1))
    with pytest.raises(InvalidToken, match="type"):
        parse_claims(claims, TokenType.REFRESH)


@pytest.mark.parametrize("missing", REQUIRED_CLAIMS)
def test_parse_claims_requires_every_claim(missing: str) -> None:
    claims = access_claims("u1", "s1", "j1", EPOCH, timedelta(minutes=1))
    del claims[missing]
    with pytest.raises(InvalidToken):
        parse_claims(claims, TokenType.ACCESS)


@pytest.mark.parametrize(
    ("name", "value"), [("sub", ""), ("sid", 5), ("jti", None), ("iat", "1"), ("exp", True)]
)
def test_parse_claims_checks_types(name: str, value: object) -> None:
    claims = access_claims("u1", "s1", "j1", EPOCH, timedelta(minutes=1))
    claims[name] = value
    with pytest.raises(InvalidToken, match=name):
        parse_claims(claims, TokenType.ACCESS)


# --- Refresh rotation -----------------------------------------------------------------------


def test_the_current_refresh_token_rotates() -> None:
    decision = decide_refresh(_session(), "jti-current")
    assert decision.outcome is RefreshOutcome.ROTATE
    assert not decision.revokes_session
    assert decision.audit_action is AuditAction.TOKEN_REFRESH


def test_an_already_rotated_token_revokes_the_session() -> None:
    decision = decide_refresh(_session(), "jti-old")
    assert decision.outcome is RefreshOutcome.REUSE_DETECTED
    assert decision.revokes_session
    assert decision.audit_action is AuditAction.REFRESH_TOKEN_REUSE


@pytest.mark.parametrize(
    ("session", "jti"),
    [
        (None, "jti-current"),
        (_session(is_active=False), "jti-current"),
        (_session(is_active=False), "jti-old"),
        (_session(refresh_jti=None), "jti-current"),
        (_session(), ""),
    ],
)
def test_refresh_is_rejected_without_an_active_session(session: Session | None, jti: str) -> None:
    decision = decide_refresh(session, jti)
    assert decision.outcome is RefreshOutcome.REJECT
    assert not decision.revokes_session


# --- API keys -------------------------------------------------------------------------------


def test_new_api_key_is_prefixed_hashed_and_shown_by_prefix() -> None:
    plaintext, display, digest = new_api_key(SeededRandom(1))
    assert plaintext.startswith(API_KEY_PREFIX)
    assert len(plaintext) == len(API_KEY_PREFIX) + 43  # 32 bytes, URL-safe base64
    assert display == plaintext[:12]
    assert digest == hashlib.sha256(plaintext.encode()).hexdigest()
    assert looks_like_api_key(plaintext)


def test_new_api_keys_differ() -> None:
    random = SeededRandom(2)
    keys = {new_api_key(random)[0] for _ in range(20)}
    assert len(keys) == 20


@pytest.mark.parametrize(
    "token",
    [
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.c2lnbmF0dXJl",
        "tck_",
        "tck_short",
        "tck_" + "A" * 42,
        "tck_" + "A" * 44,
        "tck_" + "A" * 42 + "=",
        "TCK_" + "A" * 43,
        "tck_" + "A" * 43 + "\n",
        "",
    ],
)
def test_only_key_shaped_tokens_look_like_api_keys(token: str) -> None:
    assert not looks_like_api_key(token)


@given(st.text())
def test_hash_token_never_raises_and_is_hex(token: str) -> None:
    digest = hash_token(token)
    assert len(digest) == 64
    assert int(digest, 16) >= 0


def test_last_used_is_written_at_most_once_a_minute() -> None:
    assert should_touch(None, EPOCH)
    assert not should_touch(EPOCH, EPOCH + timedelta(seconds=59))
    assert should_touch(EPOCH, EPOCH + LAST_USED_TOUCH_INTERVAL)
    assert not should_touch(EPOCH + timedelta(seconds=5), EPOCH)


# --- Passwords and e-mail -------------------------------------------------------------------


@pytest.mark.parametrize("pw", ["12345678", "x" * 64, "p" * 1024, "correct horse battery", "ü" * 8])
def test_acceptable_passwords(pw: str) -> None:
    assert validate_password(pw) is None


@pytest.mark.parametrize(
    ("pw", "reason"),
    [
        (None, "string"),
        (12345678, "string"),
        (b"12345678", "string"),
        ("1234567", "at least 8"),
        ("", "at least 8"),
        ("p" * 1025, "at most 1024"),
        ("abc\ud800defgh", "invalid"),
    ],
)
def test_unacceptable_passwords_say_why(pw: object, reason: str) -> None:
    problem = validate_password(pw)
    assert problem is not None
    assert reason in problem


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("  Alice@Example.COM ", "alice@example.com"),
        ("bob.smith+tag@mail.example.co.uk", "bob.smith+tag@mail.example.co.uk"),
        ("x@a-b.io", "x@a-b.io"),
    ],
)
def test_emails_are_trimmed_and_lowercased(raw: str, normalized: str) -> None:
    assert normalize_email(raw) == normalized


@pytest.mark.parametrize(
    "raw",
    [
        None,
        42,
        "",
        "plain",
        "@example.com",
        "a@",
        "a@b",
        "a@@b.com",
        "a b@c.com",
        "a@b.com\r\nBcc: victim@x.com",
        "a@b.com,c@d.com",
        "<a@b.com>",
        "a..b@c.com",
        ".a@c.com",
        "a@-b.com",
        "a@b..com",
        "a@b.com.",
        "x" * 65 + "@example.com",
        "a@" + "b" * 250 + ".com",
    ],
)
def test_malformed_emails_are_refused(raw: object) -> None:
    assert normalize_email(raw) is None


@given(st.text())
def test_normalized_emails_are_single_line_and_bounded(raw: str) -> None:
    result = normalize_email(raw)
    if result is not None:
        assert len(result) <= 254
        assert result == result.strip().lower()
        assert not any(c in result for c in "\r\n,<> \t")
        assert result.count("@") == 1
        assert normalize_email(result) == result
