"""Authentication: login, silent refresh, logout, revocation, the ``/auth/token`` grants, and
the authentication of every request.

Refusals are ``Rejected`` values; the HTTP layer turns them into problem responses. Unknown
user and wrong password get the same status and body. A store that cannot be reached is 503,
never 401. Every login, refresh, logout and revocation leaves one audit entry; no entry, log
line or ``repr`` holds a password, a token or a CSRF token.

Tokens: a session's refresh token id (``jti``) is stored as its SHA-256 digest; refresh
tokens rotate on every use and an already-rotated one coming back revokes the session. A
session lives at most ``refresh_ttl`` from login: rotation hands out a new refresh token with
the old one's expiry, never a later one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from tradecore.audit import AuditAction, RequestContext
from tradecore.errors import InvalidToken, StoreUnavailable
from tradecore.identity import Session, User
from tradecore.ports.identity import CaptchaVerifier, PasswordHasher, TokenCodec
from tradecore.ports.protection import RateLimiter
from tradecore.ports.repositories import ApiKeyRepository, SessionRepository, UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.security_events import SecurityEvents
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected, bad_request
from tradecore.sessions import (
    ACCESS_TOKEN_EXPIRE_MINUTES,
    CSRF_TOKEN_BYTES,
    MAX_PASSWORD_LENGTH,
    REFRESH_TOKEN_EXPIRE_DAYS,
    RefreshOutcome,
    TokenClaims,
    TokenType,
    access_claims,
    decide_refresh,
    hash_token,
    looks_like_api_key,
    normalize_email,
    parse_claims,
    refresh_claims,
    should_touch,
)

log = logging.getLogger(__name__)

JTI_BYTES = 16

INVALID_CREDENTIALS = Rejected(401, "invalid_credentials", "Invalid e-mail or password")
NOT_AUTHENTICATED = Rejected(401, "not_authenticated", "Authentication required")
INVALID_REFRESH = Rejected(401, "invalid_refresh_token", "Session expired; log in again")
USER_DISABLED = Rejected(403, "user_disabled", "This account is disabled")
CAPTCHA_FAILED = Rejected(403, "captcha_failed", "Bot challenge failed")


def _positive(_: object, attribute: attrs.Attribute[timedelta], value: timedelta) -> None:
    if value <= timedelta(0):
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen
class AuthSettings:
    """Token lifetimes, the bot challenge, and the ``/auth/token`` password-grant limit.

    ``captcha_bypass_user_agents`` is an explicit list of exact User-Agent values (security
    scanners) that skip the challenge; empty by default. ``token_grant_attempts`` password
    grants are admitted per e-mail address and per client IP in ``token_grant_window_s``: the
    grant has no bot challenge, so this is what stands between it and password guessing.
    """

    access_ttl: timedelta = attrs.field(
        default=timedelta(minutes=ACCESS_TOKEN_EXPIRE_MINUTES), validator=_positive
    )
    refresh_ttl: timedelta = attrs.field(
        default=timedelta(days=REFRESH_TOKEN_EXPIRE_DAYS), validator=_positive
    )
    captcha_enabled: bool = True
    captcha_bypass_user_agents: frozenset[str] = attrs.field(
        default=frozenset(), converter=frozenset
    )
    token_grant_attempts: int = 10
    token_grant_window_s: float = 900.0


@attrs.frozen
class IssuedTokens:
    """A signed access token and refresh token with their expiry times (tokens not in repr)."""

    access_token: str = attrs.field(repr=False)
    refresh_token: str = attrs.field(repr=False)
    access_expires_at: datetime
    refresh_expires_at: datetime


@attrs.frozen(repr=False)
class LoginResult:
    """A successful login: the user, the new session (its ``csrf_token`` goes to the client
    once, in the body) and the tokens for the cookies."""

    user: User
    session: Session
    tokens: IssuedTokens

    @property
    def csrf_token(self) -> str:
        return self.session.csrf_token

    def __repr__(self) -> str:
        return f"LoginResult(user_id={self.user.id!r}, session_id={self.session.id!r})"


class BotChallenge:
    """The bot challenge of login and register: on when enabled, except for the User-Agents
    of the bypass list."""

    def __init__(
        self, verifier: CaptchaVerifier, *, enabled: bool, bypass_user_agents: frozenset[str]
    ) -> None:
        self._verifier = verifier
        self._enabled = enabled
        self._bypass = bypass_user_agents

    def applies(self, context: RequestContext) -> bool:
        return self._enabled and context.user_agent not in self._bypass

    def bypassed(self, context: RequestContext) -> bool:
        """True when the challenge is on but this User-Agent skipped it (audited)."""
        return self._enabled and context.user_agent in self._bypass

    async def check(self, token: object, context: RequestContext) -> Rejected | None:
        """None when the request may proceed; 400 without a token, 403 when refused. A
        verifier that raises counts as a refusal."""
        if not self.applies(context):
            return None
        if not isinstance(token, str) or not token:
            return bad_request("turnstile_token is required")
        try:
            passed = await self._verifier.verify(token, context.ip_address)
        except Exception:
            log.exception("bot challenge verifier failed; refusing")
            passed = False
        return None if passed is True else CAPTCHA_FAILED


def _expiry(claims: Mapping[str, Any]) -> datetime:
    return datetime.fromtimestamp(claims["exp"], UTC)


class Authenticator:
    """Sessions and request authentication (see the module docstring)."""

    def __init__(
        self,
        users: UserRepository,
        sessions: SessionRepository,
        api_keys: ApiKeyRepository,
        hasher: PasswordHasher,
        codec: TokenCodec,
        captcha: CaptchaVerifier,
        events: SecurityEvents,
        clock: Clock,
        random: RandomSource,
        settings: AuthSettings,
        *,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._users = users
        self._sessions = sessions
        self._api_keys = api_keys
        self._hasher = hasher
        self._codec = codec
        self._challenge = BotChallenge(
            captcha,
            enabled=settings.captcha_enabled,
            bypass_user_agents=settings.captcha_bypass_user_agents,
        )
        self._events = events
        self._clock = clock
        self._random = random
        self._settings = settings
        self._limiter = limiter

    # --- login and the password grant ---------------------------------------------------

    async def login(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> LoginResult | Rejected:
        """``POST /auth/login``: bot challenge, user by e-mail, Argon2id verification (a dummy
        one for unknown users), rehash if due, a new session with its CSRF token, and the two
        tokens. 400 bad input, 401 unknown user or wrong password (one body), 403 challenge
        refused or user disabled (only after a correct password), 503 store down."""
        try:
            return await self._login(email, password, turnstile_token, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _login(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> LoginResult | Rejected:
        metadata: dict[str, Any] = {"method": "login"}
        if self._challenge.bypassed(context):
            metadata["captcha_bypassed"] = True
        refused = await self._challenge.check(turnstile_token, context)
        if refused is not None:
            await self._audit_login_failure(None, context, refused.code, metadata)
            return refused
        credentials = _credentials(email, password)
        if isinstance(credentials, Rejected):
            await self._audit_login_failure(None, context, "invalid request", metadata)
            return credentials
        user = await self._check_password(*credentials, context, metadata)
        if isinstance(user, Rejected):
            return user
        session, tokens = await self._open_session(user, context)
        await self._audit(
            AuditAction.LOGIN, context, user.id, True, session_id=session.id, metadata=metadata
        )
        return LoginResult(user, session, tokens)

    async def password_grant(
        self, username: object, password: object, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """``POST /auth/token`` with ``grant_type=password``: login for API clients, without
        the bot challenge but limited per e-mail and per client IP (429). Creates a session
        like login. Same refusals as login otherwise."""
        try:
            return await self._password_grant(username, password, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _password_grant(
        self, username: object, password: object, context: RequestContext
    ) -> IssuedTokens | Rejected:
        metadata: dict[str, Any] = {"method": "password_grant"}
        credentials = _credentials(username, password)
        if isinstance(credentials, Rejected):
            await self._audit_login_failure(None, context, "invalid request", metadata)
            return credentials
        limited = await self._grant_limited(credentials[0], context)
        if limited is not None:
            await self._audit_login_failure(None, context, "rate limited", metadata)
            return limited
        user = await self._check_password(*credentials, context, metadata)
        if isinstance(user, Rejected):
            return user
        session, tokens = await self._open_session(user, context)
        await self._audit(
            AuditAction.LOGIN, context, user.id, True, session_id=session.id, metadata=metadata
        )
        return tokens

    async def _grant_limited(self, email: str, context: RequestContext) -> Rejected | None:
        if self._limiter is None:
            return None
        limit, window = self._settings.token_grant_attempts, self._settings.token_grant_window_s
        # The address goes into a store key as a digest, never in clear.
        keys = (f"auth-token:ip:{context.ip_address}", f"auth-token:email:{hash_token(email)}")
        for key in keys:
            decision = await self._limiter.hit(key, limit, window)
            if not decision.allowed:
                return Rejected(
                    429,
                    "rate_limited",
                    "Too many attempts; try again later",
                    retry_after_s=decision.retry_after_s,
                )
        return None

    async def _check_password(
        self, email: str, password: str, context: RequestContext, metadata: dict[str, Any]
    ) -> User | Rejected:
        """The user whose password this is, or the refusal (audited).

        A hash made with outdated parameters is replaced by a compare-and-set on the hash that
        was checked. When the password changed meanwhile (a reset) the newer hash is never
        overwritten: the user is read again and the password checked against what is stored
        now, without a second rehash."""
        user = await self._verified_user(email, password, context, metadata)
        if isinstance(user, Rejected) or not self._hasher.needs_rehash(user.password_hash):
            return user
        rehashed = attrs.evolve(user, password_hash=await self._hasher.hash(password))
        stored = await self._users.save(rehashed, previous=user)
        if stored is not None:
            return stored
        return await self._verified_user(email, password, context, metadata)

    async def _verified_user(
        self, email: str, password: str, context: RequestContext, metadata: dict[str, Any]
    ) -> User | Rejected:
        user = await self._users.by_email(email)
        if user is None:
            await self._hasher.verify_dummy(password)
            await self._audit_login_failure(None, context, "unknown user", metadata)
            return INVALID_CREDENTIALS
        if not await self._hasher.verify(user.password_hash, password):
            await self._audit_login_failure(user.id, context, "wrong password", metadata)
            return INVALID_CREDENTIALS
        if user.disabled:
            await self._audit_login_failure(user.id, context, "user disabled", metadata)
            return USER_DISABLED
        return user

    async def _open_session(
        self, user: User, context: RequestContext
    ) -> tuple[Session, IssuedTokens]:
        now = self._clock.now()
        session_id = self._random.new_id()
        refresh_jti = self._random.token_urlsafe(JTI_BYTES)
        session = Session(
            id=session_id,
            user_id=user.id,
            csrf_token=self._random.token_urlsafe(CSRF_TOKEN_BYTES),
            ip_address=context.ip_address,
            user_agent=context.user_agent,
            created_at=now,
            is_active=True,
            refresh_jti=hash_token(refresh_jti),
        )
        tokens = self._sign(user.id, session_id, refresh_jti, now, self._settings.refresh_ttl)
        await self._sessions.add(session)
        return session, tokens

    def _sign(
        self, user_id: str, session_id: str, refresh_jti: str, now: datetime, refresh_ttl: timedelta
    ) -> IssuedTokens:
        access = access_claims(
            user_id,
            session_id,
            self._random.token_urlsafe(JTI_BYTES),
            now,
            self._settings.access_ttl,
        )
        refresh = refresh_claims(user_id, session_id, refresh_jti, now, refresh_ttl)
        return IssuedTokens(
            access_token=self._codec.encode(access),
            refresh_token=self._codec.encode(refresh),
            access_expires_at=_expiry(access),
            refresh_expires_at=_expiry(refresh),
        )

    # --- refresh ------------------------------------------------------------------------

    async def refresh(
        self, refresh_token: str | None, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """``POST /auth/silent-refresh`` (and ``/auth/token`` with ``grant_type=refresh_token``):
        a new access token and a rotated refresh token that expires when the presented one
        did. 401 for a missing, invalid or expired token or an inactive session; an
        already-rotated token revokes its session (401, audited ``refresh_token_reuse``); 403
        for a disabled user; 503 store down."""
        try:
            return await self._refresh(refresh_token, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _refresh(
        self, refresh_token: str | None, context: RequestContext
    ) -> IssuedTokens | Rejected:
        claims = self._verified(refresh_token, TokenType.REFRESH)
        if claims is None:
            await self._audit(AuditAction.TOKEN_REFRESH, context, None, False, "invalid token")
            return INVALID_REFRESH
        session = await self._sessions.get(claims.sid)
        if session is not None and session.user_id != claims.sub:
            session = None
        decision = decide_refresh(session, hash_token(claims.jti))
        if decision.outcome is RefreshOutcome.REJECT:
            await self._audit(
                AuditAction.TOKEN_REFRESH,
                context,
                claims.sub,
                False,
                decision.reason,
                session_id=claims.sid,
            )
            return INVALID_REFRESH
        if decision.outcome is RefreshOutcome.REUSE_DETECTED:
            return await self._reuse_detected(claims, context)
        user = await self._users.get(claims.sub)
        if user is None or user.disabled:
            reason = "unknown user" if user is None else "user disabled"
            await self._audit(
                AuditAction.TOKEN_REFRESH,
                context,
                claims.sub,
                False,
                reason,
                session_id=claims.sid,
            )
            return INVALID_REFRESH if user is None else USER_DISABLED
        now = self._clock.now()
        new_jti = self._random.token_urlsafe(JTI_BYTES)
        # The new refresh token keeps the old one's expiry: a session never outlives
        # refresh_ttl from login.
        remaining = timedelta(seconds=claims.exp - int(now.timestamp()))
        if remaining <= timedelta(0):  # only inside a codec's leeway
            await self._audit(
                AuditAction.TOKEN_REFRESH,
                context,
                user.id,
                False,
                "session expired",
                session_id=claims.sid,
            )
            return INVALID_REFRESH
        tokens = self._sign(user.id, claims.sid, new_jti, now, remaining)
        rotated = await self._sessions.rotate_refresh(
            claims.sid, hash_token(claims.jti), hash_token(new_jti)
        )
        if not rotated:
            # Another request rotated this token first: it was presented twice.
            return await self._reuse_detected(claims, context)
        await self._audit(AuditAction.TOKEN_REFRESH, context, user.id, True, session_id=claims.sid)
        return tokens

    async def _reuse_detected(self, claims: TokenClaims, context: RequestContext) -> Rejected:
        await self._sessions.deactivate(claims.sid, self._clock.now())
        await self._audit(
            AuditAction.REFRESH_TOKEN_REUSE,
            context,
            claims.sub,
            False,
            "refresh token reused; session revoked",
            session_id=claims.sid,
        )
        return INVALID_REFRESH

    def _verified(self, token: object, expected: TokenType) -> TokenClaims | None:
        if not isinstance(token, str) or not token:
            return None
        try:
            return parse_claims(self._codec.decode(token, expected_type=expected.value), expected)
        except InvalidToken:
            return None

    # --- logout and revocation ----------------------------------------------------------

    async def logout(self, principal: Principal, context: RequestContext) -> None:
        """``POST /auth/logout``: the principal's session becomes inactive at once (its access
        and refresh tokens stop working). An API-key principal has no session to end; that is
        audited as a failed logout. May raise StoreUnavailable."""
        if principal.session is None:
            await self._audit(
                AuditAction.LOGOUT, context, principal.user_id, False, "no browser session"
            )
            return
        await self._sessions.deactivate(principal.session.id, self._clock.now())
        await self._audit(
            AuditAction.LOGOUT, context, principal.user_id, True, session_id=principal.session.id
        )

    async def revoke_all_sessions(self, user_id: str, context: RequestContext) -> int:
        """The administrative action: every active session of the user ends at once; the
        number revoked. May raise StoreUnavailable."""
        revoked = await self._sessions.deactivate_all(user_id, self._clock.now())
        await self._audit(
            AuditAction.SESSION_REVOKED,
            context,
            user_id,
            True,
            metadata={"sessions_revoked": revoked},
        )
        return revoked

    # --- request authentication ---------------------------------------------------------

    async def authenticate(
        self, cookie_token: str | None, bearer: str | None
    ) -> Principal | Rejected:
        """The principal of a request. ``cookie_token`` is the access_token cookie and is used
        when present; otherwise ``bearer`` (the value after ``Authorization: Bearer``), which
        is an API key when it has the key's shape and an access token otherwise. 401 for any
        missing, invalid, expired, revoked or foreign credential (one body), 403 for a
        disabled user, 503 store down. Not audited here: the endpoint records the request."""
        try:
            if isinstance(cookie_token, str) and cookie_token:
                return await self._from_access_token(cookie_token, via_cookie=True)
            if isinstance(bearer, str) and bearer:
                if looks_like_api_key(bearer):
                    return await self._from_api_key(bearer)
                return await self._from_access_token(bearer, via_cookie=False)
            return NOT_AUTHENTICATED
        except StoreUnavailable:
            return UNAVAILABLE

    async def _from_access_token(self, token: str, *, via_cookie: bool) -> Principal | Rejected:
        claims = self._verified(token, TokenType.ACCESS)
        if claims is None:
            return NOT_AUTHENTICATED
        session = await self._sessions.get(claims.sid)
        if session is None or not session.is_active or session.user_id != claims.sub:
            return NOT_AUTHENTICATED
        user = await self._users.get(claims.sub)
        if user is None:
            return NOT_AUTHENTICATED
        if user.disabled:
            return USER_DISABLED
        plan = user.effective_plan(self._clock.now())
        return Principal(user, session, None, via_cookie, plan)

    async def _from_api_key(self, key: str) -> Principal | Rejected:
        now = self._clock.now()
        api_key = await self._api_keys.by_hash(hash_token(key))
        if api_key is None or not api_key.is_usable(now):
            return NOT_AUTHENTICATED
        user = await self._users.get(api_key.user_id)
        if user is None:
            return NOT_AUTHENTICATED
        if user.disabled:
            return USER_DISABLED
        if should_touch(api_key.last_used_at, now):
            await self._api_keys.touch(api_key.id, now)
            api_key = attrs.evolve(api_key, last_used_at=now)
        return Principal(user, None, api_key, False, user.effective_plan(now))

    # --- audit --------------------------------------------------------------------------

    async def _audit_login_failure(
        self, user_id: str | None, context: RequestContext, reason: str, metadata: dict[str, Any]
    ) -> None:
        await self._audit(AuditAction.LOGIN, context, user_id, False, reason, metadata=metadata)

    async def _audit(
        self,
        action: AuditAction,
        context: RequestContext,
        user_id: str | None,
        success: bool,
        error: str | None = None,
        *,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        await self._events.record(
            action,
            context,
            user_id=user_id,
            success=success,
            error_message=error,
            resource_type="session" if session_id is not None else None,
            resource_id=session_id,
            metadata=metadata,
        )


def _credentials(email: object, password: object) -> tuple[str, str] | Rejected:
    """(normalized e-mail, password) or 400. The password is only bounded here (at most
    MAX_PASSWORD_LENGTH characters, so no huge input reaches the hasher); its strength rules
    apply when it is set, not when it is checked."""
    if not isinstance(email, str) or not email:
        return bad_request("email is required and must be a string")
    if not isinstance(password, str) or not password:
        return bad_request("password is required and must be a string")
    if len(password) > MAX_PASSWORD_LENGTH:
        return bad_request(f"password must be at most {MAX_PASSWORD_LENGTH} characters")
    try:
        password.encode("utf-8")
    except UnicodeEncodeError:
        return bad_request("password contains invalid characters")
    normalized = normalize_email(email)
    if normalized is None:
        return bad_request("email is not a valid e-mail address")
    return normalized, password
