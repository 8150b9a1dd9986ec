"""Saves that commit with an order's outcome (``SavesWithOrder`` on ``PostgresOrderHistory``).

What a paper trader depends on: the book the paper venue keeps and the order's outcome are
stored together or not at all, so no crash or outage leaves an order in the book that its
history does not record, or the reverse. "Together" is read from the rows: every row version
carries the id of the transaction that wrote it (``xmin``).
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from test_repositories import T0, order, postgres_stores, two_users_with_accounts

from tradecore.errors import DatabaseUnavailable
from tradecore.order_lifecycle import Submitted
from tradecore.orders import OrderStatus
from tradecore_adapters.postgres import Pool, PostgresDocumentStore, PostgresOrderHistory
from tradecore_adapters.postgres.group_commit import Statement, shared_batcher
from tradecore_adapters.postgres.rows import fetch_one

pytestmark = pytest.mark.postgres

CLAIM = Submitted(T0, Decimal(0))


async def _written_by(pool: Pool, table: str, column: str, key: str) -> str | None:
    """The id of the transaction that wrote the row's current version, None without a row."""
    row = await fetch_one(
        pool, f"SELECT xmin::text AS xid FROM {table} WHERE {column} = %s", (key,)
    )
    return None if row is None else str(row["xid"])


async def _orders_with_one_order(pool: Pool) -> PostgresOrderHistory:
    stores = postgres_stores(pool)
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1"))
    assert isinstance(stores.orders, PostgresOrderHistory)
    return stores.orders


async def test_a_save_waiting_for_an_order_commits_with_its_transition(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool)
    documents = PostgresDocumentStore(pg_pool)
    book: dict[str, Any] = {"cash": "1"}
    saved: list[str] = []

    orders.save_with_order(
        "o-1",
        lambda: {"paper:book": dict(book), "paper:o-1": {"id": "o-1"}},
        lambda: saved.append("o-1"),
    )
    book["cash"] = "2"  # changed before the transition: the save holds the state of then
    assert await documents.load("paper:book") is None  # nothing stored before the transition

    row = await orders.transition("o-1", CLAIM)

    assert row is not None and row.status is OrderStatus.SUBMITTED
    assert await documents.load("paper:book") == {"cash": "2"}
    assert await documents.load("paper:o-1") == {"id": "o-1"}
    assert saved == ["o-1"]
    written = await _written_by(pg_pool, "order_history", "id", "o-1")
    assert written == await _written_by(pg_pool, "documents", "name", "paper:book")
    assert written == await _written_by(pg_pool, "documents", "name", "paper:o-1")


async def test_the_save_is_stored_when_the_compare_and_set_finds_the_row_moved_on(
    pg_pool: Pool,
) -> None:
    """The documents record what the venue did, whichever process records the order."""
    orders = await _orders_with_one_order(pg_pool)
    assert await orders.transition("o-1", CLAIM) is not None  # claimed already
    saved: list[bool] = []
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "3"}}, lambda: saved.append(True))

    assert await orders.transition("o-1", CLAIM) is None  # not queued any more

    assert await PostgresDocumentStore(pg_pool).load("paper:book") == {"cash": "3"}
    assert saved == [True]


async def test_an_outage_stores_neither_and_leaves_the_save_to_its_caller(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool)
    saved: list[bool] = []
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "4"}}, lambda: saved.append(True))
    # Sorted after the order's writes (its lock key sorts last): the connection dies after
    # they ran inside the batch's transaction, before its commit.
    cut = Statement("SELECT pg_terminate_backend(pg_backend_pid())", None, ("~cut",))

    results = await asyncio.gather(
        orders.transition("o-1", CLAIM), shared_batcher(pg_pool).run(cut), return_exceptions=True
    )

    assert all(isinstance(r, DatabaseUnavailable) for r in results), results
    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None
    assert saved == []
    # The save went with the failed write: the order's next transition stores no documents.
    assert await orders.transition("o-1", CLAIM) is not None
    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None


async def test_a_later_save_for_the_same_order_replaces_the_earlier(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool)
    calls: list[str] = []
    orders.save_with_order("o-1", lambda: {"paper:first": {}}, lambda: calls.append("first"))
    orders.save_with_order("o-1", lambda: {"paper:second": {}}, lambda: calls.append("second"))

    await orders.transition("o-1", CLAIM)

    documents = PostgresDocumentStore(pg_pool)
    assert await documents.load("paper:first") is None
    assert await documents.load("paper:second") == {}
    assert calls == ["second"]
