"""Named JSON documents (table ``documents``): whole-document load and replace.

Used for state that is read and written as one piece, such as the paper broker's snapshot in
real mode. A save replaces the document atomically; the last save wins. ``create_if_absent``
never replaces: the first document stored under a name stays (key material, the KeyStore port).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from tradecore_adapters.postgres.group_commit import Statement, shared_batcher
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import fetch_one


@functools.lru_cache(maxsize=16)
def _upsert_rows(count: int) -> str:
    """One INSERT ... ON CONFLICT for ``count`` (name, body) pairs."""
    return (
        sql.SQL(
            "INSERT INTO documents (name, body, updated_at) VALUES {rows}"
            " ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body, updated_at = now()"
        )
        .format(rows=sql.SQL(", ").join([sql.SQL("(%s, %s, now())")] * count))
        .as_string()
    )


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
        await self.save_many({name: document})

    async def save_many(self, documents: Mapping[str, dict[str, Any]]) -> None:
        """Store every document under its name in one statement (all or none), durably."""
        if not documents:
            return
        # Written by group commit with other adapters' writes (``group_commit``); rows are
        # locked in name order, so the lock key is the first name.
        names = sorted(documents)
        params: list[Any] = []
        for name in names:
            params += [name, Jsonb(documents[name])]
        statement = Statement(_upsert_rows(len(names)), params, ("documents", names[0]))
        await shared_batcher(self._pool).run(statement)

    async def create_if_absent(self, name: str, document: dict[str, Any]) -> dict[str, Any]:
        """Store ``document`` under ``name`` unless one is there; the stored document. Of
        concurrent calls (any process) exactly one insert wins and every caller gets it."""
        for _ in range(3):
            inserted = await fetch_one(
                self._pool,
                "INSERT INTO documents (name, body, updated_at) VALUES (%s, %s, now())"
                " ON CONFLICT (name) DO NOTHING RETURNING body",
                (name, Jsonb(document)),
            )
            if inserted is not None:
                return dict(inserted["body"])
            # A separate statement: its snapshot sees the row whose insert made ours a no-op.
            existing = await self.load(name)
            if existing is not None:
                return existing
        raise RuntimeError(f"document {name!r} neither inserted nor found")
