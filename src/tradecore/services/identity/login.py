"""Logging in with a password: ``POST /auth/login`` (with the bot challenge) and the
``/auth/token`` password grant (without it).

Both are throttled (``throttling``, docs/security.md "Login throttling"): failed attempts
are counted per client address and per account from one address, and failed grants per
account from any address; a full window answers 429 with Retry-After before any password
work, audited as a credential attack. A successful attempt does not count.

Unknown user and wrong password get the same status and body, and cost the same password work
(a dummy verification for an unknown user). A store that cannot be reached is 503, never 401.
Every attempt leaves one audit entry; no entry, log line or ``repr`` holds a password, a token
or a CSRF token.
"""

from __future__ import annotations

from typing import Any

import attrs

from tradecore.attacks import throttled_metadata
from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import Session, User
from tradecore.ports.identity import PasswordHasher
from tradecore.ports.protection import RateLimiter
from tradecore.ports.repositories import SessionRepository, UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.refusals import INVALID_CREDENTIALS, USER_DISABLED
from tradecore.services.identity.session_tokens import IssuedTokens, SessionTokens
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.identity.throttling import (
    AttemptThrottle,
    Throttled,
    Window,
    account_ip_window,
    account_window,
    ip_window,
)
from tradecore.services.vocabulary import Rejected, bad_request, refuses_outages
from tradecore.sessions import CSRF_TOKEN_BYTES, MAX_PASSWORD_LENGTH, hash_token, normalize_email


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


class PasswordLogin:
    """Opens a session for a correct e-mail and password (see the module docstring)."""

    def __init__(
        self,
        users: UserRepository,
        sessions: SessionRepository,
        hasher: PasswordHasher,
        challenge: BotChallenge,
        tokens: SessionTokens,
        audit: IdentityAudit,
        clock: Clock,
        random: RandomSource,
        settings: AuthSettings,
        *,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._users = users
        self._sessions = sessions
        self._hasher = hasher
        self._challenge = challenge
        self._tokens = tokens
        self._audit = audit
        self._clock = clock
        self._random = random
        self._settings = settings
        self._throttle = AttemptThrottle(limiter, settings.throttle_window_s)

    @refuses_outages
    async def login(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> LoginResult | Rejected:
        """``POST /auth/login``: bot challenge, user by e-mail, Argon2id verification (a dummy
        one for unknown users), rehash if due, a new session with its CSRF token, and the two
        tokens. 400 bad input, 401 unknown user or wrong password (one body), 403 challenge
        refused or user disabled (only after a correct password), 429 throttled (failures
        per client address, per account from this address), 503 store down."""
        metadata: dict[str, Any] = {"method": "login"}
        if self._challenge.bypassed(context):
            metadata["captcha_bypassed"] = True
        refused = await self._challenge.check(turnstile_token, context)
        if refused is not None:
            await self._login_failed(None, context, refused.code, metadata)
            return refused
        credentials = _credentials(email, password)
        if isinstance(credentials, Rejected):
            await self._login_failed(None, context, "invalid request", metadata)
            return credentials
        return await self._throttled_sign_in(credentials, context, metadata, grant=False)

    @refuses_outages
    async def password_grant(
        self, username: object, password: object, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """``POST /auth/token`` with ``grant_type=password``: login for API clients, without
        the bot challenge, so also throttled per account from any address (429). Creates a
        session like login. Same refusals as login otherwise."""
        metadata: dict[str, Any] = {"method": "password_grant"}
        credentials = _credentials(username, password)
        if isinstance(credentials, Rejected):
            await self._login_failed(None, context, "invalid request", metadata)
            return credentials
        signed_in = await self._throttled_sign_in(credentials, context, metadata, grant=True)
        return signed_in if isinstance(signed_in, Rejected) else signed_in.tokens

    async def _throttled_sign_in(
        self,
        credentials: tuple[str, str],
        context: RequestContext,
        metadata: dict[str, Any],
        *,
        grant: bool,
    ) -> LoginResult | Rejected:
        """``_sign_in`` inside the throttle: a slot in each window first (429 when one is
        full, audited as a credential attack), given back unless the password was wrong."""
        taken = await self._throttle.take(self._windows(credentials[0], context, grant=grant))
        if isinstance(taken, Throttled):
            reason = {**metadata, **throttled_metadata("credential_attack", taken.rule)}
            # an attack on the account: its owner (if the address has one) gets the alert;
            # the answer is the same 429 either way
            owner = await self._users.by_email(credentials[0])
            await self._audit.record(
                AuditAction.LOGIN_CREDENTIAL_ATTACK,
                context,
                None if owner is None else owner.id,
                "rate limited",
                metadata=reason,
            )
            return taken.rejection()
        try:
            outcome = await self._sign_in(credentials, context, metadata)
        except BaseException:  # an outage (503): not a failed guess
            await self._throttle.give_back(taken)
            raise
        if not (isinstance(outcome, Rejected) and outcome == INVALID_CREDENTIALS):
            await self._throttle.give_back(taken)  # a success, or a disabled user's password
        return outcome

    def _windows(self, email: str, context: RequestContext, *, grant: bool) -> list[Window]:
        """Failures per client address and per account from it (login and grant share
        them); for the grant, also per account from any address."""
        settings, ip = self._settings, context.ip_address
        windows = [
            ip_window("login", ip, settings.login_failures_per_ip),
            account_ip_window("login", email, ip, settings.login_failures_per_account_ip),
        ]
        if grant:
            windows.append(
                account_window("token", email, settings.token_grant_failures_per_account)
            )
        return windows

    async def _sign_in(
        self, credentials: tuple[str, str], context: RequestContext, metadata: dict[str, Any]
    ) -> LoginResult | Rejected:
        """The password check (refusals audited there), then a new session with its tokens
        and the successful login's entry."""
        user = await self._check_password(*credentials, context, metadata)
        if isinstance(user, Rejected):
            return user
        session, tokens = await self._open_session(user, context)
        await self._audit.record(
            AuditAction.LOGIN, context, user.id, resource=("session", session.id), metadata=metadata
        )
        return LoginResult(user, session, tokens)

    async def _login_failed(
        self, user_id: str | None, context: RequestContext, reason: str, metadata: dict[str, Any]
    ) -> None:
        """Audits a refused login or password grant (``user_id`` None when no user was
        found)."""
        await self._audit.record(AuditAction.LOGIN, context, user_id, reason, metadata=metadata)

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
            await self._login_failed(None, context, "unknown user", metadata)
            return INVALID_CREDENTIALS
        if not await self._hasher.verify(user.password_hash, password):
            await self._login_failed(user.id, context, "wrong password", metadata)
            return INVALID_CREDENTIALS
        if user.disabled:
            await self._login_failed(user.id, context, "user disabled", metadata)
            return USER_DISABLED
        return user

    async def _open_session(
        self, user: User, context: RequestContext
    ) -> tuple[Session, IssuedTokens]:
        """An active session with a new CSRF token and its tokens (the refresh ``jti`` stored
        as a digest), written to the session store."""
        now = self._clock.now()
        session_id = self._random.new_id()
        refresh_jti = self._tokens.new_jti()
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
        tokens = self._tokens.sign(
            user.id, session_id, refresh_jti, now, self._settings.refresh_ttl
        )
        await self._sessions.add(session)
        return session, tokens


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
