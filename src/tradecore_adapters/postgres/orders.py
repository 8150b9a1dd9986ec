"""Order history in Postgres: durable intents, compare-and-set transitions, the replay backstop.

``order_history`` is partitioned by month (migration 0010), so its own unique indexes cannot
span months; every order's keys live in ``order_keys`` (not partitioned) instead. Its partial
unique index ``order_keys_fingerprint`` on (user_id, fingerprint) keeps a replayed webhook from
becoming a second order even when the replay store lost its key and the first order is in
another month; ``add`` writes the key row and the order row in one statement (the order row
only if the key row went in) and turns a conflict into ``DuplicateOrder``. A lookup by id
reads the order's ``created_at`` from ``order_keys`` so only its month's partition is probed.
A transition is one ``UPDATE ... WHERE status = ANY``
of the statuses the lifecycle table lets the change leave (``order_lifecycle.sources``): of
concurrent transitions from the same status, exactly one applies.

``add`` and ``transition`` are written by group commit (``group_commit.shared_batcher``): the
writes of concurrent callers share one transaction and one commit, and each returns once that
commit is done. A batch succeeds or fails per order: the insert is ``ON CONFLICT DO NOTHING``,
so a duplicate fingerprint refuses only its own order (also against an insert earlier in the
same batch), and an outage fails every caller of the batch with ``DatabaseUnavailable``, with
nothing of the batch written. A batch's adds, and its transitions of one kind, are sent as one
multi-row statement each (``order_writes``).

A venue that keeps its state in this database (the paper broker in real mode) may hand its
save to the order's next transition (``save_with_order``, the ``SavesWithOrder`` port): the
transition and the documents' upsert are then ONE statement (the UPDATE a CTE, the upsert
after it; merged with the batch's other such transitions, ``order_writes``), one round trip
and one commit for both. After a claim the documents are stored even when the
compare-and-set finds the row moved on (they record what the venue did, whichever process
records the order); a placement made without a claim is kept only by its execution's write,
if it takes, and the venue is told to drop it otherwise (``discarded``;
``order_lifecycle.placement_kept``).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs
from psycopg import sql

from tradecore import order_lifecycle
from tradecore.errors import DuplicateOrder
from tradecore.order_lifecycle import OrderChange, PlacementKept, placement_kept
from tradecore.orders import (
    AlertAction,
    OrderError,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    RejectionCode,
    Source,
)
from tradecore_adapters.postgres.group_commit import Statement, StatementBatcher, shared_batcher
from tradecore_adapters.postgres.json_values import jsonb
from tradecore_adapters.postgres.order_writes import (
    ADD_MERGE,
    document_rows,
    documents_after,
    transition_merge,
    transition_with_documents_merge,
)
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import Row, fetch_all, fetch_one, utc, utc_or_none

_FIELDS = tuple(f.name for f in attrs.fields(OrderHistoryRecord))


def error_to_json(error: OrderError) -> dict[str, Any]:
    return {
        "code": error.code.value,
        "message": error.message,
        "retry_after": error.retry_after,
        "broker_message": error.broker_message,
    }


def error_from_json(data: Mapping[str, Any]) -> OrderError:
    return OrderError(
        code=RejectionCode(data["code"]),
        message=data["message"],
        retry_after=data.get("retry_after"),
        broker_message=data.get("broker_message"),
    )


def _text(value: Any) -> Any:
    return str(value)


_ENCODERS: dict[str, Callable[[Any], Any]] = {
    "action": _text,
    "order_type": _text,
    "source": _text,
    "status": _text,
    "broker_refs": list,
    "error": lambda e: jsonb(error_to_json(e)),
    "exit_order_result": lambda d: jsonb(dict(d)),
}


def _encode(field: str, value: Any) -> Any:
    """The parameter for column ``field`` (None stays NULL)."""
    if value is None:
        return None
    encoder = _ENCODERS.get(field)
    return value if encoder is None else encoder(value)


def order_from_row(row: Row) -> OrderHistoryRecord:
    error = row["error"]
    return OrderHistoryRecord(
        id=row["id"],
        user_id=row["user_id"],
        trading_account_id=row["trading_account_id"],
        broker_name=row["broker_name"],
        symbol=row["symbol"],
        action=AlertAction(row["action"]),
        quantity=row["quantity"],
        order_type=None if row["order_type"] is None else OrderType(row["order_type"]),
        source=Source(row["source"]),
        simulation=row["simulation"],
        status=OrderStatus(row["status"]),
        created_at=utc(row["created_at"]),
        request_id=row["request_id"],
        fingerprint=row["fingerprint"],
        order_id=row["order_id"],
        client_order_id=row["client_order_id"],
        broker_refs=tuple(row["broker_refs"]),
        submitted_at=utc_or_none(row["submitted_at"]),
        fill_price=row["fill_price"],
        fill_quantity=row["fill_quantity"],
        filled_at=utc_or_none(row["filled_at"]),
        auto_exit=row["auto_exit"],
        exit_quantity=row["exit_quantity"],
        position_before=row["position_before"],
        exit_order_result=row["exit_order_result"],
        error=None if error is None else error_from_json(error),
        admitted_at=utc_or_none(row["admitted_at"]),
        placed_at=utc_or_none(row["placed_at"]),
    )


# Query texts are composed once: composing (quoting every identifier) on each call costs more
# client time than the statement's round trip.

# The key row first: a fingerprint already taken (in any month) inserts no key row, and then
# no order row either. An id already taken fails the statement, as the primary key did.
_INSERT = (
    sql.SQL(
        "WITH key AS (INSERT INTO order_keys (id, user_id, created_at, fingerprint)"
        " VALUES (%(id)s, %(user_id)s, %(created_at)s, %(fingerprint)s)"
        " ON CONFLICT (user_id, fingerprint) WHERE fingerprint IS NOT NULL"
        " DO NOTHING RETURNING 1)"
        " INSERT INTO order_history ({columns}) SELECT {values} FROM key RETURNING id"
    )
    .format(
        columns=sql.SQL(", ").join(sql.Identifier(f) for f in _FIELDS),
        values=sql.SQL(", ").join(sql.Placeholder(f) for f in _FIELDS),
    )
    .as_string()
)


_CREATED_AT = "created_at = order_created_at(%(order_id)s)"
"""The order's month, for a statement that finds an order by id: ``order_created_at`` (0010)
reads it from ``order_keys``; being STABLE, it is evaluated as the executor starts, which
then opens only that month's partition (in a prepared plan too)."""
_GET = (
    sql.SQL("SELECT * FROM order_history WHERE id = %(order_id)s AND {}")
    .format(sql.SQL(_CREATED_AT))
    .as_string()
)


