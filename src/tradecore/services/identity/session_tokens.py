"""A session's signed tokens: an access token and a refresh token, signed as a pair and read
back one at a time.

A refresh token's id (``jti``) is stored with the session as its SHA-256 digest only; the
access token carries a fresh ``jti`` of its own. The refresh token's lifetime is the caller's
choice (``refresh_ttl`` at login, what is left of it on rotation), so a session never outlives
``refresh_ttl`` from login.

On rotation the successor's ids are derived from the retired token's ``jti`` under the JWT
secret (``successor_jti``, ``access_jti_for``): a retired token coming back within the grace
can be answered with exactly the tokens its first use got, signed again, without keeping any
token in clear.
"""

from __future__ import annotations

import base64
import hashlib
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
_DERIVED = "derived-jti"  # the ``typ`` of the claims a derived id is the digest of


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

    def successor_jti(self, retired_jti: str) -> str:
        """The id of the refresh token that replaces ``retired_jti`` on rotation: always the
        same for the same id, unpredictable without the JWT secret."""
        return self._derive("refresh-successor", retired_jti)

    def access_jti_for(self, refresh_jti: str) -> str:
        """The id of the access token issued with the refresh token ``refresh_jti``."""
        return self._derive("access", refresh_jti)

    def _derive(self, purpose: str, jti: str) -> str:
        # The codec signs with HMAC-SHA256 under the JWT secret, deterministically: the digest
        # of the signed token is a keyed pseudo-random function of (purpose, jti).
        claims = {"sub": purpose, "sid": jti, "typ": _DERIVED, "jti": jti, "iat": 0, "exp": 0}
        digest = hashlib.sha256(self._codec.encode(claims).encode("ascii")).digest()
        return base64.urlsafe_b64encode(digest[:JTI_BYTES]).decode("ascii").rstrip("=")

    def sign(
        self,
        user_id: str,
        session_id: str,
        refresh_jti: str,
        now: datetime,
        refresh_ttl: timedelta,
        *,
        access_jti: str | None = None,
    ) -> IssuedTokens:
        """An access token (lifetime ``access_ttl``, ``access_jti`` or a fresh one) and a
        refresh token with ``refresh_jti`` expiring ``refresh_ttl`` after ``now``. The same
        arguments sign the same tokens."""
        access_id = self.new_jti() if access_jti is None else access_jti
        access = access_claims(user_id, session_id, access_id, now, self._settings.access_ttl)
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
