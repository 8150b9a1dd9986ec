"""AccountCredentials: issuing a new webhook secret or URL token and checking the broker
credentials, on the memory adapters, the real AES-GCM cipher and the fakes of
``accounts_world``."""

from __future__ import annotations

import os

import attrs
import pytest
from accounts_world import (
    CREDENTIALS,
    World,
    build,
    ctx,
    leaks,
    new_entries,
    racing,
    token_owner,
)

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction
from tradecore.services.vocabulary import Rejected
from tradecore.webhooks.checks import hash_secret
from tradecore_adapters.crypto.cipher import AesGcmCipher


@pytest.fixture
async def world() -> World:
    return await build()


# --- regenerate, rotate ---------------------------------------------------------------------


async def test_regenerate_secret_and_rotate_token(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    secret = await world.credentials.regenerate_secret(world.ada, new.account.id, ctx())
    assert isinstance(secret, str) and secret != new.webhook_secret
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and stored.webhook_secret_hash == hash_secret(secret)
    assert world.last().entry.action is AuditAction.WEBHOOK_SECRET_REGENERATED
    assert not leaks(world.last(), secret)
    token = await world.credentials.rotate_token(world.ada, new.account.id, ctx())
    assert isinstance(token, str) and token != new.webhook_token
    assert await token_owner(world, hash_secret(new.webhook_token)) is None
    found = await token_owner(world, hash_secret(token))
    assert found is not None and found[0].webhook_secret_hash == hash_secret(secret)
    assert world.last().entry.action is AuditAction.WEBHOOK_TOKEN_ROTATED
    assert not leaks(world.last(), token)
    assert await world.vault.open(found[0]) == CREDENTIALS


# --- verify ---------------------------------------------------------------------------------


async def test_verify_gives_the_broker_the_decrypted_credentials(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    verified = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(verified, TradingAccount) and verified.credentials_verified
    assert await world.accounts.get(new.account.id) == verified
    assert world.verifier.calls == [(new.account.id, CREDENTIALS)]
    entry = world.last().entry
    assert entry.action is AuditAction.ACCOUNT_UPDATED and entry.success
    assert entry.metadata["fields"] == ["credentials_verified"]
    assert not leaks(world.last(), *CREDENTIALS.values())


async def test_verify_refused_by_the_broker_is_400_with_its_reason(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    world.verifier.reason = "Invalid API key"
    outcome = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())
    assert outcome == Rejected(400, "credentials_rejected", "Invalid API key")
    assert await world.accounts.get(new.account.id) == new.account
    assert not world.last().entry.success


async def test_verify_with_the_broker_down_is_503(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    world.verifier.down = True
    outcome = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 503
    assert await world.accounts.get(new.account.id) == new.account


async def test_verify_with_unreadable_credentials_asks_for_them_again(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    foreign = AesGcmCipher(os.urandom(32)).encrypt(b"{}", new.account.id.encode())
    unreadable = attrs.evolve(new.account, encrypted_credentials=foreign)
    assert await world.accounts.save(unreadable, previous=new.account)
    outcome = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(outcome, Rejected) and outcome.code == "credentials_unreadable"
    assert world.verifier.calls == []


async def test_credentials_replaced_during_the_check_are_not_marked_verified(
    world: World,
) -> None:
    new = await world.create(credentials=CREDENTIALS)

    async def replace() -> None:
        await world.service.update(
            world.ada, new.account.id, {"credentials": {"api_key": "other"}}, ctx()
        )

    world.verifier.during = replace
    outcome = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 409
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and not stored.credentials_verified


# --- lost races: another request changes the account just before a save ---------------------


async def test_a_regeneration_beside_a_rename_keeps_the_new_name() -> None:
    world, accounts = await racing()
    new = await world.create()
    accounts.races.append(lambda a: attrs.evolve(a, name="Renamed elsewhere"))

    secret = await world.credentials.regenerate_secret(world.ada, new.account.id, ctx())

    assert isinstance(secret, str)
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and stored.name == "Renamed elsewhere"
    assert stored.webhook_secret_hash == hash_secret(secret)


async def test_a_regeneration_never_writes_over_a_secret_issued_meanwhile() -> None:
    world, accounts = await racing()
    new = await world.create()
    other = hash_secret("secret shown to the other request")
    accounts.races.append(lambda a: attrs.evolve(a, webhook_secret_hash=other))
    before = len(world.entries())

    outcome = await world.credentials.regenerate_secret(world.ada, new.account.id, ctx())

    assert isinstance(outcome, Rejected)
    assert (outcome.status, outcome.code) == (409, "webhook_secret_changed")
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and stored.webhook_secret_hash == other
    assert accounts.saves == 1
    [entry] = new_entries(world, before)
    assert entry.entry.action is AuditAction.WEBHOOK_SECRET_REGENERATED
    assert not entry.entry.success and entry.entry.error_message == "changed concurrently"


async def test_a_rotation_never_writes_over_a_token_issued_meanwhile() -> None:
    world, accounts = await racing()
    new = await world.create()
    other = hash_secret("token shown to the other request")
    accounts.races.append(lambda a: attrs.evolve(a, webhook_token_hash=other))
    before = len(world.entries())

    outcome = await world.credentials.rotate_token(world.ada, new.account.id, ctx())

    assert isinstance(outcome, Rejected)
    assert (outcome.status, outcome.code) == (409, "webhook_token_changed")
    found = await token_owner(world, other)
    assert found is not None and found[0].id == new.account.id
    [entry] = new_entries(world, before)
    assert entry.entry.action is AuditAction.WEBHOOK_TOKEN_ROTATED and not entry.entry.success


async def test_a_regeneration_of_an_account_deleted_meanwhile_is_404() -> None:
    world, accounts = await racing()
    new = await world.create()
    accounts.races.append(lambda a: attrs.evolve(a, deleted=True, encrypted_credentials=None))
    before = len(world.entries())

    outcome = await world.credentials.regenerate_secret(world.ada, new.account.id, ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 404
    row = world.accounts._accounts[new.account.id]
    assert row.webhook_secret_hash == new.account.webhook_secret_hash
    [entry] = new_entries(world, before)
    assert entry.entry.error_message == "not found"


async def test_credentials_replaced_just_before_marking_verified_are_not_marked() -> None:
    world, accounts = await racing()
    new = await world.create(credentials=CREDENTIALS)
    accounts.races.append(lambda a: attrs.evolve(a, encrypted_credentials=b"replaced"))
    before = len(world.entries())

    outcome = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())

    assert isinstance(outcome, Rejected) and outcome.code == "credentials_changed"
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and not stored.credentials_verified
    [entry] = new_entries(world, before)
    assert entry.entry.error_message == "credentials changed"


async def test_a_verification_that_another_one_beat_succeeds_without_writing() -> None:
    world, accounts = await racing()
    new = await world.create(credentials=CREDENTIALS)
    accounts.races.append(lambda a: attrs.evolve(a, credentials_verified=True, name="Other"))
    before = len(world.entries())

    outcome = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())

    assert isinstance(outcome, TradingAccount) and outcome.credentials_verified
    assert outcome == await world.accounts.get(new.account.id)
    assert accounts.saves == 1
    [entry] = new_entries(world, before)
    assert entry.entry.success
