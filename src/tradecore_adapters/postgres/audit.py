"""The audit log in Postgres (table ``audit_logs``): ids from an identity column, newest first."""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

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
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import Row, fetch_all, fetch_one, utc


def _dumps(value: Any) -> str:
    # A value JSON cannot hold (a Decimal, a datetime) is stored as its text rather than
    # losing the entry.
    return json.dumps(value, default=str)


_CHAIN_ATTEMPTS = 50
# One statement: move the chain head from the seal we sealed onto to the new seal, and insert
# the entry only if that compare-and-set took. Concurrent appends serialize on the head row.
_APPEND = (
    "WITH head AS (UPDATE audit_chain_head SET seal = %(seal)s"
    " WHERE seal = %(previous)s RETURNING 1)"
    " INSERT INTO audit_logs (user_id, action, success, ip_address, user_agent, request_path,"
    " request_method, error_message, resource_type, resource_id, metadata, created_at,"
    " previous_seal, seal)"
    " SELECT %(user_id)s, %(action)s, %(success)s, %(ip_address)s, %(user_agent)s,"
    " %(request_path)s, %(request_method)s, %(error_message)s, %(resource_type)s,"
    " %(resource_id)s, %(metadata)s, %(created_at)s, %(previous)s, %(seal)s FROM head"
    " RETURNING id"
)


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
    entries were appended; ``metadata`` values JSON cannot hold are stored as text."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._head: str | None = None  # the newest seal this process saw (a cache)

    async def append(self, entry: AuditEntry) -> int:
        stored = normalized(entry)
        context = stored.context
        params: dict[str, Any] = {
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
            "metadata": Jsonb(dict(stored.metadata), dumps=_dumps),
            "created_at": stored.created_at,
        }
        for _ in range(_CHAIN_ATTEMPTS):
            previous = self._head if self._head is not None else await self._read_head()
            params["previous"], params["seal"] = previous, seal(previous, stored)
            row = await fetch_one(self._pool, _APPEND, params)
            if row is not None:
                self._head = params["seal"]
                return int(row["id"])
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
