"""TradingAccounts: the account use cases on the memory adapters, the real AES-GCM cipher, and
fakes of the transport key and the broker's credential check."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from racing import RacingAccounts
from support import fast_hasher

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, RequestContext, StoredAuditEntry
from tradecore.errors import BrokerDisconnected, DatabaseUnavailable
from tradecore.identity import ApiKey, Plan, Session, User
from tradecore.ports.crypto import DecryptionFailed
from tradecore.services.provisioning import NewAccount, Provisioning
from tradecore.services.security_events import SecurityEvents
from tradecore.services.trading_accounts import AccountRules, TradingAccounts
from tradecore.services.vocabulary import Principal, Rejected
from tradecore.testing.clock import EPOCH, FakeClock, SeededRandom
from tradecore.webhooks import hash_secret
from tradecore_adapters.crypto.cipher import AesGcmCipher
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.memory.protection import MemoryAlertThrottle
from tradecore_adapters.memory.repositories import (
    MemoryAllowedIpRepository,
    MemoryAuditLog,
    MemoryOrderHistory,
    MemoryTradingAccountRepository,
    MemoryUserRepository,
)

KEY = bytes(range(32))
SYMBOLS = frozenset({"BTCUSDT", "ETHUSDT", "ES", "EURUSD"})
CREDENTIALS = {"api_key": "AKIA-live-key-4711", "api_secret": "s3cr3t-value-0815"}


def ctx() -> RequestContext:
    return RequestContext(
        ip_address="203.0.113.7",
        user_agent="Mozilla/5.0",
        request_path="/trading/accounts",
        request_method="POST",
    )


@attrs.define
class FakeTransport:
    """TransportKey: ``seal`` hands out opaque strings; anything else does not unseal."""

    sealed: dict[str, bytes] = attrs.field(factory=dict)

    def seal(self, plaintext: bytes) -> str:
        name = f"sealed-{len(self.sealed)}"
        self.sealed[name] = plaintext
        return name

    async def public_jwk(self) -> Mapping[str, str]:
        return {"kty": "RSA"}

    async def unseal(self, sealed: str) -> bytes:
        if sealed not in self.sealed:
            raise DecryptionFailed("not ours")
        return self.sealed[sealed]


@attrs.define
class FakeVerifier:
    """CredentialVerifier: records what it was given; answers ``reason`` (or raises)."""

    reason: str | None = None
    down: bool = False
    calls: list[tuple[str, dict[str, str]]] = attrs.field(factory=list)
    during: Any = None  # an awaitable factory run mid-check (a concurrent change)

    async def verify(self, account: TradingAccount, credentials: Mapping[str, str]) -> str | None:
        self.calls.append((account.id, dict(credentials)))
        if self.during is not None:
            await self.during()
        if self.down:
            raise BrokerDisconnected("broker down")
        return self.reason


class Instruments:
    async def symbols(self, broker_name: str) -> frozenset[str]:
        return SYMBOLS if broker_name == "paper" else frozenset()


class DownAccounts(MemoryTradingAccountRepository):
    async def list_for_user(self, user_id: str) -> list[TradingAccount]:
        raise DatabaseUnavailable("postgres down")

    async def get(self, account_id: str) -> TradingAccount | None:
        raise DatabaseUnavailable("postgres down")


@attrs.define
class World:
    users: MemoryUserRepository
    accounts: MemoryTradingAccountRepository
    audit: MemoryAuditLog
    transport: FakeTransport
    verifier: FakeVerifier
    provisioning: Provisioning
    service: TradingAccounts
    ada: Principal
    bob: Principal

    def entries(self) -> list[StoredAuditEntry]:
        return self.audit.all()

    def last(self) -> StoredAuditEntry:
        return self.audit.all()[-1]

    async def create(self, principal: Principal | None = None, **fields: Any) -> NewAccount:
        body: dict[str, Any] = {"name": "Main", "broker": None, "credentials": None}
        body.update({"encrypted_credentials": None, **fields})
        created = await self.service.create(
            principal or self.ada,
            body["name"],
            body["broker"],
            body["credentials"],
            body["encrypted_credentials"],
            ctx(),
        )
        assert isinstance(created, NewAccount), created
        return created


def principal(user: User, *, api_key: bool = False) -> Principal:
    if api_key:
        key = ApiKey("key-1", user.id, "bot", "h", "tck_", EPOCH)
        return Principal(user, None, key, False, user.plan)
    session = Session(f"session-{user.id}", user.id, "csrf", "203.0.113.7", "UA", EPOCH)
    return Principal(user, session, None, True, user.plan)


async def build(
    accounts_type: type[MemoryTradingAccountRepository] = MemoryTradingAccountRepository,
    rules: AccountRules | None = None,
) -> World:
    clock = FakeClock()
    users = MemoryUserRepository()
    accounts = accounts_type(users, MemoryAllowedIpRepository(), MemoryOrderHistory())
    audit = MemoryAuditLog()
    events = SecurityEvents(audit, users, MemoryAlertThrottle(clock), LoggingOutbox(), clock)
    provisioning = Provisioning(users, accounts, fast_hasher(), clock, SeededRandom(3))
    transport = FakeTransport()
    verifier = FakeVerifier()
    service = TradingAccounts(
        accounts,
        provisioning,
        AesGcmCipher(KEY),
        transport,
        verifier,
        Instruments(),
        events,
        rules,
    )
    ada = User("user-ada", "ada@example.com", "h", Plan.PRO, EPOCH)
    bob = User("user-bob", "bob@example.com", "h", Plan.PRO, EPOCH)
    for u in (ada, bob):
        assert await users.add(u)
    return World(
        users,
        accounts,
        audit,
        transport,
        verifier,
        provisioning,
        service,
        principal(ada),
        principal(bob),
    )


@pytest.fixture
async def world() -> World:
    return await build()


async def token_owner(world: World, token_hash: str) -> tuple[TradingAccount, User] | None:
    """The account and owner a webhook token resolves to (the webhook's lookup)."""
    found = await world.accounts.webhook_owner(token_hash, orders_since=EPOCH)
    return None if found is None else (found.account, found.user)


def leaks(entry: StoredAuditEntry, *secrets: str) -> bool:
    text = repr(entry) + json.dumps(dict(entry.entry.metadata), default=str)
    return any(s in text for s in secrets)


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
    assert await world.service.broker_credentials(stored) == CREDENTIALS
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
        "credentials": "plain",
    }
    assert not leaks(world.last(), *CREDENTIALS.values(), new.webhook_secret, new.webhook_token)


