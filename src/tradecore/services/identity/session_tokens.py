"""A session's signed tokens: an access token and a refresh token, signed as a pair and read
back one at a time.

A refresh token's id (``jti``) is stored with the session as its SHA-256 digest only; the
access token carries a fresh ``jti`` of its own. The refresh token's lifetime is the caller's
choice (``refresh_ttl`` at login, what is left of it on rotation), so a session never outlives
``refresh_ttl`` from login.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from tradecore.errors import InvalidToken
from tradecore.ports.identity import TokenCodec
from tradecore.ports.runtime import RandomSource
from tradecore.services.identity.settings import AuthSettings
from tradecore.sessions import TokenClaims, TokenType, access_claims, parse_claims, refresh_claims

JTI_BYTES = 16


@attrs.frozen
class IssuedTokens:
    """A signed access token and refresh token with their expiry times (tokens not in repr)."""

    access_token: str = attrs.field(repr=False)
    refresh_token: str = attrs.field(repr=False)
    access_expires_at: datetime
    refresh_expires_at: datetime


def _expiry(claims: Mapping[str, Any]) -> datetime:
    return datetime.fromtimestamp(claims["exp"], UTC)


class SessionTokens:
    """Signs and reads the tokens of a session with the service's ``TokenCodec``."""

    def __init__(self, codec: TokenCodec, random: RandomSource, settings: AuthSettings) -> None:
        self._codec = codec
        self._random = random
        self._settings = settings

    def new_jti(self) -> str:
        """A fresh random token id (URL-safe, ``JTI_BYTES`` of entropy)."""
        return self._random.token_urlsafe(JTI_BYTES)

    def sign(
        self, user_id: str, session_id: str, refresh_jti: str, now: datetime, refresh_ttl: timedelta
    ) -> IssuedTokens:
        """An access token (lifetime ``access_ttl``, its own fresh ``jti``) and a refresh token
        with ``refresh_jti`` expiring ``refresh_ttl`` after ``now``."""
        access = access_claims(user_id, session_id, self.new_jti(), now, self._settings.access_ttl)
        refresh = refresh_claims(user_id, session_id, refresh_jti, now, refresh_ttl)
        return IssuedTokens(
            access_token=self._codec.encode(access),
            refresh_token=self._codec.encode(refresh),
            access_expires_at=_expiry(access),
            refresh_expires_at=_expiry(refresh),
        )

    def read(self, token: object, expected: TokenType) -> TokenClaims | None:
        """The claims of ``token`` when it is a non-empty string, correctly signed, unexpired
        and of the ``expected`` type; None otherwise (never raises for a bad token)."""
        if not isinstance(token, str) or not token:
            return None
        try:
            return parse_claims(self._codec.decode(token, expected_type=expected.value), expected)
        except InvalidToken:
            return None
