"""Named JSON documents (table ``documents``): whole-document load and replace.

Used for state that is read and written as one piece, such as the paper broker's snapshot in
real mode. A save replaces the document atomically; the last save wins.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import execute, fetch_one


class PostgresDocumentStore:
    """Load and save JSON objects by name. Values must be JSON (``TypeError`` otherwise);
    every method may raise ``DatabaseUnavailable``."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def load(self, name: str) -> dict[str, Any] | None:
        """The document last saved under ``name``, or None."""
        row = await fetch_one(self._pool, "SELECT body FROM documents WHERE name = %s", (name,))
        return None if row is None else dict(row["body"])

    async def save(self, name: str, document: dict[str, Any]) -> None:
        """Store ``document`` under ``name``, replacing any earlier one, durably."""
        await execute(
            self._pool,
            "INSERT INTO documents (name, body, updated_at) VALUES (%s, %s, now())"
            " ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body, updated_at = now()",
            (name, Jsonb(document)),
        )
