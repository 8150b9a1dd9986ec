"""PostgreSQL for the contract suites.

Each test session works in its own throwaway database (``tradecore_test_<random>``), created
through the admin URL, migrated once, and dropped at the end, so concurrent runs never collide.
Each test gets a fresh pool over emptied tables. The admin URL is ``TRADECORE_TEST_POSTGRES_URL``
(default: the local server, user postgres, trust auth).

An unreachable server skips the Postgres tests with the reason, except in CI (``CI=true``)
where it fails them.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tradecore_adapters.postgres import Pool, migrate, open_pool
from tradecore_adapters.postgres.rows import fetch_all

__all__ = [
    "create_database",
    "drop_database",
    "fresh_pg_database",
    "insert_owner",
    "pg_admin_conninfo",
    "pg_conninfo",
    "pg_pool",
]

ADMIN_URL_ENV = "TRADECORE_TEST_POSTGRES_URL"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _unreachable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"PostgreSQL is required in CI (CI=true) but is not reachable: {reason}",
            pytrace=False,
        )
    pytest.skip(f"PostgreSQL not reachable ({ADMIN_URL_ENV}): {reason}")


def create_database(admin: str) -> str:
    """A new empty database; its conninfo."""
    name = f"tradecore_test_{secrets.token_hex(6)}"
    with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin, dbname=name)


def drop_database(admin: str, conninfo: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]
    with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


@pytest.fixture(scope="session")
def pg_admin_conninfo() -> str:
    """A connection string to a database where test databases may be created."""
    admin = os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL)
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:
        _unreachable(str(e).strip())
    return admin


@pytest.fixture(scope="session")
def pg_conninfo(pg_admin_conninfo: str) -> Iterator[str]:
    """The session's migrated throwaway database."""
    conninfo = create_database(pg_admin_conninfo)
    try:
        # Outside the tests' event loops: a helper thread with its own loop.
        with ThreadPoolExecutor(max_workers=1) as runner:
            runner.submit(asyncio.run, migrate(conninfo)).result()
        yield conninfo
    finally:
        drop_database(pg_admin_conninfo, conninfo)


@pytest.fixture
def fresh_pg_database(pg_admin_conninfo: str) -> Iterator[str]:
    """An empty, unmigrated database for this test alone."""
    conninfo = create_database(pg_admin_conninfo)
    try:
        yield conninfo
    finally:
        drop_database(pg_admin_conninfo, conninfo)


@pytest.fixture
async def pg_pool(pg_conninfo: str) -> AsyncIterator[Pool]:
    """A pool over the session database with every table emptied (identities restarted)."""
    # Several connections up front, so the concurrency tests race on separate sessions.
    pool = await open_pool(pg_conninfo, min_size=4, max_size=8, timeout_s=5.0)
    try:
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'schema_migrations'"
            )
            tables = [sql.Identifier(name) for (name,) in await cursor.fetchall()]
            await conn.execute(
                sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(sql.SQL(", ").join(tables))
            )
            # the audit chain starts again from its genesis seal
            await conn.execute("INSERT INTO audit_chain_head (seal) VALUES (repeat('0', 64))")
        yield pool
    finally:
        await pool.close()


async def insert_owner(conn: psycopg.AsyncConnection[Any]) -> None:
    """User ``u1`` and its trading account ``a1``, written by hand: what an order row refers
    to, for tests that write orders into a database of their own (or one of an older
    schema) without the repositories."""
    await conn.execute(
        "INSERT INTO users (id, email, email_key, password_hash, plan, created_at)"
        " VALUES ('u1', 'a@example.com', 'a@example.com', 'x', 'pro', now())"
    )
    await conn.execute(
        "INSERT INTO trading_accounts (id, user_id, name, broker_name, webhook_token_hash,"
        " webhook_secret_hash, created_at, max_request_age, max_quantity)"
        " VALUES ('a1', 'u1', 'Main', 'paper', 'h', 's', now(), 300, 1000)"
    )


async def session_ended(pool: Pool, pid: int) -> bool:
    """Whether the server has ended session ``pid`` (looked at for up to two seconds: the
    server ends a session a moment after its client hung up or it was terminated)."""
    for _ in range(200):
        rows = await fetch_all(pool, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
        if not rows:
            return True
        await asyncio.sleep(0.01)
    return False
