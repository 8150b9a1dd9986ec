"""The session parts of identity (``PasswordLogin``, ``SessionLifetime``,
``RequestAuthenticator``): login, refresh rotation and reuse detection, logout, revocation, the
token grants and request authentication, on the memory adapters with a real JWT codec."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime, timedelta
from typing import Any

import argon2
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from identity_world import session_services
from racing import RacingUsers

from tradecore.audit import AuditAction, RequestContext, StoredAuditEntry
from tradecore.errors import DatabaseUnavailable
from tradecore.identity import ApiKey, Plan, Session, User
from tradecore.ports.identity import MailMessage
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.login import LoginResult, PasswordLogin
from tradecore.services.identity.refusals import INVALID_CREDENTIALS, NOT_AUTHENTICATED
from tradecore.services.identity.registration import Registration
from tradecore.services.identity.request_authentication import RequestAuthenticator
from tradecore.services.identity.session_lifetime import SessionLifetime
from tradecore.services.identity.session_tokens import IssuedTokens
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected
from tradecore.sessions import (
    REFRESH_REUSE_GRACE,
    access_claims,
    hash_token,
    new_api_key,
    refresh_claims,
)
from tradecore.testing.clock import EPOCH, FakeClock, SeededRandom
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.crypto.tokens import JwtTokenCodec
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.memory.protection import MemoryAlertThrottle, MemoryRateLimiter
from tradecore_adapters.memory.repositories import (
    MemoryApiKeyRepository,
    MemoryAuditLog,
    MemorySessionRepository,
    MemoryUserRepository,
)

PASSWORD = "correct horse battery staple"
EMAIL = "ada@example.com"
JWT_SECRET = "j" * 48
USER_IP = "203.0.113.7"
BROWSER = "Mozilla/5.0 (X11; Linux x86_64)"
SCANNER = "ZAP-scanner/2.15 (authorized)"
CAPTCHA = "turnstile-token-ok"


def ctx(ip: str = USER_IP, ua: str = BROWSER, path: str = "/auth/login") -> RequestContext:
    return RequestContext(ip_address=ip, user_agent=ua, request_path=path, request_method="POST")


def argon2_fast(time_cost: int = 1) -> argon2.PasswordHasher:
    return argon2.PasswordHasher(time_cost=time_cost, memory_cost=1024, parallelism=1)


class SpyHasher(Argon2PasswordHasher):
    """The real (fast) hasher, counting the password work it does."""

    def __init__(self) -> None:
        super().__init__(hasher=argon2_fast())
        self.calls: list[str] = []

    async def hash(self, password: str) -> str:
        self.calls.append("hash")
        return await super().hash(password)

    async def verify(self, encoded: str, password: str) -> bool:
        self.calls.append("verify")
        return await super().verify(encoded, password)

    async def verify_dummy(self, password: str) -> None:
        self.calls.append("verify_dummy")
        await super().verify_dummy(password)


@attrs.define
class FakeCaptcha:
    """A CaptchaVerifier that answers ``answer`` (or raises) and records each call."""

    answer: bool = True
    error: Exception | None = None
    calls: list[tuple[str, str]] = attrs.field(factory=list)

    async def verify(self, token: str, client_ip: str) -> bool:
        self.calls.append((token, client_ip))
        if self.error is not None:
            raise self.error
        return self.answer


class DownUsers(MemoryUserRepository):
    async def by_email(self, email: str) -> User | None:
        raise DatabaseUnavailable("postgres down")

    async def get(self, user_id: str) -> User | None:
        raise DatabaseUnavailable("postgres down")


@attrs.define
class World:
    clock: FakeClock
    random: SeededRandom
    users: MemoryUserRepository
    sessions: MemorySessionRepository
    api_keys: MemoryApiKeyRepository
    audit: MemoryAuditLog
    hasher: SpyHasher
    codec: JwtTokenCodec
    captcha: FakeCaptcha
    limiter: MemoryRateLimiter
    password_login: PasswordLogin
    session_lifetime: SessionLifetime
    authentication: RequestAuthenticator

    async def add_user(
        self, email: str = EMAIL, password: str = PASSWORD, *, encoded: str | None = None, **kw: Any
    ) -> User:
        user = User(
            id=self.random.new_id(),
            email=email,
            password_hash=encoded or argon2_fast().hash(password),
            plan=kw.pop("plan", Plan.PRO),
            created_at=self.clock.now(),
            **kw,
        )
        assert await self.users.add(user)
        return user

    async def login(self, email: str = EMAIL, password: str = PASSWORD, **kw: Any) -> LoginResult:
        result = await self.password_login.login(email, password, CAPTCHA, kw.pop("context", ctx()))
        assert isinstance(result, LoginResult), result
        return result

    async def add_key(self, user: User, **kw: Any) -> tuple[ApiKey, str]:
        plaintext, prefix, digest = new_api_key(self.random)
        key = ApiKey(
            id=self.random.new_id(),
            user_id=user.id,
            name="bot",
            key_hash=digest,
            prefix=prefix,
            created_at=self.clock.now(),
            **kw,
        )
        await self.api_keys.add(key)
        return key, plaintext

    def entries(self, action: AuditAction | None = None) -> list[StoredAuditEntry]:
        return [s for s in self.audit.all() if action is None or s.entry.action is action]


def make_world(users: MemoryUserRepository | None = None, **settings: Any) -> World:
    clock = FakeClock()
    random = SeededRandom(3)
    users = users or MemoryUserRepository()
    sessions = MemorySessionRepository()
    api_keys = MemoryApiKeyRepository()
    audit = MemoryAuditLog()
    hasher = SpyHasher()
    codec = JwtTokenCodec(JWT_SECRET, clock=clock)
    captcha = FakeCaptcha()
    limiter = MemoryRateLimiter(clock)
    events = SecurityEvents(audit, users, MemoryAlertThrottle(clock), LoggingOutbox(), clock)
    settings.setdefault("captcha_enabled", True)
    auth_settings = AuthSettings(**settings)
    challenge = BotChallenge(
        captcha,
        enabled=auth_settings.captcha_enabled,
        bypass_user_agents=auth_settings.captcha_bypass_user_agents,
    )
    parts = session_services(
        users,
        sessions,
        api_keys,
        hasher,
        codec,
        challenge,
        IdentityAudit(events),
        clock,
        random,
        auth_settings,
        limiter=limiter,
    )
    return World(
        clock, random, users, sessions, api_keys, audit, hasher, codec, captcha, limiter, *parts
    )


@pytest.fixture
def world() -> World:
    return make_world()


# --- login ----------------------------------------------------------------------------------


async def test_login_creates_an_active_session_and_signs_both_tokens(world: World) -> None:
    user = await world.add_user()
    result = await world.login(context=ctx(ip="198.51.100.4", ua="Firefox/128"))

    session = await world.sessions.get(result.session.id)
    assert session is not None and session.is_active
    assert (session.user_id, session.ip_address, session.user_agent) == (
        user.id,
        "198.51.100.4",
        "Firefox/128",
    )
    assert session.created_at == EPOCH
    assert result.csrf_token == session.csrf_token and len(result.csrf_token) == 43
    access = world.codec.decode(result.tokens.access_token, expected_type="access")
    refresh = world.codec.decode(result.tokens.refresh_token, expected_type="refresh")
    assert (access["sub"], access["sid"]) == (user.id, session.id)
    assert (refresh["sub"], refresh["sid"]) == (user.id, session.id)
    assert access["jti"] != refresh["jti"]
    # The session keeps only the digest of the refresh token's id.
    assert session.refresh_jti == hash_token(refresh["jti"])
    assert result.tokens.access_expires_at == EPOCH + timedelta(minutes=30)
    assert result.tokens.refresh_expires_at == EPOCH + timedelta(days=30)
    [entry] = world.entries(AuditAction.LOGIN)
    assert entry.entry.success and entry.entry.user_id == user.id
    assert entry.entry.resource_id == session.id


async def test_every_login_makes_a_new_session_and_csrf_token(world: World) -> None:
    await world.add_user()
    first, second = await world.login(), await world.login()
    assert first.session.id != second.session.id
    assert first.csrf_token != second.csrf_token


async def test_the_email_is_matched_trimmed_and_case_insensitively(world: World) -> None:
    user = await world.add_user()
    result = await world.login("  Ada@EXAMPLE.com ")
    assert result.user.id == user.id


async def test_unknown_user_and_wrong_password_get_the_same_refusal(world: World) -> None:
    user = await world.add_user()
    unknown = await world.password_login.login("bob@example.com", PASSWORD, CAPTCHA, ctx())
    wrong = await world.password_login.login(EMAIL, "not the password", CAPTCHA, ctx())
    assert unknown == wrong == INVALID_CREDENTIALS
    assert isinstance(unknown, Rejected) and unknown.status == 401
    # The unknown user still costs one real verification (against the dummy hash), so timing
    # does not tell them apart.
    assert world.hasher.calls == ["verify_dummy", "verify", "verify"]
    failures = world.entries(AuditAction.LOGIN)
    assert [(e.entry.success, e.entry.user_id) for e in failures] == [
        (False, None),
        (False, user.id),
    ]


async def test_a_disabled_user_is_refused_with_403_only_after_the_right_password(
    world: World,
) -> None:
    await world.add_user(disabled=True)
    wrong = await world.password_login.login(EMAIL, "not the password", CAPTCHA, ctx())
    right = await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx())
    assert wrong == INVALID_CREDENTIALS
    assert isinstance(right, Rejected) and (right.status, right.code) == (403, "user_disabled")


async def test_the_captcha_is_checked_first_with_the_client_ip(world: World) -> None:
    await world.add_user()
    await world.login(context=ctx(ip="192.0.2.55"))
    assert world.captcha.calls == [(CAPTCHA, "192.0.2.55")]


@pytest.mark.parametrize("failure", ["refused", "raises"])
async def test_a_failed_captcha_stops_login_before_any_password_work(
    world: World, failure: str
) -> None:
    await world.add_user()
    if failure == "refused":
        world.captcha.answer = False
    else:
        world.captcha.error = RuntimeError("provider exploded")
    result = await world.password_login.login(EMAIL, PASSWORD, "bad-token", ctx())
    assert isinstance(result, Rejected) and (result.status, result.code) == (403, "captcha_failed")
    assert world.hasher.calls == []
    [entry] = world.entries(AuditAction.LOGIN)
    assert not entry.entry.success and entry.entry.error_message == "captcha_failed"


@pytest.mark.parametrize("token", [None, "", 17, ["x"]])
async def test_a_missing_captcha_token_is_a_bad_request(world: World, token: object) -> None:
    await world.add_user()
    result = await world.password_login.login(EMAIL, PASSWORD, token, ctx())
    assert isinstance(result, Rejected) and result.status == 400
    assert world.captcha.calls == [] and world.hasher.calls == []


async def test_captcha_off_is_not_consulted() -> None:
    world = make_world(captcha_enabled=False)
    await world.add_user()
    result = await world.password_login.login(EMAIL, PASSWORD, None, ctx())
    assert isinstance(result, LoginResult)
    assert world.captcha.calls == []


async def test_only_a_listed_user_agent_bypasses_the_captcha() -> None:
    world = make_world(captcha_bypass_user_agents={SCANNER})
    world.captcha.answer = False
    await world.add_user()
    bypassed = await world.password_login.login(EMAIL, PASSWORD, None, ctx(ua=SCANNER))
    assert isinstance(bypassed, LoginResult)
    near_miss = await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx(ua=SCANNER + " "))
    assert isinstance(near_miss, Rejected) and near_miss.code == "captcha_failed"
    assert world.entries(AuditAction.LOGIN)[0].entry.metadata["captcha_bypassed"] is True


@given(
    st.one_of(st.none(), st.integers(), st.booleans(), st.lists(st.text()), st.binary()),
    st.sampled_from(["email", "password"]),
)
def test_wrong_types_are_a_bad_request_without_password_work(bad: object, field: str) -> None:
    async def scenario() -> None:
        world = make_world()
        await world.add_user()
        email, password = (bad, PASSWORD) if field == "email" else (EMAIL, bad)
        result = await world.password_login.login(email, password, CAPTCHA, ctx())
        assert isinstance(result, Rejected) and result.status == 400
        assert world.hasher.calls == []
        [entry] = world.entries(AuditAction.LOGIN)
        assert not entry.entry.success

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("email", "password"),
    [
        (EMAIL, "x" * 1025),
        (EMAIL, "ok\ud800surrogate"),
        ("not-an-address", PASSWORD),
        (EMAIL, ""),
        ("", PASSWORD),
    ],
)
async def test_unusable_input_is_refused_before_hashing(
    world: World, email: str, password: str
) -> None:
    await world.add_user()
    result = await world.password_login.login(email, password, CAPTCHA, ctx())
    assert isinstance(result, Rejected) and result.status == 400
    assert world.hasher.calls == []


async def test_a_1024_character_password_is_accepted(world: World) -> None:
    long_password = "p" * 1024
    await world.add_user(password=long_password)
    assert isinstance(await world.login(password=long_password), LoginResult)


async def test_an_outdated_hash_is_replaced_after_a_successful_login(world: World) -> None:
    old = argon2.PasswordHasher(time_cost=2, memory_cost=1024, parallelism=1).hash(PASSWORD)
    user = await world.add_user(encoded=old)
    assert world.hasher.needs_rehash(old)
    await world.login()
    stored = await world.users.get(user.id)
    assert stored is not None and stored.password_hash != old
    assert not world.hasher.needs_rehash(stored.password_hash)
    assert isinstance(
        await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx()), LoginResult
    )


async def test_a_current_hash_is_left_alone(world: World) -> None:
    user = await world.add_user()
    await world.login()
    assert (await world.users.get(user.id)) == user


async def test_a_store_outage_is_503_not_401() -> None:
    world = make_world(users=DownUsers())
    result = await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx())
    assert isinstance(result, Rejected) and result.status == 503
    session = Session("sid-1", "uid-1", "csrf", USER_IP, BROWSER, EPOCH, refresh_jti="x")
    await world.sessions.add(session)
    token = world.codec.encode(access_claims("uid-1", "sid-1", "j", EPOCH, timedelta(minutes=5)))
    outage = await world.authentication.authenticate(token, None)
    assert isinstance(outage, Rejected) and outage.status == 503


async def test_every_session_use_case_answers_an_outage_with_the_shared_503() -> None:
    world = make_world(users=DownUsers())
    assert await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx()) == UNAVAILABLE
    assert await world.password_login.password_grant(EMAIL, PASSWORD, ctx()) == UNAVAILABLE
    session = Session(
        "sid-1", "uid-1", "csrf", USER_IP, BROWSER, EPOCH, refresh_jti=hash_token("r")
    )
    await world.sessions.add(session)
    refresh = world.codec.encode(refresh_claims("uid-1", "sid-1", "r", EPOCH, timedelta(days=1)))
    assert await world.session_lifetime.refresh(refresh, ctx()) == UNAVAILABLE
    access = world.codec.encode(access_claims("uid-1", "sid-1", "a", EPOCH, timedelta(minutes=5)))
    assert await world.authentication.authenticate(access, None) == UNAVAILABLE
    assert await world.authentication.authenticate(None, access) == UNAVAILABLE


# --- request authentication -----------------------------------------------------------------


async def test_the_access_cookie_authenticates(world: World) -> None:
    user = await world.add_user()
    login = await world.login()
    principal = await world.authentication.authenticate(login.tokens.access_token, None)
    assert isinstance(principal, Principal)
    assert principal.user.id == user.id and principal.via_cookie
    assert principal.session == login.session and principal.api_key is None
    assert principal.plan is Plan.PRO


async def test_a_bearer_access_token_authenticates_without_the_cookie_flag(world: World) -> None:
    await world.add_user()
    login = await world.login()
    principal = await world.authentication.authenticate(None, login.tokens.access_token)
    assert isinstance(principal, Principal)
    assert not principal.via_cookie and principal.has_browser_session


async def test_the_cookie_is_read_before_the_bearer_header(world: World) -> None:
    ada = await world.add_user()
    await world.add_user("bob@example.com")
    cookie = (await world.login()).tokens.access_token
    bearer = (await world.login("bob@example.com")).tokens.access_token
    principal = await world.authentication.authenticate(cookie, bearer)
    assert isinstance(principal, Principal) and principal.user.id == ada.id
    assert principal.via_cookie


async def test_no_credential_is_401(world: World) -> None:
    assert await world.authentication.authenticate(None, None) == NOT_AUTHENTICATED
    assert await world.authentication.authenticate("", "") == NOT_AUTHENTICATED


async def test_an_access_token_expires_after_30_minutes(world: World) -> None:
    await world.add_user()
    token = (await world.login()).tokens.access_token
    world.clock.advance(30 * 60 - 1)
    assert isinstance(await world.authentication.authenticate(token, None), Principal)
    world.clock.advance(1)
    assert await world.authentication.authenticate(token, None) == NOT_AUTHENTICATED


async def test_logout_makes_the_access_token_useless_at_once(world: World) -> None:
    await world.add_user()
    login = await world.login()
    principal = await world.authentication.authenticate(login.tokens.access_token, None)
    assert isinstance(principal, Principal)
    await world.session_lifetime.logout(principal, ctx(path="/auth/logout"))
    assert (
        await world.authentication.authenticate(login.tokens.access_token, None)
        == NOT_AUTHENTICATED
    )
    assert isinstance(
        await world.session_lifetime.refresh(login.tokens.refresh_token, ctx()), Rejected
    )
    [entry] = world.entries(AuditAction.LOGOUT)
    assert entry.entry.success and entry.entry.resource_id == login.session.id


async def test_logout_with_an_api_key_ends_nothing(world: World) -> None:
    user = await world.add_user()
    login = await world.login()
    _, plaintext = await world.add_key(user)
    principal = await world.authentication.authenticate(None, plaintext)
    assert isinstance(principal, Principal)
    await world.session_lifetime.logout(principal, ctx(path="/auth/logout"))
    assert isinstance(
        await world.authentication.authenticate(login.tokens.access_token, None), Principal
    )
    assert isinstance(await world.authentication.authenticate(None, plaintext), Principal)
    [entry] = world.entries(AuditAction.LOGOUT)
    assert not entry.entry.success


async def test_administrative_revocation_ends_every_session_of_that_user_only(
    world: World,
) -> None:
    ada = await world.add_user()
    await world.add_user("bob@example.com")
    ada_logins = [await world.login(), await world.login()]
    bob_login = await world.login("bob@example.com")
    revoked = await world.session_lifetime.revoke_all_sessions(ada.id, ctx(path="cli"))
    assert revoked == 2
    for login in ada_logins:
        assert (
            await world.authentication.authenticate(login.tokens.access_token, None)
            == NOT_AUTHENTICATED
        )
    assert isinstance(
        await world.authentication.authenticate(bob_login.tokens.access_token, None), Principal
    )
    [entry] = world.entries(AuditAction.SESSION_REVOKED)
    assert entry.entry.user_id == ada.id and entry.entry.metadata == {"sessions_revoked": 2}


async def test_a_disabled_user_is_refused_even_with_a_live_token(world: World) -> None:
    user = await world.add_user()
    login = await world.login()
    assert await world.users.save(attrs.evolve(user, disabled=True), previous=user)
    result = await world.authentication.authenticate(login.tokens.access_token, None)
    assert isinstance(result, Rejected) and result.status == 403
    refreshed = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(refreshed, Rejected) and refreshed.status == 403


async def test_subscription_expiry_downgrades_the_plan_on_the_next_request(world: World) -> None:
    await world.add_user(subscription_expires_at=EPOCH + timedelta(minutes=10))
    token = (await world.login()).tokens.access_token
    before = await world.authentication.authenticate(token, None)
    world.clock.advance(10 * 60)
    after = await world.authentication.authenticate(token, None)
    assert isinstance(before, Principal) and before.plan is Plan.PRO
    assert isinstance(after, Principal) and after.plan is Plan.FREE
    assert after.user.plan is Plan.PRO  # the stored plan is unchanged; the effective one drops


async def test_a_refresh_token_is_not_an_access_token(world: World) -> None:
    await world.add_user()
    tokens = (await world.login()).tokens
    assert await world.authentication.authenticate(tokens.refresh_token, None) == NOT_AUTHENTICATED
    assert await world.authentication.authenticate(None, tokens.refresh_token) == NOT_AUTHENTICATED


async def test_tokens_signed_with_another_key_or_alg_none_are_refused(world: World) -> None:
    user = await world.add_user()
    login = await world.login()
    claims = world.codec.decode(login.tokens.access_token, expected_type="access")
    forged = JwtTokenCodec("another secret of at least 32 bytes!!", clock=world.clock)

    def b64(data: dict[str, Any]) -> str:
        raw = json.dumps(data).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    unsigned = b64({"alg": "none", "typ": "JWT"}) + "." + b64(dict(claims)) + "."
    for token in (forged.encode(claims), unsigned):
        assert await world.authentication.authenticate(token, None) == NOT_AUTHENTICATED
        assert await world.authentication.authenticate(None, token) == NOT_AUTHENTICATED
    assert user.id == claims["sub"]


async def test_a_token_for_a_session_of_another_user_is_refused(world: World) -> None:
    await world.add_user()
    bob = await world.add_user("bob@example.com")
    login = await world.login()
    claims = dict(world.codec.decode(login.tokens.access_token, expected_type="access"))
    claims["sub"] = bob.id  # signed by us but naming someone else's session
    assert (
        await world.authentication.authenticate(world.codec.encode(claims), None)
        == NOT_AUTHENTICATED
    )


@given(st.text(max_size=200))
def test_any_bearer_text_is_refused_without_raising(text: str) -> None:
    async def scenario() -> None:
        world = make_world()
        assert await world.authentication.authenticate(None, text) == NOT_AUTHENTICATED
        assert await world.authentication.authenticate(text, None) == NOT_AUTHENTICATED

    asyncio.run(scenario())


# --- API keys -------------------------------------------------------------------------------


async def test_an_api_key_authenticates_as_its_owner(world: World) -> None:
    user = await world.add_user()
    key, plaintext = await world.add_key(user)
    principal = await world.authentication.authenticate(None, plaintext)
    assert isinstance(principal, Principal)
    assert principal.user.id == user.id and principal.api_key is not None
    assert principal.api_key.id == key.id
    assert principal.session is None and not principal.via_cookie
    assert not principal.has_browser_session


async def test_an_api_key_is_not_accepted_from_the_cookie(world: World) -> None:
    user = await world.add_user()
    _, plaintext = await world.add_key(user)
    assert await world.authentication.authenticate(plaintext, None) == NOT_AUTHENTICATED


async def test_last_used_is_written_at_most_once_a_minute(world: World) -> None:
    user = await world.add_user()
    key, plaintext = await world.add_key(user)

    async def last_used() -> Any:
        [stored] = await world.api_keys.list_for_user(user.id)
        return stored.last_used_at

    await world.authentication.authenticate(None, plaintext)
    assert await last_used() == EPOCH
    world.clock.advance(59)
    await world.authentication.authenticate(None, plaintext)
    assert await last_used() == EPOCH
    world.clock.advance(1)
    await world.authentication.authenticate(None, plaintext)
    assert await last_used() == EPOCH + timedelta(seconds=60)
    assert key.last_used_at is None


async def test_a_revoked_api_key_is_refused_at_once(world: World) -> None:
    user = await world.add_user()
    key, plaintext = await world.add_key(user)
    assert isinstance(await world.authentication.authenticate(None, plaintext), Principal)
    assert await world.api_keys.revoke(key.id, user.id, world.clock.now())
    assert await world.authentication.authenticate(None, plaintext) == NOT_AUTHENTICATED


async def test_an_expired_api_key_is_refused(world: World) -> None:
    user = await world.add_user()
    _, plaintext = await world.add_key(user, expires_at=EPOCH + timedelta(hours=1))
    world.clock.advance(3600 - 1)
    assert isinstance(await world.authentication.authenticate(None, plaintext), Principal)
    world.clock.advance(1)
    assert await world.authentication.authenticate(None, plaintext) == NOT_AUTHENTICATED


async def test_an_unknown_key_and_a_disabled_owner_are_refused(world: World) -> None:
    user = await world.add_user(disabled=True)
    _, plaintext = await world.add_key(user)
    unknown, _, _ = new_api_key(SeededRandom(99))
    assert await world.authentication.authenticate(None, unknown) == NOT_AUTHENTICATED
    disabled = await world.authentication.authenticate(None, plaintext)
    assert isinstance(disabled, Rejected) and disabled.status == 403


async def test_an_api_key_principal_gets_the_effective_plan(world: World) -> None:
    user = await world.add_user(subscription_expires_at=EPOCH)
    _, plaintext = await world.add_key(user)
    principal = await world.authentication.authenticate(None, plaintext)
    assert isinstance(principal, Principal) and principal.plan is Plan.FREE


# --- refresh --------------------------------------------------------------------------------


async def test_refresh_rotates_and_the_new_tokens_work(world: World) -> None:
    await world.add_user()
    login = await world.login()
    world.clock.advance(40 * 60)  # the access token has expired
    assert (
        await world.authentication.authenticate(login.tokens.access_token, None)
        == NOT_AUTHENTICATED
    )
    fresh = await world.session_lifetime.refresh(
        login.tokens.refresh_token, ctx(path="/auth/silent-refresh")
    )
    assert isinstance(fresh, IssuedTokens)
    assert fresh.refresh_token != login.tokens.refresh_token
    principal = await world.authentication.authenticate(fresh.access_token, None)
    assert isinstance(principal, Principal) and principal.session is not None
    assert principal.session.id == login.session.id
    assert principal.session.csrf_token == login.csrf_token  # the session's token stays
    assert fresh.access_expires_at == world.clock.now() + timedelta(minutes=30)
    again = await world.session_lifetime.refresh(fresh.refresh_token, ctx())
    assert isinstance(again, IssuedTokens)
    [*_, entry] = world.entries(AuditAction.TOKEN_REFRESH)
    assert entry.entry.success


async def test_rotation_never_extends_the_session_past_30_days(world: World) -> None:
    await world.add_user()
    login = await world.login()
    world.clock.advance(20 * 24 * 3600)
    fresh = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(fresh, IssuedTokens)
    assert fresh.refresh_expires_at == login.tokens.refresh_expires_at
    world.clock.advance(10 * 24 * 3600)
    assert isinstance(await world.session_lifetime.refresh(fresh.refresh_token, ctx()), Rejected)


async def test_reusing_a_rotated_refresh_token_revokes_the_session(world: World) -> None:
    user = await world.add_user()
    login = await world.login()
    fresh = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(fresh, IssuedTokens)

    world.clock.advance(REFRESH_REUSE_GRACE.total_seconds())  # the grace is over
    replay = await world.session_lifetime.refresh(
        login.tokens.refresh_token, ctx(ip="198.51.100.66")
    )
    assert isinstance(replay, Rejected) and replay.status == 401
    session = await world.sessions.get(login.session.id)
    assert session is not None and not session.is_active
    # Everything of that session is dead now, the legitimate new tokens included.
    assert await world.authentication.authenticate(fresh.access_token, None) == NOT_AUTHENTICATED
    assert isinstance(await world.session_lifetime.refresh(fresh.refresh_token, ctx()), Rejected)
    [reuse] = world.entries(AuditAction.REFRESH_TOKEN_REUSE)
    assert reuse.entry.user_id == user.id and not reuse.entry.success
    assert reuse.entry.context.ip_address == "198.51.100.66"
    assert reuse.entry.resource_id == login.session.id


async def test_two_concurrent_refreshes_get_the_same_successor(world: World) -> None:
    """Two tabs refresh with one cookie: both decide to rotate before either writes."""
    await world.add_user()
    login = await world.login()
    original = world.sessions.rotate_refresh
    arrived: list[str] = []
    both_decided = asyncio.Event()

    async def after_both_decided(sid: str, expected: str, new: str, *, at: datetime) -> bool:
        arrived.append(sid)
        if len(arrived) == 2:
            both_decided.set()
        await asyncio.wait_for(both_decided.wait(), 1)
        return await original(sid, expected, new, at=at)

    world.sessions.rotate_refresh = after_both_decided  # type: ignore[method-assign]
    first, second = await asyncio.gather(
        world.session_lifetime.refresh(login.tokens.refresh_token, ctx()),
        world.session_lifetime.refresh(login.tokens.refresh_token, ctx()),
    )
    assert len(arrived) == 2
    assert isinstance(first, IssuedTokens) and isinstance(second, IssuedTokens)
    assert first == second  # the same refresh and access tokens, the same expiry times
    await _the_successor_works(world, login, second)


async def test_a_refresh_just_after_another_gets_the_same_successor(world: World) -> None:
    await world.add_user()
    login = await world.login()
    world.clock.advance(40 * 60)
    first = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    world.clock.advance(9)  # the other tab's request arrives late, within the grace
    second = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(first, IssuedTokens) and isinstance(second, IssuedTokens)
    assert first == second
    await _the_successor_works(world, login, second)


async def _the_successor_works(world: World, login: LoginResult, successor: IssuedTokens) -> None:
    """The session is alive, the successor's access token names it with its CSRF token, the
    successor's refresh token rotates, and nothing was audited as reuse."""
    session = await world.sessions.get(login.session.id)
    assert session is not None and session.is_active
    principal = await world.authentication.authenticate(successor.access_token, None)
    assert isinstance(principal, Principal) and principal.session is not None
    assert principal.session.csrf_token == login.csrf_token
    assert not world.entries(AuditAction.REFRESH_TOKEN_REUSE)
    refreshes = world.entries(AuditAction.TOKEN_REFRESH)
    assert [e.entry.success for e in refreshes] == [True, True]
    assert [e.entry.metadata.get("reissued") for e in refreshes] == [None, True]
    world.clock.advance(60)
    after = await world.session_lifetime.refresh(successor.refresh_token, ctx())
    assert isinstance(after, IssuedTokens) and after.refresh_token != successor.refresh_token


