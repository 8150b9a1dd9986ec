"""Small helpers shared by the adapters: one statement per pooled connection, UTC times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg.abc import Params, QueryNoTemplate
from psycopg.rows import dict_row

from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.postgres.pool import Pool

Row = dict[str, Any]


def utc(value: datetime) -> datetime:
    """A timestamptz as read back, as an aware UTC datetime."""
    return value.astimezone(UTC)


def utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


async def fetch_one(pool: Pool, query: QueryNoTemplate, params: Params | None = None) -> Row | None:
    """Run one statement; its first row, or None."""
    with database_errors():
        async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchone()


async def fetch_all(pool: Pool, query: QueryNoTemplate, params: Params | None = None) -> list[Row]:
    """Run one statement; every row."""
    with database_errors():
        async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()


async def execute(pool: Pool, query: QueryNoTemplate, params: Params | None = None) -> int:
    """Run one statement; the number of rows it affected."""
    with database_errors():
        async with pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(query, params)
            return cur.rowcount
