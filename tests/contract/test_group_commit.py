"""Group commit (``tradecore_adapters.postgres.group_commit``) and the order history on it.

The mechanism alone (``GroupCommit`` with a recording writer): an idle batcher writes at once,
a busy one gathers what arrives, results and failures are per item, a cancelled caller's item
is still written. On Postgres (``PostgresOrderHistory``): concurrent adds and transitions share
one commit, a duplicate fingerprint refuses only its own order, an outage inside a batch fails
every caller of that batch and leaves none of its rows behind. Merged statements
(``Merge``, ``plan_batch``): which statements of a batch are sent as one, in what order, and
on Postgres that a merged statement answers each caller, falls back to one statement at a
time when refused, and fails every caller without writing again when its results cannot be
split after the commit (the order history's merges: test_merged_writes.py).

"One commit" is read from the rows themselves: every row version carries the id of the
transaction that wrote it (``xmin``), so rows of one batch share exactly one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from postgres_fixtures import session_ended
from test_repositories import order, postgres_stores, two_users_with_accounts

from tradecore.errors import DatabaseUnavailable, DuplicateOrder
from tradecore.order_lifecycle import Submitted
from tradecore.orders import OrderStatus
from tradecore_adapters.postgres import Pool, open_pool
from tradecore_adapters.postgres.group_commit import (
    GroupCommit,
    Merge,
    Statement,
    StatementBatcher,
    StatementResult,
    plan_batch,
    shared_batcher,
)
from tradecore_adapters.postgres.rows import fetch_all

# A bound on a hang, not a measurement: every wait below ends long before it when correct.
HANG_GUARD_S = 60.0


class Writer:
    """A ``write`` that records its batches; ``gate`` (when given) holds each write until set;
    ``fail`` maps an item to the exception its batch raises."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.gate = gate
        self.fail: dict[int, Exception] = {}
        self._started = asyncio.Condition()

    async def started(self, count: int) -> None:
        """Wait until ``count`` batches have been handed to the writer."""
        async with self._started:
            await self._started.wait_for(lambda: len(self.batches) >= count)

    async def __call__(self, items: list[int]) -> Sequence[str]:
        self.batches.append(list(items))
        async with self._started:
            self._started.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        for item in items:
            if item in self.fail:
                raise self.fail[item]
        return [f"done-{i}" for i in items]


async def test_an_idle_batcher_writes_a_lone_item_at_once() -> None:
    writer = Writer()
    # An hour's linger: were a lone item made to wait for company, this test would hang.
    group: GroupCommit[int, str] = GroupCommit(writer, linger_s=3600.0)
    async with asyncio.timeout(HANG_GUARD_S):
        assert await group.submit(1) == "done-1"
    assert writer.batches == [[1]]


async def test_items_arriving_while_a_batch_is_written_go_together_in_the_next() -> None:
    gate = asyncio.Event()
    writer = Writer(gate)
    group: GroupCommit[int, str] = GroupCommit(writer, max_in_flight=1, linger_s=0.0)
    async with asyncio.timeout(HANG_GUARD_S):
        first = asyncio.ensure_future(group.submit(0))
        await writer.started(1)  # the first batch is being written (held by the gate)
        rest = [asyncio.ensure_future(group.submit(i)) for i in range(1, 6)]
        await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(first, *rest)
    assert writer.batches == [[0], [1, 2, 3, 4, 5]]
    assert results == [f"done-{i}" for i in range(6)]


async def test_a_busy_batcher_lingers_until_the_batch_fills() -> None:
    gate = asyncio.Event()
    writer = Writer(gate)
    group: GroupCommit[int, str] = GroupCommit(
        writer, max_batch=3, max_in_flight=2, linger_s=3600.0
    )
    async with asyncio.timeout(HANG_GUARD_S):
        first = asyncio.ensure_future(group.submit(0))
        await writer.started(1)
        # A slot is free, but a batch is in flight: the next one waits to fill (3 items),
        # not an hour.
        rest = [asyncio.ensure_future(group.submit(i)) for i in (1, 2, 3)]
        await writer.started(2)
        gate.set()
        await asyncio.gather(first, *rest)
    assert writer.batches == [[0], [1, 2, 3]]


