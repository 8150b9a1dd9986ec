"""The audit log in Postgres (table ``audit_logs``, partitioned by month since 0010): ids from
an identity column, newest first. Retention (``partitions.maintain_partitions``) removes the
oldest months and records where it cut the chain in ``audit_chain_anchor``."""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

import attrs
from psycopg import sql
from psycopg.types.json import Jsonb

from tradecore.audit import (
    AuditAction,
    AuditEntry,
    AuditSummary,
    RequestContext,
    StoredAuditEntry,
)
from tradecore.audit_chain import SealedEntry, normalized, seal
from tradecore.errors import DatabaseUnavailable
from tradecore_adapters.postgres.group_commit import GroupCommit
from tradecore_adapters.postgres.pool import KeptConnection, Pool, kept_connection
from tradecore_adapters.postgres.rows import Row, fetch_all, fetch_one, utc


def _dumps(value: Any) -> str:
    # A value JSON cannot hold (a Decimal, a datetime) is stored as its text rather than
    # losing the entry.
    return json.dumps(value, default=str)


_CHAIN_ATTEMPTS = 50
_BATCH = 256
"""Most entries sealed and inserted by one statement."""
_COLUMNS = (
    "user_id",
    "action",
    "success",
    "ip_address",
    "user_agent",
    "request_path",
    "request_method",
    "error_message",
    "resource_type",
    "resource_id",
    "metadata",
    "created_at",
    "previous_seal",
    "seal",
)
_TYPES = (
    "text",
    "text",
    "boolean",
    "inet",
    "text",
    "text",
    "text",
    "text",
    "text",
    "text",
    "jsonb",
    "timestamptz",
    "text",
    "text",
)
# One statement per batch: move the chain head from the seal the batch was sealed onto to the
# batch's last seal, and insert the entries, in chain order, only if that compare-and-set
# took. Concurrent appends (other processes) serialize on the head row; the loser's
# compare-and-set finds the head moved, inserts nothing, and seals its batch again. A batch
# of one uses the plain form (no arrays to build). Both texts are composed once.
_APPEND = (
    sql.SQL(
        "WITH head AS (UPDATE audit_chain_head SET seal = %(last)s"
        " WHERE seal = %(previous)s RETURNING 1)"
        " INSERT INTO audit_logs ({columns})"
        " SELECT {selected} FROM head,"
        " ROWS FROM (jsonb_to_recordset(%(entries)s::jsonb) AS ({typed}))"
        " WITH ORDINALITY AS e({columns}, n)"
        " ORDER BY e.n RETURNING id, seal"
    )
    .format(
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS),
        selected=sql.SQL(", ").join(sql.SQL("e.{}").format(sql.Identifier(c)) for c in _COLUMNS),
        typed=sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
            for c, t in zip(_COLUMNS, _TYPES, strict=True)
        ),
    )
    .as_string()
)
_APPEND_ONE = (
    sql.SQL(
        "WITH head AS (UPDATE audit_chain_head SET seal = %(last)s"
        " WHERE seal = %(previous)s RETURNING 1)"
        " INSERT INTO audit_logs ({columns}) SELECT {values} FROM head RETURNING id, seal"
    )
    .format(
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS),
        values=sql.SQL(", ").join(sql.Placeholder(c) for c in _COLUMNS),
    )
    .as_string()
)


def _columns(stored: AuditEntry) -> dict[str, Any]:
    """The row of ``stored`` by column, but for its seals (they depend on the chain's head
    when it is written). In a JSON document ``_dumps`` writes ``created_at`` as its text,
    exact to the microsecond."""
    context = stored.context
    return {
        "user_id": stored.user_id,
        "action": stored.action.value,
        "success": stored.success,
        "ip_address": context.ip_address,
        "user_agent": context.user_agent,
        "request_path": context.request_path,
        "request_method": context.request_method,
        "error_message": stored.error_message,
        "resource_type": stored.resource_type,
        "resource_id": stored.resource_id,
        "metadata": dict(stored.metadata),
        "created_at": stored.created_at,
    }