async def test_create_with_sealed_credentials(world: World) -> None:
    sealed = world.transport.seal(json.dumps(CREDENTIALS).encode())
    new = await world.create(encrypted_credentials=sealed)
    assert await world.service.broker_credentials(new.account) == CREDENTIALS
    assert world.last().entry.metadata["credentials"] == "encrypted"


async def test_create_without_credentials_stores_none(world: World) -> None:
    for fields in ({}, {"credentials": {}}, {"encrypted_credentials": None}):
        new = await world.create(**fields)
        assert new.account.encrypted_credentials is None
        assert await world.service.broker_credentials(new.account) == {}
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
        assert await world.service.broker_credentials(stored) == credentials
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
    for call in (world.service.regenerate_secret, world.service.rotate_token):
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
        world.service.regenerate_secret(world.ada, account_id, ctx()),
        world.service.rotate_token(world.ada, account_id, ctx()),
        world.service.verify_credentials(world.ada, account_id, ctx()),
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
        await world.service.regenerate_secret(world.ada, "a", ctx()),
        await world.service.rotate_token(world.ada, "a", ctx()),
        await world.service.verify_credentials(world.ada, "a", ctx()),
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
    verified = await world.service.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(verified, TradingAccount) and verified.credentials_verified
    sealed = world.transport.seal(b'{"api_key":"rotated"}')
    updated = await world.service.update(
        world.ada, new.account.id, {"encrypted_credentials": sealed}, ctx()
    )
    assert isinstance(updated, TradingAccount) and not updated.credentials_verified
    assert await world.service.broker_credentials(updated) == {"api_key": "rotated"}
    assert world.last().entry.metadata["fields"] == ["credentials", "credentials_verified"]
    removed = await world.service.update(world.ada, new.account.id, {"credentials": None}, ctx())
    assert isinstance(removed, TradingAccount) and removed.encrypted_credentials is None


# --- delete, regenerate, rotate ---------------------------------------------------------------


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


