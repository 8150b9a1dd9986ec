"""Auto-pipelining: many callers' Redis calls sent in one round trip.

``RedisBatcher`` is to Redis what ``postgres.group_commit`` is to Postgres: callers issue a
script call (``script``) or a plain command (``command``) and wait; calls issued while a
batch is on the wire go together as the next batch, one non-transactional pipeline (every
command written at once, then every reply read, on one pooled connection). Under load
hundreds of concurrent orders' calls cost a handful of round trips instead of one each,
which on a small machine is mostly client CPU saved (redis-py spends about as much per
round trip as per command).

* **No delay when idle.** A call issued while no batch is in flight is sent at once, alone;
  while a batch is in flight, new calls wait for it and then go together, up to
  ``max_batch``. The waiting is therefore bounded by one round trip. A lone call is a batch
  of one: written the same way, never sent twice (below), so the client's retry after a
  connection error, which would run it again, does not apply to it.
* **One connection of its own.** With one batch in flight at a time the batcher needs one
  connection; it keeps one between round trips (where the pool has at least ``KEEP_FROM``),
  looked at before each use as the pool looks at one it hands out, so the pool's checkout
  and return are not paid per round trip.
* **One deadline per round trip.** The replies of a batch are read under one timeout, the
  connection's socket timeout, instead of one per reply (redis-py arms a timer for each
  read): a batch of many calls costs one timer, and no reply waits longer than before.
* **Per call.** Each caller gets its own reply, in the order the calls were issued. An error
  reply (a ``ResponseError``: a script's error, a wrong type) fails that caller only.
* **One failure for the batch, never sent twice.** A failure of the connection (or any
  exception while sending or reading) fails every call of a pipeline with that same exception,
  which the callers translate as any failure of a call (``unavailable_on_failure`` ->
  ``KeyValueStoreUnavailable``). A batch is never sent again: once written, its calls may
  have run even though the replies were lost, and an order's push run twice is a doubled
  order. (redis-py's ``Pipeline.execute`` retries after a connection error, with the
  client's retry policy, which is why a pipeline is written on a pooled connection here.)
  Getting the connection may still reconnect and health-check it: nothing is sent then.
* **Scripts by their SHA.** A script goes as EVALSHA. Calls answered NOSCRIPT (the server
  lost its script cache: a restart, a failover, SCRIPT FLUSH) did not run; their scripts are
  loaded and those calls sent again, together, in one more round trip.
* **Cancellation.** A caller cancelled before its batch was written is left out of it; once
  written, its call runs all the same (as a lone call would) and the others' replies are
  unaffected.

On a Redis Cluster a call is sent at once, on its own, through the cluster client (which
routes it by its keys and follows slot moves): redis-py's cluster pipeline refuses scripts,
and grouping by node would have to redo the client's handling of MOVED and ASK replies.
Batching there is left for later.

``shared_batcher`` gives every adapter on one client the same batcher, so an order's push
and another user's admission share a round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from redis import exceptions as rx
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.typing import EncodableT, KeyT

from tradecore_adapters.redis.client import Client

MAX_BATCH = 128
"""Most calls in one pipeline by default (a batch's replies are read before any caller is
answered, so a larger batch delays its first callers)."""

KEEP_FROM = 4
"""The smallest pool of which the batcher keeps a connection between round trips (at most one
in four of a pool's connections, as a Postgres writer keeps; a smaller pool stays shared)."""

Arg = EncodableT


async def _ready(connection: AbstractConnection) -> bool:
    """``connection`` can carry a batch: connected, nothing unread, the server has not closed
    it (the check the pool makes before it hands a connection out)."""
    try:
        return connection.is_connected and not await connection.can_read()
    except (rx.ConnectionError, rx.TimeoutError, OSError):
        return False


async def _give_back(pool: ConnectionPool, connection: AbstractConnection, *, broken: bool) -> None:
    """Return ``connection`` to ``pool``; a ``broken`` one (a failed batch may have left
    replies unread on it, or it failed its check) is closed first, so the pool reconnects."""
    if broken:
        with contextlib.suppress(Exception):
            await connection.disconnect()
    await pool.release(connection)


async def _replies(connection: AbstractConnection, count: int) -> list[Any]:
    """The next ``count`` replies on ``connection`` (an error reply as its ``ResponseError``),
    read under one deadline, the connection's socket timeout (module doc): redis-py's read
    arms no timer of its own when given an infinite timeout. Raises redis-py's
    ``TimeoutError`` when the deadline passes, as a timed-out read of its own does."""
    replies: list[Any] = []
    try:
        async with asyncio.timeout(connection.socket_timeout):
            for _ in range(count):
                try:
                    replies.append(await connection.read_response(timeout=math.inf))
                except rx.ResponseError as e:
                    replies.append(e)
    except TimeoutError as e:
        raise rx.TimeoutError("Timeout reading the replies of a pipeline") from e
    return replies


@attrs.define
class _Waiter:
    command: tuple[Arg, ...]
    script: AsyncScript | None
    done: asyncio.Future[Any]


def _fail(waiter: _Waiter, error: BaseException) -> None:
    if not waiter.done.done():
        waiter.done.set_exception(error)


def _resolve(waiter: _Waiter, reply: Any) -> None:
    if not waiter.done.done():
        waiter.done.set_result(reply)


class RedisBatcher:
    """Calls on ``client`` sent in pipelines (module doc). Replies are as the client's own
    ``evalsha`` and ``execute_command`` give them for commands without a reply callback
    (scripts, list pops and moves): decoded to ``str`` when the client decodes."""

    def __init__(self, client: Client, *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        # A weak reference: the batcher is kept per client (``shared_batcher``) and must not
        # keep a closed client alive.
        self._client = weakref.ref(client)
        self._cluster = isinstance(client, RedisCluster)
        self._max_batch = max_batch
        self._pending: list[_Waiter] = []
        self._drainer: asyncio.Task[None] | None = None
        self._kept: tuple[ConnectionPool, AbstractConnection] | None = None

    async def script(self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[Arg]) -> Any:
        """Run ``script`` (from the client's ``register_script``) on ``keys`` and ``args``
        in the next batch; its reply. Raises what the call raised (``ResponseError`` for a
        script error), or what failed the batch."""
        if self._cluster:
            return await script(keys=list(keys), args=list(args))
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        return await self._submit(command, script)

    async def command(self, *command: Arg) -> Any:
        """Send ``command`` (its name and arguments) in the next batch; its raw reply."""
        if self._cluster:
            client = self._live_client()
            return await client.execute_command(*command)
        return await self._submit(tuple(command), None)

    async def _submit(self, command: tuple[Arg, ...], script: AsyncScript | None) -> Any:
        waiter = _Waiter(command, script, asyncio.get_running_loop().create_future())
        self._pending.append(waiter)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="redis-batcher")
        return await waiter.done

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                # A caller cancelled while waiting has withdrawn its call: it was not sent.
                batch = [w for w in batch if not w.done.done()]
                if batch:
                    await self._settle(batch)
        except BaseException:  # cancelled (shutdown): nobody is left to send the rest
            for waiter in self._pending:
                waiter.done.cancel()
            self._pending = []
            raise

    async def _settle(self, batch: list[_Waiter]) -> None:
        """Send ``batch`` once and answer each waiter (the module doc's rules)."""
        try:
            replies = await self._send([w.command for w in batch])
            missing = [i for i, r in enumerate(replies) if isinstance(r, rx.NoScriptError)]
            if missing:
                again = await self._load_and_send([batch[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        except Exception as e:
            for waiter in batch:
                _fail(waiter, e)
            return
        except BaseException:
            for waiter in batch:
                waiter.done.cancel()
            raise
        for waiter, reply in zip(batch, replies, strict=True):
            if isinstance(reply, rx.ResponseError):
                _fail(waiter, reply)
            else:
                _resolve(waiter, reply)

    async def _load_and_send(self, waiters: list[_Waiter]) -> list[Any]:
        """Load the scripts of ``waiters`` (answered NOSCRIPT, so not run) and send their
        calls again, in one pipeline; their replies."""
        scripts = {w.script.sha: w.script for w in waiters if w.script is not None}
        loads: list[tuple[Arg, ...]] = [("SCRIPT", "LOAD", s.script) for s in scripts.values()]
        replies = await self._send(loads + [w.command for w in waiters])
        for reply in replies[: len(loads)]:
            if isinstance(reply, rx.ResponseError):
                raise reply
        return replies[len(loads) :]

    async def _send(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        """One reply per command (an error reply as its ``ResponseError``). The commands, one
        or several, are written on one connection (``_connection``), then their replies read,
        never retried (module doc); on any failure that connection is dropped, as replies may
        be left unread on it."""
        pool, connection = await self._connection()
        try:
            await connection.send_packed_command(connection.pack_commands(commands))
            replies = await _replies(connection, len(commands))
        except BaseException:
            self._kept = None
            await _give_back(pool, connection, broken=True)
            raise
        if self._kept is None:
            await _give_back(pool, connection, broken=False)
        return replies

    async def _connection(self) -> tuple[ConnectionPool, AbstractConnection]:
        """The pool and connection the next batch goes on. Where the pool allows at least
        ``KEEP_FROM`` connections the batcher keeps one between its round trips (it has one
        in flight at a time), sparing the pool's checkout and return, a third of a lone
        call's client time; it is looked at before each use as the pool looks at one it
        hands out, and one the server closed, or with unread data, is given back (the pool
        replaces it) and another taken. Elsewhere each round trip checks one out and gives
        it back."""
        client = self._live_client()
        assert isinstance(client, Redis)
        pool = client.connection_pool
        kept = self._kept
        if kept is not None:
            if kept[0] is pool and await _ready(kept[1]):
                return kept
            self._kept = None
            await _give_back(*kept, broken=True)
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        if pool.max_connections >= KEEP_FROM:
            self._kept = (pool, connection)
        return pool, connection

    def _live_client(self) -> Client:
        client = self._client()
        if client is None:
            raise rx.ConnectionError("the Redis client is gone")
        return client


_SHARED: weakref.WeakKeyDictionary[Client, RedisBatcher] = weakref.WeakKeyDictionary()


def shared_batcher(client: Client) -> RedisBatcher:
    """The batcher every adapter on ``client`` shares (created on first use)."""
    batcher = _SHARED.get(client)
    if batcher is None:
        batcher = _SHARED[client] = RedisBatcher(client)
    return batcher
