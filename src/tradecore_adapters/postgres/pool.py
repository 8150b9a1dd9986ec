"""The connection pool every Postgres adapter shares.

Connections run in autocommit mode: a single statement commits on its own, and an adapter that
needs several statements to be atomic opens ``conn.transaction()``. Every session uses UTC and
a statement timeout, so no query can hang a request past its budget.
"""

from __future__ import annotations

import math
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from tradecore_adapters.postgres.errors import database_errors

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]
"""The pool type the adapters take."""


def connection_options(timeout_s: float, statement_timeout_s: float) -> dict[str, Any]:
    """Connection keyword arguments: connect and statement timeouts, UTC, autocommit."""
    statement_ms = max(1, round(statement_timeout_s * 1000))
    return {
        "autocommit": True,
        # libpq counts whole seconds and treats anything below 2 as 2.
        "connect_timeout": max(2, math.ceil(timeout_s)),
        "options": f"-c statement_timeout={statement_ms} -c TimeZone=UTC",
        "application_name": "tradecore",
    }


def make_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout_s: float = 5.0,
    statement_timeout_s: float | None = None,
    check_on_checkout: bool = True,
) -> Pool:
    """A pool that is not open yet (the composition root opens it inside the event loop with
    ``await pool.open(wait=True, timeout=...)``); the options are those of ``open_pool``."""
    statement_s = timeout_s if statement_timeout_s is None else statement_timeout_s
    pool: Pool = AsyncConnectionPool(
        conninfo,
        kwargs=connection_options(timeout_s, statement_s),
        min_size=min_size,
        max_size=max_size,
        timeout=timeout_s,
        open=False,
        check=AsyncConnectionPool.check_connection if check_on_checkout else None,
        name="tradecore",
    )
    return pool


async def open_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout_s: float = 5.0,
    statement_timeout_s: float | None = None,
    check_on_checkout: bool = True,
) -> Pool:
    """Open a pool and wait until ``min_size`` connections are up.

    ``timeout_s`` bounds opening, connecting and waiting for a free connection;
    ``statement_timeout_s`` (default ``timeout_s``) bounds each statement on the server.
    ``check_on_checkout`` pings a connection before lending it, so connections broken by a
    server restart are replaced instead of failing a request. Raises ``DatabaseUnavailable``
    when the server cannot be reached within ``timeout_s``.
    """
    pool = make_pool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        timeout_s=timeout_s,
        statement_timeout_s=statement_timeout_s,
        check_on_checkout=check_on_checkout,
    )
    try:
        with database_errors():
            await pool.open(wait=True, timeout=timeout_s)
    except BaseException:
        await pool.close()
        raise
    return pool
