"""Session rules: CSRF, the session lifecycle, JWT claims and refresh rotation, API keys,
passwords and e-mail addresses.

Everything here is pure: time and randomness come in as parameters. Nothing in this module
logs or returns a secret it was given, except the one-time plaintext of a new API key.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from tradecore.audit import AuditAction
from tradecore.errors import IllegalTransition, InvalidToken
from tradecore.identity import Session
from tradecore.ports.runtime import RandomSource

# --- CSRF ---------------------------------------------------------------------------------

CSRF_TOKEN_BYTES = 32
CSRF_HEADER = "X-CSRF-Token"
CSRF_PROTECTED_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})

_CSRF_EXEMPT_PATHS = frozenset(
    {
        "/auth/login",
        "/auth/register",
        "/auth/token",
        "/auth/forgot-password",
        "/auth/reset-password",
        "/auth/silent-refresh",
        "/auth/public-key",
        "/health",
        "/docs",
        "/openapi.json",
    }
)
_CSRF_EXEMPT_PREFIXES = ("/webhook/", "/public/")
# A path segment of an exempt prefix route: no dot segments, no encoding, no separators tricks.
_SAFE_SEGMENT = re.compile(r"[A-Za-z0-9_\-.~]+")


def is_csrf_exempt(path: str) -> bool:
    """True when the specification exempts ``path`` from CSRF.

    Exact matches for the listed endpoints; for ``/webhook/*`` and ``/public/*`` every further
    segment must be a plain, non-empty segment that is not ``.`` or ``..``. Anything unusual
    (a trailing slash, a query string, percent-encoding, a backslash, other case) is not
    exempt: when in doubt the token is required.
    """
    if not isinstance(path, str):
        return False
    if path in _CSRF_EXEMPT_PATHS:
        return True
    for prefix in _CSRF_EXEMPT_PREFIXES:
        if path.startswith(prefix):
            segments = path[len(prefix) :].split("/")
            return all(
                s not in (".", "..") and _SAFE_SEGMENT.fullmatch(s) is not None for s in segments
            )
    return False


def csrf_required(method: str, path: str) -> bool:
    """True when a cookie-authenticated request with ``method`` on ``path`` needs the header."""
    return method.upper() in CSRF_PROTECTED_METHODS and not is_csrf_exempt(path)


def _utf8(text: str) -> bytes:
    # surrogatepass: injective and never raises, even on lone surrogates.
    return text.encode("utf-8", "surrogatepass")


def csrf_matches(presented: object, expected: str) -> bool:
    """Constant-time comparison of the presented header value with the session's token.

    False for a missing, empty or non-string value and for any mismatch (non-ASCII included);
    never raises.
    """
    if not isinstance(presented, str) or not isinstance(expected, str):
        return False
    if not presented or not expected:
        return False
    return hmac.compare_digest(_utf8(presented), _utf8(expected))


# --- Session lifecycle ----------------------------------------------------------------------


class SessionState(enum.Enum):
    ACTIVE = "active"
    INACTIVE = "inactive"


class SessionTrigger(enum.Enum):
    LOGOUT = "logout"
    ADMIN_REVOKE = "admin_revoke"
    REFRESH_REUSE = "refresh_reuse"  # an already-rotated refresh token came back
    PASSWORD_RESET = "password_reset"  # noqa: S105 - every session of the user ends


SESSION_TRANSITIONS: Mapping[tuple[SessionState, SessionTrigger], SessionState] = {
    (SessionState.ACTIVE, SessionTrigger.LOGOUT): SessionState.INACTIVE,
    (SessionState.ACTIVE, SessionTrigger.ADMIN_REVOKE): SessionState.INACTIVE,
    (SessionState.ACTIVE, SessionTrigger.REFRESH_REUSE): SessionState.INACTIVE,
    (SessionState.ACTIVE, SessionTrigger.PASSWORD_RESET): SessionState.INACTIVE,
    # There is no way back: an inactive session is never reactivated, a new login makes a
    # new session.
}


def session_state(session: Session) -> SessionState:
    return SessionState.ACTIVE if session.is_active else SessionState.INACTIVE


def next_session_state(state: SessionState, trigger: SessionTrigger) -> SessionState:
    """The state after ``trigger``; raises IllegalTransition when the table has no entry."""
    try:
        return SESSION_TRANSITIONS[(state, trigger)]
    except KeyError:
        raise IllegalTransition(state, trigger) from None


# --- JWT claims -----------------------------------------------------------------------------


class TokenType(enum.StrEnum):
    ACCESS = "access"
    REFRESH = "refresh"


REQUIRED_CLAIMS = ("exp", "iat", "sub", "sid", "typ", "jti")
ACCESS_TOKEN_EXPIRE_MINUTES = 30
REFRESH_TOKEN_EXPIRE_DAYS = 30


def _positive(_: object, attribute: attrs.Attribute[timedelta], value: timedelta) -> None:
    if value <= timedelta(0):
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class TokenLifetimes:
    """How long access and refresh tokens (and their cookies) live."""

    access: timedelta = attrs.field(
        default=timedelta(minutes=ACCESS_TOKEN_EXPIRE_MINUTES), validator=_positive
    )
    refresh: timedelta = attrs.field(
        default=timedelta(days=REFRESH_TOKEN_EXPIRE_DAYS), validator=_positive
    )

    @classmethod
    def from_settings(cls, access_minutes: int, refresh_days: int) -> TokenLifetimes:
        """From ACCESS_TOKEN_EXPIRE_MINUTES and REFRESH_TOKEN_EXPIRE_DAYS; ValueError if not
        positive."""
        return cls(access=timedelta(minutes=access_minutes), refresh=timedelta(days=refresh_days))


def _numeric_date(when: datetime) -> int:
    if when.tzinfo is None:
        raise ValueError("token times must be timezone-aware")
    return int(when.timestamp())


def _claims(
    typ: TokenType, user_id: str, session_id: str, jti: str, now: datetime, ttl: timedelta
) -> dict[str, Any]:
    if ttl <= timedelta(0):
        raise ValueError("token lifetime must be positive")
    iat = _numeric_date(now)
    return {
        "sub": user_id,
        "sid": session_id,
        "typ": typ.value,
        "jti": jti,
        "iat": iat,
        "exp": iat + int(ttl.total_seconds()),
    }


def access_claims(
    user_id: str, session_id: str, jti: str, now: datetime, ttl: timedelta
) -> dict[str, Any]:
    """The claims of an access token: every REQUIRED_CLAIMS key, times as integer seconds."""
    return _claims(TokenType.ACCESS, user_id, session_id, jti, now, ttl)


def refresh_claims(
    user_id: str, session_id: str, jti: str, now: datetime, ttl: timedelta
) -> dict[str, Any]:
    """The claims of a refresh token; the session keeps the SHA-256 digest of its ``jti``."""
    return _claims(TokenType.REFRESH, user_id, session_id, jti, now, ttl)


@attrs.frozen
class TokenClaims:
    """Verified claims, typed."""

    sub: str
    sid: str
    typ: TokenType
    jti: str
    iat: int
    exp: int


def parse_claims(claims: Mapping[str, Any], expected: TokenType) -> TokenClaims:
    """Typed claims; raises InvalidToken when a required claim is missing, has the wrong type
    or is empty, or when ``typ`` is not ``expected``. (Signature and expiry are the codec's.)"""
    missing = [name for name in REQUIRED_CLAIMS if name not in claims]
    if missing:
        raise InvalidToken(f"missing claims: {', '.join(missing)}")
    if claims["typ"] != expected.value:
        raise InvalidToken("wrong token type")
    for name in ("sub", "sid", "jti"):
        value = claims[name]
        if not isinstance(value, str) or not value:
            raise InvalidToken(f"claim {name} must be a non-empty string")
    for name in ("iat", "exp"):
        value = claims[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidToken(f"claim {name} must be an integer")
    return TokenClaims(
        sub=claims["sub"],
        sid=claims["sid"],
        typ=expected,
        jti=claims["jti"],
        iat=claims["iat"],
        exp=claims["exp"],
    )


# --- Refresh rotation -----------------------------------------------------------------------

REFRESH_REUSE_GRACE = timedelta(seconds=10)
"""How long a just-rotated refresh token may come back and get its successor again (two tabs
refreshing at once) instead of revoking the session."""


class RefreshOutcome(enum.Enum):
    ROTATE = "rotate"  # issue a new access and refresh token, record the new jti
    REISSUE = "reissue"  # the token the latest rotation retired, within the grace: its successor
    REUSE_DETECTED = "reuse_detected"  # revoke the session and audit refresh_token_reuse
    REJECT = "reject"  # 401: no session, session inactive, or a malformed jti


@attrs.frozen
class RefreshRotation:
    """A session's latest rotation: the digest of the refresh token id it retired and when
    (whole seconds: the successor's ``iat``). The successor is the session's ``refresh_jti``."""

    retired_jti: str = attrs.field(repr=False)
    rotated_at: datetime


@attrs.frozen
class RefreshDecision:
    outcome: RefreshOutcome
    reason: str

    @property
    def revokes_session(self) -> bool:
        return self.outcome is RefreshOutcome.REUSE_DETECTED

    @property
    def audit_action(self) -> AuditAction:
        if self.outcome is RefreshOutcome.REUSE_DETECTED:
            return AuditAction.REFRESH_TOKEN_REUSE
        return AuditAction.TOKEN_REFRESH


def decide_refresh(
    session: Session | None,
    presented_jti: str,
    *,
    rotation: RefreshRotation | None = None,
    now: datetime | None = None,
    grace: timedelta = REFRESH_REUSE_GRACE,
) -> RefreshDecision:
    """What to do with a refresh token (signature and expiry already verified) whose ``sid``
    loaded ``session``; ``presented_jti`` and the stored ids are SHA-256 digests.

    Rotation on every use: only the session's current ``refresh_jti`` rotates. The token the
    session's latest ``rotation`` retired, presented again less than ``grace`` after it (at
    ``now``), gets the same successor again (REISSUE). Any other jti of an active session is
    an already-rotated token coming back, which revokes the session.
    """
    if session is None:
        return RefreshDecision(RefreshOutcome.REJECT, "unknown session")
    if not session.is_active:
        return RefreshDecision(RefreshOutcome.REJECT, "session inactive")
    if not isinstance(presented_jti, str) or not presented_jti or session.refresh_jti is None:
        return RefreshDecision(RefreshOutcome.REJECT, "no valid refresh token")
    if hmac.compare_digest(_utf8(presented_jti), _utf8(session.refresh_jti)):
        return RefreshDecision(RefreshOutcome.ROTATE, "current refresh token")
    if (
        rotation is not None
        and now is not None
        and hmac.compare_digest(_utf8(presented_jti), _utf8(rotation.retired_jti))
        and rotation.rotated_at <= now < rotation.rotated_at + grace
    ):
        return RefreshDecision(RefreshOutcome.REISSUE, "just rotated; within the grace")
    return RefreshDecision(RefreshOutcome.REUSE_DETECTED, "refresh token reused")


# --- API keys -------------------------------------------------------------------------------

API_KEY_PREFIX = "tck_"
API_KEY_BYTES = 32
API_KEY_DISPLAY_CHARS = 8
LAST_USED_TOUCH_INTERVAL = timedelta(minutes=1)
# token_urlsafe(32) is 43 characters of the URL-safe base64 alphabet.
_API_KEY = re.compile(re.escape(API_KEY_PREFIX) + r"[A-Za-z0-9_-]{43}")


def new_api_key(random: RandomSource) -> tuple[str, str, str]:
    """A fresh key: (plaintext shown once, display prefix, SHA-256 hex to store).

    The display prefix is ``tck_`` plus the first 8 characters of the random part: enough to
    tell keys apart in a list, far too little to guess the rest.
    """
    plaintext = API_KEY_PREFIX + random.token_urlsafe(API_KEY_BYTES)
    display = plaintext[: len(API_KEY_PREFIX) + API_KEY_DISPLAY_CHARS]
    return plaintext, display, hash_token(plaintext)


def looks_like_api_key(token: str) -> bool:
    """True when a Bearer value has the API-key shape (a JWT never does)."""
    return isinstance(token, str) and _API_KEY.fullmatch(token) is not None


def hash_token(token: str) -> str:
    """SHA-256 hex digest of ``token`` (UTF-8): the form in which keys and tokens are stored."""
    return hashlib.sha256(_utf8(token)).hexdigest()


def should_touch(last_used_at: datetime | None, now: datetime) -> bool:
    """True when ``last_used_at`` is due to be written (never written, or a minute old)."""
    return last_used_at is None or now - last_used_at >= LAST_USED_TOUCH_INTERVAL


# --- Passwords and e-mail -------------------------------------------------------------------

MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024
MAX_EMAIL_LENGTH = 254

# ASCII only: a dot-atom local part (RFC 5322 atext) and a hostname with at least one dot.
# No quoted local parts, no IP literals, no whitespace or commas (header injection).
_EMAIL = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
)


def validate_password(pw: object) -> str | None:
    """None when ``pw`` is acceptable, otherwise the reason (safe to show to the user)."""
    if not isinstance(pw, str):
        return "password must be a string"
    if len(pw) < MIN_PASSWORD_LENGTH:
        return f"password must be at least {MIN_PASSWORD_LENGTH} characters"
    if len(pw) > MAX_PASSWORD_LENGTH:
        return f"password must be at most {MAX_PASSWORD_LENGTH} characters"
    try:
        pw.encode("utf-8")
    except UnicodeEncodeError:
        return "password contains invalid characters"
    return None


def normalize_email(email: object) -> str | None:
    """The stored form of an address (trimmed, lower case), or None when it is not one."""
    if not isinstance(email, str):
        return None
    normalized = email.strip().lower()
    if len(normalized) > MAX_EMAIL_LENGTH:
        return None
    local, _, _ = normalized.partition("@")
    if len(local) > 64 or _EMAIL.fullmatch(normalized) is None:
        return None
    return normalized