async def test_an_outage_fails_every_item_of_the_batch() -> None:
    writer = Writer()
    writer.fail[2] = DatabaseUnavailable("database unavailable: OperationalError")
    group: GroupCommit[int, str] = GroupCommit(writer)
    results = await asyncio.gather(*(group.submit(i) for i in (1, 2, 3)), return_exceptions=True)
    assert all(isinstance(r, DatabaseUnavailable) for r in results)
    assert writer.batches == [[1, 2, 3]]  # not retried item by item


async def test_another_error_fails_only_its_own_item() -> None:
    writer = Writer()
    writer.fail[2] = ValueError("refused")
    group: GroupCommit[int, str] = GroupCommit(writer)
    results = await asyncio.gather(*(group.submit(i) for i in (1, 2, 3)), return_exceptions=True)
    assert results[0] == "done-1"
    assert isinstance(results[1], ValueError)
    assert results[2] == "done-3"
    assert writer.batches == [[1, 2, 3], [1], [2], [3]]


async def test_a_cancelled_caller_does_not_withdraw_its_item() -> None:
    gate = asyncio.Event()
    writer = Writer(gate)
    group: GroupCommit[int, str] = GroupCommit(writer, max_in_flight=1)
    async with asyncio.timeout(HANG_GUARD_S):
        first = asyncio.ensure_future(group.submit(0))
        await writer.started(1)
        cancelled = asyncio.ensure_future(group.submit(1))
        await asyncio.sleep(0)
        cancelled.cancel()
        gate.set()
        await first
        await writer.started(2)
    assert writer.batches == [[0], [1]]


def test_nonsense_settings_are_refused() -> None:
    writer = Writer()
    with pytest.raises(ValueError, match="max_batch"):
        GroupCommit(writer, max_batch=0)
    with pytest.raises(ValueError, match="max_batch"):
        GroupCommit(writer, linger_s=-1.0)


# --- merged statements: how a batch is sent -------------------------------------------------


def _never(*_: object) -> Any:
    raise AssertionError("plan_batch only groups statements")


KIND_A = Merge(("a",), _never, _never)
KIND_B = Merge(("b",), _never, _never)


def _statement(row: str, merge: Merge | None) -> Statement:
    return Statement(f"-- {row}", None, ("t", row), merge)


def test_without_merges_a_batch_is_sent_one_statement_at_a_time_in_lock_key_order() -> None:
    statements = [_statement(row, None) for row in ("c", "a", "b", "a")]
    # the two statements of row a in the order they came
    assert plan_batch(statements) == [[1], [3], [2], [0]]


def test_statements_of_one_kind_are_merged_and_one_row_written_twice_is_not() -> None:
    statements = [
        _statement("d", KIND_A),  # 0
        _statement("b", KIND_A),  # 1
        _statement("c", KIND_B),  # 2
        _statement("b", KIND_A),  # 3: row b again, same kind: a later statement
        _statement("a", None),  # 4: no merge: alone
        _statement("c", KIND_A),  # 5: after 2 (row c), so not with 1
        _statement("e", KIND_B),  # 6
        _statement("b", KIND_B),  # 7: row b a third time, after 3
    ]
    # Taken in lock key order: a4 b1 b3 b7 c2 c5 d0 e6; groups in the order they start.
    assert plan_batch(statements) == [[4], [1], [3], [7, 2, 6], [5, 0]]


def test_a_batch_of_distinct_rows_is_one_statement_per_kind() -> None:
    statements = [_statement(row, KIND_A if row < "m" else KIND_B) for row in "zkmacb"]
    assert plan_batch(statements) == [[3, 5, 4, 1], [2, 0]]


# --- on Postgres ---------------------------------------------------------------------------


async def _transactions_of(pool: Pool, order_ids: Sequence[str]) -> set[str]:
    """The ids of the transactions that wrote the current versions of these rows."""
    rows = await fetch_all(
        pool,
        "SELECT xmin::text AS xid FROM order_history WHERE id = ANY(%s)",
        (list(order_ids),),
    )
    return {str(r["xid"]) for r in rows}


async def _stored_ids(pool: Pool) -> set[str]:
    return {str(r["id"]) for r in await fetch_all(pool, "SELECT id FROM order_history")}


