"""Login throttling (docs/security.md, "Login throttling"): failed logins and password grants
per client address and per account from one address, failed grants per account from any
address, registration and reset requests per client address; 429 with Retry-After, audited,
on the memory limiter with the fake clock."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from identity_world import CAPTCHA, FakeCaptcha, ctx, session_services
from support import fast_hasher

from tradecore.audit import AuditAction, RequestContext, StoredAuditEntry
from tradecore.identity import Plan, User
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.login import LoginResult, PasswordLogin
from tradecore.services.identity.password_reset import PasswordReset, ResetSettings
from tradecore.services.identity.refusals import INVALID_CREDENTIALS
from tradecore.services.identity.registration import Registration
from tradecore.services.identity.session_tokens import IssuedTokens
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock, SeededRandom
from tradecore_adapters.crypto.tokens import JwtTokenCodec
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.memory.protection import MemoryAlertThrottle, MemoryRateLimiter
from tradecore_adapters.memory.repositories import (
    MemoryApiKeyRepository,
    MemoryAuditLog,
    MemorySessionRepository,
    MemoryUserRepository,
)
from tradecore_adapters.memory.resets import MemoryPasswordResetTokens

EMAIL = "ada@example.com"
PASSWORD = "correct horse battery staple"
WRONG = "wrong horse battery staple"
ATTACKER = "198.51.100.66"
OWNER = "203.0.113.7"
WINDOW_S = 900.0


@attrs.define
class World:
    clock: FakeClock
    users: MemoryUserRepository
    audit: MemoryAuditLog
    captcha: FakeCaptcha
    login: PasswordLogin
    registration: Registration
    reset: PasswordReset

    async def add_user(self) -> User:
        hasher = fast_hasher()
        user = User(
            id="u-ada",
            email=EMAIL,
            password_hash=await hasher.hash(PASSWORD),
            plan=Plan.PRO,
            created_at=self.clock.now(),
        )
        assert await self.users.add(user)
        return user

    async def attempt(self, password: str, ip: str, email: str = EMAIL) -> object:
        return await self.login.login(email, password, CAPTCHA, ctx(ip=ip, path="/auth/login"))

    async def grant(self, password: str, ip: str, email: str = EMAIL) -> object:
        return await self.login.password_grant(email, password, ctx(ip=ip, path="/auth/token"))

    def throttled(self, action: AuditAction) -> list[StoredAuditEntry]:
        return [
            s
            for s in self.audit.all()
            if s.entry.action is action and s.entry.error_message == "rate limited"
        ]


def make_world(**settings: Any) -> World:
    clock = FakeClock()
    random = SeededRandom(5)
    users = MemoryUserRepository()
    audit = MemoryAuditLog()
    captcha = FakeCaptcha()
    limiter = MemoryRateLimiter(clock)
    throttle = MemoryAlertThrottle(clock)
    identity_audit = IdentityAudit(SecurityEvents(audit, users, throttle, LoggingOutbox(), clock))
    auth = AuthSettings(**settings)
    challenge = BotChallenge(captcha, enabled=auth.captcha_enabled, bypass_user_agents=frozenset())
    hasher = fast_hasher()
    login, _, _ = session_services(
        users,
        MemorySessionRepository(),
        MemoryApiKeyRepository(),
        hasher,
        JwtTokenCodec("k" * 40, clock=clock),
        challenge,
        identity_audit,
        clock,
        random,
        auth,
        limiter=limiter,
    )
    registration = Registration(
        users,
        hasher,
        challenge,
        identity_audit,
        clock,
        random,
        terms_version="1",
        limiter=limiter,
        settings=auth,
    )
    reset = PasswordReset(
        users,
        MemorySessionRepository(),
        MemoryPasswordResetTokens(),
        hasher,
        LoggingOutbox(),
        identity_audit,
        clock,
        random,
        ResetSettings(link_base="https://trade.example.com"),
        throttle=throttle,
        limiter=limiter,
        auth=auth,
    )
    return World(clock, users, audit, captcha, login, registration, reset)


@pytest.fixture(params=[True, False], ids=["challenge", "no-challenge"])
def world(request: pytest.FixtureRequest) -> World:
    return make_world(captcha_enabled=request.param)


def assert_throttled(outcome: object) -> Rejected:
    assert isinstance(outcome, Rejected), outcome
    assert (outcome.status, outcome.code) == (429, "rate_limited")
    assert outcome.retry_after_s is not None and 0 < outcome.retry_after_s <= WINDOW_S
    return outcome


# --- /auth/login ------------------------------------------------------------------------------


async def test_thirty_wrong_passwords_then_the_right_one_is_429(world: World) -> None:
    await world.add_user()
    for _ in range(30):
        await world.attempt(WRONG, ATTACKER)
    assert_throttled(await world.attempt(PASSWORD, ATTACKER))
    entries = world.throttled(AuditAction.LOGIN_CREDENTIAL_ATTACK)
    assert len(entries) == 26  # 5 wrong passwords counted, the next 25 and the right one refused
    assert entries[-1].entry.metadata["attack_type"] == "credential_attack"
    assert entries[-1].entry.context.ip_address == ATTACKER


async def test_the_throttle_lifts_when_the_window_has_passed(world: World) -> None:
    await world.add_user()
    for _ in range(30):
        await world.attempt(WRONG, ATTACKER)
    refused = assert_throttled(await world.attempt(PASSWORD, ATTACKER))
    assert refused.retry_after_s is not None
    world.clock.advance(refused.retry_after_s)
    assert isinstance(await world.attempt(PASSWORD, ATTACKER), LoginResult)


async def test_failures_per_client_address_cover_every_account(world: World) -> None:
    for i in range(10):
        assert await world.attempt(WRONG, ATTACKER, f"u{i}@example.com") == INVALID_CREDENTIALS
    refused = await world.attempt(WRONG, ATTACKER, "someone-else@example.com")
    assert assert_throttled(refused)
    [*_, last] = world.throttled(AuditAction.LOGIN_CREDENTIAL_ATTACK)
    assert last.entry.metadata["throttle"] == "ip"
    other = await world.attempt(WRONG, "192.0.2.1", "someone-else@example.com")
    assert other == INVALID_CREDENTIALS


async def test_the_owner_is_not_locked_out_by_an_attacker_elsewhere(world: World) -> None:
    await world.add_user()
    for n in range(40):  # 8 addresses, each stopped by the account-and-address rule
        await world.attempt(WRONG, f"198.51.100.{n // 5}")
    assert_throttled(await world.attempt(PASSWORD, "198.51.100.0"))
    assert isinstance(await world.attempt(PASSWORD, OWNER), LoginResult)


async def test_a_success_does_not_spend_the_windows(world: World) -> None:
    await world.add_user()
    for _ in range(30):
        assert isinstance(await world.attempt(PASSWORD, OWNER), LoginResult)
    for _ in range(5):
        assert await world.attempt(WRONG, OWNER) == INVALID_CREDENTIALS
    assert_throttled(await world.attempt(PASSWORD, OWNER))


async def test_a_refused_challenge_and_bad_input_do_not_count() -> None:
    world = make_world(captcha_enabled=True)
    await world.add_user()
    world.captcha.answer = False
    for _ in range(20):
        refused = await world.attempt(WRONG, ATTACKER)
        assert isinstance(refused, Rejected) and refused.status == 403
    world.captcha.answer = True
    for _ in range(20):
        bad = await world.login.login(EMAIL, None, CAPTCHA, ctx(ip=ATTACKER))
        assert isinstance(bad, Rejected) and bad.status == 400
    assert isinstance(await world.attempt(PASSWORD, ATTACKER), LoginResult)


# --- /auth/token -------------------------------------------------------------------------------


async def test_the_password_grant_shares_the_address_windows(world: World) -> None:
    await world.add_user()
    for _ in range(5):
        await world.attempt(WRONG, ATTACKER)
    assert_throttled(await world.grant(PASSWORD, ATTACKER))
    assert isinstance(await world.grant(PASSWORD, OWNER), IssuedTokens)


async def test_failed_grants_from_everywhere_close_the_grant_not_the_login(
    world: World,
) -> None:
    await world.add_user()
    for n in range(10):
        assert await world.grant(WRONG, f"198.51.100.{n}") == INVALID_CREDENTIALS
    assert_throttled(await world.grant(PASSWORD, OWNER))
    [*_, last] = world.throttled(AuditAction.LOGIN_CREDENTIAL_ATTACK)
    assert last.entry.metadata["throttle"] == "account"
    assert isinstance(await world.attempt(PASSWORD, OWNER), LoginResult)


# --- /auth/register and /auth/forgot-password --------------------------------------------------


def other(ip: str) -> RequestContext:
    return ctx(ip=ip, path="/auth/register")


async def test_registration_is_limited_per_client_address(world: World) -> None:
    for i in range(10):
        assert (
            await world.registration.register(
                f"n{i}@example.com", PASSWORD, CAPTCHA, other(ATTACKER)
            )
            is None
        )
    assert_throttled(
        await world.registration.register("late@example.com", PASSWORD, CAPTCHA, other(ATTACKER))
    )
    [entry] = world.throttled(AuditAction.REGISTER)
    assert entry.entry.metadata["throttle"] == "ip"
    assert await world.users.by_email("late@example.com") is None
    assert (
        await world.registration.register("late@example.com", PASSWORD, CAPTCHA, other(OWNER))
        is None
    )
    world.clock.advance(WINDOW_S)
    assert (
        await world.registration.register("later@example.com", PASSWORD, CAPTCHA, other(ATTACKER))
        is None
    )


async def test_reset_requests_are_limited_per_client_address(world: World) -> None:
    await world.add_user()
    for _ in range(10):
        assert await world.reset.forgot_password(EMAIL, ctx(ip=ATTACKER)) is None
    assert_throttled(await world.reset.forgot_password(EMAIL, ctx(ip=ATTACKER)))
    [entry] = world.throttled(AuditAction.PASSWORD_RESET_REQUESTED)
    assert entry.entry.user_id is None  # the refusal reveals nothing about the account
    assert await world.reset.forgot_password(EMAIL, ctx(ip=OWNER)) is None
    world.clock.advance(WINDOW_S)
    assert await world.reset.forgot_password(EMAIL, ctx(ip=ATTACKER)) is None