async def test_a_retired_token_within_the_grace_loses_once_its_successor_rotated(
    world: World,
) -> None:
    await world.add_user()
    login = await world.login()
    first = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(first, IssuedTokens)
    world.clock.advance(1)
    assert isinstance(
        await world.session_lifetime.refresh(first.refresh_token, ctx()), IssuedTokens
    )
    world.clock.advance(1)
    replay = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(replay, Rejected) and replay.status == 401
    assert world.entries(AuditAction.REFRESH_TOKEN_REUSE)


async def test_a_lost_compare_and_set_counts_as_reuse(world: World) -> None:
    await world.add_user()
    login = await world.login()
    sessions = world.sessions
    original = sessions.rotate_refresh

    async def someone_else_rotated_first(
        sid: str, expected: str, new: str, *, at: datetime
    ) -> bool:
        await original(sid, expected, "rotated-elsewhere", at=at)
        return await original(sid, expected, new, at=at)

    sessions.rotate_refresh = someone_else_rotated_first  # type: ignore[method-assign]
    result = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(result, Rejected) and result.status == 401
    assert world.entries(AuditAction.REFRESH_TOKEN_REUSE)


async def test_an_access_token_is_not_a_refresh_token(world: World) -> None:
    await world.add_user()
    login = await world.login()
    result = await world.session_lifetime.refresh(login.tokens.access_token, ctx())
    assert isinstance(result, Rejected) and result.status == 401
    session = await world.sessions.get(login.session.id)
    assert session is not None and session.is_active  # a type mix-up is no reuse


