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

``StatementBatcher`` applies it to SQL on a pool: the statements of a batch run in one
transaction sent in pipeline mode (one round trip, one commit; the implicit transaction of
the pipeline's one Sync, ``_atomically``). Statements are run in the
order of their ``lock_key``, so two processes' batches take row locks in the same order;
should the server still abort the transaction (a deadlock or serialization failure), the
batch is retried one statement at a time. ``shared_batcher`` gives every adapter on a pool
the same batcher, so an order's claim of one user and another user's result share a commit.

* **Merged statements.** A statement may carry a ``Merge``: statements of a batch whose
  merges have the same ``key`` are sent as ONE statement (say one multi-row UPDATE for many
  orders' claims), which saves the client's per-statement work (the pipeline's messages, the
  parameters' set-up, a cursor and a result description each). Two statements with the same
  ``lock_key`` (the same row) never share a merged statement, since a multi-row UPDATE
  applies only one change to a row it is asked to change twice: the second goes in a later
  statement, so it sees the first's effect as if each were sent alone (``plan_batch``).
  Statements without a merge are sent one by one in ``lock_key`` order, as before, and a
  merge lists its statements in ``lock_key`` order. A merged statement takes its rows' locks
  in the order its plan visits them, and is sent where its first statement's ``lock_key``
  sorts: two processes' batches that write the same two rows can now take their locks in
  opposite orders and deadlock; the server detects it (after ``deadlock_timeout``) and aborts
  one, which is then written again one statement at a time (nothing lost or applied twice).
  Every fallback is per statement: a batch of one statement, a group of one, and every retry
  run the statement unmerged, so a merge changes how a batch is sent, never what it writes.
  A merge's ``split`` runs after the commit: should it fail, every caller of the batch gets
  ``DatabaseUnavailable`` (as after a lost COMMIT), and nothing is written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import attrs
import psycopg
from psycopg.abc import Params, QueryNoTemplate
from psycopg.rows import dict_row

from tradecore.errors import DatabaseUnavailable
from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.postgres.pool import Pool, kept_connection

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
    the row locks they take): use the table and the key of the row the statement writes;
    statements with the same ``lock_key`` are taken to write the same row. ``merge`` (when
    given) says how statements of its kind are written as one (``Merge``)."""

    query: QueryNoTemplate
    params: Params | None
    lock_key: tuple[str, ...]
    merge: Merge | None = None


@attrs.frozen
class StatementResult:
    """What one statement returned: its rows (empty without a result set) and row count."""

    rows: list[dict[str, Any]]
    rowcount: int


@attrs.frozen(eq=False)
class Merge:
    """How statements of one kind are written as one statement.

    Statements whose merges have equal ``key`` (hashable) may be merged; they must then
    merge alike (``combine`` and ``split`` of any of them serve for all). ``combine`` gets two
    or more such statements, in ``lock_key`` order and no two with the same ``lock_key``, and
    returns the query and parameters of ONE statement that writes what they would write one
    after the other in that order. That query is sent by a raw cursor: its placeholders are
    PostgreSQL's own (``$1``, ``$2``, ...) and its parameters a sequence (psycopg parses
    ``%s`` placeholders in Python on every call for a query over 4 KB or 50 parameters,
    milliseconds for a long multi-row statement). ``split`` gets the same statements and that
    statement's result, and returns each statement's own result (what it would have returned
    alone), in the same order; it runs after the commit and must not fail (module doc).
    """

    key: Hashable
    combine: Callable[[Sequence[Statement]], tuple[str, Sequence[Any]]]
    split: Callable[[Sequence[Statement], StatementResult], Sequence[StatementResult]]


@functools.lru_cache(maxsize=4096)
def _numbered_row(types: tuple[str, ...], index: int) -> str:
    """Row ``index`` (from 0) of ``numbered_values``: ``($k::type, ...)``."""
    first = index * len(types) + 1
    cells = (f"${first + n}::{type_}" for n, type_ in enumerate(types))
    return f"({', '.join(cells)})"


def numbered_values(types: tuple[str, ...], rows: int) -> str:
    """``VALUES`` of ``rows`` rows of ``types`` for a ``Merge``'s query: PostgreSQL's own
    placeholders, numbered from ``$1`` row after row, each cast to its type (the parameters
    of NULLs and of strings carry no type of their own). The rows are cached; the list is
    joined per call (a cached list of 128 order adds would be 60 KB)."""
    return "VALUES " + ", ".join(_numbered_row(types, index) for index in range(rows))


class BatchAborted(Exception):
    """The server aborted a batch's transaction (deadlock, serialization failure): the batch
    is written again one statement at a time."""


class StatementBatcher:
    """Statements on ``pool`` written by group commit (module doc).

    With one batch in flight at a time (the default), the batcher writes every batch on one
    connection it keeps between batches when the pool lets it (``pool.kept_connection``:
    looked at as the pool's check would before each use, replaced when it is not usable,
    given back after any error of a batch and when the pool closes) instead of taking one
    from the pool per batch."""

    def __init__(
        self,
        pool: Pool,
        *,
        max_batch: int = MAX_BATCH,
        max_in_flight: int = MAX_IN_FLIGHT,
        linger_s: float = LINGER_S,
    ) -> None:
        self._group: GroupCommit[Statement, StatementResult] = GroupCommit(
            self._write,
            max_batch=max_batch,
            max_in_flight=max_in_flight,
            linger_s=linger_s,
            name="postgres-group-commit",
        )
        # A weak reference to the pool: the batcher is kept per pool (``shared_batcher``) and
        # must not keep a closed pool alive (a KeptConnection refers to it weakly too). With
        # several batches in flight each takes its own connection from the pool.
        self._pool = weakref.ref(pool)
        self._kept = kept_connection(pool) if max_in_flight == 1 else None

    async def run(self, statement: Statement) -> StatementResult:
        """Run ``statement`` in the next batch; its result once the batch is committed.
        Raises ``DatabaseUnavailable`` when the batch could not be committed."""
        return await self._group.submit(statement)

    async def _write(self, statements: list[Statement]) -> list[StatementResult]:
        connections = self._kept or self._pool()
        if connections is None:
            raise DatabaseUnavailable("database unavailable: the pool is gone")
        with database_errors():
            async with connections.connection() as conn:
                return await _write_on(conn, statements)


async def _write_on(
    conn: psycopg.AsyncConnection[Any], statements: list[Statement]
) -> list[StatementResult]:
    """A batch on ``conn``: one statement alone (autocommit: no BEGIN and COMMIT to send),
    several in one transaction; an aborted transaction raised as ``BatchAborted``."""
    if len(statements) == 1:
        return [await _execute(conn, statements[0])]
    try:
        return await _execute_in_one_transaction(conn, statements)
    except psycopg.Error as e:
        # Class 40 (transaction rollback: serialization failure, deadlock). psycopg's classes
        # for 40001 and 40P01 do not derive from TransactionRollback, so the SQLSTATE decides.
        if (e.sqlstate or "").startswith("40"):
            raise BatchAborted(str(e)) from e
        raise


async def _execute(conn: psycopg.AsyncConnection[Any], statement: Statement) -> StatementResult:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement.query, statement.params)
        rows = await cur.fetchall() if cur.description is not None else []
        return StatementResult(rows, cur.rowcount)


def plan_batch(statements: Sequence[Statement]) -> list[list[int]]:
    """How a batch is sent: the statements' indexes grouped into the statements sent, in the
    order they are sent. A group of one is sent unmerged, a longer one merged (its members
    share a merge key and no ``lock_key``, in ``lock_key`` order).

    The statements are taken in ``lock_key`` order (among equal keys, the batch's order).
    Each joins the latest group of its merge key unless a statement of its ``lock_key`` was
    put in that group or a later one (it must run after that statement); otherwise it starts
    a group of its own. Groups are sent in the order they were started. Without merges this
    is one statement at a time in ``lock_key`` order."""
    order = sorted(range(len(statements)), key=lambda i: statements[i].lock_key)
    sent: list[list[int]] = []
    latest: dict[Hashable, int] = {}  # merge key -> its latest group (index in ``sent``)
    last: dict[tuple[str, ...], int] = {}  # lock key -> the group of its last statement
    for i in order:
        statement = statements[i]
        merge = statement.merge
        group = None if merge is None else latest.get(merge.key)
        if group is not None and last.get(statement.lock_key, -1) < group:
            sent[group].append(i)
        else:
            group = len(sent)
            sent.append([i])
            if merge is not None:
                latest[merge.key] = group
        last[statement.lock_key] = group
    return sent


def _combined(statements: Sequence[Statement]) -> tuple[QueryNoTemplate, Params | None]:
    """The query and parameters sending ``statements`` (one group of ``plan_batch``)."""
    if len(statements) == 1:
        return statements[0].query, statements[0].params
    merge = statements[0].merge
    assert merge is not None  # plan_batch groups merged statements only
    return merge.combine(statements)


def _split(statements: Sequence[Statement], result: StatementResult) -> Sequence[StatementResult]:
    """Each of ``statements``' own result from the result of the statement that sent them."""
    if len(statements) == 1:
        return [result]
    merge = statements[0].merge
    assert merge is not None
    results = merge.split(statements, result)
    if len(results) != len(statements):
        raise RuntimeError(f"merge split: {len(results)} results for {len(statements)}")
    return results


async def _execute_in_one_transaction(
    conn: psycopg.AsyncConnection[Any], statements: list[Statement]
) -> list[StatementResult]:
    """Every statement in one transaction, merged and ordered by ``plan_batch``, sent as one
    pipeline; the results in the order of ``statements``, once committed."""
    plan = plan_batch(statements)
    groups = [[statements[i] for i in group] for group in plan]
    cursors: list[psycopg.AsyncCursor[dict[str, Any]]] = []
    try:
        async with _atomically(conn, len(groups)):
            for group in groups:
                cursor = (
                    conn.cursor(row_factory=dict_row)
                    if len(group) == 1
                    else psycopg.AsyncRawCursor(conn, row_factory=dict_row)
                )
                cursors.append(cursor)
                await cursor.execute(*_combined(group))
        try:
            results: dict[int, StatementResult] = {}
            for indexes, group, cursor in zip(plan, groups, cursors, strict=True):
                rows = await cursor.fetchall() if cursor.description is not None else []
                sent = StatementResult(rows, cursor.rowcount)
                results.update(zip(indexes, _split(group, sent), strict=True))
            return [results[i] for i in range(len(statements))]
        except Exception as e:
            # Committed: written again, a statement would apply twice (or find itself a
            # duplicate); its caller cannot be told more than after a lost COMMIT.
            raise DatabaseUnavailable(
                "database unavailable: a committed batch's results could not be read"
            ) from e
    finally:
        for cursor in cursors:
            await cursor.close()


@contextlib.asynccontextmanager
async def _atomically(conn: psycopg.AsyncConnection[Any], statements: int) -> AsyncIterator[None]:
    """One transaction around ``statements`` statements sent; nothing around one (a batch
    merged into a single statement): a statement is atomic on its own, and the pool's
    connections commit it (autocommit), which spares the pipeline's set-up and its sync.

    Several statements go in one pipeline without BEGIN and COMMIT: on an autocommit
    connection the server runs everything up to the pipeline's one Sync as a single implicit
    transaction (the extended query protocol's rule), committed at that Sync, and a failing
    statement rolls back the ones before it and skips the rest, as a transaction block would.
    That spares two statements and their messages per batch (client CPU per write of a batch
    of several statements, ``bench/merged_writes.py`` "single" mode at 8 writers: 15-30%
    less). Both rest on the pool's connections being in autocommit (``pool.py``)."""
    if statements == 1:
        yield
        return
    async with conn.pipeline():
        yield


_SHARED: weakref.WeakKeyDictionary[Pool, StatementBatcher] = weakref.WeakKeyDictionary()


def shared_batcher(pool: Pool) -> StatementBatcher:
    """The batcher every adapter on ``pool`` shares (created on first use)."""
    batcher = _SHARED.get(pool)
    if batcher is None:
        batcher = _SHARED[pool] = StatementBatcher(pool)
    return batcher
