"""The order history's writes merged by group commit: many orders' adds, or many orders'
transitions of one kind, as ONE statement (``group_commit.Merge``).

``PostgresOrderHistory`` (``orders.py``) builds each write as its own statement, which is what
runs when it is alone in its batch or written again alone; these merges say how a batch's
writes of one kind are sent together. Each merged statement carries its rows in a ``VALUES``
list (``group_commit.numbered_values``), every value cast to its column's type
(``ORDER_COLUMN_TYPES``), with PostgreSQL's own placeholders (``$1``...):
the batcher sends a merged statement by a raw cursor, since psycopg would otherwise parse the
``%s`` placeholders of a long query in Python on every call (it caches no query over 4 KB or
50 parameters; about 3 ms for 2,000 placeholders).

* **Transitions.** Statements setting the same fields (one kind of ``OrderChange``) merge
  into one ``UPDATE order_history AS h ... FROM (VALUES ...) AS v JOIN order_keys AS k``: each
  row's ``created_at`` is read from ``order_keys`` by its primary key, and the order row is
  then found by ``order_history``'s primary key (id, created_at), so run-time partition
  pruning probes only that row's month (a nested loop over the ``VALUES``; EXPLAIN ANALYZE of
  128 claims over four monthly partitions of 10,000-50,000 rows: one ``order_keys`` probe and
  one index scan of one partition per row, the other partitions never executed, in the
  generic plan of a prepared statement too; ``bench/merged_writes.py --explain``). Below
  about 10,000 rows in all, the planner hashes the ``VALUES`` against a scan of the whole
  (small) table instead: a few milliseconds. The nested loop locks the rows in the order of
  the ``VALUES`` list (``lock_key`` order). Each row keeps its own compare-and-set: the
  statuses it may leave travel as a comma-joined text (``string_to_array``), so changes of
  one kind leaving different statuses still merge. A statement's result is the returned row
  of its id, or none. The batcher never merges two statements of one order (same
  ``lock_key``).
* **Adds.** One statement inserts every key row into ``order_keys`` with ``ON CONFLICT
  (user_id, fingerprint) WHERE fingerprint IS NOT NULL DO NOTHING`` and the order rows of the
  key rows that went in. Of two rows of one INSERT with the same user and fingerprint the
  first (in ``lock_key`` order, as when sent one by one) goes in and the second is skipped,
  so a duplicate refuses only its own order, in the batch as against an earlier order of any
  month. An id already taken makes the statement fail (the primary key of ``order_keys``), as
  alone: the batch is then written again one statement at a time and only that caller gets
  the error. A statement's result is a row if its (id, user_id, fingerprint) went in; within
  one merged statement that triple is unique (the same id, user and fingerprint are one
  ``lock_key``).

* **Transitions that save documents** (a venue's book handed to the order's outcome,
  ``SavesWithOrder``): the same merged UPDATE as a CTE with the documents' upsert after it,
  one statement for every such transition of a batch that sets the same fields; each
  document row says whether it is saved always or only if its order's row was updated
  (``order_lifecycle.placement_kept``).

Parameters read from the statements: a transition's are a mapping with ``order_id``,
``expected`` (the status texts it may leave) and ``set_<field>`` for each field it sets (and
when it saves documents, ``documents``: ``document_rows`` as ``Jsonb``); an add's are a
mapping with every column of ``order_history`` by name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from tradecore_adapters.postgres.documents import upsert_query
from tradecore_adapters.postgres.group_commit import (
    Merge,
    Statement,
    StatementResult,
    numbered_values,
)
from tradecore_adapters.postgres.json_values import jsonb

ORDER_COLUMN_TYPES: Mapping[str, str] = {
    "id": "text",
    "user_id": "text",
    "trading_account_id": "text",
    "broker_name": "text",
    "symbol": "text",
    "action": "text",
    "quantity": "numeric",
    "order_type": "text",
    "source": "text",
    "simulation": "boolean",
    "status": "text",
    "created_at": "timestamp with time zone",
    "request_id": "text",
    "fingerprint": "text",
    "order_id": "text",
    "client_order_id": "text",
    "broker_refs": "text[]",
    "submitted_at": "timestamp with time zone",
    "fill_price": "numeric",
    "fill_quantity": "numeric",
    "filled_at": "timestamp with time zone",
    "auto_exit": "boolean",
    "exit_quantity": "numeric",
    "position_before": "numeric",
    "exit_order_result": "jsonb",
    "error": "jsonb",
    "admitted_at": "timestamp with time zone",
    "placed_at": "timestamp with time zone",
}
"""Every column of ``order_history`` and its type, as the migrations declare it (a contract
test compares it with the catalog)."""


def _mapping(statement: Statement) -> Mapping[str, Any]:
    """A statement's parameters by name (module doc: what each kind carries)."""
    params = statement.params
    if not isinstance(params, Mapping):
        raise TypeError(f"order write without named parameters: {statement.lock_key}")
    return params


