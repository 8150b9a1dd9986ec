"""PasswordReset: the reset mail (throttled, sent in the background) and the reset itself, on
the memory adapters (``identity_world``); and no account flow writes a secret to the audit
log."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import attrs
import pytest
from identity_world import (
    BASE_URL,
    CAPTCHA,
    EMAIL,
    NEW_PASSWORD,
    PASSWORD,
    World,
    ctx,
    make_world,
    status,
    store_down,
)
from racing import RacingUsers

from tradecore.audit import AuditAction
from tradecore.ports.resets import PasswordResetTokens
from tradecore.services.identity.login import LoginResult
from tradecore.services.identity.password_reset import INVALID_RESET_TOKEN
from tradecore.services.vocabulary import UNAVAILABLE, Rejected
from tradecore.sessions import hash_token
from tradecore.testing.clock import EPOCH
from tradecore_adapters.memory.resets import MemoryPasswordResetTokens


@pytest.fixture
def world() -> World:
    return make_world()


# --- forgotten and reset passwords ----------------------------------------------------------


async def test_forgot_password_mails_a_single_use_link_and_stores_only_its_digest(
    world: World,
) -> None:
    user = await world.register()
    assert await world.password_reset.forgot_password(EMAIL, ctx()) is None
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
    assert await world.password_reset.forgot_password(email, ctx()) is None
    await world.password_reset.drain()
    assert world.mail.sent == [] and len(world.resets) == 0
    [entry] = world.entries(AuditAction.PASSWORD_RESET_REQUESTED)
    assert entry.entry.user_id is None


async def test_forgot_password_sends_nothing_for_a_disabled_user(world: World) -> None:
    user = await world.register()
    assert await world.users.save(attrs.evolve(user, disabled=True), previous=user)
    assert await world.password_reset.forgot_password(EMAIL, ctx()) is None
    await world.password_reset.drain()
    assert world.mail.sent == []


@pytest.mark.parametrize("email", [None, 42, "", "no at sign"])
async def test_forgot_password_refuses_a_malformed_address(world: World, email: object) -> None:
    assert status(await world.password_reset.forgot_password(email, ctx())) == 400


async def test_reset_replaces_the_password_and_ends_every_session(world: World) -> None:
    user = await world.register()
    logins = [await world.login(), await world.login()]
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()

    assert await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) is None

    for login in logins:
        assert (
            status(await world.authentication.authenticate(login.tokens.access_token, None)) == 401
        )
        assert (
            status(await world.session_lifetime.refresh(login.tokens.refresh_token, ctx())) == 401
        )
    assert status(await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx())) == 401
    assert isinstance(await world.login(password=NEW_PASSWORD), LoginResult)
    [entry] = world.entries(AuditAction.PASSWORD_RESET)
    assert entry.entry.success and entry.entry.user_id == user.id
    assert entry.entry.metadata == {"sessions_revoked": 2}


async def test_a_reset_token_works_once(world: World) -> None:
    await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    assert await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) is None
    again = await world.password_reset.reset_password(token, "a third password here", ctx())
    assert again == INVALID_RESET_TOKEN
    assert isinstance(await world.login(password=NEW_PASSWORD), LoginResult)


async def test_a_reset_token_expires_after_30_minutes(world: World) -> None:
    await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    world.clock.advance(30 * 60)
    assert (
        await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) == INVALID_RESET_TOKEN
    )


async def test_a_reset_token_is_still_good_just_before_expiry(world: World) -> None:
    await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    world.clock.advance(30 * 60 - 1)
    assert await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) is None


async def test_a_weak_new_password_keeps_the_token(world: World) -> None:
    await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    assert status(await world.password_reset.reset_password(token, "short", ctx())) == 400
    assert await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) is None


@pytest.mark.parametrize("token", [None, "", "x" * 43, "y" * 5000, 12])
async def test_an_unknown_reset_token_is_refused_with_the_same_body(
    world: World, token: object
) -> None:
    await world.register()
    assert (
        await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) == INVALID_RESET_TOKEN
    )


async def test_reset_mails_are_throttled_per_user_and_a_reset_voids_the_others(
    world: World,
) -> None:
    await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    first = await world.reset_link_token()
    await world.password_reset.forgot_password(EMAIL, ctx())
    await world.password_reset.drain()
    assert len(world.mail.sent) == 1  # within the minute: no second mail, no second token
    world.clock.advance(60)
    await world.password_reset.forgot_password(EMAIL, ctx())
    second = await world.reset_link_token()
    assert len(world.mail.sent) == 2 and second != first
    assert await world.password_reset.reset_password(second, NEW_PASSWORD, ctx()) is None
    assert await world.password_reset.reset_password(first, PASSWORD, ctx()) == INVALID_RESET_TOKEN


async def test_a_failed_reset_mail_gives_the_throttle_slot_back(world: World) -> None:
    await world.register()
    world.mail.down = True
    assert await world.password_reset.forgot_password(EMAIL, ctx()) is None
    await world.password_reset.drain()
    world.mail.down = False
    assert await world.password_reset.forgot_password(EMAIL, ctx()) is None
    token = await world.reset_link_token()
    assert await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) is None


async def test_both_steps_answer_503_when_a_store_is_down(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.register()
    monkeypatch.setattr(world.users, "by_email", store_down)
    assert await world.password_reset.forgot_password(EMAIL, ctx()) == UNAVAILABLE
    monkeypatch.setattr(world.resets, "consume", store_down)
    assert await world.password_reset.reset_password("x" * 43, NEW_PASSWORD, ctx()) == UNAVAILABLE
    await world.password_reset.drain()
    assert world.mail.sent == []


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


# --- lost races: the user changes while a reset is saved -----------------------------------


async def test_a_reset_wins_over_a_rehash_that_landed_first() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    user = await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    users.races.append(lambda u: attrs.evolve(u, password_hash=u.password_hash + "-rehashed"))

    assert await world.password_reset.reset_password(token, NEW_PASSWORD, ctx()) is None

    assert users.saves == 2
    assert status(await world.password_login.login(EMAIL, PASSWORD, CAPTCHA, ctx())) == 401
    assert isinstance(await world.login(password=NEW_PASSWORD), LoginResult)
    [entry] = world.entries(AuditAction.PASSWORD_RESET)
    assert entry.entry.success and entry.entry.user_id == user.id


async def test_a_reset_that_loses_twice_is_409_and_audited_once() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    await world.register()
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    users.races.extend(
        [
            lambda u: attrs.evolve(u, password_hash="$other-1"),
            lambda u: attrs.evolve(u, password_hash="$other-2"),
        ]
    )

    outcome = await world.password_reset.reset_password(token, NEW_PASSWORD, ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 409
    stored = await world.users.by_email(EMAIL)
    assert stored is not None and stored.password_hash == "$other-2"
    [entry] = world.entries(AuditAction.PASSWORD_RESET)
    assert not entry.entry.success and entry.entry.error_message == "changed concurrently"


# --- secrets stay out of the audit log ------------------------------------------------------


async def test_no_password_key_or_reset_token_reaches_the_audit_log(world: World) -> None:
    await world.register()
    await world.registration.register(EMAIL, "taken but secret pw", CAPTCHA, ctx())
    principal = await world.principal()
    created = await world.keys.create_api_key(principal, "bot", None, ctx())
    assert isinstance(created, tuple)
    key, plaintext = created
    await world.keys.revoke_api_key(principal, key.id, ctx())
    await world.password_reset.forgot_password(EMAIL, ctx())
    token = await world.reset_link_token()
    await world.password_reset.reset_password(token, "weak", ctx())
    await world.password_reset.reset_password(token, NEW_PASSWORD, ctx())
    await world.password_reset.reset_password(token, NEW_PASSWORD, ctx())
    await world.ips.add_allowed_ip(principal, "203.0.113.7", ctx())
    await world.registration.accept_terms(principal, "1", ctx())

    secrets = [PASSWORD, "taken but secret pw", NEW_PASSWORD, plaintext, token, hash_token(token)]
    secrets.append(principal.session.csrf_token if principal.session else "-")
    dump = repr(world.audit.all())
    assert len(world.audit.all()) >= 10
    for secret in secrets:
        assert secret not in dump