@pytest.mark.postgres
async def test_concurrent_adds_commit_once_and_a_duplicate_refuses_only_itself(
    pg_pool: Pool,
) -> None:
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    await stores.orders.add(order("stored", fingerprint="fp-stored"))
    records = [
        order(f"o-{n}", user_id=f"user-{1 + n % 2}", fingerprint=f"fp-{n}") for n in range(10)
    ]
    records.append(order("replay-of-stored", fingerprint="fp-stored"))
    # Two adds of one fingerprint in the same batch: the first in the batch wins.
    records.append(order("replay-in-batch", user_id="user-1", fingerprint="fp-0"))

    results = await asyncio.gather(*(stores.orders.add(r) for r in records), return_exceptions=True)

    refused = {r.id for r, res in zip(records, results, strict=True) if res is not None}
    assert refused == {"replay-of-stored", "replay-in-batch"}
    assert all(isinstance(res, DuplicateOrder) for res in results if res is not None)
    added = [f"o-{n}" for n in range(10)]
    assert await _stored_ids(pg_pool) == {"stored", *added}
    assert len(await _transactions_of(pg_pool, added)) == 1  # ten orders, one commit


@pytest.mark.postgres
async def test_concurrent_transitions_commit_once_and_a_lost_race_loses_alone(
    pg_pool: Pool,
) -> None:
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    ids = [f"o-{n}" for n in range(8)]
    for order_id in ids:
        await stores.orders.add(order(order_id))
    await stores.orders.add(order("settled", status=OrderStatus.FILLED))
    claim = Submitted(order("x").created_at, None)

    results = await asyncio.gather(*(stores.orders.transition(i, claim) for i in [*ids, "settled"]))

    assert [r is not None and r.status is OrderStatus.SUBMITTED for r in results[:-1]] == [
        True
    ] * len(ids)
    assert results[-1] is None  # not queued: the compare-and-set found nothing to change
    assert len(await _transactions_of(pg_pool, ids)) == 1


@pytest.mark.postgres
async def test_an_outage_inside_a_batch_fails_every_caller_and_writes_nothing(
    pg_pool: Pool,
) -> None:
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    records = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(5)]
    # Ordered after the inserts (its lock key sorts last): the connection dies after they ran
    # inside the batch's transaction, before its commit.
    cut = Statement("SELECT pg_terminate_backend(pg_backend_pid())", None, ("~cut",))

    results = await asyncio.gather(
        *(stores.orders.add(r) for r in records),
        shared_batcher(pg_pool).run(cut),
        return_exceptions=True,
    )

    assert all(isinstance(r, DatabaseUnavailable) for r in results)
    assert await _stored_ids(pg_pool) == set()
    # The pool replaced the lost connection: the same orders go through afterwards.
    await asyncio.gather(*(stores.orders.add(r) for r in records))
    assert await _stored_ids(pg_pool) == {r.id for r in records}


@pytest.mark.postgres
async def test_a_statement_the_database_refuses_fails_only_its_own_order(pg_pool: Pool) -> None:
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    records = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(4)]
    orphan = order("orphan", user_id="nobody")  # no such user: a foreign-key violation

    results = await asyncio.gather(
        *(stores.orders.add(r) for r in [*records, orphan]), return_exceptions=True
    )

    assert results[:-1] == [None] * len(records)
    assert isinstance(results[-1], Exception)
    assert not isinstance(results[-1], DatabaseUnavailable | DuplicateOrder)
    assert await _stored_ids(pg_pool) == {r.id for r in records}


@pytest.mark.postgres
async def test_a_batch_the_server_aborts_is_written_again_statement_by_statement(
    pg_pool: Pool,
) -> None:
    """A transaction the server aborts (here a serialization failure raised on purpose, as a
    deadlock would) fails only the statement that cannot run alone; the others commit."""
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    records = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(3)]
    abort = Statement(
        "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$",
        None,
        ("~abort",),
    )

    results = await asyncio.gather(
        *(stores.orders.add(r) for r in records),
        shared_batcher(pg_pool).run(abort),
        return_exceptions=True,
    )

    assert results[:-1] == [None] * len(records)
    assert isinstance(results[-1], DatabaseUnavailable)
    stored = [r.id for r in records]
    assert await _stored_ids(pg_pool) == set(stored)
    assert len(await _transactions_of(pg_pool, stored)) == len(stored)  # one by one