async def test_regenerate_secret_and_rotate_token(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    secret = await world.service.regenerate_secret(world.ada, new.account.id, ctx())
    assert isinstance(secret, str) and secret != new.webhook_secret
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and stored.webhook_secret_hash == hash_secret(secret)
    assert world.last().entry.action is AuditAction.WEBHOOK_SECRET_REGENERATED
    assert not leaks(world.last(), secret)
    token = await world.service.rotate_token(world.ada, new.account.id, ctx())
    assert isinstance(token, str) and token != new.webhook_token
    assert await token_owner(world, hash_secret(new.webhook_token)) is None
    found = await token_owner(world, hash_secret(token))
    assert found is not None and found[0].webhook_secret_hash == hash_secret(secret)
    assert world.last().entry.action is AuditAction.WEBHOOK_TOKEN_ROTATED
    assert not leaks(world.last(), token)
    assert await world.service.broker_credentials(found[0]) == CREDENTIALS


# --- verify ---------------------------------------------------------------------------------


async def test_verify_gives_the_broker_the_decrypted_credentials(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    verified = await world.service.verify_credentials(world.ada, new.account.id, ctx())
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
    outcome = await world.service.verify_credentials(world.ada, new.account.id, ctx())
    assert outcome == Rejected(400, "credentials_rejected", "Invalid API key")
    assert await world.accounts.get(new.account.id) == new.account
    assert not world.last().entry.success


async def test_verify_with_the_broker_down_is_503(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    world.verifier.down = True
    outcome = await world.service.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 503
    assert await world.accounts.get(new.account.id) == new.account


async def test_verify_with_unreadable_credentials_asks_for_them_again(world: World) -> None:
    new = await world.create(credentials=CREDENTIALS)
    foreign = AesGcmCipher(os.urandom(32)).encrypt(b"{}", new.account.id.encode())
    unreadable = attrs.evolve(new.account, encrypted_credentials=foreign)
    assert await world.accounts.save(unreadable, previous=new.account)
    outcome = await world.service.verify_credentials(world.ada, new.account.id, ctx())
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
    outcome = await world.service.verify_credentials(world.ada, new.account.id, ctx())
    assert isinstance(outcome, Rejected) and outcome.status == 409
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and not stored.credentials_verified


# --- lost races: another request changes the account just before a save ----------------------


async def racing() -> tuple[World, RacingAccounts]:
    world = await build(RacingAccounts)
    assert isinstance(world.accounts, RacingAccounts)
    return world, world.accounts


def new_entries(world: World, before: int) -> list[StoredAuditEntry]:
    return world.entries()[before:]


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


async def test_a_regeneration_beside_a_rename_keeps_the_new_name() -> None:
    world, accounts = await racing()
    new = await world.create()
    accounts.races.append(lambda a: attrs.evolve(a, name="Renamed elsewhere"))

    secret = await world.service.regenerate_secret(world.ada, new.account.id, ctx())

    assert isinstance(secret, str)
    stored = await world.accounts.get(new.account.id)
    assert stored is not None and stored.name == "Renamed elsewhere"
    assert stored.webhook_secret_hash == hash_secret(secret)


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
    assert await world.service.broker_credentials(updated) == {"api_key": "rotated"}
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


async def test_a_regeneration_never_writes_over_a_secret_issued_meanwhile() -> None:
    world, accounts = await racing()
    new = await world.create()
    other = hash_secret("secret shown to the other request")
    accounts.races.append(lambda a: attrs.evolve(a, webhook_secret_hash=other))
    before = len(world.entries())

    outcome = await world.service.regenerate_secret(world.ada, new.account.id, ctx())

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

    outcome = await world.service.rotate_token(world.ada, new.account.id, ctx())

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

    outcome = await world.service.regenerate_secret(world.ada, new.account.id, ctx())

    assert isinstance(outcome, Rejected) and outcome.status == 404
    row = world.accounts._accounts[new.account.id]
    assert row.webhook_secret_hash == new.account.webhook_secret_hash
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


async def test_credentials_replaced_just_before_marking_verified_are_not_marked() -> None:
    world, accounts = await racing()
    new = await world.create(credentials=CREDENTIALS)
    accounts.races.append(lambda a: attrs.evolve(a, encrypted_credentials=b"replaced"))
    before = len(world.entries())

    outcome = await world.service.verify_credentials(world.ada, new.account.id, ctx())

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

    outcome = await world.service.verify_credentials(world.ada, new.account.id, ctx())

    assert isinstance(outcome, TradingAccount) and outcome.credentials_verified
    assert outcome == await world.accounts.get(new.account.id)
    assert accounts.saves == 1
    [entry] = new_entries(world, before)
    assert entry.entry.success