@attrs.frozen
class AuditAnchor:
    """Where retention cut the audit chain: the id and seal of the newest entry it removed
    (the oldest retained entry carries that seal as its previous seal), and the start of the
    oldest month kept."""

    last_id: int
    seal: str
    retained_from: datetime


def stored_entry_from_row(row: Row) -> StoredAuditEntry:
    return StoredAuditEntry(
        id=row["id"],
        entry=AuditEntry(
            user_id=row["user_id"],
            action=AuditAction(row["action"]),
            success=row["success"],
            context=RequestContext(
                ip_address=str(row["ip_address"]),
                user_agent=row["user_agent"],
                request_path=row["request_path"],
                request_method=row["request_method"],
            ),
            created_at=utc(row["created_at"]),
            error_message=row["error_message"],
            resource_type=row["resource_type"],
            resource_id=row["resource_id"],
            metadata=row["metadata"],
        ),
    )


class PostgresAuditLog:
    """AuditLog on table ``audit_logs``. "Newest first" is descending id, the order in which
    entries were appended; ``metadata`` values JSON cannot hold are stored as text.

    One per process (the composition root's singleton): it keeps one of the pool's
    connections for its appends when the pool lets it (``pool.kept_connection``), from the
    first append until the pool closes."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._head: str | None = None  # the newest seal this process saw (a cache)
        # One batch at a time: the batches of one process never contend for the chain head,
        # and each is written on the same kept connection (no checkout per batch).
        self._writes: Pool | KeptConnection = kept_connection(pool) or pool
        self._appends: GroupCommit[AuditEntry, int] = GroupCommit(
            self._append_batch, max_batch=_BATCH, max_in_flight=1, linger_s=0.0, name="audit"
        )

    async def append(self, entry: AuditEntry) -> int:
        """Appends of this process are written in batches (group commit, ``GroupCommit``):
        the entries that arrive while one batch is being written go together in the next
        statement. The id returns once the entry is committed; a cancelled caller's entry is
        still written. An entry the database refuses (not an outage) fails only its own
        append; an outage fails every append of the batch."""
        return await self._appends.submit(normalized(entry))

    async def _append_batch(self, entries: list[AuditEntry]) -> list[int]:
        """Seal ``entries`` onto the chain and insert them in one statement; their ids."""
        columns = [_columns(stored) for stored in entries]
        if len(entries) == 1:
            columns[0]["metadata"] = Jsonb(columns[0]["metadata"], dumps=_dumps)
        for _ in range(_CHAIN_ATTEMPTS):
            previous = self._head if self._head is not None else await self._read_head()
            seals: list[str] = []
            for stored in entries:
                seals.append(seal(seals[-1] if seals else previous, stored))
            sealed = [
                {**row, "previous_seal": before, "seal": after}
                for row, before, after in zip(columns, [previous, *seals[:-1]], seals, strict=True)
            ]
            chain = {"previous": previous, "last": seals[-1]}
            if len(entries) == 1:
                rows = await fetch_all(self._writes, _APPEND_ONE, {**chain, **sealed[0]})
            else:
                # The batch as one JSON document (json's C encoder), not one array per
                # column: psycopg dumps array elements one by one in Python.
                rows = await fetch_all(self._writes, _APPEND, {**chain, "entries": _dumps(sealed)})
            if rows:
                self._head = seals[-1]
                ids = {str(r["seal"]): int(r["id"]) for r in rows}
                ordered = [ids[s] for s in seals]
                if ordered != sorted(ordered):
                    raise RuntimeError("audit ids were not assigned in chain order")
                return ordered
            self._head = None  # another process moved the head: read it and seal again
        raise DatabaseUnavailable("audit chain head contended beyond the retry budget")

    async def chain(self, *, after_id: int = 0, limit: int = 1000) -> list[SealedEntry]:
        rows = await fetch_all(
            self._pool,
            "SELECT * FROM audit_logs WHERE id > %s ORDER BY id LIMIT %s",
            (after_id, max(limit, 0)),
        )
        return [
            SealedEntry(
                id=int(r["id"]),
                entry=stored_entry_from_row(r).entry,
                previous=r["previous_seal"] or "",
                seal=r["seal"] or "",
            )
            for r in rows
        ]

    async def summary(
        self, user_id: str, *, actions: Collection[AuditAction], since: datetime | None
    ) -> AuditSummary:
        rows = await fetch_all(
            self._pool,
            "SELECT action, count(*) AS n, NULL AS account, NULL::bigint AS newest"
            " FROM audit_logs WHERE user_id = %(user_id)s AND action = ANY(%(actions)s)"
            " AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s) GROUP BY action"
            " UNION ALL"
            " SELECT NULL, NULL, metadata->>'trading_account_id', max(id)"
            " FROM audit_logs WHERE user_id = %(user_id)s AND action = ANY(%(actions)s)"
            " AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)"
            " AND metadata ? 'trading_account_id'"
            " GROUP BY metadata->>'trading_account_id'",
            {"user_id": user_id, "actions": [a.value for a in actions], "since": since},
        )
        counts = {AuditAction(r["action"]): int(r["n"]) for r in rows if r["action"] is not None}
        named = sorted(
            (r for r in rows if r["action"] is None and r["account"] is not None),
            key=lambda r: int(r["newest"]),
            reverse=True,
        )
        return AuditSummary(counts, tuple(str(r["account"]) for r in named))

    async def stored_head(self) -> str:
        """The chain head as stored (the newest seal; GENESIS before the first entry)."""
        return await self._read_head()

    async def retention_anchor(self) -> AuditAnchor | None:
        """Where retention cut the chain; None while nothing was removed."""
        row = await fetch_one(
            self._pool, "SELECT last_id, seal, retained_from FROM audit_chain_anchor"
        )
        if row is None:
            return None
        return AuditAnchor(int(row["last_id"]), str(row["seal"]), utc(row["retained_from"]))

    async def _read_head(self) -> str:
        row = await fetch_one(self._pool, "SELECT seal FROM audit_chain_head")
        if row is None:
            raise DatabaseUnavailable("audit chain head missing: run `tradecore migrate`")
        return str(row["seal"])

    async def list_for_user(
        self,
        user_id: str,
        *,
        actions: Collection[AuditAction] | None = None,
        since: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[StoredAuditEntry], int]:
        conditions = [sql.SQL("user_id = %(user_id)s")]
        if actions is not None:
            conditions.append(sql.SQL("action = ANY(%(actions)s::text[])"))
        if since is not None:
            conditions.append(sql.SQL("created_at >= %(since)s"))
        where = sql.SQL(" AND ").join(conditions)
        params: dict[str, Any] = {
            "user_id": user_id,
            "actions": None if actions is None else [a.value for a in actions],
            "since": since,
            "limit": max(limit, 0),
            "offset": max(offset, 0),
        }
        page_query = sql.SQL(
            "SELECT *, count(*) OVER () AS total FROM audit_logs WHERE {where}"
            " ORDER BY id DESC LIMIT %(limit)s OFFSET %(offset)s"
        ).format(where=where)
        rows = await fetch_all(self._pool, page_query, params)
        if rows:
            return [stored_entry_from_row(r) for r in rows], int(rows[0]["total"])
        if params["offset"] == 0 and params["limit"] > 0:
            return [], 0
        count_query = sql.SQL("SELECT count(*) AS total FROM audit_logs WHERE {where}").format(
            where=where
        )
        counted = await fetch_one(self._pool, count_query, params)
        return [], 0 if counted is None else int(counted["total"])
