"""The account flows of identity (registration, password reset, API keys, allowed IPs) on the
memory adapters, with principals made by the real login and request authentication: the world
their tests share. ``session_services`` builds the session parts as the services container
does, for this world and ``test_auth``'s."""

from __future__ import annotations

from typing import NoReturn

import attrs
from support import fast_hasher

from tradecore.audit import AuditAction, RequestContext, StoredAuditEntry
from tradecore.errors import DatabaseUnavailable
from tradecore.identity import User
from tradecore.ports.identity import MailMessage, PasswordHasher, TokenCodec
from tradecore.ports.protection import RateLimiter
from tradecore.ports.repositories import ApiKeyRepository, SessionRepository, UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.identity.allowed_ips import AllowedIps
from tradecore.services.identity.api_keys import ApiKeys
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.login import LoginResult, PasswordLogin
from tradecore.services.identity.password_reset import PasswordReset, ResetSettings
from tradecore.services.identity.registration import Registration
from tradecore.services.identity.request_authentication import RequestAuthenticator
from tradecore.services.identity.session_lifetime import SessionLifetime
from tradecore.services.identity.session_tokens import SessionTokens
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.vocabulary import Principal, Rejected
from tradecore.testing.clock import FakeClock, SeededRandom
from tradecore_adapters.crypto.tokens import JwtTokenCodec
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.memory.protection import MemoryAlertThrottle
from tradecore_adapters.memory.repositories import (
    MemoryAllowedIpRepository,
    MemoryApiKeyRepository,
    MemoryAuditLog,
    MemorySessionRepository,
    MemoryUserRepository,
)
from tradecore_adapters.memory.resets import MemoryPasswordResetTokens

PASSWORD = "correct horse battery staple"
NEW_PASSWORD = "new and much longer passphrase"
EMAIL = "ada@example.com"
CAPTCHA = "turnstile-token-ok"
BASE_URL = "https://trade.example.com"
TERMS_VERSION = "1"


def ctx(ip: str = "203.0.113.7", ua: str = "Mozilla/5.0", path: str = "/x") -> RequestContext:
    return RequestContext(ip_address=ip, user_agent=ua, request_path=path, request_method="POST")


@attrs.define
class FakeCaptcha:
    answer: bool = True
    calls: list[tuple[str, str]] = attrs.field(factory=list)

    async def verify(self, token: str, client_ip: str) -> bool:
        self.calls.append((token, client_ip))
        return self.answer


@attrs.define
class FlakyOutbox:
    """A Mailer that fails while ``down`` and records what it accepted."""

    down: bool = False
    sent: list[MailMessage] = attrs.field(factory=list)

    async def send(self, message: MailMessage) -> None:
        if self.down:
            raise ConnectionError("smtp down")
        self.sent.append(message)


async def store_down(*args: object, **kwargs: object) -> NoReturn:
    """Stands in for any store method during an outage."""
    raise DatabaseUnavailable("postgres down")


class DownUsers(MemoryUserRepository):
    async def add(self, user: User) -> bool:
        raise DatabaseUnavailable("postgres down")


@attrs.define
class World:
    clock: FakeClock
    users: MemoryUserRepository
    sessions: MemorySessionRepository
    api_keys: MemoryApiKeyRepository
    allowed_ips: MemoryAllowedIpRepository
    resets: MemoryPasswordResetTokens
    audit: MemoryAuditLog
    mail: FlakyOutbox
    captcha: FakeCaptcha
    password_login: PasswordLogin
    session_lifetime: SessionLifetime
    authentication: RequestAuthenticator
    registration: Registration
    password_reset: PasswordReset
    keys: ApiKeys
    ips: AllowedIps
    registration_mail: FlakyOutbox = attrs.field(factory=FlakyOutbox)

    async def register(self, email: str = EMAIL, password: str = PASSWORD) -> User:
        assert await self.registration.register(email, password, CAPTCHA, ctx()) is None
        user = await self.users.by_email(email)
        assert user is not None
        return user

    async def login(self, email: str = EMAIL, password: str = PASSWORD) -> LoginResult:
        result = await self.password_login.login(email, password, CAPTCHA, ctx())
        assert isinstance(result, LoginResult), result
        return result

    async def principal(self, email: str = EMAIL) -> Principal:
        login = await self.login(email)
        principal = await self.authentication.authenticate(login.tokens.access_token, None)
        assert isinstance(principal, Principal)
        return principal

    async def key_principal(self, email: str = EMAIL) -> Principal:
        created = await self.keys.create_api_key(await self.principal(email), "bot", None, ctx())
        assert isinstance(created, tuple)
        principal = await self.authentication.authenticate(None, created[1])
        assert isinstance(principal, Principal) and principal.api_key is not None
        return principal

    async def reset_link_token(self) -> str:
        await self.password_reset.drain()
        link = self.mail.sent[-1].text.split("#token=")[1].split()[0]
        return link

    def entries(self, action: AuditAction) -> list[StoredAuditEntry]:
        return [s for s in self.audit.all() if s.entry.action is action]


