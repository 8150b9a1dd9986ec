"""Registration: register (behind the bot challenge) and accepting the terms, on the memory
adapters (``identity_world``)."""

from __future__ import annotations

import attrs
import pytest
from identity_world import (
    CAPTCHA,
    EMAIL,
    PASSWORD,
    DownUsers,
    World,
    ctx,
    make_world,
    status,
    store_down,
)
from racing import RacingUsers

from tradecore.audit import AuditAction
from tradecore.identity import Plan, User
from tradecore.services.identity.login import LoginResult
from tradecore.services.vocabulary import UNAVAILABLE, Rejected
from tradecore.testing.clock import EPOCH


@pytest.fixture
def world() -> World:
    return make_world()


# --- register -------------------------------------------------------------------------------


async def test_register_creates_a_free_user_without_terms_who_can_log_in(world: World) -> None:
    assert await world.registration.register("  Ada@Example.COM ", PASSWORD, CAPTCHA, ctx()) is None
    user = await world.users.by_email(EMAIL)
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
    refused = await world.registration.register(EMAIL, PASSWORD, "bad", ctx())
    missing = await world.registration.register(EMAIL, PASSWORD, None, ctx())
    assert (status(refused), status(missing)) == (403, 400)
    assert await world.users.by_email(EMAIL) is None
    assert [e.entry.success for e in world.entries(AuditAction.REGISTER)] == [False, False]


async def test_register_without_the_challenge_when_captcha_is_off() -> None:
    world = make_world(captcha_enabled=False)
    world.captcha.answer = False
    assert await world.registration.register(EMAIL, PASSWORD, None, ctx()) is None
    assert await world.users.by_email(EMAIL) is not None
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
    outcome = await world.registration.register(email, password, CAPTCHA, ctx())
    assert status(outcome) == 400
    assert world.users._by_id == {}


async def test_a_taken_email_is_answered_as_a_new_one_and_the_account_is_untouched(
    world: World,
) -> None:
    original = await world.register()
    again = await world.registration.register(
        "ADA@example.com", "another password 123", CAPTCHA, ctx()
    )
    assert again is None  # 202, as for a new address; the owner is told by mail
    assert await world.users.by_email(EMAIL) == original
    assert isinstance(await world.login(), LoginResult)


async def test_register_answers_503_when_the_store_is_down() -> None:
    world = make_world(users=DownUsers())
    assert status(await world.registration.register(EMAIL, PASSWORD, CAPTCHA, ctx())) == 503


async def test_accepting_the_terms_answers_503_when_the_store_is_down(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.register()
    principal = await world.principal()
    monkeypatch.setattr(world.users, "get", store_down)
    assert await world.registration.accept_terms(principal, "1", ctx()) == UNAVAILABLE


# --- terms ----------------------------------------------------------------------------------


async def test_accepting_the_current_terms_is_recorded(world: World) -> None:
    user = await world.register()
    principal = await world.principal()
    updated = await world.registration.accept_terms(principal, "1", ctx())
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
    assert (
        status(await world.registration.accept_terms(await world.principal(), version, ctx()))
        == 400
    )
    stored = await world.users.get(user.id)
    assert stored is not None and stored.accepted_terms_version is None


async def test_an_api_key_may_accept_terms(world: World) -> None:
    await world.register()
    by_key = await world.key_principal()
    assert isinstance(await world.registration.accept_terms(by_key, "1", ctx()), User)


# --- lost races: the user changes while an acceptance is saved ---------------------------


async def test_accepting_the_terms_beside_the_same_acceptance_succeeds_once() -> None:
    users = RacingUsers()
    world = make_world(users=users)
    await world.register()
    principal = await world.principal()
    users.races.append(lambda u: attrs.evolve(u, accepted_terms_version="1", plan=Plan.FREE))

    updated = await world.registration.accept_terms(principal, "1", ctx())

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

    outcome = await world.registration.accept_terms(principal, "1", ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 409
    [entry] = world.entries(AuditAction.TERMS_ACCEPTED)
    assert not entry.entry.success
