"""JwtTokenCodec: HS256 pinned, required claims, token type, expiry on the injected clock."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.errors import InvalidToken
from tradecore.ports.identity import TokenCodec
from tradecore.sessions import REQUIRED_CLAIMS, access_claims, refresh_claims
from tradecore.testing.clock import EPOCH, FakeClock
from tradecore_adapters.crypto.tokens import JwtTokenCodec

SECRET = "s" * 32
OTHER_SECRET = "t" * 32


def codec(clock: FakeClock, secret: str = SECRET) -> JwtTokenCodec:
    return JwtTokenCodec(secret, clock=clock)


def claims(**overrides: Any) -> dict[str, Any]:
    base = access_claims("user-1", "session-1", "jti-1", EPOCH, timedelta(minutes=30))
    base.update(overrides)
    return base


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_implements_the_port() -> None:
    assert isinstance(JwtTokenCodec(SECRET), TokenCodec)


def test_round_trip_returns_the_claims() -> None:
    clock = FakeClock()
    c = codec(clock)
    token = c.encode(claims())
    assert dict(c.decode(token, expected_type="access")) == claims()
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


@pytest.mark.parametrize("secret", ["", "short", "x" * 31, "é" * 15])
def test_a_secret_under_32_bytes_is_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        JwtTokenCodec(secret)


def test_a_32_byte_multibyte_secret_is_accepted() -> None:
    JwtTokenCodec("é" * 16)  # 32 bytes in UTF-8


def test_repr_hides_the_secret() -> None:
    assert SECRET not in repr(JwtTokenCodec(SECRET))


def test_access_and_refresh_tokens_are_told_apart() -> None:
    clock = FakeClock()
    c = codec(clock)
    access = c.encode(claims())
    refresh = c.encode(refresh_claims("user-1", "session-1", "jti-2", EPOCH, timedelta(days=30)))
    with pytest.raises(InvalidToken):
        c.decode(access, expected_type="refresh")
    with pytest.raises(InvalidToken):
        c.decode(refresh, expected_type="access")
    assert c.decode(refresh, expected_type="refresh")["typ"] == "refresh"


def test_expiry_follows_the_injected_clock() -> None:
    clock = FakeClock()
    c = codec(clock)
    token = c.encode(claims())
    clock.advance(30 * 60 - 1)
    assert c.decode(token, expected_type="access")["sub"] == "user-1"
    clock.advance(1)
    with pytest.raises(InvalidToken, match="expired"):
        c.decode(token, expected_type="access")


def test_leeway_extends_expiry() -> None:
    clock = FakeClock()
    c = JwtTokenCodec(SECRET, clock=clock, leeway=timedelta(seconds=10))
    token = c.encode(claims())
    clock.advance(30 * 60 + 9)
    c.decode(token, expected_type="access")
    clock.advance(1)
    with pytest.raises(InvalidToken):
        c.decode(token, expected_type="access")


def test_a_token_issued_in_the_future_is_refused() -> None:
    clock = FakeClock()
    c = codec(clock)
    future = EPOCH + timedelta(minutes=5)
    token = c.encode(access_claims("u", "s", "j", future, timedelta(minutes=30)))
    with pytest.raises(InvalidToken, match="future"):
        c.decode(token, expected_type="access")


def test_a_token_signed_with_another_key_is_refused() -> None:
    clock = FakeClock()
    forged = codec(clock, OTHER_SECRET).encode(claims())
    with pytest.raises(InvalidToken):
        codec(clock).decode(forged, expected_type="access")


def test_alg_none_is_refused() -> None:
    clock = FakeClock()
    header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    payload = b64(json.dumps(claims()).encode())
    for token in (f"{header}.{payload}.", f"{header}.{payload}"):
        with pytest.raises(InvalidToken):
            codec(clock).decode(token, expected_type="access")


def test_another_hmac_algorithm_with_the_right_key_is_refused() -> None:
    clock = FakeClock()
    long_secret = "k" * 64
    token = jwt.encode(claims(), long_secret, algorithm="HS512")
    with pytest.raises(InvalidToken):
        codec(clock, long_secret).decode(token, expected_type="access")


def test_a_tampered_payload_is_refused() -> None:
    clock = FakeClock()
    header, _, signature = codec(clock).encode(claims()).split(".")
    payload = b64(json.dumps(claims(sub="admin")).encode())
    with pytest.raises(InvalidToken):
        codec(clock).decode(f"{header}.{payload}.{signature}", expected_type="access")


@pytest.mark.parametrize("missing", REQUIRED_CLAIMS)
def test_every_required_claim_is_required(missing: str) -> None:
    clock = FakeClock()
    body = claims()
    del body[missing]
    token = jwt.encode(body, SECRET, algorithm="HS256")
    with pytest.raises(InvalidToken):
        codec(clock).decode(token, expected_type="access")
    with pytest.raises(ValueError, match=missing):
        codec(clock).encode(body)


@pytest.mark.parametrize(
    "bad", [{"exp": "later"}, {"exp": True}, {"iat": 1.5}, {"sub": 7}, {"jti": ["x"]}]
)
def test_claims_of_the_wrong_type_are_refused(bad: dict[str, Any]) -> None:
    clock = FakeClock()
    token = jwt.encode(claims(**bad), SECRET, algorithm="HS256")
    with pytest.raises(InvalidToken):
        codec(clock).decode(token, expected_type="access")


@pytest.mark.parametrize("token", ["", "a.b.c", "not a token", "x" * 5000, None, 42, b"bytes"])
def test_malformed_input_raises_invalid_token_only(token: Any) -> None:
    with pytest.raises(InvalidToken):
        codec(FakeClock()).decode(token, expected_type="access")


@given(st.text(max_size=300))
def test_arbitrary_text_never_decodes_and_raises_only_invalid_token(text: str) -> None:
    with pytest.raises(InvalidToken):
        codec(FakeClock()).decode(text, expected_type="access")