@pytest.mark.parametrize("token", [None, "", "garbage", "a.b.c"])
async def test_a_missing_or_malformed_refresh_token_is_401(world: World, token: Any) -> None:
    result = await world.session_lifetime.refresh(token, ctx())
    assert isinstance(result, Rejected) and result.status == 401
    [entry] = world.entries(AuditAction.TOKEN_REFRESH)
    assert not entry.entry.success


async def test_an_expired_refresh_token_is_401(world: World) -> None:
    await world.add_user()
    login = await world.login()
    world.clock.advance(30 * 24 * 3600)
    assert isinstance(
        await world.session_lifetime.refresh(login.tokens.refresh_token, ctx()), Rejected
    )


# --- the OAuth2 password grant --------------------------------------------------------------


async def test_the_password_grant_opens_a_session_without_the_captcha(world: World) -> None:
    user = await world.add_user()
    world.captcha.answer = False
    tokens = await world.password_login.password_grant(EMAIL, PASSWORD, ctx(path="/auth/token"))
    assert isinstance(tokens, IssuedTokens)
    principal = await world.authentication.authenticate(None, tokens.access_token)
    assert isinstance(principal, Principal) and principal.user.id == user.id
    assert world.captcha.calls == []
    [entry] = world.entries(AuditAction.LOGIN)
    assert entry.entry.success and entry.entry.metadata["method"] == "password_grant"


