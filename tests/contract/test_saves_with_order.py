"""Saves that commit with an order's outcome (``SavesWithOrder`` on ``PostgresOrderHistory``).

What a paper trader depends on: the book the paper venue keeps and the order's outcome are
stored together or not at all, so no crash or outage leaves an order in the book that its
history does not record, or the reverse; and a placement made without a claim is kept only
by its own execution's write, so an order withdrawn or recorded by another execution meanwhile
never reaches the book. "Together" is read from the rows: every row version carries the id of
the transaction that wrote it (``xmin``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import pytest
from test_order_transitions import UNREACHABLE, executed
from test_repositories import T0, order, postgres_stores, two_users_with_accounts

from tradecore.errors import DatabaseUnavailable
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    ClaimFailed,
    Submitted,
    Withdrawn,
)
from tradecore.orders import OrderStatus
from tradecore_adapters.postgres import Pool, PostgresDocumentStore, PostgresOrderHistory
from tradecore_adapters.postgres.group_commit import Statement, shared_batcher
from tradecore_adapters.postgres.rows import fetch_one

pytestmark = pytest.mark.postgres

CLAIM = Submitted(T0, Decimal(0))
EXECUTED = executed(OrderStatus.FILLED)
UNCLAIMED = ClaimedAndExecuted(CLAIM, EXECUTED)
UNREACHABLE_CLAIM = ClaimFailed(UNREACHABLE)


class Calls:
    """What the order history told the saver: ``saved`` or ``discarded``."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def saved(self) -> None:
        self.told.append("saved")

    def discarded(self) -> None:
        self.told.append("discarded")


async def _written_by(pool: Pool, table: str, column: str, key: str) -> str | None:
    """The id of the transaction that wrote the row's current version, None without a row."""
    row = await fetch_one(
        pool, f"SELECT xmin::text AS xid FROM {table} WHERE {column} = %s", (key,)
    )
    return None if row is None else str(row["xid"])


async def _orders_with_one_order(pool: Pool, *, claimed: bool = True) -> PostgresOrderHistory:
    """Order ``o-1``, claimed (``submitted``) unless ``claimed`` is False (``queued``)."""
    stores = postgres_stores(pool)
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1"))
    assert isinstance(stores.orders, PostgresOrderHistory)
    if claimed:
        assert await stores.orders.transition("o-1", CLAIM) is not None
    return stores.orders


def _told(calls: Calls) -> tuple[Callable[[], None], Callable[[], None]]:
    return calls.saved, calls.discarded


async def _cut_during(pool: Pool, write: Awaitable[Any]) -> list[Any]:
    """``write`` and a statement that kills the batch's connection after it ran, before the
    commit (sorted after the order's writes: its lock key sorts last)."""
    cut = Statement("SELECT pg_terminate_backend(pg_backend_pid())", None, ("~cut",))
    return await asyncio.gather(write, shared_batcher(pool).run(cut), return_exceptions=True)


async def test_a_save_waiting_for_an_order_commits_with_its_transition(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool)
    documents = PostgresDocumentStore(pg_pool)
    book: dict[str, Any] = {"cash": "1"}
    saved: list[str] = []

    orders.save_with_order(
        "o-1",
        lambda: {"paper:book": dict(book), "paper:o-1": {"id": "o-1"}},
        lambda: saved.append("o-1"),
        lambda: saved.append("discarded"),
    )
    book["cash"] = "2"  # changed before the transition: the save holds the state of then
    assert await documents.load("paper:book") is None  # nothing stored before the transition

    row = await orders.transition("o-1", EXECUTED)

    assert row is not None and row.status is OrderStatus.FILLED
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
    assert await orders.transition("o-1", EXECUTED) is not None  # recorded by another process
    calls = Calls()
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "3"}}, *_told(calls))

    assert await orders.transition("o-1", EXECUTED) is None  # not submitted any more

    assert await PostgresDocumentStore(pg_pool).load("paper:book") == {"cash": "3"}
    assert calls.told == ["saved"]


async def test_an_outage_stores_neither_and_leaves_the_save_to_its_caller(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool)
    calls = Calls()
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "4"}}, *_told(calls))

    results = await _cut_during(pg_pool, orders.transition("o-1", EXECUTED))

    assert all(isinstance(r, DatabaseUnavailable) for r in results), results
    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None
    assert calls.told == []
    # The save went with the failed write: the order's next transition stores no documents.
    assert await orders.transition("o-1", EXECUTED) is not None
    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None


async def test_a_later_save_for_the_same_order_replaces_the_earlier(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool)
    calls: list[str] = []
    orders.save_with_order(
        "o-1", lambda: {"paper:first": {}}, lambda: calls.append("first"), lambda: None
    )
    orders.save_with_order(
        "o-1", lambda: {"paper:second": {}}, lambda: calls.append("second"), lambda: None
    )

    await orders.transition("o-1", EXECUTED)

    documents = PostgresDocumentStore(pg_pool)
    assert await documents.load("paper:first") is None
    assert await documents.load("paper:second") == {}
    assert calls == ["second"]


# --- placements made without a claim (a transition that leaves ``queued``) ------------------


async def test_an_unclaimed_placement_commits_with_its_execution(pg_pool: Pool) -> None:
    orders = await _orders_with_one_order(pg_pool, claimed=False)
    calls = Calls()
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "5"}}, *_told(calls))

    row = await orders.transition("o-1", UNCLAIMED)

    assert row is not None and row.status is OrderStatus.FILLED and row.submitted_at == T0
    assert await PostgresDocumentStore(pg_pool).load("paper:book") == {"cash": "5"}
    assert calls.told == ["saved"]
    written = await _written_by(pg_pool, "order_history", "id", "o-1")
    assert written == await _written_by(pg_pool, "documents", "name", "paper:book")


async def test_an_unclaimed_placement_whose_execution_does_not_take_is_discarded(
    pg_pool: Pool,
) -> None:
    """The API withdrew the order first: the placement belongs to no recorded order."""
    orders = await _orders_with_one_order(pg_pool, claimed=False)
    assert await orders.transition("o-1", Withdrawn()) is not None
    calls = Calls()
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "6"}}, *_told(calls))

    assert await orders.transition("o-1", UNCLAIMED) is None

    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None
    assert calls.told == ["discarded"]


async def test_an_unclaimed_placement_is_kept_by_no_other_change(pg_pool: Pool) -> None:
    """The broker call failed after the placement: the order fails as an unclaimed one."""
    orders = await _orders_with_one_order(pg_pool, claimed=False)
    calls = Calls()
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "7"}}, *_told(calls))

    row = await orders.transition("o-1", UNREACHABLE_CLAIM)

    assert row is not None and row.status is OrderStatus.FAILED
    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None
    assert calls.told == ["discarded"]


async def test_an_outage_discards_an_unclaimed_placement(pg_pool: Pool) -> None:
    """What the failed write left is unknown to the caller: it is told to read it again."""
    orders = await _orders_with_one_order(pg_pool, claimed=False)
    calls = Calls()
    orders.save_with_order("o-1", lambda: {"paper:book": {"cash": "8"}}, *_told(calls))

    results = await _cut_during(pg_pool, orders.transition("o-1", UNCLAIMED))

    assert all(isinstance(r, DatabaseUnavailable) for r in results), results
    assert await PostgresDocumentStore(pg_pool).load("paper:book") is None
    assert calls.told == ["discarded"]
    row = await orders.get("o-1")
    assert row is not None and row.status is OrderStatus.QUEUED