def _names(columns: Sequence[str], table: str | None = None) -> sql.Composable:
    """The columns as a list of (qualified) identifiers."""
    qualify = () if table is None else (table,)
    return sql.SQL(", ").join(sql.Identifier(*qualify, c) for c in columns)


# --- transitions ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _transition_parts(fields: tuple[str, ...]) -> tuple[tuple[str, ...], str, str]:
    """For the merged UPDATE setting ``fields``: the VALUES column types, and the text before
    and after the VALUES list."""
    values = ["id", "expected", *(f"set_{f}" for f in fields)]
    types = ("text", "text", *(ORDER_COLUMN_TYPES[f] for f in fields))
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(f), sql.Identifier("v", f"set_{f}"))
        for f in fields
    )
    head = sql.SQL("UPDATE order_history AS h SET {} FROM (").format(assignments)
    tail = sql.SQL(
        ") AS v ({}) JOIN order_keys AS k ON k.id = v.id"
        " WHERE h.id = k.id AND h.created_at = k.created_at"
        " AND h.status = ANY(string_to_array(v.expected, ','))"
        " RETURNING h.*"
    ).format(_names(values))
    return types, head.as_string(), tail.as_string()


def _transition_params(statement: Statement, fields: tuple[str, ...]) -> list[Any]:
    params = _mapping(statement)
    return [
        params["order_id"],
        ",".join(params["expected"]),
        *(params[f"set_{f}"] for f in fields),
    ]


def _split_transitions(
    statements: Sequence[Statement], result: StatementResult
) -> list[StatementResult]:
    """Each statement's row: the returned row of its order id (ids are distinct: one order's
    statements share a ``lock_key`` and are never merged together)."""
    by_id = {row["id"]: row for row in result.rows}
    results = []
    for statement in statements:
        row = by_id.get(_mapping(statement)["order_id"])
        results.append(StatementResult([row], 1) if row is not None else StatementResult([], 0))
    return results


@functools.lru_cache(maxsize=64)
def transition_merge(fields: tuple[str, ...]) -> Merge:
    """The merge of transitions that set ``fields`` (in that order: ``change.fields()``)."""
    types, head, tail = _transition_parts(fields)

    def combine(statements: Sequence[Statement]) -> tuple[str, list[Any]]:
        params: list[Any] = []
        for statement in statements:
            params += _transition_params(statement, fields)
        return head + numbered_values(types, len(statements)) + tail, params

    return Merge(("order_history:transition", fields), combine, _split_transitions)


# --- transitions that save a venue's documents ---------------------------------------------


_DOCUMENT_ROWS = (
    "SELECT d.name, d.body FROM jsonb_to_recordset({documents}::jsonb)"
    " AS d(name text, body jsonb, order_id text, always boolean)"
    " WHERE d.always OR d.order_id IN (SELECT id FROM updated)"
)


def document_rows(
    documents: Mapping[str, Any], order_id: str, *, always: bool
) -> list[dict[str, Any]]:
    """The JSON parameter of ``documents_after`` for ``documents`` (by name), saved with
    order ``order_id``'s transition: ``always``, or only if that transition takes."""
    return [
        {"name": name, "body": documents[name], "order_id": order_id, "always": always}
        for name in sorted(documents)
    ]


