"""Schema migrations and error translation of the Postgres adapters."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgres_fixtures import insert_owner

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.audit_chain import first_break
from tradecore.errors import DatabaseUnavailable, DuplicateOrder
from tradecore.identity import Plan, User
from tradecore.order_lifecycle import Submitted
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore_adapters.postgres import (
    Pool,
    PostgresAuditLog,
    PostgresOrderHistory,
    PostgresTradingAccountRepository,
    PostgresUserRepository,
    migrate,
    open_pool,
)
from tradecore_adapters.postgres.migrate import migration_files
from tradecore_adapters.postgres.pool import ConnectionCheck, socket_quiet

pytestmark = pytest.mark.postgres

CLOSED = "postgresql://postgres@127.0.0.1:1/postgres"
TABLES = {
    "users",
    "user_sessions",
    "api_keys",
    "user_allowed_ips",
    "trading_accounts",
    "order_history",
    "audit_logs",
    "password_reset_tokens",
    "documents",
    "schema_migrations",
    "order_keys",
    "audit_chain_anchor",
}


def test_migration_files_are_numbered_and_ordered() -> None:
    names = [name for name, _ in migration_files()]
    assert names, "no migration shipped"
    assert names == sorted(names)
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", n) for n in names)


async def ledger(conninfo: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cursor = await conn.execute("SELECT name FROM schema_migrations ORDER BY name")
        return [name for (name,) in await cursor.fetchall()]


async def tables(conninfo: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cursor = await conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {name for (name,) in await cursor.fetchall()}


async def test_migrate_applies_everything_once(fresh_pg_database: str) -> None:
    everything = [name for name, _ in migration_files()]
    assert await migrate(fresh_pg_database) == everything
    assert await migrate(fresh_pg_database) == []
    assert await ledger(fresh_pg_database) == everything
    assert await tables(fresh_pg_database) >= TABLES


async def test_0007_stores_close_orders_without_an_order_type(fresh_pg_database: str) -> None:
    """Close orders stored as 'entry' before 0007 lose the type; the constraint then refuses
    a close with a type and a buy without one."""
    earlier = [(n, t) for n, t in migration_files() if n < "0007"]
    async with await psycopg.AsyncConnection.connect(fresh_pg_database, autocommit=True) as conn:
        for _, text in earlier:
            await conn.execute(text.encode())
        await conn.execute(
            "CREATE TABLE schema_migrations (name text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for name, _ in earlier:
            await conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
        await insert_owner(conn)
        for order_id, action in (("o1", "close_long"), ("o2", "buy")):
            await conn.execute(
                "INSERT INTO order_history (id, user_id, trading_account_id, broker_name, symbol,"
                " action, quantity, order_type, source, simulation, status, created_at,"
                " request_id) VALUES (%s, 'u1', 'a1', 'paper', 'BTCUSDT', %s, 1, 'entry',"
                " 'webhook', false, 'filled', now(), %s)",
                (order_id, action, f"r-{order_id}"),
            )
    assert await migrate(fresh_pg_database) == [n for n, _ in migration_files() if n >= "0007"]
    async with await psycopg.AsyncConnection.connect(fresh_pg_database, autocommit=True) as conn:
        cursor = await conn.execute("SELECT id, order_type FROM order_history ORDER BY id")
        assert await cursor.fetchall() == [("o1", None), ("o2", "entry")]
        for change in (
            "UPDATE order_history SET order_type = 'exit' WHERE id = 'o1'",
            "UPDATE order_history SET order_type = NULL WHERE id = 'o2'",
        ):
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(change)


async def test_concurrent_migrations_apply_once(fresh_pg_database: str) -> None:
    everything = [name for name, _ in migration_files()]
    runs = await asyncio.gather(*(migrate(fresh_pg_database) for _ in range(3)))
    assert sorted(runs, key=len) == [[], [], everything]
    assert await ledger(fresh_pg_database) == everything


async def test_hot_queries_have_their_indexes(pg_pool: Pool) -> None:
    async with pg_pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
        )
        indexes: dict[str, str] = dict(await cursor.fetchall())
    assert "UNIQUE" in indexes["trading_accounts_webhook_token"]
    # 0010: the replay backstop moved to the unpartitioned order_keys (one index for all months)
    fingerprint = indexes["order_keys_fingerprint"]
    assert "UNIQUE" in fingerprint and "(user_id, fingerprint)" in fingerprint
    assert "WHERE (fingerprint IS NOT NULL)" in fingerprint
    assert "(user_id, created_at DESC" in indexes["order_history_by_user"]
    assert "(trading_account_id, created_at DESC" in indexes["order_history_by_account"]
    assert "(user_id, created_at DESC)" in indexes["audit_logs_user_time"]


async def test_unreachable_server_is_database_unavailable() -> None:
    with pytest.raises(DatabaseUnavailable) as migrating:
        await migrate(CLOSED, timeout_s=2)
    assert isinstance(migrating.value.__cause__, psycopg.OperationalError)
    with pytest.raises(DatabaseUnavailable) as opening:
        await open_pool(CLOSED, timeout_s=0.5)
    assert isinstance(opening.value.__cause__, psycopg.OperationalError)


async def test_closed_pool_is_database_unavailable(pg_conninfo: str) -> None:
    pool = await open_pool(pg_conninfo, min_size=1, max_size=1, timeout_s=2)
    await pool.close()
    with pytest.raises(DatabaseUnavailable):
        await PostgresUserRepository(pool).get("user-1")


async def test_statement_timeout_is_database_unavailable(pg_conninfo: str, pg_pool: Pool) -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    await PostgresUserRepository(pg_pool).add(User("u-1", "a@example.com", "h", Plan.PRO, now))
    await PostgresTradingAccountRepository(pg_pool).add(
        TradingAccount("a-1", "u-1", "main", "paper", "token", "secret", now)
    )
    record = OrderHistoryRecord(
        id="o-1",
        user_id="u-1",
        trading_account_id="a-1",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal(1),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=OrderStatus.QUEUED,
        created_at=now,
        request_id="r-1",
    )
    short = await open_pool(pg_conninfo, max_size=1, timeout_s=2, statement_timeout_s=0.2)
    try:
        history = PostgresOrderHistory(short)
        await history.add(record)
        # Another transaction holds the row: the transition waits past its statement timeout.
        async with pg_pool.connection() as holder, holder.transaction():
            await holder.execute("SELECT 1 FROM order_history WHERE id = 'o-1' FOR UPDATE")
            with pytest.raises(DatabaseUnavailable) as waited:
                await history.transition("o-1", Submitted(now, Decimal(0)))
        assert isinstance(waited.value.__cause__, psycopg.errors.QueryCanceled)
        assert await history.get("o-1") == record
    finally:
        await short.close()


# --- the pool's check on checkout ----------------------------------------------------------


async def backend_pid(pool: Pool) -> int:
    async with pool.connection() as conn:
        return conn.info.backend_pid


async def terminate(pg_pool: Pool, pid: int) -> None:
    """End a backend from another session and wait (bounded) until it is gone."""
    async with pg_pool.connection() as conn:
        await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(200):
            cursor = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
            if await cursor.fetchone() is None:
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} still running")


@pytest.mark.parametrize("checked", [True, False])
async def test_a_connection_the_server_ended_is_replaced_before_it_is_lent(
    pg_conninfo: str, pg_pool: Pool, checked: bool
) -> None:
    pool = await open_pool(
        pg_conninfo, min_size=1, max_size=1, timeout_s=2, check_on_checkout=checked
    )
    try:
        users = PostgresUserRepository(pool)
        await users.get("user-1")  # in steady use
        await terminate(pg_pool, await backend_pid(pool))
        if checked:
            assert await users.get("user-1") is None  # on a new connection
        else:  # without the check the request that draws the dead connection fails
            with pytest.raises(DatabaseUnavailable):
                await users.get("user-1")
    finally:
        await pool.close()


class Pings:
    def __init__(self) -> None:
        self.count = 0
        self.now = 100.0

    async def ping(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.count += 1

    def monotonic(self) -> float:
        return self.now


async def test_the_check_pings_only_new_idle_or_disturbed_connections(pg_conninfo: str) -> None:
    pings = Pings()
    check = ConnectionCheck(5.0, ping=pings.ping, monotonic=pings.monotonic)
    async with await psycopg.AsyncConnection.connect(pg_conninfo, autocommit=True) as conn:
        await check.check(conn)
        assert pings.count == 1  # never lent before
        pings.now += 4.9
        await check.check(conn)
        assert pings.count == 1  # in steady use: the peek alone
        pings.now += 5.0
        await check.check(conn)
        assert pings.count == 2  # idle long enough for a silent failure
        await conn.execute("LISTEN pool_check")
        async with await psycopg.AsyncConnection.connect(pg_conninfo, autocommit=True) as other:
            await other.execute("NOTIFY pool_check")
        for _ in range(200):  # the server sends the notification on its own
            if not socket_quiet(conn):
                break
            await asyncio.sleep(0.01)
        await check.check(conn)
        assert pings.count == 3  # something unread on the socket: ping, not guess


def test_migrate_against_an_unreachable_database_says_so_once() -> None:
    """Issue 16, 9: it printed "database unavailable: database unavailable: ..."."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": "postgresql://postgres:pw-not-shown@127.0.0.1:1/none",
        "JWT_SECRET": "migrate-test-jwt-secret-0123456789abcdefghij",
        "ENCRYPTION_KEY": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "tradecore"), "migrate"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("database unavailable") == 1
    assert "pw-not-shown" not in done.stderr


