"""AccountSecurity: register, forgotten and reset passwords, terms, API keys and allowed IPs,
on the memory adapters, with principals made by the real Authenticator."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import argon2
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from racing import RacingUsers

from tradecore.audit import AuditAction, RequestContext, StoredAuditEntry
from tradecore.errors import DatabaseUnavailable
from tradecore.identity import AllowedIp, Plan, Session, User
from tradecore.netaddr import parse_allowed_entry
from tradecore.ports.identity import MailMessage
from tradecore.ports.resets import PasswordResetTokens
from tradecore.services.account_security import (
    INVALID_RESET_TOKEN,
    AccountSecurity,
    AccountSettings,
)
from tradecore.services.auth import Authenticator, AuthSettings, LoginResult
from tradecore.services.security_events import SecurityEvents
from tradecore.services.vocabulary import Principal, Rejected
from tradecore.sessions import hash_token
from tradecore.testing.clock import EPOCH, FakeClock, SeededRandom
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
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


def ctx(ip: str = "203.0.113.7", ua: str = "Mozilla/5.0", path: str = "/x") -> RequestContext:
    return RequestContext(ip_address=ip, user_agent=ua, request_path=path, request_method="POST")


def fast_hasher() -> Argon2PasswordHasher:
    return Argon2PasswordHasher(
        hasher=argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    )


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
    auth: Authenticator
    accounts: AccountSecurity

    async def register(self, email: str = EMAIL, password: str = PASSWORD) -> User:
        user = await self.accounts.register(email, password, CAPTCHA, ctx())
        assert isinstance(user, User), user
        return user

    async def login(self, email: str = EMAIL, password: str = PASSWORD) -> LoginResult:
        result = await self.auth.login(email, password, CAPTCHA, ctx())
        assert isinstance(result, LoginResult), result
        return result

    async def principal(self, email: str = EMAIL) -> Principal:
        login = await self.login(email)
        principal = await self.auth.authenticate(login.tokens.access_token, None)
        assert isinstance(principal, Principal)
        return principal

    async def key_principal(self, email: str = EMAIL) -> Principal:
        created = await self.accounts.create_api_key(
            await self.principal(email), "bot", None, ctx()
        )
        assert isinstance(created, tuple)
        principal = await self.auth.authenticate(None, created[1])
        assert isinstance(principal, Principal) and principal.api_key is not None
        return principal

    async def reset_link_token(self) -> str:
        await self.accounts.drain()
        link = self.mail.sent[-1].text.split("#token=")[1].split()[0]
        return link

    def entries(self, action: AuditAction) -> list[StoredAuditEntry]:
        return [s for s in self.audit.all() if s.entry.action is action]


def make_world(
    users: MemoryUserRepository | None = None, captcha_enabled: bool = True, **settings: Any
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
    events = SecurityEvents(audit, users, throttle, LoggingOutbox(), clock)
    auth_settings = AuthSettings(captcha_enabled=captcha_enabled)
    codec = JwtTokenCodec("k" * 40, clock=clock)
    auth = Authenticator(
        users, sessions, api_keys, hasher, codec, captcha, events, clock, random, auth_settings
    )
    settings.setdefault("reset_link_base", BASE_URL + "/")
    accounts = AccountSecurity(
        users,
        sessions,
        api_keys,
        allowed_ips,
        resets,
        hasher,
        captcha,
        mail,
        events,
        clock,
        random,
        auth_settings,
        AccountSettings(**settings),
        reset_throttle=throttle,
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
        auth,
        accounts,
    )


@pytest.fixture
def world() -> World:
    return make_world()


def status(outcome: object) -> int:
    assert isinstance(outcome, Rejected), outcome
    return outcome.status


# --- register -------------------------------------------------------------------------------


async def test_register_creates_a_free_user_without_terms_who_can_log_in(world: World) -> None:
    user = await world.accounts.register("  Ada@Example.COM ", PASSWORD, CAPTCHA, ctx())
    assert isinstance(user, User)
    assert (user.email, user.plan, user.accepted_terms_version) == (EMAIL, Plan.FREE, None)
    assert user.created_at == EPOCH and not user.disabled
    assert await world.users.get(user.id) == user
    assert PASSWORD not in user.password_hash
    assert (await world.login()).user.id == user.id
    [entry] = world.entries(AuditAction.REGISTER)
    assert entry.entry.success and entry.entry.user_id == user.id
    assert world.captcha.calls == [(CAPTCHA, "203.0.113.7"), (CAPTCHA, "203.0.113.7")]


async def test_register_needs_the_bot_challenge(world: World) -> None:
    world.captcha.answer = False
    refused = await world.accounts.register(EMAIL, PASSWORD, "bad", ctx())
    missing = await world.accounts.register(EMAIL, PASSWORD, None, ctx())
    assert (status(refused), status(missing)) == (403, 400)
    assert await world.users.by_email(EMAIL) is None
    assert [e.entry.success for e in world.entries(AuditAction.REGISTER)] == [False, False]


async def test_register_without_the_challenge_when_captcha_is_off() -> None:
    world = make_world(captcha_enabled=False)
    world.captcha.answer = False
    assert isinstance(await world.accounts.register(EMAIL, PASSWORD, None, ctx()), User)
    assert world.captcha.calls == []


@pytest.mark.parametrize(
    ("email", "password"),
    [
        ("not-an-address", PASSWORD),
        (None, PASSWORD),
        (EMAIL, "short"),
        (EMAIL, "x" * 1025),
        (EMAIL, 12345678),
        (EMAIL, None),
        ("a@b.c\r\nBcc: x@y.z", PASSWORD),
    ],
)
async def test_register_refuses_bad_input_with_400(
    world: World, email: object, password: object
) -> None:
    outcome = await world.accounts.register(email, password, CAPTCHA, ctx())
    assert status(outcome) == 400
    assert world.users._by_id == {}


async def test_a_taken_email_is_409_and_the_account_is_untouched(world: World) -> None:
    original = await world.register()
    again = await world.accounts.register("ADA@example.com", "another password 123", CAPTCHA, ctx())
    assert isinstance(again, Rejected) and (again.status, again.code) == (409, "email_taken")
    assert await world.users.by_email(EMAIL) == original
    assert isinstance(await world.login(), LoginResult)


async def test_register_answers_503_when_the_store_is_down() -> None:
    world = make_world(users=DownUsers())
    assert status(await world.accounts.register(EMAIL, PASSWORD, CAPTCHA, ctx())) == 503


# --- forgotten and reset passwords ----------------------------------------------------------


async def test_forgot_password_mails_a_single_use_link_and_stores_only_its_digest(
    world: World,
) -> None:
    user = await world.register()
    assert await world.accounts.forgot_password(EMAIL, ctx()) is None
    token = await world.reset_link_token()
    [mail] = world.mail.sent
    assert mail.to == EMAIL
    assert f"{BASE_URL}/reset-password#token={token}" in mail.text
    assert f"{BASE_URL}/reset-password#token={token}" in mail.html
    assert "30 minutes" in mail.text
    assert len(token) == 43 and len(world.resets) == 1
    assert token not in repr(world.resets._tokens)
    assert hash_token(token) in world.resets._tokens
    [entry] = world.entries(AuditAction.PASSWORD_RESET_REQUESTED)
    assert entry.entry.user_id == user.id and entry.entry.success


@pytest.mark.parametrize("email", ["nobody@example.com", "NOBODY@example.com"])
async def test_forgot_password_for_an_unknown_address_looks_the_same(
    world: World, email: str
) -> None:
    await world.register()
    assert await world.accounts.forgot_password(email, ctx()) is None
    await world.accounts.drain()
    assert world.mail.sent == [] and len(world.resets) == 0
    [entry] = world.entries(AuditAction.PASSWORD_RESET_REQUESTED)
    assert entry.entry.user_id is None


async def test_forgot_password_sends_nothing_for_a_disabled_user(world: World) -> None:
    user = await world.register()
    assert await world.users.save(attrs.evolve(user, disabled=True), previous=user)
    assert await world.accounts.forgot_password(EMAIL, ctx()) is None
    await world.accounts.drain()
    assert world.mail.sent == []


@pytest.mark.parametrize("email", [None, 42, "", "no at sign"])
async def test_forgot_password_refuses_a_malformed_address(world: World, email: object) -> None:
    assert status(await world.accounts.forgot_password(email, ctx())) == 400


async def test_reset_replaces_the_password_and_ends_every_session(world: World) -> None:
    user = await world.register()
    logins = [await world.login(), await world.login()]
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()

    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) is None

    for login in logins:
        assert status(await world.auth.authenticate(login.tokens.access_token, None)) == 401
        assert status(await world.auth.refresh(login.tokens.refresh_token, ctx())) == 401
    assert status(await world.auth.login(EMAIL, PASSWORD, CAPTCHA, ctx())) == 401
    assert isinstance(await world.login(password=NEW_PASSWORD), LoginResult)
    [entry] = world.entries(AuditAction.PASSWORD_RESET)
    assert entry.entry.success and entry.entry.user_id == user.id
    assert entry.entry.metadata == {"sessions_revoked": 2}


async def test_a_reset_token_works_once(world: World) -> None:
    await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) is None
    again = await world.accounts.reset_password(token, "a third password here", ctx())
    assert again == INVALID_RESET_TOKEN
    assert isinstance(await world.login(password=NEW_PASSWORD), LoginResult)


async def test_a_reset_token_expires_after_30_minutes(world: World) -> None:
    await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    world.clock.advance(30 * 60)
    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) == INVALID_RESET_TOKEN


async def test_a_reset_token_is_still_good_just_before_expiry(world: World) -> None:
    await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    world.clock.advance(30 * 60 - 1)
    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) is None


async def test_a_weak_new_password_keeps_the_token(world: World) -> None:
    await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    assert status(await world.accounts.reset_password(token, "short", ctx())) == 400
    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) is None


@pytest.mark.parametrize("token", [None, "", "x" * 43, "y" * 5000, 12])
async def test_an_unknown_reset_token_is_refused_with_the_same_body(
    world: World, token: object
) -> None:
    await world.register()
    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) == INVALID_RESET_TOKEN


async def test_reset_mails_are_throttled_per_user_and_a_reset_voids_the_others(
    world: World,
) -> None:
    await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    first = await world.reset_link_token()
    await world.accounts.forgot_password(EMAIL, ctx())
    await world.accounts.drain()
    assert len(world.mail.sent) == 1  # within the minute: no second mail, no second token
    world.clock.advance(60)
    await world.accounts.forgot_password(EMAIL, ctx())
    second = await world.reset_link_token()
    assert len(world.mail.sent) == 2 and second != first
    assert await world.accounts.reset_password(second, NEW_PASSWORD, ctx()) is None
    assert await world.accounts.reset_password(first, PASSWORD, ctx()) == INVALID_RESET_TOKEN


async def test_a_failed_reset_mail_gives_the_throttle_slot_back(world: World) -> None:
    await world.register()
    world.mail.down = True
    assert await world.accounts.forgot_password(EMAIL, ctx()) is None
    await world.accounts.drain()
    world.mail.down = False
    assert await world.accounts.forgot_password(EMAIL, ctx()) is None
    token = await world.reset_link_token()
    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) is None


# --- terms ----------------------------------------------------------------------------------


async def test_accepting_the_current_terms_is_recorded(world: World) -> None:
    user = await world.register()
    principal = await world.principal()
    updated = await world.accounts.accept_terms(principal, "1", ctx())
    assert isinstance(updated, User) and updated.accepted_terms_version == "1"
    stored = await world.users.get(user.id)
    assert stored is not None and stored.accepted_terms_version == "1"
    [entry] = world.entries(AuditAction.TERMS_ACCEPTED)
    assert entry.entry.success and entry.entry.metadata == {"version": "1"}


@pytest.mark.parametrize("version", ["2", "0", "", None, 1])
async def test_only_the_current_terms_version_can_be_accepted(
    world: World, version: object
) -> None:
    user = await world.register()
    assert status(await world.accounts.accept_terms(await world.principal(), version, ctx())) == 400
    stored = await world.users.get(user.id)
    assert stored is not None and stored.accepted_terms_version is None


# --- API keys -------------------------------------------------------------------------------


async def test_a_created_key_is_shown_once_stored_hashed_and_works(world: World) -> None:
    user = await world.register()
    principal = await world.principal()
    created = await world.accounts.create_api_key(principal, " trading bot ", None, ctx())
    assert isinstance(created, tuple)
    key, plaintext = created
    assert key.name == "trading bot" and key.user_id == user.id and key.expires_at is None
    assert key.key_hash == hash_token(plaintext) and plaintext.startswith(key.prefix)
    assert plaintext not in repr(await world.api_keys.list_for_user(user.id))
    via_key = await world.auth.authenticate(None, plaintext)
    assert isinstance(via_key, Principal) and via_key.user.id == user.id
    [entry] = world.entries(AuditAction.API_KEY_CREATED)
    assert entry.entry.success and entry.entry.resource_id == key.id


async def test_an_api_key_cannot_manage_credentials(world: World) -> None:
    await world.register()
    by_key = await world.key_principal()
    assert by_key.api_key is not None
    key_id = by_key.api_key.id
    refusals = [
        await world.accounts.create_api_key(by_key, "more", None, ctx()),
        await world.accounts.list_api_keys(by_key),
        await world.accounts.revoke_api_key(by_key, key_id, ctx()),
        await world.accounts.add_allowed_ip(by_key, "203.0.113.7", ctx()),
        await world.accounts.list_allowed_ips(by_key),
        await world.accounts.remove_allowed_ip(by_key, "any", ctx()),
    ]
    for refusal in refusals:
        assert isinstance(refusal, Rejected)
        assert (refusal.status, refusal.code) == (403, "browser_session_required")
    assert len(await world.api_keys.list_for_user(by_key.user.id)) == 1
    assert await world.allowed_ips.list_for_user(by_key.user.id) == []


async def test_an_api_key_may_accept_terms(world: World) -> None:
    await world.register()
    by_key = await world.key_principal()
    assert isinstance(await world.accounts.accept_terms(by_key, "1", ctx()), User)


@pytest.mark.parametrize("name", ["", "   ", None, 7, "x" * 101, "line\nbreak"])
async def test_a_key_needs_a_printable_name(world: World, name: object) -> None:
    await world.register()
    assert (
        status(await world.accounts.create_api_key(await world.principal(), name, None, ctx()))
        == 400
    )


@pytest.mark.parametrize("expires_at", ["2027-01-01", 1_900_000_000, EPOCH, EPOCH - timedelta(1)])
async def test_a_key_expiry_must_be_a_future_time(world: World, expires_at: object) -> None:
    await world.register()
    outcome = await world.accounts.create_api_key(await world.principal(), "k", expires_at, ctx())
    assert status(outcome) == 400


async def test_a_key_with_an_expiry_stops_working_then(world: World) -> None:
    await world.register()
    principal = await world.principal()
    naive = datetime(2026, 1, 5, 15, 30)  # no zone: UTC, an hour from now
    created = await world.accounts.create_api_key(principal, "k", naive, ctx())
    assert isinstance(created, tuple)
    key, plaintext = created
    assert key.expires_at == EPOCH + timedelta(hours=1)
    world.clock.advance(3600)
    assert status(await world.auth.authenticate(None, plaintext)) == 401


async def test_keys_are_listed_per_user_and_revoked_at_once(world: World) -> None:
    await world.register()
    await world.register("bob@example.com")
    ada, bob = await world.principal(), await world.principal("bob@example.com")
    ada_key = await world.accounts.create_api_key(ada, "a", None, ctx())
    bob_key = await world.accounts.create_api_key(bob, "b", None, ctx())
    assert isinstance(ada_key, tuple) and isinstance(bob_key, tuple)
    listed = await world.accounts.list_api_keys(ada)
    assert isinstance(listed, list) and [k.id for k in listed] == [ada_key[0].id]

    assert status(await world.accounts.revoke_api_key(ada, bob_key[0].id, ctx())) == 404
    assert isinstance(await world.auth.authenticate(None, bob_key[1]), Principal)
    assert await world.accounts.revoke_api_key(ada, ada_key[0].id, ctx()) is None
    assert status(await world.auth.authenticate(None, ada_key[1])) == 401
    assert status(await world.accounts.revoke_api_key(ada, ada_key[0].id, ctx())) == 404
    assert [e.entry.success for e in world.entries(AuditAction.API_KEY_REVOKED)] == [
        False,
        True,
        False,
    ]


async def test_the_number_of_usable_keys_is_capped() -> None:
    world = make_world(max_api_keys=2)
    await world.register()
    principal = await world.principal()
    first = await world.accounts.create_api_key(principal, "1", None, ctx())
    await world.accounts.create_api_key(principal, "2", None, ctx())
    assert status(await world.accounts.create_api_key(principal, "3", None, ctx())) == 409
    assert isinstance(first, tuple)
    await world.accounts.revoke_api_key(principal, first[0].id, ctx())
    assert isinstance(await world.accounts.create_api_key(principal, "3", None, ctx()), tuple)


# --- allowed IPs ----------------------------------------------------------------------------


async def test_allowed_ips_are_stored_normalized_and_duplicates_refused(world: World) -> None:
    user = await world.register()
    principal = await world.principal()
    added = await world.accounts.add_allowed_ip(principal, " ::ffff:203.0.113.7 ", ctx())
    assert isinstance(added, AllowedIp) and added.ip_address == "203.0.113.7"
    duplicate = await world.accounts.add_allowed_ip(principal, "203.0.113.7/32", ctx())
    assert isinstance(duplicate, Rejected) and duplicate.status == 409
    block = await world.accounts.add_allowed_ip(principal, "10.0.0.0/8", ctx())
    assert isinstance(block, AllowedIp) and block.ip_address == "10.0.0.0/8"
    listed = await world.accounts.list_allowed_ips(principal)
    assert isinstance(listed, list)
    assert [e.ip_address for e in listed] == ["203.0.113.7", "10.0.0.0/8"]
    assert all(e.user_id == user.id for e in listed)
    [*_, entry] = world.entries(AuditAction.ALLOWED_IP_ADDED)
    assert entry.entry.success and entry.entry.metadata == {"ip": "10.0.0.0/8"}


@pytest.mark.parametrize("text", ["nonsense", "10.0.0.1/8", "", None, 12, "300.1.1.1", "1.2.3.4 5"])
async def test_nonsense_addresses_are_400(world: World, text: object) -> None:
    await world.register()
    assert status(await world.accounts.add_allowed_ip(await world.principal(), text, ctx())) == 400


@given(st.text(max_size=60))
def test_any_text_is_either_stored_in_its_parsed_form_or_refused(text: str) -> None:
    async def scenario() -> None:
        world = make_world(captcha_enabled=False)
        owner = User("u1", EMAIL, "unused", Plan.PRO, EPOCH)
        await world.users.add(owner)
        principal = Principal(owner, _session(), None, True, Plan.PRO)
        outcome = await world.accounts.add_allowed_ip(principal, text, ctx())
        expected = parse_allowed_entry(text)
        if expected is None:
            assert status(outcome) == 400
        else:
            assert isinstance(outcome, AllowedIp) and outcome.ip_address == expected

    asyncio.run(scenario())


def _session() -> Session:
    return Session("s1", "u1", "csrf", "203.0.113.7", "ua", EPOCH)


async def test_removing_an_entry_is_limited_to_its_owner(world: World) -> None:
    await world.register()
    await world.register("bob@example.com")
    ada, bob = await world.principal(), await world.principal("bob@example.com")
    entry = await world.accounts.add_allowed_ip(ada, "203.0.113.7", ctx())
    assert isinstance(entry, AllowedIp)
    assert status(await world.accounts.remove_allowed_ip(bob, entry.id, ctx())) == 404
    assert await world.accounts.remove_allowed_ip(ada, entry.id, ctx()) is None
    assert await world.accounts.list_allowed_ips(ada) == []
    assert status(await world.accounts.remove_allowed_ip(ada, entry.id, ctx())) == 404
    assert [e.entry.success for e in world.entries(AuditAction.ALLOWED_IP_REMOVED)] == [
        False,
        True,
        False,
    ]


async def test_the_allowed_ip_list_is_capped() -> None:
    world = make_world(max_allowed_ips=2)
    await world.register()
    principal = await world.principal()
    for text in ("192.0.2.1", "192.0.2.2"):
        assert isinstance(await world.accounts.add_allowed_ip(principal, text, ctx()), AllowedIp)
    assert status(await world.accounts.add_allowed_ip(principal, "192.0.2.3", ctx())) == 409


# --- the reset-token store ------------------------------------------------------------------


async def test_the_memory_reset_store_implements_the_port_and_is_single_use() -> None:
    store = MemoryPasswordResetTokens(max_per_user=2)
    assert isinstance(store, PasswordResetTokens)
    await store.add("h1", "u1", EPOCH + timedelta(minutes=30))
    assert await store.consume("h1", EPOCH + timedelta(minutes=30)) is None  # at expiry: gone
    await store.add("h2", "u1", EPOCH + timedelta(minutes=30))
    results = await asyncio.gather(*(store.consume("h2", EPOCH) for _ in range(5)))
    assert results.count("u1") == 1 and results.count(None) == 4
    for h in ("a", "b", "c"):
        await store.add(h, "u2", EPOCH + timedelta(minutes=30))
    assert await store.consume("a", EPOCH) is None  # the oldest went when the third came
    assert await store.discard_for_user("u2") == 2
    assert await store.consume("c", EPOCH) is None
    assert await store.discard_for_user("u2") == 0


# --- secrets stay out of the audit log ------------------------------------------------------


async def test_no_password_key_or_reset_token_reaches_the_audit_log(world: World) -> None:
    await world.register()
    await world.accounts.register(EMAIL, "taken but secret pw", CAPTCHA, ctx())
    principal = await world.principal()
    created = await world.accounts.create_api_key(principal, "bot", None, ctx())
    assert isinstance(created, tuple)
    key, plaintext = created
    await world.accounts.revoke_api_key(principal, key.id, ctx())
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    await world.accounts.reset_password(token, "weak", ctx())
    await world.accounts.reset_password(token, NEW_PASSWORD, ctx())
    await world.accounts.reset_password(token, NEW_PASSWORD, ctx())
    await world.accounts.add_allowed_ip(principal, "203.0.113.7", ctx())
    await world.accounts.accept_terms(principal, "1", ctx())

    secrets = [PASSWORD, "taken but secret pw", NEW_PASSWORD, plaintext, token, hash_token(token)]
    secrets.append(principal.session.csrf_token if principal.session else "-")
    dump = repr(world.audit.all())
    assert len(world.audit.all()) >= 10
    for secret in secrets:
        assert secret not in dump


# --- lost races: the user changes while a reset or an acceptance is saved --------------------


async def test_a_reset_wins_over_a_rehash_that_landed_first() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    user = await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    users.races.append(lambda u: attrs.evolve(u, password_hash=u.password_hash + "-rehashed"))

    assert await world.accounts.reset_password(token, NEW_PASSWORD, ctx()) is None

    assert users.saves == 2
    assert status(await world.auth.login(EMAIL, PASSWORD, CAPTCHA, ctx())) == 401
    assert isinstance(await world.login(password=NEW_PASSWORD), LoginResult)
    [entry] = world.entries(AuditAction.PASSWORD_RESET)
    assert entry.entry.success and entry.entry.user_id == user.id


async def test_a_reset_that_loses_twice_is_409_and_audited_once() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    await world.register()
    await world.accounts.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    users.races.extend(
        [
            lambda u: attrs.evolve(u, password_hash="$other-1"),
            lambda u: attrs.evolve(u, password_hash="$other-2"),
        ]
    )

    outcome = await world.accounts.reset_password(token, NEW_PASSWORD, ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 409
    stored = await world.users.by_email(EMAIL)
    assert stored is not None and stored.password_hash == "$other-2"
    [entry] = world.entries(AuditAction.PASSWORD_RESET)
    assert not entry.entry.success and entry.entry.error_message == "changed concurrently"


async def test_accepting_the_terms_beside_the_same_acceptance_succeeds_once() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    await world.register()
    principal = await world.principal()
    users.races.append(lambda u: attrs.evolve(u, accepted_terms_version="1", plan=Plan.FREE))

    updated = await world.accounts.accept_terms(principal, "1", ctx())

    assert isinstance(updated, User) and updated.accepted_terms_version == "1"
    assert updated.plan is Plan.FREE  # the other request's change is kept
    assert users.saves == 2  # the second changes nothing: it only reads the stored user
    [entry] = world.entries(AuditAction.TERMS_ACCEPTED)
    assert entry.entry.success


async def test_accepting_the_terms_that_loses_twice_is_409_and_audited_once() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    await world.register()
    principal = await world.principal()
    users.races.extend(
        [
            lambda u: attrs.evolve(u, accepted_terms_version="0"),
            lambda u: attrs.evolve(u, accepted_terms_version="00"),
        ]
    )

    outcome = await world.accounts.accept_terms(principal, "1", ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 409
    [entry] = world.entries(AuditAction.TERMS_ACCEPTED)
    assert not entry.entry.success
