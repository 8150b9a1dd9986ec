"""The audit log in Postgres (table ``audit_logs``, partitioned by month since 0010): ids from
an identity column, newest first. Retention (``partitions.maintain_partitions``) removes the
oldest months and records where it cut the chain in ``audit_chain_anchor``."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
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
from tradecore_adapters.postgres.order_writes import add_params, added_ctes
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import Row, fetch_all, fetch_all_numbered, fetch_one, utc


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
_APPEND_ROWS = (
    sql.SQL(
        "INSERT INTO audit_logs ({columns})"
        " SELECT {selected} FROM head,"
        " ROWS FROM (jsonb_to_recordset({{entries}}::jsonb) AS ({typed}))"
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
"""The insert of a batch of sealed entries (a JSON document in the parameter written in
place of ``{entries}``), in chain order, one row per entry if the CTE ``head`` (the chain
head's compare-and-set) returned its row, none otherwise."""
_HEAD_MOVED = "head AS (UPDATE audit_chain_head SET seal = {last} WHERE seal = {previous}{also}"
"""The chain head's compare-and-set as a CTE (placeholders written in place of the names;
``also``: a further condition, or nothing), returning its row when it took."""
_APPEND = (
    "WITH "
    + _HEAD_MOVED.format(last="%(last)s", previous="%(previous)s", also="")
    + " RETURNING 1) "
    + _APPEND_ROWS.replace("{entries}", "%(entries)s")
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


def _sealed(entries: list[AuditEntry], previous: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``entries`` sealed one after the other onto ``previous``, and their seals."""
    seals: list[str] = []
    for stored in entries:
        seals.append(seal(seals[-1] if seals else previous, stored))
    rows = [
        {**_columns(stored), "previous_seal": before, "seal": after}
        for stored, before, after in zip(entries, [previous, *seals[:-1]], seals, strict=True)
    ]
    return rows, seals


def _lock_key(intent: Mapping[str, Any]) -> tuple[str, str, str]:
    return intent["user_id"], intent["fingerprint"] or "", intent["id"]


def _in_chain_order(ids: Mapping[str, int], seals: list[str]) -> list[int]:
    """The ids of the entries sealed ``seals``, by seal, in chain order (they must ascend)."""
    ordered = [ids[s] for s in seals]
    if ordered != sorted(ordered):
        raise RuntimeError("audit ids were not assigned in chain order")
    return ordered


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


@attrs.frozen
class _Append:
    """One entry to append and, when it is the success entry of an order request, that
    order's intent (its row's parameters by column, ``orders.order_params``)."""

    entry: AuditEntry
    intent: Mapping[str, Any] | None = None


def _with_intents_query(intents: int, intent_params: int) -> str:
    """The statement writing ``intents`` order intents (``added_ctes``, parameters ``$1`` to
    ``$intent_params``) and a batch of entries sealed onto the chain, the entries only if
    every intent went in; its rows name the orders that went in and the entries appended."""
    n = intent_params
    every_intent = _EVERY_INTENT.format(intents=intents)
    head = _HEAD_MOVED.format(last=f"${n + 1}", previous=f"${n + 2}", also=every_intent)
    appended = _APPEND_ROWS.replace("{entries}", f"${n + 3}")
    return (
        "WITH " + added_ctes(intents) + ", " + head + " RETURNING 1)"
        ", appended AS (" + appended + ")" + _INTENTS_AND_ENTRIES
    )


_EVERY_INTENT = " AND (SELECT count(*) FROM added) = {intents}"
"""The head's further condition in a statement with intents: every intent went in."""
_INTENTS_AND_ENTRIES = (
    " SELECT id AS order_id, NULL::bigint AS entry_id, NULL::text AS seal FROM added"
    " UNION ALL SELECT NULL, id, seal FROM appended"
)


class PostgresAuditLog:
    """AuditLog on table ``audit_logs``. "Newest first" is descending id, the order in which
    entries were appended; ``metadata`` values JSON cannot hold are stored as text.

    It also writes an order request's intent together with the request's success entry
    (``append_with_intent``, the ``OrderIntentLog`` port through ``PostgresIntentLog``): the
    intents and entries of one batch go in ONE statement, so an order costs the API one
    commit where an intent and its entry took two."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._head: str | None = None  # the newest seal this process saw (a cache)
        # One batch at a time: the batches of one process never contend for the chain head.
        self._appends: GroupCommit[_Append, int | None] = GroupCommit(
            self._append_batch, max_batch=_BATCH, max_in_flight=1, linger_s=0.0, name="audit"
        )

    async def append(self, entry: AuditEntry) -> int:
        """Appends of this process are written in batches (group commit, ``GroupCommit``):
        the entries that arrive while one batch is being written go together in the next
        statement. The id returns once the entry is committed; a cancelled caller's entry is
        still written. An entry the database refuses (not an outage) fails only its own
        append; an outage fails every append of the batch."""
        entry_id = await self._appends.submit(_Append(normalized(entry)))
        assert entry_id is not None  # only an intent is refused
        return entry_id

    async def append_with_intent(self, entry: AuditEntry, intent: Mapping[str, Any]) -> int | None:
        """Write an order intent (its row by column, ``orders.order_params``) and ``entry``,
        the success entry of its request: the entry's id once both are committed, or None
        when the intent's fingerprint is taken (then neither is written).

        The batch's intents, the key rows of their fingerprints, the chain head's
        compare-and-set and the batch's entries are one statement, which appends the entries
        only if every intent of the batch went in. When one did not (a duplicate) or the head
        moved (another process appended), the intents that went in are committed all the
        same and the entries that remain are appended right after, sealed again, as plain
        appends. An outage fails every caller of the batch (``DatabaseUnavailable``); as
        after a lost commit, an intent may then have been written, with or without its
        entry."""
        return await self._appends.submit(_Append(normalized(entry), intent))

    async def _append_batch(self, items: list[_Append]) -> list[int | None]:
        # The intents in the order of their key rows' locks (the merged adds' order,
        # ``order_writes``), so two processes' statements take them in the same order.
        intents = sorted((item.intent for item in items if item.intent is not None), key=_lock_key)
        if not intents:
            return list(await self._append_entries([item.entry for item in items]))
        previous = self._head if self._head is not None else await self._read_head()
        sealed, seals = _sealed([item.entry for item in items], previous)
        params: list[Any] = []
        for intent in intents:
            params += add_params(intent)
        query = _with_intents_query(len(intents), len(params))
        params += [seals[-1], previous, _dumps(sealed)]
        rows = await fetch_all_numbered(self._pool, query, params)
        appended = {str(r["seal"]): int(r["entry_id"]) for r in rows if r["entry_id"] is not None}
        if appended:
            self._head = seals[-1]
            return list(_in_chain_order(appended, seals))
        # Nothing appended: a duplicate intent, or the head moved. The intents that went in
        # are committed; their entries and the plain ones are appended on their own now.
        self._head = None
        added = {r["order_id"] for r in rows if r["order_id"] is not None}
        kept = [item.intent is None or item.intent["id"] in added for item in items]
        remaining = [item.entry for item, keep in zip(items, kept, strict=True) if keep]
        ids = iter(await self._append_entries(remaining) if remaining else [])
        return [next(ids) if keep else None for keep in kept]

    async def _append_entries(self, entries: list[AuditEntry]) -> list[int]:
        """Seal ``entries`` onto the chain and insert them in one statement; their ids."""
        for _ in range(_CHAIN_ATTEMPTS):
            previous = self._head if self._head is not None else await self._read_head()
            sealed, seals = _sealed(entries, previous)
            chain = {"previous": previous, "last": seals[-1]}
            if len(entries) == 1:
                one = {**sealed[0], "metadata": Jsonb(sealed[0]["metadata"], dumps=_dumps)}
                rows = await fetch_all(self._pool, _APPEND_ONE, {**chain, **one})
            else:
                # The batch as one JSON document (json's C encoder), not one array per
                # column: psycopg dumps array elements one by one in Python.
                rows = await fetch_all(self._pool, _APPEND, {**chain, "entries": _dumps(sealed)})
            if rows:
                self._head = seals[-1]
                return _in_chain_order({str(r["seal"]): int(r["id"]) for r in rows}, seals)
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