class KeyInserts:
    """A merge of single-row inserts into ``order_keys`` (a table without foreign keys):
    records the batches it merged; ``fail_split`` makes its split fail."""

    def __init__(self, *, fail_split: bool = False) -> None:
        self.merged: list[list[str]] = []
        self.fail_split = fail_split
        self.merge = Merge(("test:key-insert",), self._combine, self._split)

    def statement(self, order_id: str) -> Statement:
        return Statement(
            "INSERT INTO order_keys (id, user_id, created_at) VALUES (%s, 'u', now()) RETURNING id",
            [order_id],
            ("order_keys", order_id),
            self.merge,
        )

    @staticmethod
    def _id(statement: Statement) -> str:
        assert isinstance(statement.params, list)
        return str(statement.params[0])

    def _combine(self, statements: Sequence[Statement]) -> tuple[str, list[Any]]:
        ids = [self._id(s) for s in statements]
        self.merged.append(ids)
        rows = ", ".join(f"(${n}, 'u', now())" for n in range(1, len(ids) + 1))
        return f"INSERT INTO order_keys (id, user_id, created_at) VALUES {rows} RETURNING id", ids

    def _split(
        self, statements: Sequence[Statement], result: StatementResult
    ) -> list[StatementResult]:
        if self.fail_split:
            raise KeyError("a split that fails")
        inserted = {row["id"] for row in result.rows}
        ids = [self._id(s) for s in statements]
        return [
            StatementResult([{"id": i}], 1) if i in inserted else StatementResult([], 0)
            for i in ids
        ]


async def _keys(pool: Pool) -> dict[str, str]:
    """Every order_keys row: its id and the transaction that wrote it."""
    rows = await fetch_all(pool, "SELECT id, xmin::text AS xid FROM order_keys")
    return {str(r["id"]): str(r["xid"]) for r in rows}


@pytest.mark.postgres
async def test_a_batch_of_one_kind_is_one_statement_and_each_caller_gets_its_own_result(
    pg_pool: Pool,
) -> None:
    inserts = KeyInserts()
    batcher = shared_batcher(pg_pool)
    ids = [f"k-{n}" for n in (3, 1, 2, 0)]

    results = await asyncio.gather(*(batcher.run(inserts.statement(i)) for i in ids))

    assert inserts.merged == [["k-0", "k-1", "k-2", "k-3"]]  # one statement, lock key order
    assert [r.rows for r in results] == [[{"id": i}] for i in ids]
    assert [r.rowcount for r in results] == [1] * len(ids)
    keys = await _keys(pg_pool)
    assert set(keys) == set(ids)
    assert len(set(keys.values())) == 1


@pytest.mark.postgres
async def test_a_batch_of_several_statements_commits_once_or_not_at_all(pg_pool: Pool) -> None:
    """Unmerged statements of one batch go in one pipeline without BEGIN and COMMIT: the
    pipeline's implicit transaction holds them all (one transaction id), and a statement that
    fails takes the others' writes back with it before the batch is written again one
    statement at a time (each written once)."""
    batcher = shared_batcher(pg_pool)

    def insert(order_id: str, *, fail: bool = False) -> Statement:
        # ``1 / 0`` fails at run time, after the statements before it in the batch ran
        check = "1 / 0" if fail else "1"
        return Statement(
            "INSERT INTO order_keys (id, user_id, created_at)"
            f" SELECT %s, 'u', now() WHERE {check} = 1 RETURNING id",
            [order_id],
            ("order_keys", order_id),
        )

    await asyncio.gather(*(batcher.run(insert(i)) for i in ("a-1", "a-2", "a-3")))
    keys = await _keys(pg_pool)
    assert set(keys) == {"a-1", "a-2", "a-3"}
    assert len(set(keys.values())) == 1, "one transaction for the batch"

    results = await asyncio.gather(
        batcher.run(insert("b-1")),
        batcher.run(insert("b-2", fail=True)),  # sorts between the two others
        batcher.run(insert("b-3")),
        return_exceptions=True,
    )
    assert [type(r).__name__ for r in results] == [
        "StatementResult",
        "DivisionByZero",
        "StatementResult",
    ]
    keys = await _keys(pg_pool)
    assert set(keys) == {"a-1", "a-2", "a-3", "b-1", "b-3"}
    assert keys["b-1"] != keys["b-3"], "written again one statement at a time"


