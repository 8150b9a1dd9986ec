"""Named JSON documents (table ``documents``): whole-document load and replace.

Used for state that is read and written as one piece, such as the paper broker's snapshot in
real mode. A save replaces the document atomically; the last save wins. ``create_if_absent``
never replaces: the first document stored under a name stays (key material, the KeyStore port).

Saves are written by group commit, and the saves of one batch are sent as one INSERT
(``UPSERT_MERGE``): in real mode every placement saves its account's book and order, so the
worker host's concurrent placements share one statement as well as one commit.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from tradecore_adapters.postgres.group_commit import (
    Merge,
    Statement,
    StatementResult,
    numbered_values,
    shared_batcher,
)
from tradecore_adapters.postgres.json_values import jsonb
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import fetch_one

_UPSERT_HEAD = "INSERT INTO documents (name, body) "
_UPSERT_TAIL = " ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body, updated_at = now()"
# ``updated_at`` of an inserted row is the column's default, now(), as an update sets it.


def upsert_query(rows: str) -> str:
    """The INSERT ... ON CONFLICT storing the (name, body) rows of ``rows`` (a VALUES list or
    a SELECT)."""
    return _UPSERT_HEAD + rows + _UPSERT_TAIL


@functools.lru_cache(maxsize=16)
def _upsert_rows(count: int) -> str:
    """One INSERT ... ON CONFLICT for ``count`` (name, body) pairs (psycopg's placeholders)."""
    return upsert_query("VALUES " + ", ".join(["(%s, %s)"] * count))


def _combine_upserts(statements: Sequence[Statement]) -> tuple[str, list[Any]]:
    """One upsert of every (name, body) pair of ``statements``, in their order."""
    params: list[Any] = []
    for statement in statements:
        assert isinstance(statement.params, list)
        params += statement.params
    return upsert_query(numbered_values(("text", "jsonb"), len(params) // 2)), params


def _split_upserts(
    statements: Sequence[Statement], result: StatementResult
) -> list[StatementResult]:
    """Each save wrote its own documents (the upsert returns no rows)."""
    return [StatementResult([], len(s.params or ()) // 2) for s in statements]


UPSERT_MERGE = Merge(("documents:upsert",), _combine_upserts, _split_upserts)
"""How a batch's saves are sent as one statement. Saves of different names only: the batcher
keeps two saves with one ``lock_key`` (their first name) apart, and should two merged saves
still share a name, the INSERT fails ("cannot affect row a second time") and the batch is
written again one save at a time, as any failed batch is."""


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
            params += [name, jsonb(documents[name])]
        key = ("documents", names[0])
        statement = Statement(_upsert_rows(len(names)), params, key, UPSERT_MERGE)
        await shared_batcher(self._pool).run(statement)

    async def create_if_absent(self, name: str, document: dict[str, Any]) -> dict[str, Any]:
        """Store ``document`` under ``name`` unless one is there; the stored document. Of
        concurrent calls (any process) exactly one insert wins and every caller gets it."""
        for _ in range(3):
            inserted = await fetch_one(
                self._pool,
                "INSERT INTO documents (name, body, updated_at) VALUES (%s, %s, now())"
                " ON CONFLICT (name) DO NOTHING RETURNING body",
                (name, jsonb(document)),
            )
            if inserted is not None:
                return dict(inserted["body"])
            # A separate statement: its snapshot sees the row whose insert made ours a no-op.
            existing = await self.load(name)
            if existing is not None:
                return existing
        raise RuntimeError(f"document {name!r} neither inserted nor found")