async def test_the_password_grant_refuses_like_login(world: World) -> None:
    await world.add_user()
    unknown = await world.password_login.password_grant("x@example.com", PASSWORD, ctx())
    wrong = await world.password_login.password_grant(EMAIL, "nope nope nope", ctx())
    bad = await world.password_login.password_grant(EMAIL, None, ctx())
    assert unknown == wrong == INVALID_CREDENTIALS
    assert isinstance(bad, Rejected) and bad.status == 400


async def test_the_password_grant_is_limited_per_email_before_password_work(
    world: World,
) -> None:
    await world.add_user()
    for i in range(10):
        wrong = await world.password_login.password_grant(EMAIL, "guess", ctx(ip=f"192.0.2.{i}"))
        assert wrong == INVALID_CREDENTIALS
    calls = len(world.hasher.calls)
    limited = await world.password_login.password_grant(EMAIL, PASSWORD, ctx(ip="192.0.2.200"))
    assert isinstance(limited, Rejected) and limited.status == 429
    assert limited.retry_after_s is not None and limited.retry_after_s > 0
    assert len(world.hasher.calls) == calls
    world.clock.advance(900)
    assert isinstance(
        await world.password_login.password_grant(EMAIL, PASSWORD, ctx()), IssuedTokens
    )


async def test_the_password_grant_is_limited_per_client_ip(world: World) -> None:
    for i in range(10):
        await world.password_login.password_grant(f"u{i}@example.com", "guess", ctx())
    limited = await world.password_login.password_grant("new@example.com", "guess", ctx())
    assert isinstance(limited, Rejected) and limited.status == 429
    other_ip = await world.password_login.password_grant(
        "new@example.com", "guess", ctx(ip="192.0.2.1")
    )
    assert other_ip == INVALID_CREDENTIALS


