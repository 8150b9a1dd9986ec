"""The schema ledger in Postgres: ``schema_migrations`` (written by ``migrate``) compared with
the migration files this build ships."""

from __future__ import annotations

from tradecore.ports.deployment import AppliedMigration, SchemaState
from tradecore_adapters.postgres.migrate import migration_files
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import fetch_all, fetch_one, utc


class PostgresSchemaLedger:
    """``SchemaLedger`` on table ``schema_migrations``. A database never migrated (no ledger
    table) has everything pending."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def state(self) -> SchemaState:
        ledger = await fetch_one(
            self._pool, "SELECT to_regclass('schema_migrations') IS NOT NULL AS present"
        )
        rows = []
        if ledger is not None and ledger["present"]:
            rows = await fetch_all(
                self._pool,
                "SELECT name, applied_at FROM schema_migrations ORDER BY applied_at, name",
            )
        applied = tuple(AppliedMigration(r["name"], utc(r["applied_at"])) for r in rows)
        done = {m.name for m in applied}
        pending = tuple(name for name, _ in migration_files() if name not in done)
        return SchemaState(store="postgres", applied=applied, pending=pending)