def session_services(
    users: UserRepository,
    sessions: SessionRepository,
    api_keys: ApiKeyRepository,
    hasher: PasswordHasher,
    codec: TokenCodec,
    challenge: BotChallenge,
    audit: IdentityAudit,
    clock: Clock,
    random: RandomSource,
    settings: AuthSettings,
    *,
    limiter: RateLimiter | None = None,
) -> tuple[PasswordLogin, SessionLifetime, RequestAuthenticator]:
    """Login, session lifetime and request authentication over the given ports, sharing one
    ``SessionTokens`` as the services container's providers do."""
    tokens = SessionTokens(codec, random, settings)
    return (
        PasswordLogin(
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
        ),
        SessionLifetime(users, sessions, tokens, audit, clock),
        RequestAuthenticator(users, sessions, api_keys, tokens, clock),
    )


def make_world(
    users: MemoryUserRepository | None = None,
    captcha_enabled: bool = True,
    *,
    max_keys: int = 20,
    max_entries: int = 100,
) -> World:
    clock = FakeClock()
    random = SeededRandom(11)
    users = users or MemoryUserRepository()
    sessions = MemorySessionRepository()
    api_keys = MemoryApiKeyRepository()
    allowed_ips = MemoryAllowedIpRepository()
    resets = MemoryPasswordResetTokens()
    audit = MemoryAuditLog()
    mail = FlakyOutbox()
    captcha = FakeCaptcha()
    hasher = fast_hasher()
    throttle = MemoryAlertThrottle(clock)
    identity_audit = IdentityAudit(SecurityEvents(audit, users, throttle, LoggingOutbox(), clock))
    auth_settings = AuthSettings(captcha_enabled=captcha_enabled)
    codec = JwtTokenCodec("k" * 40, clock=clock)
    challenge = BotChallenge(captcha, enabled=captcha_enabled, bypass_user_agents=frozenset())
    password_login, session_lifetime, authentication = session_services(
        users,
        sessions,
        api_keys,
        hasher,
        codec,
        challenge,
        identity_audit,
        clock,
        random,
        auth_settings,
    )
    registration_mail = FlakyOutbox()  # apart from the reset mails the reset tests count
    registration = Registration(
        users,
        hasher,
        challenge,
        identity_audit,
        clock,
        random,
        terms_version=TERMS_VERSION,
        mailer=registration_mail,
        throttle=throttle,
        link_base=BASE_URL,
    )
    password_reset = PasswordReset(
        users,
        sessions,
        resets,
        hasher,
        mail,
        identity_audit,
        clock,
        random,
        ResetSettings(link_base=BASE_URL + "/"),
        throttle=throttle,
    )
    return World(
        clock,
        users,
        sessions,
        api_keys,
        allowed_ips,
        resets,
        audit,
        mail,
        captcha,
        password_login,
        session_lifetime,
        authentication,
        registration,
        password_reset,
        ApiKeys(api_keys, identity_audit, clock, random, max_keys=max_keys),
        AllowedIps(allowed_ips, identity_audit, clock, random, max_entries=max_entries),
        registration_mail,
    )


def status(outcome: object) -> int:
    assert isinstance(outcome, Rejected), outcome
    return outcome.status