_GET_MANY = (
    "SELECT history.* FROM order_keys AS key"
    " CROSS JOIN LATERAL (SELECT * FROM order_history"
    " WHERE id = key.id AND created_at = key.created_at LIMIT 1) AS history"
    " WHERE key.id = ANY(%(order_ids)s::text[])"
)
"""Several orders by id in one statement: each id's ``created_at`` is read from
``order_keys`` (its primary key), then its row from ``order_history`` by the partition's
primary key (id, created_at), for each key in turn (a nested loop: the LATERAL subquery, kept
apart from the join by its LIMIT, is probed once per key whatever the planner estimates), so
run-time pruning opens only that key's month's partition. A join left to the planner turns,
for a long list, into a hash join over every partition read in full."""


@functools.lru_cache(maxsize=256)
def _transition_query(fields: tuple[str, ...]) -> str:
    """The compare-and-set UPDATE that sets ``fields`` (an order change's record fields)."""
    assignments = [
        sql.SQL("{} = {}").format(sql.Identifier(f), sql.Placeholder(f"set_{f}")) for f in fields
    ]
    return (
        sql.SQL(
            "UPDATE order_history SET {assignments}"
            " WHERE id = %(order_id)s AND {created_at}"
            " AND status = ANY(%(expected)s::text[]) RETURNING *"
        )
        .format(assignments=sql.SQL(", ").join(assignments), created_at=sql.SQL(_CREATED_AT))
        .as_string()
    )


@functools.lru_cache(maxsize=64)
def _transition_with_documents_query(fields: tuple[str, ...]) -> str:
    """``_transition_query`` with the upsert of the ``documents`` parameter after it, in
    ONE statement (``order_writes.documents_after``)."""
    return documents_after(_transition_query(fields), "%(documents)s")


@functools.lru_cache(maxsize=64)
def _status_texts(statuses: frozenset[OrderStatus]) -> tuple[str, ...]:
    """The statuses as the text[] parameter of the compare-and-set, in a stable order."""
    return tuple(sorted(str(s) for s in statuses))


SAVES_WITH_ORDER_KEPT = 10_000
"""Most orders whose saves wait for their transition (``save_with_order``). One beyond it (an
order whose transition never came, which the module's callers do not leave) is dropped
unsaved, oldest first: its caller still holds the changes and saves them on its own later."""


@attrs.frozen
class _SaveWithOrder:
    documents: Callable[[], Mapping[str, dict[str, Any]]]
    saved: Callable[[], None]
    discarded: Callable[[], None]


