"""Group commit: many callers' writes made durable by one commit.

``GroupCommit`` is the mechanism: callers ``submit`` an item and wait; a drainer hands the
items that are waiting to a ``write`` function as one batch, and each caller gets its own
item's result. It knows nothing of SQL.

* **No delay when idle.** An item submitted while no batch is being written starts a batch at
  once. While ``max_in_flight`` batches are being written (by default one), new items wait
  for a free slot and then go together, up to ``max_batch``. With more than one in flight,
  a slot that frees while another batch is still being written makes the drainer linger up
  to ``linger_s`` (or until ``max_batch`` items wait) so the next batch is a full one. The
  waiting is therefore bounded by one batch's write plus ``linger_s``.
* **Per item, never all-or-nothing for unrelated callers.** ``write`` returns one result per
  item (a refusal of one item, such as a duplicate, is a result, not an exception). A
  ``DatabaseUnavailable`` fails every item of the batch with that error (the batch was not
  committed, or its outcome is unknown, exactly as for a single statement). Any other
  exception is taken as one item's fault: the batch is written again one item at a time, so
  only the faulty item's caller gets the exception.
* **Durable before answered.** A caller's result is set only after ``write`` returned, that
  is after its commit. A caller cancelled while waiting does not withdraw its item: it is
  written all the same.

``StatementBatcher`` applies it to SQL on a pool: each statement of a batch runs in one
transaction sent in pipeline mode (one round trip, one commit). Statements are run in the
order of their ``lock_key``, so two processes' batches take row locks in the same order and
cannot deadlock each other; should the server still abort the transaction (a deadlock or
serialization failure), the batch is retried one statement at a time. ``shared_batcher``
gives every adapter on a pool the same batcher, so an order's claim of one user and another
user's result share a commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import attrs
import psycopg
from psycopg.abc import Params, QueryNoTemplate
from psycopg.rows import dict_row

from tradecore.errors import DatabaseUnavailable
from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.postgres.pool import Pool

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 128
"""Most statements in one transaction by default."""
MAX_IN_FLIGHT = 1
"""Most batches being written at the same time by default (each holds a pooled connection).
One: what arrives during a commit waits for it and goes in the next batch, so the wait is
bounded by one commit (measured best on the real-mode bench: docs/performance.md, "Group
commit (issue 13)")."""
LINGER_S = 0.0
"""Longest the drainer waits for a batch to fill while another batch is in flight (only
with ``max_in_flight`` above one; 1 ms measured slower than none)."""


@attrs.define
class _Waiter(Generic[T, R]):
    item: T
    done: asyncio.Future[R]


def _fail(waiter: _Waiter[Any, Any], error: BaseException) -> None:
    if not waiter.done.done():
        waiter.done.set_exception(error)


def _resolve(waiter: _Waiter[Any, R], result: R) -> None:
    if not waiter.done.done():
        waiter.done.set_result(result)


class GroupCommit(Generic[T, R]):
    """Batches of ``T`` written by ``write`` (one ``R`` per item, in order); see the module
    doc for the rules."""

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = MAX_BATCH,
        max_in_flight: int = MAX_IN_FLIGHT,
        linger_s: float = LINGER_S,
        name: str = "group-commit",
    ) -> None:
        if max_batch < 1 or max_in_flight < 1 or linger_s < 0:
            raise ValueError("max_batch and max_in_flight must be >= 1, linger_s >= 0")
        self._write = write
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._linger_s = linger_s
        self._name = name
        self._pending: list[_Waiter[T, R]] = []
        self._filled = asyncio.Event()
        self._drainer: asyncio.Task[None] | None = None
        self._writers: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()

    async def submit(self, item: T) -> R:
        """Write ``item`` with whatever else is waiting; its result once committed."""
        waiter: _Waiter[T, R] = _Waiter(item, asyncio.get_running_loop().create_future())
        self._pending.append(waiter)
        if len(self._pending) >= self._max_batch:
            self._filled.set()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name=self._name)
        return await waiter.done

    async def _drain(self) -> None:
        try:
            while self._pending:
                while len(self._writers) >= self._max_in_flight:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                if self._writers and self._linger_s > 0:
                    await self._linger()
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                if len(self._pending) < self._max_batch:
                    self._filled.clear()
                writer = asyncio.create_task(self._settle(batch), name=f"{self._name}-write")
                self._writers.add(writer)
                writer.add_done_callback(self._writer_done)
        except BaseException:  # cancelled (shutdown): nobody is left to write the rest
            for waiter in self._pending:
                waiter.done.cancel()
            self._pending = []
            raise

    def _writer_done(self, writer: asyncio.Task[None]) -> None:
        self._writers.discard(writer)
        self._slot_freed.set()

    async def _linger(self) -> None:
        """Wait until ``max_batch`` items wait, or ``linger_s`` has passed."""
        if len(self._pending) >= self._max_batch:
            return
        self._filled.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._linger_s):
                await self._filled.wait()

    async def _settle(self, batch: list[_Waiter[T, R]]) -> None:
        """Write ``batch`` and resolve each waiter (the module doc's rules)."""
        try:
            results = await self._write([w.item for w in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self._name}: {len(results)} results for {len(batch)}")
        except DatabaseUnavailable as e:
            for waiter in batch:
                _fail(waiter, e)
            return
        except Exception as e:
            if len(batch) == 1:
                _fail(batch[0], e)
                return
            for waiter in batch:
                await self._settle([waiter])
            return
        except BaseException:
            for waiter in batch:
                waiter.done.cancel()
            raise
        for waiter, result in zip(batch, results, strict=True):
            _resolve(waiter, result)


@attrs.frozen
class Statement:
    """One SQL statement of a batch. ``lock_key`` orders the statements of a batch (and so
    the row locks they take): use the table and the key of the row the statement writes."""

    query: QueryNoTemplate
    params: Params | None
    lock_key: tuple[str, ...]


@attrs.frozen
class StatementResult:
    """What one statement returned: its rows (empty without a result set) and row count."""

    rows: list[dict[str, Any]]
    rowcount: int


class BatchAborted(Exception):
    """The server aborted a batch's transaction (deadlock, serialization failure): the batch
    is written again one statement at a time."""


class StatementBatcher:
    """Statements on ``pool`` written by group commit (module doc)."""

    def __init__(
        self,
        pool: Pool,
        *,
        max_batch: int = MAX_BATCH,
        max_in_flight: int = MAX_IN_FLIGHT,
        linger_s: float = LINGER_S,
    ) -> None:
        # A weak reference: the batcher is kept per pool (``shared_batcher``) and must not
        # keep a closed pool alive.
        self._pool = weakref.ref(pool)
        self._group: GroupCommit[Statement, StatementResult] = GroupCommit(
            self._write,
            max_batch=max_batch,
            max_in_flight=max_in_flight,
            linger_s=linger_s,
            name="postgres-group-commit",
        )

    async def run(self, statement: Statement) -> StatementResult:
        """Run ``statement`` in the next batch; its result once the batch is committed.
        Raises ``DatabaseUnavailable`` when the batch could not be committed."""
        return await self._group.submit(statement)

    async def _write(self, statements: list[Statement]) -> list[StatementResult]:
        pool = self._pool()
        if pool is None:
            raise DatabaseUnavailable("database unavailable: the pool is gone")
        with database_errors():
            async with pool.connection() as conn:
                if len(statements) == 1:  # autocommit: no BEGIN and COMMIT to send
                    return [await _execute(conn, statements[0])]
                try:
                    return await _execute_in_one_transaction(conn, statements)
                except psycopg.Error as e:
                    # Class 40 (transaction rollback: serialization failure, deadlock). psycopg's
                    # classes for 40001 and 40P01 do not derive from TransactionRollback, so
                    # the SQLSTATE decides.
                    if (e.sqlstate or "").startswith("40"):
                        raise BatchAborted(str(e)) from e
                    raise


async def _execute(conn: psycopg.AsyncConnection[Any], statement: Statement) -> StatementResult:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement.query, statement.params)
        rows = await cur.fetchall() if cur.description is not None else []
        return StatementResult(rows, cur.rowcount)