# --- secrets stay out of the audit log and reprs --------------------------------------------


async def test_no_password_token_or_csrf_token_reaches_the_audit_log(world: World) -> None:
    user = await world.add_user()
    secrets: list[str] = [PASSWORD, "wrong horse battery staple", CAPTCHA]
    await world.password_login.login(EMAIL, "wrong horse battery staple", CAPTCHA, ctx())
    login = await world.login()
    secrets += [login.csrf_token, login.tokens.access_token, login.tokens.refresh_token]
    fresh = await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())
    assert isinstance(fresh, IssuedTokens)
    secrets += [fresh.access_token, fresh.refresh_token]
    await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())  # reuse
    granted = await world.password_login.password_grant(EMAIL, PASSWORD, ctx())
    assert isinstance(granted, IssuedTokens)
    secrets += [granted.access_token, granted.refresh_token]
    _, key = await world.add_key(user)
    secrets.append(key)
    principal = await world.authentication.authenticate(None, key)
    assert isinstance(principal, Principal)
    await world.session_lifetime.logout(principal, ctx())
    cookie_principal = await world.authentication.authenticate(granted.access_token, None)
    assert isinstance(cookie_principal, Principal)
    await world.session_lifetime.logout(cookie_principal, ctx())
    await world.session_lifetime.revoke_all_sessions(user.id, ctx())
    for token in (login.tokens.refresh_token, fresh.refresh_token):
        jti = world.codec.decode(token, expected_type="refresh")["jti"]
        secrets += [jti, hash_token(jti)]

    entries = world.audit.all()
    assert len(entries) >= 8
    dump = repr(entries)
    for secret in secrets:
        assert secret not in dump
    for shown in (repr(login), repr(login.tokens), repr(principal), repr(cookie_principal)):
        for secret in secrets:
            assert secret not in shown


