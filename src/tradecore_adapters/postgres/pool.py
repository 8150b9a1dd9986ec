"""The connection pool every Postgres adapter shares.

Connections run in autocommit mode: a single statement commits on its own, and an adapter that
needs several statements to be atomic opens ``conn.transaction()`` (the group commit sends
them in one pipeline instead, whose one Sync ends one implicit transaction). Every session
uses UTC and a statement timeout, so no query can hang a request past its budget.
"""

from __future__ import annotations

import contextlib
import math
import select
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from tradecore.errors import DatabaseUnavailable
from tradecore_adapters.postgres.errors import database_errors

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]
"""The pool type the adapters take."""


def connection_options(timeout_s: float, statement_timeout_s: float) -> dict[str, Any]:
    """Connection keyword arguments: connect and statement timeouts, UTC, autocommit."""
    statement_ms = max(1, round(statement_timeout_s * 1000))
    return {
        "autocommit": True,
        # libpq counts whole seconds and treats anything below 2 as 2.
        "connect_timeout": max(2, math.ceil(timeout_s)),
        "options": f"-c statement_timeout={statement_ms} -c TimeZone=UTC",
        "application_name": "tradecore",
    }


PING_AFTER_IDLE_S = 5.0


KEPT_SHARE = 4
"""A pool lets writers keep at most one of every ``KEPT_SHARE`` of its connections
(``HoldingPool.keep``; 2 of the service's 10), so a small pool is never drained by them."""


class HoldingPool(AsyncConnectionPool[AsyncConnection[TupleRow]]):
    """The pool ``make_pool`` builds: an ``AsyncConnectionPool`` that lets writers keep some
    of its connections between uses (``keep``) and gives those back before it closes, since
    the pool closes only the connections it holds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept: list[KeptConnection] = []

    def keep(self) -> KeptConnection | None:
        """A ``KeptConnection`` for a writer with one use in flight at a time, while fewer
        than one in ``KEPT_SHARE`` of the pool's connections are kept; None otherwise (the
        writer then takes a connection for each use). The first writers to ask get one; the
        service's are made once per process (singletons)."""
        if (len(self._kept) + 1) * KEPT_SHARE > self.max_size:
            return None
        kept = KeptConnection(self)
        self._kept.append(kept)
        return kept

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 - the pool's own signature
        for kept in self._kept:
            await kept.give_back()
        await super().close(timeout)


def kept_connection(pool: Pool) -> KeptConnection | None:
    """``pool.keep()`` on a ``HoldingPool``; None on any other pool."""
    return pool.keep() if isinstance(pool, HoldingPool) else None


class KeptConnection:
    """One connection of a ``HoldingPool`` kept by one writer between its uses, instead of
    being taken from the pool and returned for each use: on this project's machines a
    checkout and return after an idle spell cost about 0.13 ms of a lone write
    (docs/performance.md). For a writer with one use in flight at a time (a group commit's
    drainer), never for concurrent callers.

    Made by ``HoldingPool.keep``. ``connection()`` lends it as ``pool.connection()`` lends one
    (the caller translates driver errors): the kept connection when it is usable without a
    ping (``usable_unpinged``, the pool check's rule), otherwise it is given back (the pool
    closes a broken one) and another taken from the pool, which checks it. An exception
    inside the block gives it back too, so a connection in an unknown state is never used
    again by the writer. The pool gives it back before closing."""

    def __init__(self, pool: HoldingPool) -> None:
        # A weak reference: the writer keeping this may itself be kept per pool (in a
        # WeakKeyDictionary) and must not keep a closed pool alive.
        self._pool = weakref.ref(pool)
        self._conn: AsyncConnection[Any] | None = None
        self._used: float | None = None  # when the kept connection was last used

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """The kept connection (or a fresh one from the pool) for one use."""
        conn = await self._take()
        try:
            yield conn
        except BaseException:
            await self.give_back()
            raise
        self._used = time.monotonic()

    async def _take(self) -> AsyncConnection[Any]:
        conn = self._conn
        if conn is not None:
            if usable_unpinged(conn, self._used, time.monotonic(), PING_AFTER_IDLE_S):
                return conn
            await self.give_back()
        pool = self._pool()
        if pool is None:
            raise DatabaseUnavailable("database unavailable: the pool is gone")
        self._conn, self._used = await pool.getconn(), None
        return self._conn

    async def give_back(self) -> None:
        """Return the kept connection to the pool (which closes it when it is broken or the
        pool closed); the next use takes another."""
        conn, self._conn = self._conn, None
        pool = self._pool()
        if conn is None:
            return
        if pool is None:
            await conn.close()
            return
        await pool.putconn(conn)


