"""TradingAccounts: creating, reading, changing and deleting accounts, on the memory adapters,
the real AES-GCM cipher and the fakes of ``accounts_world``; and what holds for every account
use case (only the owner's accounts, 503 on an outage, browser sessions for credentials)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import attrs
import pytest
from accounts_world import (
    CREDENTIALS,
    KEY,
    DownAccounts,
    World,
    build,
    ctx,
    leaks,
    new_entries,
    principal,
    racing,
    token_owner,
)
from hypothesis import given
from hypothesis import strategies as st

from tradecore.account_rules import AccountRules
from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction
from tradecore.ports.crypto import DecryptionFailed
from tradecore.services.vocabulary import Rejected
from tradecore.webhooks.checks import hash_secret
from tradecore_adapters.crypto.cipher import AesGcmCipher


@pytest.fixture
async def world() -> World:
    return await build()


# --- create ---------------------------------------------------------------------------------


async def test_create_stores_credentials_encrypted_and_bound_to_the_account(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    stored = await world.accounts.get(new.account.id)
    assert stored == new.account and stored.encrypted_credentials is not None
    blob = stored.encrypted_credentials
    assert b"AKIA" not in blob and b"s3cr3t" not in blob
    opened = AesGcmCipher(KEY).decrypt(blob, stored.id.encode())
    assert json.loads(opened) == CREDENTIALS
    with pytest.raises(DecryptionFailed):  # bound to this account's id
        AesGcmCipher(KEY).decrypt(blob, b"another-account")
    assert await world.vault.open(stored) == CREDENTIALS
    assert "AKIA" not in repr(stored) and "encrypted_credentials" not in repr(stored)
    # the webhook token and secret are returned once and stored as digests
    assert stored.webhook_token_hash == hash_secret(new.webhook_token)
    assert stored.webhook_secret_hash == hash_secret(new.webhook_secret)
    assert (stored.broker_name, stored.name, stored.credentials_verified) == (
        "paper",
        "Main",
        False,
    )
    entry = world.last().entry
    assert entry.action is AuditAction.ACCOUNT_CREATED and entry.success
    assert entry.resource_id == stored.id
    assert entry.metadata == {
        "trading_account_id": stored.id,
        "broker": "paper",
        "testnet": False,
        "credentials": "plain",
    }
    assert not leaks(world.last(), *CREDENTIALS.values(), new.webhook_secret, new.webhook_token)


async def test_create_with_sealed_credentials(world: World) -> None:
    sealed = world.transport.seal(json.dumps(CREDENTIALS).encode())
    new = await world.create(encrypted_credentials=sealed)
    assert await world.vault.open(new.account) == CREDENTIALS
    assert world.last().entry.metadata["credentials"] == "encrypted"


async def test_create_without_credentials_stores_none(world: World) -> None:
    for fields in ({}, {"credentials": {}}, {"encrypted_credentials": None}):
        new = await world.create(**fields)
        assert new.account.encrypted_credentials is None
        assert await world.vault.open(new.account) == {}
        assert world.last().entry.metadata["credentials"] == "none"


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"name": ""}, "invalid_request"),
        ({"name": "x" * 101}, "invalid_request"),
        ({"name": 7}, "invalid_request"),
        ({"name": "tab\there"}, "invalid_request"),
        ({"broker": "nasdaq"}, "invalid_request"),
        ({"broker": 5}, "invalid_request"),
        ({"credentials": "a string"}, "invalid_request"),
        ({"credentials": 5}, "invalid_request"),
        ({"credentials": ["api_key"]}, "invalid_request"),
        ({"credentials": {"api_key": 5}}, "invalid_request"),
        ({"credentials": {"api_key": None}}, "invalid_request"),
        ({"credentials": {"api key": "x"}}, "invalid_request"),
        ({"credentials": {"1key": "x"}}, "invalid_request"),
        ({"credentials": {"k": "\ud800"}}, "invalid_request"),
        ({"credentials": {"k": "x" * 4097}}, "invalid_request"),
        ({"credentials": {f"k{n}": "x" for n in range(21)}}, "invalid_request"),
        ({"credentials": {"k": "x"}, "encrypted_credentials": "sealed-0"}, "invalid_request"),
        ({"encrypted_credentials": 12}, "invalid_request"),
        ({"encrypted_credentials": "forged"}, "encrypted_credentials_invalid"),
    ],
)
async def test_create_refuses_bad_input_and_stores_nothing(
    world: World, fields: dict[str, Any], code: str
) -> None:
    body: dict[str, Any] = {
        "name": "Main",
        "broker": None,
        "credentials": None,
        "encrypted_credentials": None,
        **fields,
    }
    outcome = await world.service.create(world.ada, *body.values(), ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 400 and outcome.code == code
    assert await world.accounts.list_for_user(world.ada.user_id) == []
    entry = world.last().entry
    assert entry.action is AuditAction.ACCOUNT_CREATED and not entry.success
    assert "x" * 50 not in outcome.detail


@pytest.mark.parametrize(
    "plaintext",
    [b"not json", b"\xff\xfe", b"[1, 2]", b'{"k": 1}', b'{"k": "a", "k": "b"}', b'{"k": NaN}'],
)
async def test_sealed_credentials_must_hold_an_object_of_strings(
    world: World, plaintext: bytes
) -> None:
    sealed = world.transport.seal(plaintext)
    outcome = await world.service.create(world.ada, "Main", None, None, sealed, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 400
    assert await world.accounts.list_for_user(world.ada.user_id) == []


@given(
    credentials=st.dictionaries(
        st.from_regex(r"[A-Za-z][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
        st.text(max_size=60),
        min_size=1,
        max_size=20,
    ),
    sealed=st.booleans(),
)
def test_any_valid_credentials_round_trip(credentials: dict[str, str], sealed: bool) -> None:
    async def scenario() -> None:
        world = await build()
        if sealed:
            token = world.transport.seal(json.dumps(credentials).encode())
            new = await world.create(encrypted_credentials=token)
        else:
            new = await world.create(credentials=credentials)
        stored = await world.accounts.get(new.account.id)
        assert stored is not None
        assert await world.vault.open(stored) == credentials
        # A value that the audit text holds anyway (a field or class name, an action) is no
        # leak: only the values absent from the entries of a benign creation are looked for.
        baseline = await build()
        await baseline.create(credentials={"key": "value"})
        benign = "".join(
            repr(e) + json.dumps(dict(e.entry.metadata), default=str) for e in baseline.entries()
        )
        secrets = [v for v in credentials.values() if len(v) > 8 and v not in benign]
        assert not any(leaks(e, *secrets) for e in world.entries())

    asyncio.run(scenario())


async def test_issuing_credentials_needs_a_browser_session(world: World) -> None:
    bot = principal(world.ada.user, api_key=True)
    outcome = await world.service.create(bot, "Main", None, None, None, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 403
    new = await world.create()
    for call in (world.credentials.regenerate_secret, world.credentials.rotate_token):
        refused = await call(bot, new.account.id, ctx())
        assert isinstance(refused, Rejected) and refused.status == 403
    changed = await world.service.update(bot, new.account.id, {"credentials": {"k": "v"}}, ctx())
    assert isinstance(changed, Rejected) and changed.status == 403
    renamed = await world.service.update(bot, new.account.id, {"name": "Bot named"}, ctx())
    assert isinstance(renamed, TradingAccount) and renamed.name == "Bot named"
    assert await world.accounts.get(new.account.id) == renamed


async def test_accounts_per_user_are_bounded() -> None:
    world = await build(rules=AccountRules(max_accounts=2))
    await world.create()
    await world.create()
    outcome = await world.service.create(world.ada, "Third", None, None, None, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 409
    await world.create(world.bob)  # per user


# --- reading --------------------------------------------------------------------------------


async def test_a_user_reads_only_their_own_accounts(world: World) -> None:
    mine = await world.create(name="Mine")
    theirs = await world.create(world.bob, name="Theirs")
    assert await world.service.list_accounts(world.ada) == [mine.account]
    assert await world.service.get(world.ada, mine.account.id) == mine.account
    for account_id in (theirs.account.id, "unknown", "", 5, None, "x" * 500):
        outcome = await world.service.get(world.ada, account_id)
        assert isinstance(outcome, Rejected) and outcome.status == 404


async def test_another_users_account_is_404_for_every_change(world: World) -> None:
    theirs = await world.create(world.bob, credentials=CREDENTIALS)
    account_id = theirs.account.id
    calls = [
        world.service.update(world.ada, account_id, {"name": "Mine now"}, ctx()),
        world.service.delete(world.ada, account_id, ctx()),
        world.credentials.regenerate_secret(world.ada, account_id, ctx()),
        world.credentials.rotate_token(world.ada, account_id, ctx()),
        world.credentials.verify_credentials(world.ada, account_id, ctx()),
    ]
    for call in calls:
        outcome = await call
        assert isinstance(outcome, Rejected) and outcome.status == 404
        entry = world.last().entry
        assert entry.user_id == world.ada.user_id and not entry.success
        assert "trading_account_id" not in entry.metadata
        assert entry.metadata["requested_id"] == account_id
    assert await world.accounts.get(account_id) == theirs.account
    assert world.verifier.calls == []


async def test_an_unreachable_store_is_503() -> None:
    world = await build(DownAccounts)
    outcomes = [
        await world.service.list_accounts(world.ada),
        await world.service.get(world.ada, "a"),
        await world.service.create(world.ada, "Main", None, None, None, ctx()),
        await world.service.update(world.ada, "a", {"name": "x"}, ctx()),
        await world.service.delete(world.ada, "a", ctx()),
        await world.credentials.regenerate_secret(world.ada, "a", ctx()),
        await world.credentials.rotate_token(world.ada, "a", ctx()),
        await world.credentials.verify_credentials(world.ada, "a", ctx()),
    ]
    assert all(isinstance(o, Rejected) and o.status == 503 for o in outcomes)


# --- update ---------------------------------------------------------------------------------


async def test_update_changes_the_fields_given(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    changes = {
        "name": "  Renamed ",
        "max_request_age": 60,
        "allowed_symbols": ["btcusdt", " ES ", "BTCUSDT"],
        "unknown": "ignored",
    }
    updated = await world.service.update(world.ada, new.account.id, changes, ctx())
    assert updated == attrs.evolve(
        new.account,
        name="Renamed",
        max_request_age=60,
        allowed_symbols=frozenset({"BTCUSDT", "ES"}),
    )
    assert await world.accounts.get(new.account.id) == updated
    entry = world.last().entry
    assert entry.action is AuditAction.ACCOUNT_UPDATED and entry.success
    assert entry.metadata["fields"] == ["allowed_symbols", "max_request_age", "name"]
    cleared = await world.service.update(world.ada, new.account.id, {"allowed_symbols": []}, ctx())
    assert isinstance(cleared, TradingAccount) and cleared.allowed_symbols == frozenset()


@pytest.mark.parametrize(
    "changes",
    [
        {"max_request_age": 4},
        {"max_request_age": 3601},
        {"max_request_age": True},
        {"max_request_age": "60"},
        {"max_request_age": 60.0},
        {"max_request_age": None},
        {"name": ""},
        {"allowed_symbols": "BTCUSDT"},
        {"allowed_symbols": ["NOPE"]},
        {"allowed_symbols": ["BTC USDT"]},
        {"allowed_symbols": ["ßTC"]},
        {"allowed_symbols": [7]},
        {"allowed_symbols": ["BTCUSDT"] * 501},
        {"name": "Fine", "max_request_age": 0},
        {"credentials": {"api key": "x"}},
        {"encrypted_credentials": "forged"},
    ],
)
async def test_update_refuses_bad_fields_and_changes_nothing(
    world: World, changes: dict[str, Any]
) -> None:
    new = await world.create()
    outcome = await world.service.update(world.ada, new.account.id, changes, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 400
    assert await world.accounts.get(new.account.id) == new.account
    entry = world.last().entry
    assert entry.action is AuditAction.ACCOUNT_UPDATED and not entry.success


async def test_request_age_bounds_are_inclusive(world: World) -> None:
    new = await world.create()
    for age in (5, 3600):
        updated = await world.service.update(
            world.ada, new.account.id, {"max_request_age": age}, ctx()
        )
        assert isinstance(updated, TradingAccount) and updated.max_request_age == age


async def test_new_credentials_replace_the_old_and_need_verifying_again(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    verified = await world.credentials.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(verified, TradingAccount) and verified.credentials_verified
    sealed = world.transport.seal(b'{"api_key":"rotated"}')
    updated = await world.service.update(
        world.ada, new.account.id, {"encrypted_credentials": sealed}, ctx()
    )
    assert isinstance(updated, TradingAccount) and not updated.credentials_verified
    assert await world.vault.open(updated) == {"api_key": "rotated"}
    assert world.last().entry.metadata["fields"] == ["credentials", "credentials_verified"]
    removed = await world.service.update(world.ada, new.account.id, {"credentials": None}, ctx())
    assert isinstance(removed, TradingAccount) and removed.encrypted_credentials is None


# --- delete ---------------------------------------------------------------------------------


async def test_delete_is_soft_immediate_and_erases_the_credentials(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    assert await token_owner(world, hash_secret(new.webhook_token)) is not None
    assert await world.service.delete(world.ada, new.account.id, ctx()) is None
    assert await token_owner(world, hash_secret(new.webhook_token)) is None
    assert await world.service.list_accounts(world.ada) == []
    row = world.accounts._accounts[new.account.id]
    assert row.deleted and row.encrypted_credentials is None
    assert world.last().entry.action is AuditAction.ACCOUNT_DELETED
    again = await world.service.delete(world.ada, new.account.id, ctx())
    assert isinstance(again, Rejected) and again.status == 404


# --- lost races: another request changes the account just before a save ---------------------


async def test_a_rename_beside_a_secret_regeneration_keeps_the_new_secret() -> None:
    world, accounts = await racing()
    new = await world.create()
    other = hash_secret("secret shown to the other request")
    accounts.races.append(lambda a: attrs.evolve(a, webhook_secret_hash=other))
    before = len(world.entries())

    updated = await world.service.update(world.ada, new.account.id, {"name": "Renamed"}, ctx())

    assert isinstance(updated, TradingAccount) and updated.name == "Renamed"
    assert updated.webhook_secret_hash == other
    assert await world.accounts.get(new.account.id) == updated
    assert accounts.saves == 1
    [entry] = new_entries(world, before)
    assert entry.entry.success and entry.entry.metadata["fields"] == ["name"]


async def test_an_update_that_loses_on_its_own_field_is_applied_to_the_newer_account() -> None:
    world, accounts = await racing()
    new = await world.create()
    accounts.races.append(lambda a: attrs.evolve(a, name="Other", max_request_age=60))
    before = len(world.entries())

    updated = await world.service.update(world.ada, new.account.id, {"name": "Mine"}, ctx())

    assert isinstance(updated, TradingAccount)
    assert (updated.name, updated.max_request_age) == ("Mine", 60)
    assert await world.accounts.get(new.account.id) == updated
    assert accounts.saves == 2
    [entry] = new_entries(world, before)
    assert entry.entry.success


async def test_new_credentials_stay_unverified_when_a_verification_lands_first() -> None:
    world, accounts = await racing()
    new = await world.create(credentials=CREDENTIALS)
    accounts.races.append(lambda a: attrs.evolve(a, credentials_verified=True))

    updated = await world.service.update(
        world.ada, new.account.id, {"credentials": {"api_key": "rotated"}}, ctx()
    )

    assert isinstance(updated, TradingAccount) and not updated.credentials_verified
    assert await world.vault.open(updated) == {"api_key": "rotated"}
    assert await world.accounts.get(new.account.id) == updated
    assert accounts.saves == 2


async def test_an_update_that_loses_twice_is_409_and_audited_once() -> None:
    world, accounts = await racing()
    new = await world.create()
    accounts.races.extend(
        [lambda a: attrs.evolve(a, name="First"), lambda a: attrs.evolve(a, name="Second")]
    )
    before = len(world.entries())

    outcome = await world.service.update(world.ada, new.account.id, {"name": "Mine"}, ctx())

    assert isinstance(outcome, Rejected) and (outcome.status, outcome.code) == (409, "conflict")
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and stored.name == "Second"
    [entry] = new_entries(world, before)
    assert not entry.entry.success and entry.entry.error_message == "changed concurrently"


async def test_an_update_of_an_account_deleted_meanwhile_is_404() -> None:
    world, accounts = await racing()
    new = await world.create()
    accounts.races.append(lambda a: attrs.evolve(a, deleted=True))
    before = len(world.entries())

    outcome = await world.service.update(world.ada, new.account.id, {"name": "Mine"}, ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 404
    assert world.accounts._accounts[new.account.id].name == "Main"
    [entry] = new_entries(world, before)
    assert entry.entry.error_message == "not found"


async def test_a_delete_erases_credentials_stored_meanwhile() -> None:
    world, accounts = await racing()
    new = await world.create(credentials=CREDENTIALS)
    accounts.races.append(lambda a: attrs.evolve(a, encrypted_credentials=b"stored meanwhile"))
    before = len(world.entries())

    assert await world.service.delete(world.ada, new.account.id, ctx()) is None

    row = world.accounts._accounts[new.account.id]
    assert row.deleted and row.encrypted_credentials is None
    assert accounts.saves == 2
    [entry] = new_entries(world, before)
    assert entry.entry.action is AuditAction.ACCOUNT_DELETED and entry.entry.success


async def test_a_delete_that_loses_twice_is_409_and_leaves_the_account_live() -> None:
    world, accounts = await racing()
    new = await world.create(credentials=CREDENTIALS)
    accounts.races.extend(
        [
            lambda a: attrs.evolve(a, encrypted_credentials=b"first"),
            lambda a: attrs.evolve(a, encrypted_credentials=b"second"),
        ]
    )
    before = len(world.entries())

    outcome = await world.service.delete(world.ada, new.account.id, ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 409
    assert await world.accounts.get(new.account.id) is not None
    [entry] = new_entries(world, before)
    assert not entry.entry.success
