"""TokenCodec on PyJWT: HS256 only, every required claim present, ``typ`` checked.

The signature, the algorithm (pinned to HS256: ``none``, other HMAC sizes and asymmetric
algorithms are refused) and the required claims are verified by PyJWT. Time claims are checked
here against the injected clock, the same clock that stamped them, so a test clock and the
codec agree; without one the codec reads the system's UTC time.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt

from tradecore.errors import InvalidToken
from tradecore.ports.runtime import Clock
from tradecore.sessions import REQUIRED_CLAIMS

ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32
MAX_TOKEN_CHARS = 4096  # ours are ~300 characters; anything far longer is not ours
MAX_CLOCK_SKEW = timedelta(seconds=60)  # how far in the future ``iat`` may lie


class _UtcClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def _integer(claims: Mapping[str, Any], name: str) -> int:
    value = claims[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidToken(f"claim {name} must be an integer")
    return value


class JwtTokenCodec:
    """Signs and verifies the service's access and refresh tokens.

    ``secret`` must hold at least 32 bytes (UTF-8), else ValueError. ``leeway`` extends the
    expiry (default none). ``decode`` raises ``InvalidToken`` and nothing else.
    """

    def __init__(
        self,
        secret: str,
        *,
        clock: Clock | None = None,
        leeway: timedelta = timedelta(0),
    ) -> None:
        if not isinstance(secret, str) or len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
            raise ValueError(f"the JWT secret must be at least {MIN_SECRET_BYTES} bytes")
        if leeway < timedelta(0):
            raise ValueError("leeway must not be negative")
        self._key = secret.encode("utf-8")
        self._clock: Clock = clock or _UtcClock()
        self._leeway = leeway
        self._jwt = jwt.PyJWT({"enforce_minimum_key_length": True})

    def __repr__(self) -> str:
        return "JwtTokenCodec(secret=<redacted>)"

    def encode(self, claims: Mapping[str, Any]) -> str:
        """A token carrying ``claims``; ValueError when a required claim is missing."""
        missing = [name for name in REQUIRED_CLAIMS if name not in claims]
        if missing:
            raise ValueError(f"missing claims: {', '.join(missing)}")
        return self._jwt.encode(dict(claims), self._key, algorithm=ALGORITHM)

    def decode(self, token: str, *, expected_type: str) -> Mapping[str, Any]:
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise InvalidToken("malformed token")
        try:
            claims = self._jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                options={
                    "require": list(REQUIRED_CLAIMS),
                    # Times are checked below, against our clock.
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.PyJWTError as e:
            raise InvalidToken(type(e).__name__) from e
        if claims.get("typ") != expected_type:
            raise InvalidToken("wrong token type")
        self._check_times(claims)
        return claims

    def _check_times(self, claims: Mapping[str, Any]) -> None:
        now = self._clock.now().timestamp()
        exp = _integer(claims, "exp")
        iat = _integer(claims, "iat")
        if now >= exp + self._leeway.total_seconds():
            raise InvalidToken("token expired")
        if iat > now + MAX_CLOCK_SKEW.total_seconds():
            raise InvalidToken("token issued in the future")
        if "nbf" in claims and now < _integer(claims, "nbf") - self._leeway.total_seconds():
            raise InvalidToken("token not yet valid")
