"""Schema migrations: plain SQL files applied in name order, each at most once.

``migrations/NNNN_name.sql`` files are applied in lexical order and recorded by name in
``schema_migrations``. A run holds a transaction-scoped advisory lock, so concurrent runs
(several hosts starting at once) apply each file exactly once; the whole run is one transaction,
so a failing file leaves the schema as it was.
"""

from __future__ import annotations

from importlib import resources

import psycopg

from tradecore_adapters.postgres.errors import translated
from tradecore_adapters.postgres.pool import connection_options

MIGRATIONS_PACKAGE = "tradecore_adapters.postgres"
_LOCK_KEY = 0x7472_6164_6563_6F72  # "tradecor": the advisory lock every migrator takes

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def migration_files() -> list[tuple[str, str]]:
    """Every migration as (name, SQL text), in the order they apply."""
    folder = resources.files(MIGRATIONS_PACKAGE).joinpath("migrations")
    files = [f for f in folder.iterdir() if f.name.endswith(".sql")]
    return [(f.name, f.read_text(encoding="utf-8")) for f in sorted(files, key=lambda f: f.name)]


@translated
async def migrate(conninfo: str, *, timeout_s: float = 10.0) -> list[str]:
    """Apply the pending migrations; the names applied, in order (empty when up to date).

    Raises ``DatabaseUnavailable`` when the server cannot be reached within ``timeout_s``.
    """
    options = connection_options(timeout_s, statement_timeout_s=600.0)
    connect = psycopg.AsyncConnection.connect(conninfo, **options)
    async with await connect as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        await conn.execute(_CREATE_LEDGER)
        cursor = await conn.execute("SELECT name FROM schema_migrations")
        done = {name for (name,) in await cursor.fetchall()}
        applied: list[str] = []
        for name, text in migration_files():
            if name in done:
                continue
            await conn.execute(text.encode())  # our own file, many statements
            await conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
            applied.append(name)
        return applied
