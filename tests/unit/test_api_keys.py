"""ApiKeys: creating, listing and revoking keys from a browser session, on the memory adapters
(``identity_world``)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from identity_world import (
    World,
    ctx,
    make_world,
    status,
    store_down,
)

from tradecore.audit import AuditAction
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected
from tradecore.sessions import hash_token
from tradecore.testing.clock import EPOCH


@pytest.fixture
def world() -> World:
    return make_world()


# --- API keys -------------------------------------------------------------------------------


async def test_a_created_key_is_shown_once_stored_hashed_and_works(world: World) -> None:
    user = await world.register()
    principal = await world.principal()
    created = await world.keys.create_api_key(principal, " trading bot ", None, ctx())
    assert isinstance(created, tuple)
    key, plaintext = created
    assert key.name == "trading bot" and key.user_id == user.id and key.expires_at is None
    assert key.key_hash == hash_token(plaintext) and plaintext.startswith(key.prefix)
    assert plaintext not in repr(await world.api_keys.list_for_user(user.id))
    via_key = await world.authentication.authenticate(None, plaintext)
    assert isinstance(via_key, Principal) and via_key.user.id == user.id
    [entry] = world.entries(AuditAction.API_KEY_CREATED)
    assert entry.entry.success and entry.entry.resource_id == key.id


async def test_an_api_key_cannot_manage_credentials(world: World) -> None:
    await world.register()
    by_key = await world.key_principal()
    assert by_key.api_key is not None
    key_id = by_key.api_key.id
    refusals = [
        await world.keys.create_api_key(by_key, "more", None, ctx()),
        await world.keys.list_api_keys(by_key),
        await world.keys.revoke_api_key(by_key, key_id, ctx()),
        await world.ips.add_allowed_ip(by_key, "203.0.113.7", ctx()),
        await world.ips.list_allowed_ips(by_key),
        await world.ips.remove_allowed_ip(by_key, "any", ctx()),
    ]
    for refusal in refusals:
        assert isinstance(refusal, Rejected)
        assert (refusal.status, refusal.code) == (403, "browser_session_required")
    assert len(await world.api_keys.list_for_user(by_key.user.id)) == 1
    assert await world.allowed_ips.list_for_user(by_key.user.id) == []


@pytest.mark.parametrize("name", ["", "   ", None, 7, "x" * 101, "line\nbreak"])
async def test_a_key_needs_a_printable_name(world: World, name: object) -> None:
    await world.register()
    assert (
        status(await world.keys.create_api_key(await world.principal(), name, None, ctx())) == 400
    )


@pytest.mark.parametrize("expires_at", ["2027-01-01", 1_900_000_000, EPOCH, EPOCH - timedelta(1)])
async def test_a_key_expiry_must_be_a_future_time(world: World, expires_at: object) -> None:
    await world.register()
    outcome = await world.keys.create_api_key(await world.principal(), "k", expires_at, ctx())
    assert status(outcome) == 400


async def test_a_key_with_an_expiry_stops_working_then(world: World) -> None:
    await world.register()
    principal = await world.principal()
    naive = datetime(2026, 1, 5, 15, 30)  # no zone: UTC, an hour from now
    created = await world.keys.create_api_key(principal, "k", naive, ctx())
    assert isinstance(created, tuple)
    key, plaintext = created
    assert key.expires_at == EPOCH + timedelta(hours=1)
    world.clock.advance(3600)
    assert status(await world.authentication.authenticate(None, plaintext)) == 401


async def test_keys_are_listed_per_user_and_revoked_at_once(world: World) -> None:
    await world.register()
    await world.register("bob@example.com")
    ada, bob = await world.principal(), await world.principal("bob@example.com")
    ada_key = await world.keys.create_api_key(ada, "a", None, ctx())
    bob_key = await world.keys.create_api_key(bob, "b", None, ctx())
    assert isinstance(ada_key, tuple) and isinstance(bob_key, tuple)
    listed = await world.keys.list_api_keys(ada)
    assert isinstance(listed, list) and [k.id for k in listed] == [ada_key[0].id]

    assert status(await world.keys.revoke_api_key(ada, bob_key[0].id, ctx())) == 404
    assert isinstance(await world.authentication.authenticate(None, bob_key[1]), Principal)
    assert await world.keys.revoke_api_key(ada, ada_key[0].id, ctx()) is None
    assert status(await world.authentication.authenticate(None, ada_key[1])) == 401
    assert status(await world.keys.revoke_api_key(ada, ada_key[0].id, ctx())) == 404
    assert [e.entry.success for e in world.entries(AuditAction.API_KEY_REVOKED)] == [
        False,
        True,
        False,
    ]


async def test_the_number_of_usable_keys_is_capped() -> None:
    world = make_world(max_keys=2)
    await world.register()
    principal = await world.principal()
    first = await world.keys.create_api_key(principal, "1", None, ctx())
    await world.keys.create_api_key(principal, "2", None, ctx())
    assert status(await world.keys.create_api_key(principal, "3", None, ctx())) == 409
    assert isinstance(first, tuple)
    await world.keys.revoke_api_key(principal, first[0].id, ctx())
    assert isinstance(await world.keys.create_api_key(principal, "3", None, ctx()), tuple)


async def test_every_key_call_answers_503_when_the_store_is_down(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.register()
    principal = await world.principal()
    for method in ("list_for_user", "revoke"):
        monkeypatch.setattr(world.api_keys, method, store_down)
    outcomes = [
        await world.keys.create_api_key(principal, "bot", None, ctx()),
        await world.keys.list_api_keys(principal),
        await world.keys.revoke_api_key(principal, "key-1", ctx()),
    ]
    assert outcomes == [UNAVAILABLE] * 3