# --- lost races: the password changes while a login rehashes it ------------------------------


def outdated_hash(password: str = PASSWORD) -> str:
    return argon2.PasswordHasher(time_cost=2, memory_cost=1024, parallelism=1).hash(password)


async def test_a_rehash_never_writes_the_old_password_over_a_reset() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    user = await world.add_user(encoded=outdated_hash())
    reset_hash = argon2_fast().hash("the new password after a reset")
    users.races.append(lambda u: attrs.evolve(u, password_hash=reset_hash))

    result = await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx())

    assert result == INVALID_CREDENTIALS
    stored = await world.users.get(user.id)
    assert stored is not None and stored.password_hash == reset_hash
    [entry] = world.entries(AuditAction.LOGIN)
    assert not entry.entry.success and entry.entry.error_message == "wrong password"
    assert world.sessions._sessions == {}


async def test_a_rehash_that_another_login_beat_still_logs_in() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    user = await world.add_user(encoded=outdated_hash())
    other_rehash = argon2_fast().hash(PASSWORD)
    users.races.append(lambda u: attrs.evolve(u, password_hash=other_rehash))

    result = await world.login()

    assert result.user == attrs.evolve(user, password_hash=other_rehash)
    assert (await world.users.get(user.id)) == result.user
    assert users.saves == 1
    assert world.hasher.calls == ["verify", "hash", "verify"]
    [entry] = world.entries(AuditAction.LOGIN)
    assert entry.entry.success