class PostgresOrderHistory:
    """OrderHistory on table ``order_history``, and ``SavesWithOrder`` on table ``documents``:
    a save waiting for an order's transition is written in the transition's statement."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._batcher: StatementBatcher | None = None
        self._with_order: OrderedDict[str, _SaveWithOrder] = OrderedDict()

    @property
    def _writes(self) -> StatementBatcher:
        """The pool's shared batcher, looked up on first use."""
        if self._batcher is None:
            self._batcher = shared_batcher(self._pool)
        return self._batcher

    async def add(self, record: OrderHistoryRecord) -> None:
        params = {f: _encode(f, getattr(record, f)) for f in _FIELDS}
        # Locks are taken on the fingerprint's index entry (and the new id): order by both.
        key = ("order_history:add", record.user_id, record.fingerprint or "", record.id)
        # Merged with the batch's other adds into one statement (order_writes).
        inserted = await self._writes.run(Statement(_INSERT, params, key, ADD_MERGE))
        if not inserted.rows:
            raise DuplicateOrder(record.fingerprint)

    async def get(self, order_id: str) -> OrderHistoryRecord | None:
        row = await fetch_one(self._pool, _GET, {"order_id": order_id})
        return None if row is None else order_from_row(row)

    async def get_many(self, order_ids: Sequence[str]) -> dict[str, OrderHistoryRecord]:
        if not order_ids:
            return {}
        wanted = list(dict.fromkeys(order_ids))
        rows = await fetch_all(self._pool, _GET_MANY, {"order_ids": wanted})
        return {row["id"]: order_from_row(row) for row in rows}

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        leaves = order_lifecycle.sources(change)
        fields = change.fields()
        params: dict[str, Any] = {f"set_{f}": _encode(f, v) for f, v in fields.items()}
        params["order_id"] = order_id
        params["expected"] = list(_status_texts(leaves))
        written = tuple(fields)
        key = ("order_history", order_id)
        waiting = self._with_order.pop(order_id, None)
        kept = None if waiting is None else placement_kept(change)
        if waiting is not None and kept is PlacementKept.NEVER:
            waiting.discarded()
            waiting = None
        if waiting is None:
            # Merged with the batch's other transitions of its kind into one statement.
            statement = Statement(
                _transition_query(written), params, key, transition_merge(written)
            )
        else:  # the transition and the documents' upsert in ONE statement (order_writes)
            always = kept is PlacementKept.ALWAYS
            rows = document_rows(waiting.documents(), order_id, always=always)
            params["documents"] = jsonb(rows)
            statement = Statement(
                _transition_with_documents_query(written),
                params,
                key,
                transition_with_documents_merge(written),
            )
        try:
            updated = (await self._writes.run(statement)).rows
        except BaseException:
            if waiting is not None and kept is PlacementKept.IF_APPLIED:
                waiting.discarded()  # it may or may not have committed: the caller re-reads
            raise
        if waiting is not None:
            if updated or kept is PlacementKept.ALWAYS:
                waiting.saved()
            else:
                waiting.discarded()
        return order_from_row(updated[0]) if updated else None

    def save_with_order(
        self,
        order_id: str,
        documents: Callable[[], Mapping[str, dict[str, Any]]],
        saved: Callable[[], None],
        discarded: Callable[[], None],
    ) -> None:
        """The ``SavesWithOrder`` port: ``documents()`` upserted in the transaction of the
        order's next ``transition``."""
        self._with_order.pop(order_id, None)  # re-inserted last: newest
        self._with_order[order_id] = _SaveWithOrder(documents, saved, discarded)
        while len(self._with_order) > SAVES_WITH_ORDER_KEPT:
            self._with_order.popitem(last=False)

    async def list_for_user(
        self,
        user_id: str,
        *,
        trading_account_id: str | None = None,
        before: datetime | None = None,
        limit: int = 50,
    ) -> Sequence[OrderHistoryRecord]:
        conditions = [sql.SQL("user_id = %(user_id)s")]
        if trading_account_id is not None:
            conditions.append(sql.SQL("trading_account_id = %(account_id)s"))
        if before is not None:
            conditions.append(sql.SQL("created_at < %(before)s"))
        query = sql.SQL(
            "SELECT * FROM order_history WHERE {conditions}"
            " ORDER BY created_at DESC, id DESC LIMIT %(limit)s"
        ).format(conditions=sql.SQL(" AND ").join(conditions))
        params = {
            "user_id": user_id,
            "account_id": trading_account_id,
            "before": before,
            "limit": max(limit, 0),
        }
        return [order_from_row(r) for r in await fetch_all(self._pool, query, params)]

    async def count_since(self, user_id: str, since: datetime) -> int:
        row = await fetch_one(
            self._pool,
            "SELECT count(*) AS n FROM order_history WHERE user_id = %s AND created_at >= %s",
            (user_id, since),
        )
        return 0 if row is None else int(row["n"])

    async def stale_queued(self, before: datetime, limit: int) -> list[OrderHistoryRecord]:
        # the partial index order_history_queued (migration 0008) holds only queued rows
        rows = await fetch_all(
            self._pool,
            "SELECT * FROM order_history WHERE status = 'queued' AND created_at < %s"
            " ORDER BY created_at, id LIMIT %s",
            (before, max(limit, 0)),
        )
        return [order_from_row(r) for r in rows]
