"""Contract of the repository ports: the memory and the Postgres adapters behave alike.

Every test runs against both adapters of each port (``stores`` is parametrized); values must
come back exactly as stored: Decimal places, aware datetimes, JSON metadata, tuples.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postgres_fixtures import session_ended

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.audit_chain import GENESIS, first_break
from tradecore.errors import DuplicateOrder
from tradecore.identity import AllowedIp, ApiKey, Plan, Session, User
from tradecore.order_lifecycle import Submitted
from tradecore.orders import (
    AlertAction,
    OrderError,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    RejectionCode,
    Source,
    recorded_order_type,
)
from tradecore.ports.crypto import KeyStore
from tradecore.ports.documents import DocumentStore
from tradecore.ports.repositories import (
    AllowedIpRepository,
    ApiKeyRepository,
    AuditLog,
    OrderHistory,
    SessionRepository,
    TradingAccountRepository,
    UserRepository,
    WebhookOwner,
)
from tradecore.ports.resets import PasswordResetTokens
from tradecore.sessions import RefreshRotation
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_adapters.memory.repositories import (
    MemoryAllowedIpRepository,
    MemoryApiKeyRepository,
    MemoryAuditLog,
    MemoryOrderHistory,
    MemorySessionRepository,
    MemoryTradingAccountRepository,
    MemoryUserRepository,
)
from tradecore_adapters.memory.resets import MemoryPasswordResetTokens
from tradecore_adapters.postgres import (
    Pool,
    PostgresAllowedIpRepository,
    PostgresApiKeyRepository,
    PostgresAuditLog,
    PostgresDocumentStore,
    PostgresOrderHistory,
    PostgresPasswordResetTokens,
    PostgresSessionRepository,
    PostgresTradingAccountRepository,
    PostgresUserRepository,
    open_pool,
)
from tradecore_adapters.postgres.rows import fetch_all

T0 = datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@attrs.frozen
class Stores:
    users: UserRepository
    sessions: SessionRepository
    api_keys: ApiKeyRepository
    allowed_ips: AllowedIpRepository
    accounts: TradingAccountRepository
    orders: OrderHistory
    audit: AuditLog
    resets: PasswordResetTokens

    async def token_owner(self, token_hash: str) -> tuple[TradingAccount, User] | None:
        """The account and owner a webhook token resolves to (``webhook_owner``)."""
        found = await self.accounts.webhook_owner(token_hash)
        return None if found is None else (found.account, found.user)


def memory_stores() -> Stores:
    users = MemoryUserRepository()
    allowed_ips = MemoryAllowedIpRepository()
    orders = MemoryOrderHistory()
    return Stores(
        users=users,
        sessions=MemorySessionRepository(),
        api_keys=MemoryApiKeyRepository(),
        allowed_ips=allowed_ips,
        accounts=MemoryTradingAccountRepository(users, allowed_ips, orders),
        orders=orders,
        audit=MemoryAuditLog(),
        resets=MemoryPasswordResetTokens(max_per_user=3),
    )


def postgres_stores(pool: Pool) -> Stores:
    return Stores(
        users=PostgresUserRepository(pool),
        sessions=PostgresSessionRepository(pool),
        api_keys=PostgresApiKeyRepository(pool),
        allowed_ips=PostgresAllowedIpRepository(pool),
        accounts=PostgresTradingAccountRepository(pool),
        orders=PostgresOrderHistory(pool),
        audit=PostgresAuditLog(pool),
        resets=PostgresPasswordResetTokens(pool, max_per_user=3),
    )


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest) -> Stores:
    if request.param == "memory":
        return memory_stores()
    return postgres_stores(request.getfixturevalue("pg_pool"))


def test_adapters_implement_their_ports() -> None:
    pool: Any = object()
    for s in (memory_stores(), postgres_stores(pool)):
        for port, adapter in (
            (UserRepository, s.users),
            (SessionRepository, s.sessions),
            (ApiKeyRepository, s.api_keys),
            (AllowedIpRepository, s.allowed_ips),
            (TradingAccountRepository, s.accounts),
            (OrderHistory, s.orders),
            (AuditLog, s.audit),
            (PasswordResetTokens, s.resets),
        ):
            assert isinstance(adapter, port)


# --- factories -----------------------------------------------------------------------------


def user(n: int = 1, **changes: Any) -> User:
    base = User(
        id=f"user-{n}",
        email=f"trader{n}@example.com",
        password_hash=f"$argon2id$v=19$m=65536,t=3,p=4$salt{n}$hash",
        plan=Plan.PRO,
        created_at=at(n),
    )
    return attrs.evolve(base, **changes)


def account(n: int = 1, user_id: str = "user-1", **changes: Any) -> TradingAccount:
    base = TradingAccount(
        id=f"acct-{n}",
        user_id=user_id,
        name=f"Account {n}",
        broker_name="paper",
        webhook_token_hash=f"{n:064x}",
        webhook_secret_hash=f"secret-{n}",
        created_at=at(n),
    )
    return attrs.evolve(base, **changes)


def order(row_id: str, /, user_id: str = "user-1", **changes: Any) -> OrderHistoryRecord:
    base = OrderHistoryRecord(
        id=row_id,
        user_id=user_id,
        trading_account_id="acct-1" if user_id == "user-1" else "acct-2",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal("0.010"),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=OrderStatus.QUEUED,
        created_at=T0,
        request_id=f"req-{row_id}",
    )
    return attrs.evolve(base, **changes)


def context(ip: str = "203.0.113.7") -> RequestContext:
    return RequestContext(
        ip_address=ip, user_agent="TradingView/1.0", request_path="/login", request_method="POST"
    )


def entry(user_id: str | None, action: AuditAction, seconds: float, **changes: Any) -> AuditEntry:
    base = AuditEntry(
        user_id=user_id, action=action, success=True, context=context(), created_at=at(seconds)
    )
    return attrs.evolve(base, **changes)


async def two_users_with_accounts(s: Stores) -> None:
    for n in (1, 2):
        assert await s.users.add(user(n))
        await s.accounts.add(account(n, user_id=f"user-{n}"))


# --- users ---------------------------------------------------------------------------------


async def test_user_round_trips_exactly(stores: Stores) -> None:
    stored = user(
        1,
        plan=Plan.FREE,
        disabled=True,
        subscription_expires_at=datetime(2030, 1, 1, 12, 0, 0, 1, tzinfo=UTC),
        accepted_terms_version="2025-01",
    )
    assert await stores.users.add(stored)
    assert await stores.users.get("user-1") == stored
    assert await stores.users.get("nobody") is None


async def test_email_is_unique_case_insensitively(stores: Stores) -> None:
    first = user(1, email="Trader@Example.com")
    assert await stores.users.add(first)
    assert not await stores.users.add(user(2, email="tRADER@example.COM"))
    assert await stores.users.get("user-2") is None
    assert await stores.users.by_email("TRADER@EXAMPLE.COM") == first
    assert await stores.users.by_email("other@example.com") is None


async def test_user_save_replaces_and_moves_the_email(stores: Stores) -> None:
    assert await stores.users.add(user(1))
    changed = user(1, email="new@example.com", disabled=True, password_hash="$argon2id$new")
    assert await stores.users.save(changed, previous=user(1)) == changed
    assert await stores.users.get("user-1") == changed
    assert await stores.users.by_email("trader1@example.com") is None
    assert await stores.users.by_email("NEW@example.com") == changed
    assert await stores.users.add(user(2, email="trader1@example.com"))


# --- sessions ------------------------------------------------------------------------------


def session(n: int, user_id: str = "user-1", **changes: Any) -> Session:
    base = Session(
        id=f"sess-{n}",
        user_id=user_id,
        csrf_token=f"csrf-{n}",
        ip_address="2001:db8::7",
        user_agent="Mozilla/5.0",
        created_at=at(n),
        refresh_jti=f"jti-{n}",
    )
    return attrs.evolve(base, **changes)


async def test_session_round_trips_exactly(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for stored in (session(1), session(2, ip_address="198.51.100.9", refresh_jti=None)):
        await stores.sessions.add(stored)
        assert await stores.sessions.get(stored.id) == stored
    assert await stores.sessions.get("nope") is None


async def test_rotate_refresh_is_compare_and_set(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.sessions.add(session(1))
    assert not await stores.sessions.rotate_refresh("sess-1", "wrong", "jti-2", at=at(1))
    assert await stores.sessions.rotate_refresh("sess-1", "jti-1", "jti-2", at=at(2))
    assert not await stores.sessions.rotate_refresh("sess-1", "jti-1", "jti-3", at=at(3))  # reused
    got = await stores.sessions.get("sess-1")
    assert got is not None and got.refresh_jti == "jti-2"
    assert not await stores.sessions.rotate_refresh("missing", "jti-2", "jti-3", at=at(4))


async def test_concurrent_rotations_let_exactly_one_win(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.sessions.add(session(1))
    outcomes = await asyncio.gather(
        *(stores.sessions.rotate_refresh("sess-1", "jti-1", f"new-{i}", at=at(i)) for i in range(6))
    )
    assert outcomes.count(True) == 1
    got = await stores.sessions.get("sess-1")
    winner = outcomes.index(True)
    assert got is not None and got.refresh_jti == f"new-{winner}"
    assert await stores.sessions.last_rotation("sess-1") == RefreshRotation("jti-1", at(winner))


async def test_a_rotation_records_what_it_retired_and_when(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.sessions.add(session(1))
    assert await stores.sessions.last_rotation("sess-1") is None
    assert await stores.sessions.rotate_refresh("sess-1", "jti-1", "jti-2", at=at(10))
    assert await stores.sessions.last_rotation("sess-1") == RefreshRotation("jti-1", at(10))
    assert not await stores.sessions.rotate_refresh("sess-1", "jti-1", "jti-3", at=at(11))
    assert await stores.sessions.last_rotation("sess-1") == RefreshRotation("jti-1", at(10))
    assert await stores.sessions.rotate_refresh("sess-1", "jti-2", "jti-3", at=at(12))
    assert await stores.sessions.last_rotation("sess-1") == RefreshRotation("jti-2", at(12))
    got = await stores.sessions.get("sess-1")
    assert got == attrs.evolve(session(1), refresh_jti="jti-3")  # the session itself as before
    assert await stores.sessions.last_rotation("missing") is None


async def test_deactivate_once_and_then_no_rotation(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.sessions.add(session(1))
    assert await stores.sessions.deactivate("sess-1", at(100))
    assert not await stores.sessions.deactivate("sess-1", at(200))
    got = await stores.sessions.get("sess-1")
    assert got == attrs.evolve(session(1), is_active=False, revoked_at=at(100))
    assert not await stores.sessions.rotate_refresh("sess-1", "jti-1", "jti-2", at=at(300))
    assert not await stores.sessions.deactivate("missing", at(100))


async def test_deactivate_all_revokes_only_the_users_active_sessions(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for n in (1, 2, 3):
        await stores.sessions.add(session(n))
    await stores.sessions.add(session(4, user_id="user-2"))
    assert await stores.sessions.deactivate("sess-3", at(50))
    assert await stores.sessions.deactivate_all("user-1", at(100)) == 2
    assert await stores.sessions.deactivate_all("user-1", at(200)) == 0
    for sid, revoked in (("sess-1", at(100)), ("sess-2", at(100)), ("sess-3", at(50))):
        got = await stores.sessions.get(sid)
        assert got is not None and not got.is_active and got.revoked_at == revoked
    other = await stores.sessions.get("sess-4")
    assert other is not None and other.is_active


# --- api keys ------------------------------------------------------------------------------


def api_key(n: int, user_id: str = "user-1", **changes: Any) -> ApiKey:
    base = ApiKey(
        id=f"key-{n}",
        user_id=user_id,
        name=f"bot {n}",
        key_hash=f"{n:064x}",
        prefix=f"tc_{n}",
        created_at=at(n),
        expires_at=at(86_400 * 30),
    )
    return attrs.evolve(base, **changes)


async def test_api_keys_by_hash_and_listed_oldest_first(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for key in (api_key(3), api_key(1, expires_at=None), api_key(2, user_id="user-2")):
        await stores.api_keys.add(key)
    assert await stores.api_keys.by_hash(f"{1:064x}") == api_key(1, expires_at=None)
    assert await stores.api_keys.by_hash("0" * 63 + "f") is None
    assert await stores.api_keys.list_for_user("user-1") == [
        api_key(1, expires_at=None),
        api_key(3),
    ]
    assert await stores.api_keys.list_for_user("user-3") == []


async def test_api_key_revoke_and_touch(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.api_keys.add(api_key(1))
    assert not await stores.api_keys.revoke("key-1", "user-2", at(10))
    assert await stores.api_keys.revoke("key-1", "user-1", at(10))
    assert not await stores.api_keys.revoke("key-1", "user-1", at(20))
    assert not await stores.api_keys.revoke("missing", "user-1", at(20))
    await stores.api_keys.touch("key-1", at(30))
    await stores.api_keys.touch("missing", at(30))
    got = await stores.api_keys.by_hash(f"{1:064x}")
    assert got == api_key(1, revoked_at=at(10), last_used_at=at(30))
    assert got is not None and not got.is_usable(at(31))


# --- allowed ips ---------------------------------------------------------------------------


async def test_allowed_ips_unique_per_user_and_listed_oldest_first(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    entries = [
        AllowedIp("ip-1", "user-1", "2001:db8::/32", at(3)),
        AllowedIp("ip-2", "user-1", "203.0.113.7", at(1)),
        AllowedIp("ip-3", "user-1", "10.0.0.0/8", at(2)),
    ]
    for e in entries:
        assert await stores.allowed_ips.add(e)
    assert not await stores.allowed_ips.add(AllowedIp("ip-4", "user-1", "203.0.113.7", at(4)))
    assert await stores.allowed_ips.add(AllowedIp("ip-5", "user-2", "203.0.113.7", at(5)))
    listed = await stores.allowed_ips.list_for_user("user-1")
    assert listed == [entries[1], entries[2], entries[0]]


async def test_allowed_ip_removal_is_owned(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    assert await stores.allowed_ips.add(AllowedIp("ip-1", "user-1", "198.51.100.1", at(1)))
    assert not await stores.allowed_ips.remove("ip-1", "user-2")
    assert await stores.allowed_ips.remove("ip-1", "user-1")
    assert not await stores.allowed_ips.remove("ip-1", "user-1")
    assert await stores.allowed_ips.list_for_user("user-1") == []
    assert await stores.allowed_ips.add(AllowedIp("ip-2", "user-1", "198.51.100.1", at(2)))


# --- trading accounts ----------------------------------------------------------------------


async def test_trading_account_round_trips_and_hides_deleted(stores: Stores) -> None:
    assert await stores.users.add(user(1))
    rich = account(
        1,
        max_request_age=45,
        allowed_symbols=frozenset({"BTCUSDT", "ETHUSDT"}),
        max_quantity=Decimal("12.500"),
        credentials_verified=True,
    )
    await stores.accounts.add(rich)
    await stores.accounts.add(account(3, created_at=at(0)))
    await stores.accounts.add(account(2, deleted=True))
    got = await stores.accounts.get("acct-1")
    assert got == rich
    assert got is not None and str(got.max_quantity) == "12.500"
    assert await stores.accounts.get("acct-2") is None
    assert await stores.accounts.list_for_user("user-1") == [account(3, created_at=at(0)), rich]
    assert await stores.accounts.save(attrs.evolve(rich, deleted=True), previous=rich)
    assert await stores.accounts.get("acct-1") is None
    assert await stores.accounts.list_for_user("user-1") == [account(3, created_at=at(0))]


async def test_encrypted_credentials_round_trip_as_bytes(stores: Stores) -> None:
    """The ciphertext comes back byte for byte, through add, save, lookups and removal."""
    assert await stores.users.add(user(1))
    blob = bytes(range(256)) + b"\x00\x01tail"
    sealed = account(1, encrypted_credentials=blob)
    await stores.accounts.add(sealed)
    await stores.accounts.add(account(2))
    got = await stores.accounts.get("acct-1")
    assert got == sealed and got is not None
    assert type(got.encrypted_credentials) is bytes and got.encrypted_credentials == blob
    assert (await stores.accounts.get("acct-2")) == account(2)  # None stays None
    found = await stores.token_owner(f"{1:064x}")
    assert found is not None and found[0].encrypted_credentials == blob
    assert [a.encrypted_credentials for a in await stores.accounts.list_for_user("user-1")] == [
        blob,
        None,
    ]
    replaced = attrs.evolve(sealed, encrypted_credentials=b"\x01" + b"n" * 40)
    assert await stores.accounts.save(replaced, previous=sealed) == replaced
    assert await stores.accounts.get("acct-1") == replaced
    erased = attrs.evolve(replaced, encrypted_credentials=None)
    assert await stores.accounts.save(erased, previous=replaced) == erased
    got = await stores.accounts.get("acct-1")
    assert got is not None and got.encrypted_credentials is None
    assert "encrypted_credentials" not in repr(sealed)


async def test_webhook_token_lookup_returns_account_and_owner(stores: Stores) -> None:
    owner = user(1, disabled=True)
    assert await stores.users.add(owner)
    await stores.accounts.add(account(1))
    assert await stores.token_owner(f"{1:064x}") == (account(1), owner)
    assert await stores.token_owner(f"{9:064x}") is None


async def test_webhook_token_rotation_and_deletion(stores: Stores) -> None:
    assert await stores.users.add(user(1))
    await stores.accounts.add(account(1))
    rotated = account(1, webhook_token_hash="f" * 64)
    assert await stores.accounts.save(rotated, previous=account(1)) == rotated
    assert await stores.token_owner(f"{1:064x}") is None
    assert await stores.token_owner("f" * 64) == (rotated, user(1))
    assert await stores.accounts.save(attrs.evolve(rotated, deleted=True), previous=rotated)
    assert await stores.token_owner("f" * 64) is None


async def test_webhook_owner_reads_account_owner_and_allowed_ips(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.accounts.add(account(3, user_id="user-1"))
    entries = [
        AllowedIp("ip-1", "user-1", "2001:db8::/32", at(3)),
        AllowedIp("ip-2", "user-1", "203.0.113.7", at(1)),
        AllowedIp("ip-3", "user-1", "10.0.0.0/8", at(2)),
        AllowedIp("ip-4", "user-2", "198.51.100.1", at(1)),
    ]
    for e in entries:
        assert await stores.allowed_ips.add(e)

    found = await stores.accounts.webhook_owner(f"{1:064x}")

    assert found == WebhookOwner(
        account=account(1),
        user=user(1),
        allowed_ips=("203.0.113.7", "10.0.0.0/8", "2001:db8::/32"),
    )
    listed = await stores.allowed_ips.list_for_user("user-1")
    assert found is not None and found.allowed_ips == tuple(e.ip_address for e in listed)
    via_other = await stores.accounts.webhook_owner(f"{3:064x}")
    assert via_other is not None and via_other.account == account(3, user_id="user-1")
    other = await stores.accounts.webhook_owner(f"{2:064x}")
    assert other == WebhookOwner(account(2, user_id="user-2"), user(2), ("198.51.100.1",))


async def test_webhook_owner_without_allowed_ips_or_orders_and_hidden_when_deleted(
    stores: Stores,
) -> None:
    owner = user(1, disabled=True)
    assert await stores.users.add(owner)
    await stores.accounts.add(account(1))
    found = await stores.accounts.webhook_owner(f"{1:064x}")
    assert found == WebhookOwner(account(1), owner, ())
    assert await stores.accounts.webhook_owner(f"{9:064x}") is None
    assert await stores.accounts.save(account(1, deleted=True), previous=account(1))
    assert await stores.accounts.webhook_owner(f"{1:064x}") is None


# --- order history -------------------------------------------------------------------------


def full_order(order_id: str) -> OrderHistoryRecord:
    return order(
        order_id,
        action=AlertAction.CLOSE_SHORT,
        quantity=Decimal("1.2500"),
        order_type=None,  # a close has none (recorded_order_type)
        source=Source.DASHBOARD,
        simulation=True,
        status=OrderStatus.REJECTED,
        fingerprint="ab" * 16,
        order_id="broker-77",
        client_order_id=order_id,
        broker_refs=("broker-76", "broker-77"),
        submitted_at=at(1),
        fill_price=Decimal("64123.10"),
        fill_quantity=Decimal("0.50"),
        filled_at=at(2),
        auto_exit=True,
        exit_quantity=Decimal("-3.000"),
        position_before=Decimal("-3.000"),
        exit_order_result={"status": "filled", "order_id": "broker-76"},
        error=OrderError(RejectionCode.BROKER_RATE_LIMITED, "slow down", retry_after=1.5),
        admitted_at=at(0.5),
        placed_at=at(1.5),
    )


async def test_order_round_trips_exactly(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for record in (order("o-1"), full_order("o-2")):
        await stores.orders.add(record)
        got = await stores.orders.get(record.id)
        assert got == record
        assert got is not None and type(got.broker_refs) is tuple
        assert str(got.quantity) == str(record.quantity)  # places kept
    assert await stores.orders.get("o-9") is None


decimals = st.decimals(
    min_value=Decimal("-1e12"), max_value=Decimal("1e12"), allow_nan=False, places=8
)
aware_times = st.datetimes(
    min_value=datetime(1980, 1, 1),
    max_value=datetime(2200, 1, 1),
    timezones=st.sampled_from(
        [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    ),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(
    action=st.sampled_from(AlertAction),
    order_type=st.sampled_from(OrderType),
    source=st.sampled_from(Source),
    status=st.sampled_from(OrderStatus),
    quantity=decimals,
    fill_price=st.none() | decimals,
    created_at=aware_times,
    filled_at=st.none() | aware_times,
    refs=st.lists(st.text(min_size=1, max_size=8).filter(lambda t: "\x00" not in t), max_size=3),
    error=st.none()
    | st.builds(
        OrderError,
        st.sampled_from(RejectionCode),
        st.text(max_size=20).filter(lambda t: "\x00" not in t),
        st.none() | st.floats(0, 3600),
    ),
)
async def test_any_order_round_trips(
    stores: Stores,
    action: AlertAction,
    order_type: OrderType,
    source: Source,
    status: OrderStatus,
    quantity: Decimal,
    fill_price: Decimal | None,
    created_at: datetime,
    filled_at: datetime | None,
    refs: list[str],
    error: OrderError | None,
) -> None:
    if await stores.users.get("user-1") is None:
        await two_users_with_accounts(stores)
    record = order(
        str(uuid.uuid4()),
        action=action,
        order_type=recorded_order_type(action, order_type),
        source=source,
        status=status,
        quantity=quantity,
        fill_price=fill_price,
        created_at=created_at,
        filled_at=filled_at,
        broker_refs=tuple(refs),
        error=error,
    )
    await stores.orders.add(record)
    got = await stores.orders.get(record.id)
    assert got == record
    assert got is not None and got.created_at.tzinfo is not None


def month_start(moment: datetime, months_ahead: int = 0) -> datetime:
    """The first instant (UTC) of the month ``months_ahead`` after ``moment``'s."""
    month = moment.year * 12 + moment.month - 1 + months_ahead
    return datetime(month // 12, month % 12 + 1, 1, tzinfo=UTC)


async def test_get_many_reads_every_row_it_finds_across_months(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    # Months with a partition of their own in Postgres (migration 0010 makes the current
    # month's and the next two) and one without (T0: the default partition); both edges of
    # a month, so a lookup by the wrong month would miss.
    now = datetime.now(UTC)
    this_month, next_month = month_start(now), month_start(now, 1)
    rows = [
        order("o-1"),
        full_order("o-2"),
        order("o-3", user_id="user-2", created_at=this_month),
        order("o-4", created_at=next_month - timedelta(microseconds=1)),
        order("o-5", created_at=next_month),
        order("o-6", user_id="user-2", created_at=next_month + timedelta(days=3)),
    ]
    for record in rows:
        await stores.orders.add(record)
    wanted = ["o-6", "o-9", "o-1", "o-4", "o-1", "o-2", "o-5", "o-3", "missing"]

    got = await stores.orders.get_many(wanted)

    assert got == {record.id: record for record in rows}
    for record in rows:
        assert got[record.id] == await stores.orders.get(record.id)
    assert await stores.orders.get_many(["o-3"]) == {"o-3": rows[2]}
    assert await stores.orders.get_many(["o-9", "missing"]) == {}
    assert await stores.orders.get_many([]) == {}


async def test_get_many_reads_the_rows_as_they_are_now(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1"))
    await stores.orders.add(order("o-2", user_id="user-2"))
    claimed = await stores.orders.transition("o-1", Submitted(at(1), Decimal("0.5")))
    assert claimed is not None and claimed.status is OrderStatus.SUBMITTED
    got = await stores.orders.get_many(["o-1", "o-2"])
    assert got == {"o-1": claimed, "o-2": order("o-2", user_id="user-2")}


async def test_duplicate_fingerprint_is_refused_per_user(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1", fingerprint="f1"))
    with pytest.raises(DuplicateOrder):
        await stores.orders.add(order("o-2", fingerprint="f1"))
    assert await stores.orders.get("o-2") is None
    await stores.orders.add(order("o-3", user_id="user-2", fingerprint="f1"))
    await stores.orders.add(order("o-4"))
    await stores.orders.add(order("o-5"))  # no fingerprint: never a duplicate
    assert await stores.orders.count_since("user-1", T0) == 3


async def test_concurrent_adds_of_one_fingerprint_store_one_row(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    outcomes = await asyncio.gather(
        *(stores.orders.add(order(f"o-{i}", fingerprint="same")) for i in range(6)),
        return_exceptions=True,
    )
    assert sum(o is None for o in outcomes) == 1
    assert all(isinstance(o, DuplicateOrder) for o in outcomes if o is not None)
    assert len(await stores.orders.list_for_user("user-1")) == 1


async def test_orders_listed_newest_first_with_cursor_and_account_filter(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.accounts.add(account(3, user_id="user-1"))
    rows = [
        order("o-a", created_at=at(1)),
        order("o-c", created_at=at(2)),
        order("o-b", created_at=at(2), trading_account_id="acct-3"),
        order("o-d", created_at=at(3), trading_account_id="acct-3"),
        order("o-x", user_id="user-2", created_at=at(4)),
    ]
    for r in rows:
        await stores.orders.add(r)
    ids = [r.id for r in await stores.orders.list_for_user("user-1")]
    assert ids == ["o-d", "o-c", "o-b", "o-a"]  # equal times: larger id first
    page = await stores.orders.list_for_user("user-1", limit=2)
    assert [r.id for r in page] == ["o-d", "o-c"]
    rest = await stores.orders.list_for_user("user-1", before=page[-1].created_at)
    assert [r.id for r in rest] == ["o-a"]  # the cursor is exclusive on created_at
    by_account = await stores.orders.list_for_user("user-1", trading_account_id="acct-3")
    assert [r.id for r in by_account] == ["o-d", "o-b"]
    assert await stores.orders.list_for_user("user-1", trading_account_id="acct-2") == []
    assert await stores.orders.list_for_user("user-1", limit=0) == []


async def test_count_since_is_inclusive_and_per_user(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for i, seconds in enumerate((-1, 0, 5)):
        await stores.orders.add(order(f"o-{i}", created_at=at(seconds), simulation=i == 2))
    await stores.orders.add(order("o-x", user_id="user-2", created_at=at(9)))
    assert await stores.orders.count_since("user-1", at(0)) == 2
    assert await stores.orders.count_since("user-1", at(5.000001)) == 0
    assert await stores.orders.count_since("user-3", at(-10)) == 0


# --- audit ---------------------------------------------------------------------------------


async def test_audit_ids_increase_and_entries_round_trip(stores: Stores) -> None:
    entries = [
        entry(
            "user-1",
            AuditAction.WEBHOOK_REPLAY_ATTACK,
            1,
            success=False,
            context=context("2001:db8::1"),
            error_message="replay",
            resource_type="trading_account",
            resource_id="acct-1",
            metadata={"attack_type": "replay", "age_s": 1.25, "nested": {"a": [1, None, True]}},
        ),
        entry(None, AuditAction.LOGIN, 2, success=False, error_message="unknown user"),
        entry("user-2", AuditAction.LOGOUT, 3),
    ]
    ids = [await stores.audit.append(e) for e in entries]
    assert ids == sorted(ids) and len(set(ids)) == 3
    page, total = await stores.audit.list_for_user("user-1")
    assert total == 1
    assert [(s.id, s.entry) for s in page] == [(ids[0], entries[0])]


async def test_every_audit_action_is_storable(stores: Stores) -> None:
    for i, action in enumerate(AuditAction):
        await stores.audit.append(entry("user-1", action, i))
    page, total = await stores.audit.list_for_user("user-1", limit=1000)
    assert total == len(AuditAction)
    assert {s.entry.action for s in page} == set(AuditAction)


async def test_audit_listing_pages_and_filters(stores: Stores) -> None:
    actions = [AuditAction.LOGIN, AuditAction.WEBHOOK_IP_BLOCKED, AuditAction.LOGIN] * 3
    ids = [await stores.audit.append(entry("user-1", a, i)) for i, a in enumerate(actions)]
    await stores.audit.append(entry("user-2", AuditAction.LOGIN, 50))
    page, total = await stores.audit.list_for_user("user-1", limit=4)
    assert total == 9 and [s.id for s in page] == ids[::-1][:4]
    page, total = await stores.audit.list_for_user("user-1", limit=4, offset=8)
    assert total == 9 and [s.id for s in page] == [ids[0]]
    page, total = await stores.audit.list_for_user("user-1", offset=20)
    assert (page, total) == ([], 9)
    page, total = await stores.audit.list_for_user(
        "user-1", actions={AuditAction.WEBHOOK_IP_BLOCKED}, since=at(4)
    )
    assert total == 2 and [s.id for s in page] == [ids[7], ids[4]]
    page, total = await stores.audit.list_for_user("user-1", actions=set())
    assert (page, total) == ([], 0)
    page, total = await stores.audit.list_for_user("user-1", limit=0)
    assert (page, total) == ([], 9)


async def test_appends_form_one_sealed_chain_even_when_concurrent(stores: Stores) -> None:
    entries = [
        entry(f"user-{i % 3}", AuditAction.WEBHOOK_ORDER, i, metadata={"n": i, "amount": 1.5})
        for i in range(40)
    ]
    ids = await asyncio.gather(*(stores.audit.append(e) for e in entries))

    sealed = await stores.audit.chain()

    assert sorted(ids) == [s.id for s in sealed]
    assert first_break(sealed) is None
    assert sealed[0].previous == GENESIS
    assert [s.id for s in await stores.audit.chain(after_id=sealed[9].id, limit=5)] == [
        s.id for s in sealed[10:15]
    ]


async def test_the_chain_names_an_entry_altered_in_the_store(stores: Stores) -> None:
    for i in range(5):
        await stores.audit.append(entry("user-1", AuditAction.LOGIN, i))
    sealed = await stores.audit.chain()
    forged = attrs.evolve(sealed[2], entry=attrs.evolve(sealed[2].entry, success=False))

    found = first_break([*sealed[:2], forged, *sealed[3:]])

    assert found is not None and found.entry_id == sealed[2].id


async def test_summary_counts_by_action_and_names_the_accounts(stores: Stores) -> None:
    plan = [
        ("user-1", AuditAction.WEBHOOK_CREDENTIAL_ATTACK, 1, "acct-1"),
        ("user-1", AuditAction.WEBHOOK_CREDENTIAL_ATTACK, 2, "acct-2"),
        ("user-1", AuditAction.WEBHOOK_REPLAY_ATTACK, 3, "acct-1"),
        ("user-1", AuditAction.LOGIN, 4, None),
        ("user-2", AuditAction.WEBHOOK_REPLAY_ATTACK, 5, "acct-9"),
        ("user-1", AuditAction.WEBHOOK_IP_BLOCKED, 0, "acct-3"),
    ]
    for user_id, action, seconds, account_id in plan:
        metadata = {} if account_id is None else {"trading_account_id": account_id}
        await stores.audit.append(entry(user_id, action, seconds, metadata=metadata))
    attacks = {
        AuditAction.WEBHOOK_CREDENTIAL_ATTACK,
        AuditAction.WEBHOOK_REPLAY_ATTACK,
        AuditAction.WEBHOOK_IP_BLOCKED,
    }

    summary = await stores.audit.summary("user-1", actions=attacks, since=at(1))

    assert summary.counts == {
        AuditAction.WEBHOOK_CREDENTIAL_ATTACK: 2,
        AuditAction.WEBHOOK_REPLAY_ATTACK: 1,
    }
    assert summary.trading_account_ids == ("acct-1", "acct-2")
    everything = await stores.audit.summary("user-1", actions=attacks, since=None)
    assert everything.trading_account_ids == ("acct-3", "acct-1", "acct-2")


# --- password reset tokens -----------------------------------------------------------------


async def test_reset_token_is_single_use_and_expires(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.resets.add("h-1", "user-1", at(60))
    await stores.resets.add("h-2", "user-2", at(60))
    assert await stores.resets.consume("h-1", at(59)) == "user-1"
    assert await stores.resets.consume("h-1", at(59)) is None
    assert await stores.resets.consume("h-2", at(60)) is None  # usable strictly before expiry
    assert await stores.resets.consume("h-2", at(0)) is None  # an expired take still spends it
    assert await stores.resets.consume("unknown", at(0)) is None


async def test_concurrent_consumes_let_exactly_one_win(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.resets.add("h-1", "user-1", at(60))
    taken = await asyncio.gather(*(stores.resets.consume("h-1", at(1)) for _ in range(8)))
    assert taken.count("user-1") == 1
    assert taken.count(None) == 7


async def test_reset_tokens_bounded_per_user_and_discarded(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for i in range(5):  # max_per_user is 3: h-0 and h-1 are dropped
        await stores.resets.add(f"h-{i}", "user-1", at(60))
    await stores.resets.add("h-other", "user-2", at(60))
    assert await stores.resets.consume("h-0", at(1)) is None
    assert await stores.resets.consume("h-1", at(1)) is None
    assert await stores.resets.consume("h-2", at(1)) == "user-1"
    assert await stores.resets.discard_for_user("user-1") == 2
    assert await stores.resets.discard_for_user("user-1") == 0
    assert await stores.resets.consume("h-4", at(1)) is None
    assert await stores.resets.consume("h-other", at(1)) == "user-2"


async def test_consume_sweeps_expired_tokens(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.resets.add("h-old", "user-1", at(10))
    await stores.resets.add("h-new", "user-1", at(100))
    await stores.resets.add("h-2", "user-2", at(10))
    assert await stores.resets.consume("unknown", at(50)) is None
    assert await stores.resets.discard_for_user("user-1") == 1
    assert await stores.resets.discard_for_user("user-2") == 0


# --- key store: create-if-absent (memory and Postgres) -------------------------------------


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def key_store(request: pytest.FixtureRequest) -> KeyStore:
    if request.param == "memory":
        return MemoryDocumentStore()
    return PostgresDocumentStore(request.getfixturevalue("pg_pool"))


async def test_key_store_keeps_the_first_document(key_store: KeyStore) -> None:
    assert isinstance(key_store, KeyStore)
    assert await key_store.load("transport-key") is None
    first = {"format": 1, "private_key": "AAAA"}
    assert await key_store.create_if_absent("transport-key", first) == first
    second = {"format": 1, "private_key": "BBBB"}
    assert await key_store.create_if_absent("transport-key", second) == first
    assert await key_store.load("transport-key") == first
    assert await key_store.create_if_absent("other", second) == second


async def test_concurrent_creates_converge_on_one_document(key_store: KeyStore) -> None:
    offers = [{"n": n, "key": f"key-{n}"} for n in range(8)]
    results = await asyncio.gather(
        *(key_store.create_if_absent("transport-key", offer) for offer in offers)
    )
    assert len({json_text(r) for r in results}) == 1
    assert results[0] in offers
    assert await key_store.load("transport-key") == results[0]


def json_text(document: dict[str, Any]) -> str:
    return repr(sorted(document.items()))


# --- document store ------------------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def documents(request: pytest.FixtureRequest) -> DocumentStore:
    if request.param == "memory":
        return MemoryDocumentStore()
    return PostgresDocumentStore(request.getfixturevalue("pg_pool"))


async def test_documents_load_what_was_last_saved(documents: DocumentStore) -> None:
    docs = documents
    assert isinstance(docs, DocumentStore)
    assert await docs.load("paper") is None
    first = {"positions": {"BTCUSDT": "0.010"}, "orders": [1, 2], "ok": True}
    await docs.save("paper", first)
    assert await docs.load("paper") == first
    await docs.save("paper", {"positions": {}})
    assert await docs.load("paper") == {"positions": {}}
    assert await docs.load("other") is None


async def test_save_many_stores_each_document_under_its_name(documents: DocumentStore) -> None:
    await documents.save("book", {"cash": "100"})
    await documents.save("other", {"kept": True})

    await documents.save_many(
        {"book": {"cash": "90", "open": []}, "book:order:1": {"status": "filled", "n": 1}}
    )
    await documents.save_many({})

    assert await documents.load("book") == {"cash": "90", "open": []}
    assert await documents.load("book:order:1") == {"status": "filled", "n": 1}
    assert await documents.load("other") == {"kept": True}


async def test_a_saved_document_is_a_copy(documents: DocumentStore) -> None:
    book: dict[str, Any] = {"holdings": {"BTCUSDT": "1"}}
    await documents.save_many({"book": book})
    book["holdings"]["BTCUSDT"] = "2"
    loaded = await documents.load("book")
    assert loaded == {"holdings": {"BTCUSDT": "1"}}


@pytest.mark.postgres
async def test_save_many_stores_all_or_nothing(pg_pool: Pool) -> None:
    documents = PostgresDocumentStore(pg_pool)
    await documents.save("book", {"cash": "100"})
    # jsonb refuses a NUL character: the whole statement fails
    with pytest.raises(Exception, match="unsupported Unicode escape sequence"):
        await documents.save_many({"book": {"cash": "90"}, "book:order:1": {"note": "\x00"}})
    assert await documents.load("book") == {"cash": "100"}
    assert await documents.load("book:order:1") is None


# --- audit chain: group commit and several processes (Postgres) ----------------------------


@pytest.mark.postgres
async def test_appends_of_several_processes_form_one_chain_in_id_order(pg_pool: Pool) -> None:
    processes = [PostgresAuditLog(pg_pool) for _ in range(3)]  # each with its own head cache
    entries = [entry(f"user-{i % 4}", AuditAction.WEBHOOK_ORDER, i) for i in range(60)]

    ids = await asyncio.gather(*(processes[i % 3].append(e) for i, e in enumerate(entries)))

    sealed = await processes[0].chain()
    assert sorted(ids) == [s.id for s in sealed]
    assert len(set(ids)) == len(entries)
    assert first_break(sealed) is None
    assert sealed[0].previous == GENESIS
    by_id = {s.id: s.entry for s in sealed}
    assert [by_id[i].created_at for i in ids] == [e.created_at for e in entries]


async def _audit_writers(pool: Pool) -> list[int]:
    """The sessions of this database whose last statement appended to the audit log."""
    rows = await fetch_all(
        pool,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'WITH head AS (UPDATE audit_chain_head%'",
    )
    return [int(r["pid"]) for r in rows]


@pytest.mark.postgres
async def test_audit_batches_share_one_kept_connection_given_back_when_the_pool_closes(
    pg_conninfo: str, pg_pool: Pool
) -> None:
    pool = await open_pool(pg_conninfo, min_size=4, max_size=4, timeout_s=5.0)
    audit = PostgresAuditLog(pool)
    for i in range(3):  # three batches, one after the other (the pool lends in turn)
        await audit.append(entry("user-1", AuditAction.LOGIN, i))
    writers = await _audit_writers(pg_pool)

    await pool.close()

    assert len(writers) == 1
    assert await session_ended(pg_pool, writers[0])


@pytest.mark.postgres
async def test_an_audit_connection_the_server_ended_is_replaced_before_the_next_batch(
    pg_pool: Pool,
) -> None:
    audit = PostgresAuditLog(pg_pool)
    await audit.append(entry("user-1", AuditAction.LOGIN, 0))
    [first] = await _audit_writers(pg_pool)
    await fetch_all(pg_pool, "SELECT pg_terminate_backend(%s)", (first,))
    assert await session_ended(pg_pool, first)

    await audit.append(entry("user-1", AuditAction.LOGIN, 1))  # not an outage

    assert await _audit_writers(pg_pool) != [first]
    assert len(await audit.chain()) == 2


@pytest.mark.postgres
async def test_an_entry_the_database_refuses_fails_only_its_own_append(pg_pool: Pool) -> None:
    audit = PostgresAuditLog(pg_pool)
    bad_context = RequestContext("not-an-address", "agent", "/webhook", "POST")
    good = [entry("user-1", AuditAction.LOGIN, i) for i in range(5)]
    bad = attrs.evolve(entry("user-1", AuditAction.LOGIN, 9), context=bad_context)

    outcomes = await asyncio.gather(
        *(audit.append(e) for e in [*good[:2], bad, *good[2:]]), return_exceptions=True
    )

    assert [isinstance(o, int) for o in outcomes] == [True, True, False, True, True, True]
    sealed = await audit.chain()
    assert [s.entry.created_at for s in sealed] == [e.created_at for e in good]
    assert first_break(sealed) is None
