"""Merged writes: a batch's order adds, its order transitions of one kind (``order_writes``)
and its document saves (the paper books, ``documents.UPSERT_MERGE``), sent by group commit as
one statement each, on Postgres.

Each test gathers its writes so they make one batch (an idle batcher starts a batch with
whatever is waiting when its drainer runs, and every write here is queued before that), and
checks that what each caller gets, and what is stored, is what the writes would give sent
one by one: compare-and-set per row, one winner per order, a duplicate fingerprint refusing
only its own order, an id taken failing only its own caller, an outage failing every caller.
Which statements reached the server is read from a spy on psycopg's cursor ``execute``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import attrs
import psycopg
import pytest
from test_order_transitions import CHANGES, EXPIRED, UNREACHABLE, executed, row_in
from test_repositories import Stores, at, order, postgres_stores, two_users_with_accounts

from tradecore.errors import DatabaseUnavailable, DuplicateOrder
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    ClaimFailed,
    Expired,
    Interrupted,
    OrderChange,
    Submitted,
    Withdrawn,
    sources,
)
from tradecore.orders import OrderHistoryRecord, OrderStatus
from tradecore_adapters.postgres import Pool, PostgresDocumentStore, PostgresOrderHistory
from tradecore_adapters.postgres.group_commit import Statement, shared_batcher
from tradecore_adapters.postgres.order_writes import ORDER_COLUMN_TYPES
from tradecore_adapters.postgres.rows import fetch_all

pytestmark = pytest.mark.postgres

# Months with partitions of their own in the session database (migration 0010 makes the
# current month's and the next two; the clock of these tests is the real one) and one without
# (the DEFAULT partition).
NOW = datetime.now(UTC)


def month(offset: int) -> datetime:
    """Noon on the 15th, ``offset`` months from now's month."""
    index = NOW.year * 12 + NOW.month - 1 + offset
    return datetime(index // 12, index % 12 + 1, 15, 12, tzinfo=UTC)


MONTHS = (month(0), month(1), month(2), month(-40))


@attrs.define
class Sent:
    """The statements on ``order_history`` sent while recording."""

    queries: list[str] = attrs.Factory(list)

    def updates(self) -> list[str]:
        return [q for q in self.queries if q.startswith("UPDATE order_history")]

    def inserts(self) -> list[str]:
        return [q for q in self.queries if "INSERT INTO order_history" in q]

    def document_saves(self) -> list[str]:
        return [q for q in self.queries if q.startswith("INSERT INTO documents")]

    def transitions_with_documents(self) -> list[str]:
        return [q for q in self.queries if q.startswith("WITH updated AS (UPDATE order_history")]

    def clear(self) -> None:
        self.queries.clear()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """A spy on every cursor's ``execute`` (the raw cursor's too)."""
    spy = Sent()
    execute = psycopg.AsyncCursor.execute

    async def recording(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else str(query)
        if "order_history" in text or "INSERT INTO documents" in text:
            spy.queries.append(text)
        return await execute(cursor, query, params, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", recording)
    return spy


@pytest.fixture
async def stores(pg_pool: Pool) -> Stores:
    s = postgres_stores(pg_pool)
    await two_users_with_accounts(s)
    return s


async def _transactions(pool: Pool, order_ids: list[str]) -> set[str]:
    rows = await fetch_all(
        pool, "SELECT xmin::text AS xid FROM order_history WHERE id = ANY(%s)", (order_ids,)
    )
    return {str(r["xid"]) for r in rows}


async def _rows(pool: Pool) -> dict[str, dict[str, Any]]:
    """Every stored order row by id (two rows of one id would fail the test)."""
    rows = await fetch_all(pool, "SELECT * FROM order_history")
    by_id = {str(r["id"]): r for r in rows}
    assert len(by_id) == len(rows), "an id stored twice"
    return by_id


def _changed(row: OrderHistoryRecord, change: OrderChange) -> OrderHistoryRecord:
    return attrs.evolve(row, **change.fields())


# --- transitions ---------------------------------------------------------------------------


async def test_concurrent_claims_are_one_statement_and_one_commit(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    records = [order(f"o-{n}", created_at=MONTHS[n % len(MONTHS)]) for n in range(12)]
    for record in records:
        await stores.orders.add(record)
    claim = Submitted(at(1), Decimal("0.5"))
    sent.clear()

    results = await asyncio.gather(*(stores.orders.transition(r.id, claim) for r in records))

    assert results == [_changed(r, claim) for r in records]
    assert len(sent.updates()) == 1
    assert "FROM (VALUES" in sent.updates()[0]
    assert len(await _transactions(pg_pool, [r.id for r in records])) == 1
    for record in records:
        assert await stores.orders.get(record.id) == _changed(record, claim)


async def test_merged_transitions_write_what_each_would_write_alone(
    stores: Stores, sent: Sent
) -> None:
    """Every kind of change, each on two rows it may leave and one it may not, in one batch:
    NULLs, json, an empty and a full text[], and changes of one field set leaving different
    statuses (expiry from queued, interruption from submitted) merged together."""
    cases: list[tuple[OrderHistoryRecord, OrderChange, bool]] = []
    for n, change in enumerate(CHANGES):
        leaves = sorted(sources(change))
        stays = sorted(set(OrderStatus) - sources(change))
        for k, status in enumerate([leaves[0], leaves[-1], leaves[0], stays[0]]):
            created_at = MONTHS[(n + k) % len(MONTHS)]
            row = attrs.evolve(row_in(status, f"o-{n}-{k}"), created_at=created_at)
            cases.append((row, change, k < 3))
    for row, _, _ in cases:
        await stores.orders.add(row)
    sent.clear()

    results = await asyncio.gather(*(stores.orders.transition(r.id, c) for r, c, _ in cases))

    for (row, change, applies), result in zip(cases, results, strict=True):
        expected = _changed(row, change) if applies else None
        assert result == expected, f"{change!r} on a {row.status} row"
        assert await stores.orders.get(row.id) == (expected or row)
    kinds = {tuple(change.fields()) for change in CHANGES}
    assert len(sent.updates()) == len(kinds) < len(cases)


async def test_two_transitions_of_one_order_in_a_batch_let_exactly_one_win(
    stores: Stores, sent: Sent
) -> None:
    """The first of an order's writes in the batch runs first, as when sent one by one; the
    other orders' writes of the same batch are not held back by it."""
    for n in range(6):
        await stores.orders.add(order(f"o-{n}", fingerprint=f"fp-{n}"))
    claim = Submitted(at(1), Decimal(0))
    other_claim = Submitted(at(2), Decimal(1))
    writes: list[tuple[str, OrderChange]] = [
        ("o-0", claim),
        ("o-1", claim),
        ("o-0", other_claim),  # same kind, same order: a later statement, which loses
        ("o-2", Withdrawn()),
        ("o-1", Expired(EXPIRED)),  # another kind, same order: loses
        ("o-3", claim),
        ("o-2", claim),  # loses to the withdrawal
        ("o-4", ClaimFailed(UNREACHABLE)),
        ("o-5", claim),
        ("o-3", executed(OrderStatus.FILLED)),  # after o-3's claim: applies over it
    ]
    sent.clear()

    results = await asyncio.gather(*(stores.orders.transition(i, c) for i, c in writes))

    applied = [result is not None for result in results]
    assert applied == [True, True, False, True, False, True, False, True, True, True]
    claimed_3 = _changed(order("o-3", fingerprint="fp-3"), claim)
    assert results[9] == _changed(claimed_3, executed(OrderStatus.FILLED))
    for (order_id, _), result in zip(writes, results, strict=True):
        if result is not None and order_id != "o-3":
            assert await stores.orders.get(order_id) == result
    assert await stores.orders.get("o-3") == results[9]
    # claims: o-0 o-1 o-3 o-5 together, then o-0 again and o-2 after its withdrawal
    assert len(sent.updates()) < len(writes)


async def test_a_lost_compare_and_set_in_a_merged_statement_loses_alone(
    stores: Stores, pg_pool: Pool
) -> None:
    interrupt = Interrupted(UNREACHABLE)  # leaves submitted only
    await stores.orders.add(order("o-queued"))
    for n in range(3):
        await stores.orders.add(order(f"o-{n}", status=OrderStatus.SUBMITTED))

    results = await asyncio.gather(
        *(stores.orders.transition(i, interrupt) for i in ("o-0", "o-queued", "o-1", "o-2"))
    )

    assert [r is not None for r in results] == [True, False, True, True]
    assert await stores.orders.get("o-queued") == order("o-queued")
    assert len(await _transactions(pg_pool, ["o-0", "o-1", "o-2"])) == 1


# --- adds ----------------------------------------------------------------------------------


async def test_concurrent_adds_are_one_statement_and_a_duplicate_refuses_only_itself(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    await stores.orders.add(order("stored", fingerprint="fp-old", created_at=MONTHS[1]))
    fresh = [
        order(f"o-{n}", user_id=f"user-{1 + n % 2}", fingerprint=f"fp-{n}", created_at=MONTHS[0])
        for n in range(6)
    ]
    dashboard = [order(f"d-{n}", fingerprint=None, created_at=MONTHS[n]) for n in range(2)]
    refused = [
        # the earlier order's fingerprint, from another month
        order("replay-of-old", fingerprint="fp-old", created_at=MONTHS[0]),
        # o-0's fingerprint in the same batch: o-0 sorts first and wins, as sent one by one
        order("replay-in-batch", fingerprint="fp-0", created_at=MONTHS[2]),
    ]
    # the same fingerprint for the other user is another order
    other_user = [order("o-other-user", user_id="user-2", fingerprint="fp-0")]
    records = [*fresh, *refused, *dashboard, *other_user]
    sent.clear()

    results = await asyncio.gather(*(stores.orders.add(r) for r in records), return_exceptions=True)

    outcome = {r.id: res for r, res in zip(records, results, strict=True)}
    assert {i for i, res in outcome.items() if res is not None} == {r.id for r in refused}
    assert all(isinstance(outcome[r.id], DuplicateOrder) for r in refused)
    added = [*fresh, *dashboard, *other_user]
    stored = await _rows(pg_pool)
    assert set(stored) == {"stored", *(r.id for r in added)}
    for record in added:
        assert await stores.orders.get(record.id) == record
    assert len(sent.inserts()) == 1
    assert len(await _transactions(pg_pool, [r.id for r in added])) == 1


async def test_an_add_whose_id_is_taken_fails_only_its_caller(
    stores: Stores, pg_pool: Pool
) -> None:
    taken = order("taken", fingerprint="fp-taken", created_at=MONTHS[1])
    await stores.orders.add(taken)
    records = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(3)]
    again = order("taken", fingerprint="fp-new", created_at=MONTHS[0])

    results = await asyncio.gather(
        *(stores.orders.add(r) for r in [*records, again]), return_exceptions=True
    )

    assert results[:-1] == [None] * len(records)
    assert isinstance(results[-1], psycopg.errors.UniqueViolation)
    assert set(await _rows(pg_pool)) == {"taken", *(r.id for r in records)}
    assert await stores.orders.get("taken") == taken
    # fp-new was not used: the refused order left no key row behind
    await stores.orders.add(order("o-new", fingerprint="fp-new"))


async def test_one_id_twice_in_a_batch_is_stored_once(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    """One id offered twice in a batch. With the second fingerprint already taken, the second
    is a duplicate (no error), and the order row is the first's alone, the batch still one
    statement. With two free fingerprints, the id is taken by the first and only the second
    caller fails (the batch written again one by one, in the batch's order, as before)."""
    await stores.orders.add(order("stored", fingerprint="fp-stored"))
    first = order("twice", fingerprint="fp-a", created_at=MONTHS[0])
    duplicate = order("twice", fingerprint="fp-stored", created_at=MONTHS[1])
    plain = order("plain", fingerprint="fp-plain")
    sent.clear()

    results = await asyncio.gather(
        *(stores.orders.add(r) for r in (duplicate, first, plain)), return_exceptions=True
    )

    assert isinstance(results[0], DuplicateOrder)
    assert results[1:] == [None, None]
    assert len(sent.inserts()) == 1
    assert set(await _rows(pg_pool)) == {"stored", "twice", "plain"}
    assert await stores.orders.get("twice") == first

    other = order("twice-2", fingerprint="fp-b")
    clash = order("twice-2", fingerprint="fp-c", request_id="req-clash")
    results = await asyncio.gather(
        *(stores.orders.add(r) for r in (other, clash)), return_exceptions=True
    )

    assert results[0] is None
    assert isinstance(results[1], psycopg.errors.UniqueViolation)
    assert await stores.orders.get("twice-2") == other


async def test_an_outage_fails_every_caller_of_a_merged_batch_and_writes_nothing(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    queued = [order(f"q-{n}", fingerprint=f"fp-q-{n}") for n in range(3)]
    for record in queued:
        await stores.orders.add(record)
    records = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(4)]
    claim = Submitted(at(1), Decimal(0))
    # Sorted after every write (its lock key): the connection dies after the merged insert
    # and update ran inside the batch's transaction, before its commit.
    cut = Statement("SELECT pg_terminate_backend(pg_backend_pid())", None, ("~cut",))
    sent.clear()

    def writes() -> list[Coroutine[Any, Any, Any]]:
        return [
            *(stores.orders.add(r) for r in records),
            *(stores.orders.transition(q.id, claim) for q in queued),
        ]

    results = await asyncio.gather(
        *writes(), shared_batcher(pg_pool).run(cut), return_exceptions=True
    )

    assert all(isinstance(r, DatabaseUnavailable) for r in results), results
    assert (len(sent.inserts()), len(sent.updates())) == (1, 1)
    assert set(await _rows(pg_pool)) == {q.id for q in queued}
    for record in queued:
        assert await stores.orders.get(record.id) == record
    # The same writes go through afterwards.
    assert await asyncio.gather(*writes()) == [None] * len(records) + [
        _changed(q, claim) for q in queued
    ]


# --- the column types ----------------------------------------------------------------------


async def test_the_merged_values_are_cast_to_the_columns_types(pg_pool: Pool) -> None:
    rows = await fetch_all(
        pg_pool,
        "SELECT attname AS name, format_type(atttypid, atttypmod) AS type FROM pg_attribute"
        " WHERE attrelid = 'order_history'::regclass AND attnum > 0 AND NOT attisdropped",
    )
    assert {r["name"]: r["type"] for r in rows} == dict(ORDER_COLUMN_TYPES)
    assert set(ORDER_COLUMN_TYPES) == {f.name for f in attrs.fields(OrderHistoryRecord)}


# --- document saves (the paper books) ---------------------------------------------------------


async def test_concurrent_saves_are_one_statement_and_each_stores_its_documents(
    pg_pool: Pool, sent: Sent
) -> None:
    documents = PostgresDocumentStore(pg_pool)
    await documents.save("book-0", {"cash": "1"})  # replaced below
    sent.clear()
    saves = [
        {f"book-{n}": {"cash": str(n)}, f"book-{n}:order:c{n}": {"filled": n}} for n in range(6)
    ]

    await asyncio.gather(*(documents.save_many(d) for d in saves))

    assert len(sent.document_saves()) == 1
    for save in saves:
        for name, body in save.items():
            assert await documents.load(name) == body


async def test_saves_sharing_a_name_are_written_one_by_one_and_the_last_wins(
    pg_pool: Pool, sent: Sent
) -> None:
    # Different first names (lock keys), so the batcher merges them; the shared second name
    # makes the merged upsert fail, and the batch is written again one save at a time.
    documents = PostgresDocumentStore(pg_pool)
    sent.clear()

    await asyncio.gather(
        documents.save_many({"a-book": {"n": 1}, "shared": {"by": "a"}}),
        documents.save_many({"b-book": {"n": 2}, "shared": {"by": "b"}}),
    )

    assert len(sent.document_saves()) == 3  # the merged one, then each alone
    assert await documents.load("a-book") == {"n": 1}
    assert await documents.load("b-book") == {"n": 2}
    assert await documents.load("shared") == {"by": "b"}


# --- transitions that save documents (``SavesWithOrder``) -----------------------------------


def _book(n: int) -> dict[str, dict[str, Any]]:
    """What a paper placement of order ``o-{n}`` saves: its order and its account's book."""
    return {f"paper:live:acct-{n}": {"cash": str(n)}, f"paper:live:acct-{n}:order:o-{n}": {"n": n}}


async def _claimed(stores: Stores, records: list[OrderHistoryRecord]) -> PostgresOrderHistory:
    """The orders of ``records`` added and claimed: their executions' saves keep nothing
    back, whichever write takes."""
    orders = stores.orders
    assert isinstance(orders, PostgresOrderHistory)
    for record in records:
        await orders.add(record)
        assert await orders.transition(record.id, Submitted(at(1), Decimal("0.5"))) is not None
    return orders


async def test_transitions_saving_documents_are_one_statement_with_their_saves(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    records = [order(f"o-{n}", created_at=MONTHS[n % len(MONTHS)]) for n in range(6)]
    plain = [order(f"p-{n}") for n in range(2)]  # transitions of the same kind, no documents
    orders = await _claimed(stores, [*records, *plain])
    saved: list[int] = []
    for n in range(6):
        orders.save_with_order(
            f"o-{n}", lambda n=n: _book(n), lambda n=n: saved.append(n), lambda: None
        )
    done = executed(OrderStatus.FILLED)
    sent.clear()

    results = await asyncio.gather(*(orders.transition(r.id, done) for r in [*records, *plain]))

    assert all(r is not None and r.status is OrderStatus.FILLED for r in results)
    [merged] = sent.transitions_with_documents()
    assert "FROM (VALUES" in merged
    assert len(sent.updates()) == 1  # the plain ones, merged on their own
    assert sorted(saved) == list(range(6))
    documents = PostgresDocumentStore(pg_pool)
    for n in range(6):
        for name, body in _book(n).items():
            assert await documents.load(name) == body
    ids = [r.id for r in [*records, *plain]]
    assert len(await _transactions(pg_pool, ids)) == 1


async def test_unclaimed_executions_keep_only_the_documents_of_those_that_take(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    """One statement for the batch's unclaimed executions; two of its orders were withdrawn
    first, and only their placements are discarded."""
    records = [order(f"o-{n}", created_at=MONTHS[n % len(MONTHS)]) for n in range(6)]
    for record in records:
        await stores.orders.add(record)
    orders = stores.orders
    assert isinstance(orders, PostgresOrderHistory)
    for withdrawn in ("o-1", "o-4"):
        assert await orders.transition(withdrawn, Withdrawn()) is not None
    told: list[tuple[str, int]] = []
    for n in range(6):
        orders.save_with_order(
            f"o-{n}",
            lambda n=n: _book(n),
            lambda n=n: told.append(("saved", n)),
            lambda n=n: told.append(("discarded", n)),
        )
    change = ClaimedAndExecuted(Submitted(at(1), Decimal(0)), executed(OrderStatus.FILLED))
    sent.clear()

    results = await asyncio.gather(*(orders.transition(r.id, change) for r in records))

    taken = [n for n in range(6) if n not in (1, 4)]
    assert [r is not None for r in results] == [n in taken for n in range(6)]
    [merged] = sent.transitions_with_documents()
    assert "FROM (VALUES" in merged
    assert sorted(told) == sorted(
        [("saved", n) for n in taken] + [("discarded", 1), ("discarded", 4)]
    )
    documents = PostgresDocumentStore(pg_pool)
    for n in range(6):
        for name, body in _book(n).items():
            assert await documents.load(name) == (body if n in taken else None)
    assert len(await _transactions(pg_pool, [f"o-{n}" for n in taken])) == 1


async def test_two_transitions_saving_one_document_are_written_one_by_one(
    stores: Stores, pg_pool: Pool, sent: Sent
) -> None:
    """Two orders of one book in one batch (two hosts serving one account for a moment): the
    merged upsert would write the book twice, so the batch is written again one statement at
    a time, in ``lock_key`` order; each order's transition and documents are written once."""
    orders = await _claimed(stores, [order(f"o-{n}") for n in range(2)])
    for n in range(2):
        orders.save_with_order(
            f"o-{n}", lambda n=n: {"paper:live:acct-1": {"by": n}}, lambda: None, lambda: None
        )
    done = executed(OrderStatus.FILLED)
    sent.clear()

    results = await asyncio.gather(*(orders.transition(f"o-{n}", done) for n in range(2)))

    assert all(r is not None and r.status is OrderStatus.FILLED for r in results)
    assert len(sent.transitions_with_documents()) == 3  # the merged one, then each alone
    assert await PostgresDocumentStore(pg_pool).load("paper:live:acct-1") == {"by": 1}