def documents_after(update: str, placeholder: str) -> str:
    """``update`` (an UPDATE of ``order_history`` RETURNING its rows) as a CTE, then the
    upsert of the documents of one JSON parameter (``document_rows``, in name order) that
    are saved ``always`` or whose order that UPDATE changed; the changed rows are the
    statement's result. One statement: one round trip, one commit. The order rows are
    locked first, then the documents in name order."""
    rows = _DOCUMENT_ROWS.replace("{documents}", placeholder)
    return "WITH updated AS (" + update + "), saved AS (" + upsert_query(rows) + ")" + _UPDATED


_UPDATED = " SELECT * FROM updated"


@functools.lru_cache(maxsize=64)
def transition_with_documents_merge(fields: tuple[str, ...]) -> Merge:
    """The merge of transitions that set ``fields`` and save documents with them
    (``SavesWithOrder``, parameter ``documents``: a ``Jsonb`` of ``document_rows``): the
    merged UPDATE in one ``documents_after`` of every statement's documents, in name order,
    so the whole is ONE statement. Two of them saving one name make the upsert fail
    ("cannot affect row a second time"), and the batch is written again one statement at a
    time, as any failed batch."""
    types, head, tail = _transition_parts(fields)

    def combine(statements: Sequence[Statement]) -> tuple[str, list[Any]]:
        params: list[Any] = []
        rows: list[dict[str, Any]] = []
        for statement in statements:
            params += _transition_params(statement, fields)
            rows += _mapping(statement)["documents"].obj
        rows.sort(key=lambda row: str(row["name"]))
        update = head + numbered_values(types, len(statements)) + tail
        return documents_after(update, f"${len(params) + 1}"), [*params, jsonb(rows)]

    return Merge(("order_history:transition+documents", fields), combine, _split_transitions)


# --- adds ----------------------------------------------------------------------------------

_ADD_COLUMNS = tuple(ORDER_COLUMN_TYPES)
_ADD_TYPES = tuple(ORDER_COLUMN_TYPES.values())
_ADD_HEAD = sql.SQL("WITH offered ({}) AS (").format(_names(_ADD_COLUMNS)).as_string()
# The key rows in the order of the VALUES list (its lock_key order): of two with one
# fingerprint the first goes in. The order rows only for key rows that went in, matched on
# the whole key (an id offered twice with two fingerprints: only the one inserted).
_ADD_TAIL = (
    sql.SQL(
        "), keyed AS (INSERT INTO order_keys (id, user_id, created_at, fingerprint)"
        " SELECT id, user_id, created_at, fingerprint FROM offered"
        " ON CONFLICT (user_id, fingerprint) WHERE fingerprint IS NOT NULL DO NOTHING"
        " RETURNING id, user_id, fingerprint)"
        " INSERT INTO order_history ({columns}) SELECT {offered} FROM offered AS o"
        " JOIN keyed AS k ON k.id = o.id AND k.user_id = o.user_id"
        " AND k.fingerprint IS NOT DISTINCT FROM o.fingerprint"
        " RETURNING id, user_id, fingerprint"
    )
    .format(columns=_names(_ADD_COLUMNS), offered=_names(_ADD_COLUMNS, "o"))
    .as_string()
)


def _add_key(params: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return params["id"], params["user_id"], params["fingerprint"]


def _combine_adds(statements: Sequence[Statement]) -> tuple[str, list[Any]]:
    params: list[Any] = []
    for statement in statements:
        row = _mapping(statement)
        params += [row[column] for column in _ADD_COLUMNS]
    return _ADD_HEAD + numbered_values(_ADD_TYPES, len(statements)) + _ADD_TAIL, params


def _split_adds(statements: Sequence[Statement], result: StatementResult) -> list[StatementResult]:
    """A row (its id) for each statement whose order went in, none for a refused one."""
    inserted = {(row["id"], row["user_id"], row["fingerprint"]) for row in result.rows}
    results = []
    for statement in statements:
        key = _add_key(_mapping(statement))
        went_in = key in inserted
        results.append(StatementResult([{"id": key[0]}] if went_in else [], int(went_in)))
    return results


ADD_MERGE = Merge(("order_history:add",), _combine_adds, _split_adds)
"""The merge of ``PostgresOrderHistory.add``'s statements."""
