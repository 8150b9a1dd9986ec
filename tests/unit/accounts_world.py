"""The trading-account services (``TradingAccounts``, ``AccountCredentials``) on the memory
adapters, the real AES-GCM cipher, and fakes of the transport key and the broker's credential
check: the world their tests share."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
from racing import RacingAccounts
from support import fast_hasher

from tradecore.account_rules import AccountRules
from tradecore.accounts import TradingAccount
from tradecore.audit import RequestContext, StoredAuditEntry
from tradecore.errors import BrokerDisconnected, DatabaseUnavailable
from tradecore.identity import ApiKey, Plan, Session, User
from tradecore.ports.crypto import DecryptionFailed
from tradecore.services.accounts.account_credentials import AccountCredentials
from tradecore.services.accounts.provisioning import NewAccount, Provisioning
from tradecore.services.accounts.trading_accounts import TradingAccounts
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.credentials.credential_vault import CredentialVault
from tradecore.services.vocabulary import Principal
from tradecore.testing.clock import EPOCH, FakeClock, SeededRandom
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


VENUE_SYMBOLS = frozenset({"BTCUSDT", "ETHUSDT", "SOLUSDT"})
TESTNET_SYMBOLS = frozenset({"BTCUSDT"})


class Instruments:
    """The paper catalogue and one real venue (``binanceusdm``) whose test environment lists
    less; ``down`` makes the venue's list unloadable."""

    def __init__(self) -> None:
        self.down = False

    def venues(self) -> frozenset[str]:
        return frozenset({"paper", "binanceusdm"})

    async def symbols(self, broker_name: str, *, testnet: bool = False) -> frozenset[str]:
        if broker_name == "paper":
            return SYMBOLS
        if broker_name != "binanceusdm":
            return frozenset()
        if self.down:
            raise BrokerDisconnected("venue down")
        return TESTNET_SYMBOLS if testnet else VENUE_SYMBOLS


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
    vault: CredentialVault
    service: TradingAccounts
    credentials: AccountCredentials
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
            testnet=body.get("testnet", False),
            symbol_map=body.get("symbol_map"),
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
    vault = CredentialVault(AesGcmCipher(KEY), transport)
    service = TradingAccounts(accounts, provisioning, vault, Instruments(), events, rules)
    credentials = AccountCredentials(accounts, provisioning, vault, verifier, events)
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
        vault,
        service,
        credentials,
        principal(ada),
        principal(bob),
    )


async def token_owner(world: World, token_hash: str) -> tuple[TradingAccount, User] | None:
    """The account and owner a webhook token resolves to (the webhook's lookup)."""
    found = await world.accounts.webhook_owner(token_hash)
    return None if found is None else (found.account, found.user)


def leaks(entry: StoredAuditEntry, *secrets: str) -> bool:
    text = repr(entry) + json.dumps(dict(entry.entry.metadata), default=str)
    return any(s in text for s in secrets)


async def racing() -> tuple[World, RacingAccounts]:
    world = await build(RacingAccounts)
    assert isinstance(world.accounts, RacingAccounts)
    return world, world.accounts


def new_entries(world: World, before: int) -> list[StoredAuditEntry]:
    return world.entries()[before:]