# --- registration reveals no account ----------------------------------------------------------


@attrs.define
class Outbox:
    down: bool = False
    sent: list[MailMessage] = attrs.field(factory=list)

    async def send(self, message: MailMessage) -> None:
        if self.down:
            raise ConnectionError("smtp down")
        self.sent.append(message)


def registration_of(world: World, outbox: Outbox) -> Registration:
    """Registration over the world's users, hasher and clock, mailing to ``outbox``."""
    throttle = MemoryAlertThrottle(world.clock)
    events = SecurityEvents(world.audit, world.users, throttle, LoggingOutbox(), world.clock)
    challenge = BotChallenge(world.captcha, enabled=True, bypass_user_agents=frozenset())
    return Registration(
        world.users,
        world.hasher,
        challenge,
        IdentityAudit(events),
        world.clock,
        world.random,
        terms_version="1",
        mailer=outbox,
        throttle=throttle,
        link_base="https://trade.example.com",
    )


async def test_a_new_and_a_taken_address_get_the_same_answer_and_work(world: World) -> None:
    outbox = Outbox()
    registration = registration_of(world, outbox)
    assert await registration.register(EMAIL, PASSWORD, CAPTCHA, ctx()) is None
    original = await world.users.by_email(EMAIL)
    assert original is not None and original.plan is Plan.FREE
    assert world.hasher.calls == ["hash"]

    again = await registration.register("ADA@example.com", "other password 123", CAPTCHA, ctx())
    assert again is None  # the same answer as for a new address
    assert world.hasher.calls == ["hash", "hash"]  # and the same password work
    assert await world.users.by_email(EMAIL) == original
    assert isinstance(await world.login(), LoginResult)
    assert [e.entry.success for e in world.entries(AuditAction.REGISTER)] == [True, False]

    await registration.drain()
    welcome, notice = outbox.sent
    assert (welcome.to, notice.to) == (EMAIL, EMAIL)
    assert welcome.subject == "Your account is ready"
    assert notice.subject == "Someone tried to register with your address"
    for part in (notice.text, notice.html):
        assert "https://trade.example.com/ui/login" in part
        assert "https://trade.example.com/ui/forgot-password" in part
    dump = repr(outbox.sent)
    assert PASSWORD not in dump and "other password 123" not in dump


async def test_the_taken_address_notice_is_mailed_at_most_every_30_minutes(world: World) -> None:
    outbox = Outbox()
    registration = registration_of(world, outbox)
    await world.add_user()
    for _ in range(3):
        assert await registration.register(EMAIL, PASSWORD, CAPTCHA, ctx()) is None
    await registration.drain()
    assert len(outbox.sent) == 1
    world.clock.advance(30 * 60)
    assert await registration.register(EMAIL, PASSWORD, CAPTCHA, ctx()) is None
    await registration.drain()
    assert len(outbox.sent) == 2


async def test_a_mail_failure_changes_no_answer_and_a_disabled_owner_gets_no_notice(
    world: World,
) -> None:
    outbox = Outbox(down=True)
    registration = registration_of(world, outbox)
    assert await registration.register(EMAIL, PASSWORD, CAPTCHA, ctx()) is None
    assert await registration.register(EMAIL, PASSWORD, CAPTCHA, ctx()) is None
    await registration.drain()
    outbox.down = False
    await world.add_user("off@example.com", disabled=True)
    assert await registration.register("off@example.com", PASSWORD, CAPTCHA, ctx()) is None
    await registration.drain()
    assert outbox.sent == []