class ConnectionCheck:
    """The pool's check of a connection before lending it, without a round trip on the hot
    path.

    A connection the server closed (a restart, a terminated backend, a proxy that dropped
    it) has its end of the socket readable: a non-blocking peek sees the end of the stream
    or the server's farewell message. Such a connection, one lent for the first time, and
    one last lent ``ping_after_idle_s`` or more ago (a silent network failure shows no sign
    on the socket) are pinged with an empty query; the pool replaces a connection whose
    ping fails. A connection in steady use is lent after the peek alone. (No ``reset``
    callback is needed: one would route every return through the pool's worker tasks.)
    """

    def __init__(
        self,
        ping_after_idle_s: float = PING_AFTER_IDLE_S,
        *,
        ping: Callable[[AsyncConnection[Any]], Awaitable[None]] = (
            AsyncConnectionPool.check_connection
        ),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ping_after_idle_s = ping_after_idle_s
        self._ping = ping
        self._monotonic = monotonic
        self._lent: weakref.WeakKeyDictionary[AsyncConnection[Any], float]
        self._lent = weakref.WeakKeyDictionary()

    async def check(self, conn: AsyncConnection[Any]) -> None:
        """The pool's ``check`` callback: return quietly, or raise for a broken connection."""
        now = self._monotonic()
        lent = self._lent.get(conn)
        self._lent[conn] = now
        if not usable_unpinged(conn, lent, now, self._ping_after_idle_s):
            await self._ping(conn)


def usable_unpinged(
    conn: AsyncConnection[Any], last_used: float | None, now: float, ping_after_idle_s: float
) -> bool:
    """Whether ``conn``, last used at ``last_used`` (monotonic; None: never), may be used at
    ``now`` without a ping: used less than ``ping_after_idle_s`` ago, and its socket quiet
    (``ConnectionCheck``'s rule, which a writer keeping a connection applies too)."""
    return last_used is not None and now - last_used < ping_after_idle_s and socket_quiet(conn)


def socket_quiet(conn: AsyncConnection[Any]) -> bool:
    """True when the connection is open and the server has sent nothing since its last reply
    (nothing to read, no end of stream, no error): one non-blocking ``poll``, no round trip."""
    if conn.broken or conn.closed:
        return False
    try:
        fd = conn.pgconn.socket
    except Exception:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    try:
        ready = poller.poll(0)
    except OSError:
        return False
    return not ready  # readable: the end of the stream, or a message nobody asked for


def make_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout_s: float = 5.0,
    statement_timeout_s: float | None = None,
    check_on_checkout: bool = True,
) -> Pool:
    """A pool that is not open yet (the composition root opens it inside the event loop with
    ``await pool.open(wait=True, timeout=...)``); the options are those of ``open_pool``."""
    statement_s = timeout_s if statement_timeout_s is None else statement_timeout_s
    check = ConnectionCheck() if check_on_checkout else None
    pool: Pool = HoldingPool(
        conninfo,
        kwargs=connection_options(timeout_s, statement_s),
        min_size=min_size,
        max_size=max_size,
        timeout=timeout_s,
        open=False,
        check=None if check is None else check.check,
        name="tradecore",
    )
    return pool


async def open_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout_s: float = 5.0,
    statement_timeout_s: float | None = None,
    check_on_checkout: bool = True,
) -> Pool:
    """Open a pool and wait until ``min_size`` connections are up.

    ``timeout_s`` bounds opening, connecting and waiting for a free connection;
    ``statement_timeout_s`` (default ``timeout_s``) bounds each statement on the server.
    ``check_on_checkout`` checks a connection before lending it (``ConnectionCheck``), so
    connections broken by a server restart are replaced instead of failing a request.
    Raises ``DatabaseUnavailable`` when the server cannot be reached within ``timeout_s``.
    """
    pool = make_pool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        timeout_s=timeout_s,
        statement_timeout_s=statement_timeout_s,
        check_on_checkout=check_on_checkout,
    )
    try:
        with database_errors():
            await pool.open(wait=True, timeout=timeout_s)
    except BaseException:
        await pool.close()
        raise
    return pool