async def _insert_0009_rows(conn: psycopg.AsyncConnection[Any]) -> None:
    """Orders on both sides of a month boundary and in another year, and sealed audit
    entries, written with the 0009 schema."""
    await insert_owner(conn)
    for order_id, created_at, fingerprint in (
        ("o1", "2025-01-31 23:59:59+00", "fp-1"),
        ("o2", "2025-02-01 00:00:01+00", "fp-2"),
        ("o3", "2024-07-15 12:00:00+00", None),
    ):
        await conn.execute(
            "INSERT INTO order_history (id, user_id, trading_account_id, broker_name, symbol,"
            " action, quantity, order_type, source, simulation, status, created_at,"
            " request_id, fingerprint) VALUES (%s, 'u1', 'a1', 'paper', 'BTCUSDT', 'buy',"
            " 1.50, 'entry', 'webhook', false, 'filled', %s, %s, %s)",
            (order_id, created_at, f"r-{order_id}", fingerprint),
        )


async def test_0010_partitions_the_rows_of_0009_and_keeps_every_guarantee(
    fresh_pg_database: str,
) -> None:
    earlier = [(n, t) for n, t in migration_files() if n < "0010"]
    async with await psycopg.AsyncConnection.connect(fresh_pg_database, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE schema_migrations (name text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for name, text in earlier:
            await conn.execute(text.encode())
            await conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
        await _insert_0009_rows(conn)
    pool = await open_pool(fresh_pg_database, min_size=1, max_size=2, timeout_s=5.0)
    try:
        audit = PostgresAuditLog(pool)
        for n in range(3):  # sealed through the chain head, ids 1..3
            await audit.append(_audit_entry(n))
        before = await audit.chain()
    finally:
        await pool.close()

    assert await migrate(fresh_pg_database) == ["0010_monthly_partitions.sql"]

    async with await psycopg.AsyncConnection.connect(fresh_pg_database, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT id, tableoid::regclass::text, quantity, fingerprint FROM order_history"
            " ORDER BY id"
        )
        assert await cursor.fetchall() == [
            ("o1", "order_history_2025_01", Decimal("1.50"), "fp-1"),
            ("o2", "order_history_2025_02", Decimal("1.50"), "fp-2"),
            ("o3", "order_history_2024_07", Decimal("1.50"), None),
        ]
        cursor = await conn.execute("SELECT id, user_id, fingerprint FROM order_keys ORDER BY id")
        assert await cursor.fetchall() == [
            ("o1", "u1", "fp-1"),
            ("o2", "u1", "fp-2"),
            ("o3", "u1", None),
        ]
        cursor = await conn.execute("SELECT relkind FROM pg_class WHERE relname = 'audit_logs'")
        assert await cursor.fetchone() == ("p",)
        # the CHECKs and foreign keys of 0001-0009 hold on the partitioned table
        check, foreign_key = psycopg.errors.CheckViolation, psycopg.errors.ForeignKeyViolation
        refused: list[tuple[str, type[psycopg.Error]]] = [
            ("UPDATE order_history SET action = 'hold' WHERE id = 'o1'", check),
            ("UPDATE order_history SET order_type = NULL WHERE id = 'o1'", check),
            ("UPDATE order_history SET user_id = 'nobody' WHERE id = 'o1'", foreign_key),
            ("UPDATE audit_logs SET action = 'Bad Name' WHERE id = 1", check),
            (
                "INSERT INTO audit_logs (id, action, success, ip_address, user_agent,"
                " request_path, request_method, created_at)"
                " VALUES (99, 'login', true, '::1', 'x', '/', 'GET', now())",
                psycopg.errors.GeneratedAlways,
            ),
        ]
        for statement, error in refused:
            with pytest.raises(error):
                await conn.execute(statement.encode())

    pool = await open_pool(fresh_pg_database, min_size=1, max_size=2, timeout_s=5.0)
    try:
        audit = PostgresAuditLog(pool)
        assert await audit.chain() == before
        # the identity continues after the copied ids, and the chain after the copied seals
        assert await audit.append(_audit_entry(3)) == 4
        assert first_break(await audit.chain()) is None
        orders = PostgresOrderHistory(pool)
        # a replay of an order copied from 0009 is still refused, in any month
        with pytest.raises(DuplicateOrder):
            await orders.add(_copied_order_replay())
        found = await orders.get("o1")
        assert found is not None and found.fingerprint == "fp-1"
    finally:
        await pool.close()


def _audit_entry(n: int) -> AuditEntry:
    return AuditEntry(
        user_id="u1",
        action=AuditAction.LOGIN,
        success=True,
        context=RequestContext("203.0.113.9", "curl/8", "/login", "POST"),
        created_at=datetime(2025, 1, 31, 23, 59, 58, tzinfo=UTC) + timedelta(seconds=n),
    )


def _copied_order_replay() -> OrderHistoryRecord:
    return OrderHistoryRecord(
        id="o1-replay",
        user_id="u1",
        trading_account_id="a1",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal("1.50"),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=OrderStatus.QUEUED,
        created_at=datetime(2025, 3, 1, tzinfo=UTC),
        request_id="r-replay",
        fingerprint="fp-1",
    )