@pytest.mark.postgres
async def test_a_merged_statement_the_database_refuses_is_written_again_one_at_a_time(
    pg_pool: Pool,
) -> None:
    inserts = KeyInserts()
    batcher = shared_batcher(pg_pool)
    await batcher.run(inserts.statement("k-taken"))  # alone: not merged
    assert inserts.merged == []

    ids = ["k-0", "k-taken", "k-1"]
    results = await asyncio.gather(
        *(batcher.run(inserts.statement(i)) for i in ids), return_exceptions=True
    )

    assert inserts.merged == [["k-0", "k-1", "k-taken"]]  # then each alone, unmerged
    first, taken, second = results
    assert isinstance(taken, psycopg.errors.UniqueViolation)
    assert isinstance(first, StatementResult) and first.rows == [{"id": "k-0"}]
    assert isinstance(second, StatementResult) and second.rows == [{"id": "k-1"}]
    keys = await _keys(pg_pool)
    assert set(keys) == {"k-taken", "k-0", "k-1"}
    assert keys["k-0"] != keys["k-1"]


@pytest.mark.postgres
async def test_a_split_that_fails_after_the_commit_fails_every_caller_and_writes_once(
    pg_pool: Pool,
) -> None:
    """Written again, each insert would find its own row (a primary key violation), as a
    transition would find its own change: the callers get ``DatabaseUnavailable``, the batch
    stays committed once."""
    inserts = KeyInserts(fail_split=True)
    batcher = shared_batcher(pg_pool)
    ids = ["k-0", "k-1", "k-2"]

    results = await asyncio.gather(
        *(batcher.run(inserts.statement(i)) for i in ids), return_exceptions=True
    )

    assert all(isinstance(r, DatabaseUnavailable) for r in results), results
    assert inserts.merged == [ids]
    keys = await _keys(pg_pool)
    assert set(keys) == set(ids)
    assert len(set(keys.values())) == 1


# --- the connection a batcher holds between batches ------------------------------------------

_PID = Statement("SELECT pg_backend_pid() AS pid", None, ("~pid",))


async def _pid(batcher: StatementBatcher) -> int:
    return int((await batcher.run(_PID)).rows[0]["pid"])


@pytest.mark.postgres
async def test_a_batcher_writes_on_one_connection_and_gives_it_back_when_the_pool_closes(
    pg_conninfo: str, pg_pool: Pool
) -> None:
    pool = await open_pool(pg_conninfo, min_size=1, max_size=4, timeout_s=5.0)
    batcher = StatementBatcher(pool)
    first = await _pid(batcher)
    async with pool.connection() as conn:  # other work takes another connection meanwhile
        cursor = await conn.execute("SELECT pg_backend_pid()")
        other = await cursor.fetchone()
    second = await _pid(batcher)

    await pool.close()

    assert first == second and other is not None and other[0] != first
    assert await session_ended(pg_pool, first)


@pytest.mark.postgres
async def test_a_held_connection_the_server_ended_is_replaced_before_the_next_batch(
    pg_pool: Pool,
) -> None:
    batcher = StatementBatcher(pg_pool)
    first = await _pid(batcher)
    await fetch_all(pg_pool, "SELECT pg_terminate_backend(%s)", (first,))
    assert await session_ended(pg_pool, first)

    second = await _pid(batcher)  # not an outage: the batcher saw its connection had ended

    assert second != first


@pytest.mark.postgres
async def test_writers_never_keep_the_connections_a_small_pool_needs_for_the_rest(
    pg_conninfo: str,
) -> None:
    """A pool lets writers keep one connection in four (``KEPT_SHARE``): with two, none."""
    pool = await open_pool(pg_conninfo, min_size=1, max_size=2, timeout_s=1.0)
    try:
        writers = [StatementBatcher(pool) for _ in range(2)]
        for writer in writers:
            await _pid(writer)

        rows = await fetch_all(pool, "SELECT 1 AS one")  # a read still gets a connection

        assert rows == [{"one": 1}]
    finally:
        await pool.close()
