"""Small helpers shared by the adapters: one statement on a pooled (or kept) connection, UTC
times, and the compare-and-set UPDATE of the repositories' ``save``
(``ports.repositories.save_fields``)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from psycopg import sql
from psycopg.abc import Params, QueryNoTemplate
from psycopg.rows import dict_row

from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.postgres.pool import KeptConnection, Pool

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


async def fetch_all(
    pool: Pool | KeptConnection, query: QueryNoTemplate, params: Params | None = None
) -> list[Row]:
    """Run one statement (on a connection of ``pool``, or on a writer's kept one); every
    row."""
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


@functools.lru_cache(maxsize=256)
def compare_and_set_query(table: str, written: tuple[str, ...], compared: tuple[str, ...]) -> str:
    """One statement: set ``written`` (parameters ``set_<column>``) on row ``%(id)s`` if each
    of ``compared`` is not distinct from ``was_<column>``; the row after it, or no row. With
    nothing written it only reads the row under the same condition. Known column names only."""
    conditions = sql.SQL("").join(
        sql.SQL(" AND {} IS NOT DISTINCT FROM {}").format(
            sql.Identifier(c), sql.Placeholder(f"was_{c}")
        )
        for c in compared
    )
    if not written:
        query = sql.SQL("SELECT * FROM {table} WHERE id = %(id)s{conditions}")
    else:
        query = sql.SQL(
            "UPDATE {table} SET {assignments} WHERE id = %(id)s{conditions} RETURNING *"
        )
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder(f"set_{c}")) for c in written
    )
    return query.format(
        table=sql.Identifier(table), assignments=assignments, conditions=conditions
    ).as_string()


def compare_and_set_params(
    new: dict[str, Any],
    previous: dict[str, Any],
    written: tuple[str, ...],
    compared: tuple[str, ...],
) -> dict[str, Any]:
    """The parameters of ``compare_and_set_query`` from two rows' column values."""
    params: dict[str, Any] = {"id": previous["id"]}
    params.update({f"set_{c}": new[c] for c in written})
    params.update({f"was_{c}": previous[c] for c in compared})
    return params