async def _execute_in_one_transaction(
    conn: psycopg.AsyncConnection[Any], statements: list[Statement]
) -> list[StatementResult]:
    """Every statement in one transaction, in ``lock_key`` order, sent as one pipeline; the
    results in the order of ``statements``, once committed."""
    order = sorted(range(len(statements)), key=lambda i: statements[i].lock_key)
    cursors: dict[int, psycopg.AsyncCursor[dict[str, Any]]] = {}
    try:
        async with conn.pipeline(), conn.transaction():
            for i in order:
                cursor = conn.cursor(row_factory=dict_row)
                cursors[i] = cursor
                await cursor.execute(statements[i].query, statements[i].params)
        results = []
        for i in range(len(statements)):
            cursor = cursors[i]
            rows = await cursor.fetchall() if cursor.description is not None else []
            results.append(StatementResult(rows, cursor.rowcount))
        return results
    finally:
        for cursor in cursors.values():
            await cursor.close()


_SHARED: weakref.WeakKeyDictionary[Pool, StatementBatcher] = weakref.WeakKeyDictionary()


def shared_batcher(pool: Pool) -> StatementBatcher:
    """The batcher every adapter on ``pool`` shares (created on first use)."""
    batcher = _SHARED.get(pool)
    if batcher is None:
        batcher = _SHARED[pool] = StatementBatcher(pool)
    return batcher
