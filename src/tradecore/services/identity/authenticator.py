"""``Authenticator``: the one identity service the HTTP layer and the CLI call.

It builds the parts that each do one job over the same stores and settings, and answers for
them: ``PasswordLogin`` (login and the password grant), ``SessionLifetime`` (refresh, logout,
revocation) and ``RequestAuthenticator`` (the principal of a request). Refusals are
``Rejected`` values; the HTTP layer turns them into problem responses.
"""

from __future__ import annotations

from tradecore.audit import RequestContext
from tradecore.ports.identity import CaptchaVerifier, PasswordHasher, TokenCodec
from tradecore.ports.protection import RateLimiter
from tradecore.ports.repositories import ApiKeyRepository, SessionRepository, UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.login import LoginResult, PasswordLogin
from tradecore.services.identity.request_authentication import RequestAuthenticator
from tradecore.services.identity.session_audit import SessionAudit
from tradecore.services.identity.session_lifetime import SessionLifetime
from tradecore.services.identity.session_tokens import IssuedTokens, SessionTokens
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.vocabulary import Principal, Rejected


class Authenticator:
    """Sessions and request authentication; each method is its part's, documented there."""

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
        tokens = SessionTokens(codec, random, settings)
        audit = SessionAudit(events)
        challenge = BotChallenge(
            captcha,
            enabled=settings.captcha_enabled,
            bypass_user_agents=settings.captcha_bypass_user_agents,
        )
        self._login = PasswordLogin(
            users,
            sessions,
            hasher,
            challenge,
            tokens,
            audit,
            clock,
            random,
            settings,
            limiter=limiter,
        )
        self._lifetime = SessionLifetime(users, sessions, tokens, audit, clock)
        self._requests = RequestAuthenticator(users, sessions, api_keys, tokens, clock)

    async def login(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> LoginResult | Rejected:
        """``POST /auth/login`` (``PasswordLogin.login``); 503 when a store is down."""
        return await self._login.login(email, password, turnstile_token, context)

    async def password_grant(
        self, username: object, password: object, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """``/auth/token`` password grant (``PasswordLogin.password_grant``); 503 on outage."""
        return await self._login.password_grant(username, password, context)

    async def refresh(
        self, refresh_token: str | None, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """Silent refresh with rotation (``SessionLifetime.refresh``); 503 on outage."""
        return await self._lifetime.refresh(refresh_token, context)

    async def logout(self, principal: Principal, context: RequestContext) -> None:
        """Ends the principal's session (``SessionLifetime.logout``). May raise
        StoreUnavailable."""
        await self._lifetime.logout(principal, context)

    async def revoke_all_sessions(self, user_id: str, context: RequestContext) -> int:
        """Ends every session of the user; the number ended
        (``SessionLifetime.revoke_all_sessions``). May raise StoreUnavailable."""
        return await self._lifetime.revoke_all_sessions(user_id, context)

    async def authenticate(
        self, cookie_token: str | None, bearer: str | None
    ) -> Principal | Rejected:
        """The principal of a request (``RequestAuthenticator.authenticate``); 503 on
        outage."""
        return await self._requests.authenticate(cookie_token, bearer)
