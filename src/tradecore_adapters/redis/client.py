"""Redis clients with explicit timeouts, and wake-ups published over one pub/sub channel.

Two clients share one store: ``commands`` for ordinary commands, bounded by a socket
timeout, and ``blocking`` for blocking calls, which has no socket timeout because such a call
legitimately waits longer; each blocking call is bounded by its own asyncio timeout instead.
A cancelled call drops its connection (redis-py >= 5 does so), so a late reply is never read
by another caller.

The store is one server (``redis://`` or ``rediss://``, through ``redis.asyncio.Redis``) or a
Redis Cluster (``redis+cluster://`` or ``rediss+cluster://`` with one or more comma-separated
``host:port`` startup nodes, through ``redis.asyncio.cluster.RedisCluster``, which finds the
other nodes and follows slot moves). Both clients have the same commands, scripts (EVALSHA
is routed by its first key; every script here keeps its keys in one slot, see ``keys``),
non-transactional pipelines (split per node on a cluster) and ``pubsub()`` (on a cluster,
classic pub/sub on one node: a PUBLISH anywhere, a script's included, reaches every node).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar
from urllib.parse import unquote

import attrs
from redis import exceptions as rx
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tradecore_adapters.redis.errors import unavailable_on_failure
from tradecore_adapters.redis.keys import DEFAULT_SHARDS, check_shards
from tradecore_adapters.redis.packing import hiredis_packing

T = TypeVar("T")

log = logging.getLogger(__name__)

DEFAULT_SOCKET_TIMEOUT_S = 2.0
DEFAULT_CONNECT_TIMEOUT_S = 1.0
DEFAULT_HEALTH_CHECK_S = 10
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_BLOCKING_CONNECTIONS = 512
DEFAULT_POOL_TIMEOUT_S = 2.0
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

Client = Redis | RedisCluster
"""A client of one server or of a cluster: the adapters use only what both offer."""


_LISTENER_HEADROOM = 8
"""Connections per node beyond the command bound, for the pub/sub listeners (which borrow
from the node's pool) and the operators' pipelines."""


class _Cluster(RedisCluster):
    """A cluster client with the bounds of the single server's client.

    It retries a command after a connection error or a cluster-state error (a failover, a
    slot not yet covered) only, never after a read timeout, so a write that may have been
    applied is not sent twice (redis-py also retries timeouts). At most ``command_slots``
    commands are under way at once; a caller beyond them waits up to ``pool_timeout_s`` for
    a slot, then fails with a ConnectionError, as with ``BlockingConnectionPool`` (redis-py's
    cluster pools refuse at once when a node's connections are all in use).
    """

    ERRORS_ALLOW_RETRY = (  # type: ignore[assignment]  # narrower than redis-py's on purpose
        rx.ConnectionError,
        rx.ClusterDownError,
        rx.SlotNotCoveredError,
    )

    def __init__(self, *, command_slots: int, pool_timeout_s: float, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._command_slots = asyncio.Semaphore(command_slots)
        self._pool_timeout_s = pool_timeout_s

    async def execute_command(self, *args: object, **kwargs: object) -> object:
        try:
            async with asyncio.timeout(self._pool_timeout_s):
                await self._command_slots.acquire()
        except TimeoutError:
            raise rx.MaxConnectionsError(
                f"no cluster connection free within {self._pool_timeout_s} s"
            ) from None
        try:
            return await super().execute_command(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self._command_slots.release()


def is_cluster_url(url: str) -> bool:
    """True for a ``redis+cluster://`` or ``rediss+cluster://`` URL."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, bool]:
    """The startup nodes, user name, password and TLS flag of a cluster URL
    ``redis[s]+cluster://[user[:password]@]host:port[,host:port...][/0]``. ValueError when a
    node lacks its port, or a database other than 0 is named (a cluster has only 0)."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError("not a redis+cluster:// or rediss+cluster:// URL")
    rest, _, query = rest.partition("?")
    if query:
        raise ValueError("a cluster URL takes no query parameters")
    netloc, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError("a cluster has only database 0")
    userinfo, _, hosts = netloc.rpartition("@")
    user: str | None = None
    password: str | None = None
    if userinfo:
        name, has_password, secret = userinfo.partition(":")
        user = unquote(name) or None
        password = unquote(secret) if has_password else None
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("every cluster node is host:port")
        nodes.append((host.strip("[]"), int(port)))
    return nodes, user, password, scheme.lower() == "rediss+cluster"


def connect(
    url: str,
    *,
    socket_timeout_s: float | None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    health_check_interval_s: int = DEFAULT_HEALTH_CHECK_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
    retries: int = 1,
) -> Redis:
    """A client for ``url`` (``redis://host:port/db``) that decodes replies to ``str``.

    ``socket_timeout_s`` bounds every read (None: no bound, for blocking pops only);
    ``connect_timeout_s`` bounds connecting. At most ``max_connections`` are open; a caller
    beyond them waits up to ``pool_timeout_s`` for one, then fails with a ConnectionError. A
    connection idle longer than ``health_check_interval_s`` is pinged before use. A command
    is retried ``retries`` times after a connection error only, never after a read timeout,
    so a write that may have been applied is not sent twice. Nothing connects until the first
    command. Closing the client closes its pool. Commands are packed by hiredis
    (``packing``); a cluster client keeps redis-py's packer.
    """
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        health_check_interval=health_check_interval_s,
        retry=Retry(
            ExponentialBackoff(cap=0.05, base=0.005),
            retries,
            supported_errors=(rx.ConnectionError,),
        ),
        decode_responses=True,
    )
    pool.connection_class = hiredis_packing(pool.connection_class)  # before any connects
    return Redis.from_pool(pool)


def connect_cluster(
    url: str,
    *,
    socket_timeout_s: float | None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    health_check_interval_s: int = DEFAULT_HEALTH_CHECK_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
    retries: int = 1,
) -> RedisCluster:
    """A cluster client for the cluster URL ``url`` (see ``cluster_nodes``), decoding replies
    to ``str``, with the bounds of ``connect``: at most ``max_connections`` commands under
    way (so at most that many connections to any node, plus a few for listeners), a caller
    beyond them waiting up to ``pool_timeout_s``. Retries as ``_Cluster`` says. Nothing
    connects until the first command, which reads the slot map from a startup node."""
    nodes, user, password, tls = cluster_nodes(url)
    return _Cluster(
        command_slots=max_connections,
        pool_timeout_s=pool_timeout_s,
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=user,
        password=password,
        ssl=tls,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        health_check_interval=health_check_interval_s,
        max_connections=max_connections + _LISTENER_HEADROOM,
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), retries),
        decode_responses=True,
    )


@attrs.frozen
class RedisConnections:
    """The two clients of one store (see the module docstring). ``grace_s`` is added to a
    blocking call's own timeout to bound it on the client side. ``queue_shards`` is the
    shard count of the shared queues (``keys``): the same in every process of a
    deployment."""

    commands: Client
    blocking: Client
    grace_s: float = DEFAULT_SOCKET_TIMEOUT_S
    queue_shards: int = attrs.field(default=DEFAULT_SHARDS, converter=check_shards)

    @property
    def cluster(self) -> bool:
        """True when the store is a Redis Cluster."""
        return isinstance(self.commands, RedisCluster)

    async def check(self) -> None:
        """Return when the server answers a PING on each client (readiness); raise
        KeyValueStoreUnavailable otherwise."""
        with unavailable_on_failure("ping"):
            await self.commands.ping()
            await self.blocking.ping()

    async def aclose(self) -> None:
        """Close both clients and their pools."""
        await self.commands.aclose()
        await self.blocking.aclose()


def open_connections(
    url: str,
    *,
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    health_check_interval_s: int = DEFAULT_HEALTH_CHECK_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_blocking_connections: int = DEFAULT_MAX_BLOCKING_CONNECTIONS,
    queue_shards: int = DEFAULT_SHARDS,
) -> RedisConnections:
    """The command and blocking clients for ``url`` (one server, or a cluster URL) with the
    given bounds; on one server a caller waits for a free connection at most
    ``socket_timeout_s``."""
    if is_cluster_url(url):
        return RedisConnections(
            connect_cluster(
                url,
                socket_timeout_s=socket_timeout_s,
                connect_timeout_s=connect_timeout_s,
                health_check_interval_s=health_check_interval_s,
                max_connections=max_connections,
                pool_timeout_s=socket_timeout_s,
            ),
            connect_cluster(
                url,
                socket_timeout_s=None,
                connect_timeout_s=connect_timeout_s,
                health_check_interval_s=health_check_interval_s,
                max_connections=max_blocking_connections,
                pool_timeout_s=socket_timeout_s,
            ),
            grace_s=socket_timeout_s,
            queue_shards=queue_shards,
        )
    commands = connect(
        url,
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        health_check_interval_s=health_check_interval_s,
        max_connections=max_connections,
        pool_timeout_s=socket_timeout_s,
    )
    blocking = connect(
        url,
        socket_timeout_s=None,
        connect_timeout_s=connect_timeout_s,
        health_check_interval_s=health_check_interval_s,
        max_connections=max_blocking_connections,
        pool_timeout_s=socket_timeout_s,
    )
    return RedisConnections(commands, blocking, grace_s=socket_timeout_s, queue_shards=queue_shards)


def text(value: str | bytes) -> str:
    """A reply as text, whether or not the client decodes replies."""
    return value.decode() if isinstance(value, bytes) else value


def px_ms(seconds: float) -> int:
    """A PX time to live: whole milliseconds, at least 1 (Redis refuses 0)."""
    return max(1, round(seconds * 1000))


_LISTEN_SLICE_S = 1.0
_BACKOFF_FIRST_S = 0.05
_BACKOFF_CAP_S = 2.0


class Wakeups:
    """Named wake-ups carried by one pub/sub channel, for every process that listens.

    Publishing ``name`` on ``channel`` (a script may do so atomically with a write) sets the
    events of this process's watchers of ``name``. Publishing ``"{name} {carried}"`` does the
    same and hands ``carried`` to those watchers (``Watch.carried``): what the writer would
    otherwise make each watcher read back (a name never contains a space). Delivery is best
    effort: what is published while the listener reconnects is lost, so every watcher is
    woken when a subscription is confirmed (at first and after each reconnection) and on
    every listener error; a watcher must re-check its condition after each wake-up, and now
    and then on its own. The listener holds one connection; it starts with the first
    ``watch``.
    """

    def __init__(self, client: Client, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._watchers: dict[str, set[Watch]] = {}
        self._listener: asyncio.Task[None] | None = None

    @property
    def channel(self) -> str:
        return self._channel

    def watch(self, name: str) -> Watch:
        """A new event set at the next wake-up of ``name``; pass it to ``unwatch`` when done."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name=f"wakeups:{self._channel}")
        event = Watch()
        self._watchers.setdefault(name, set()).add(event)
        return event

    @property
    def listening(self) -> bool:
        """A watch has started the listener and it runs."""
        return self._listener is not None and not self._listener.done()

    @property
    def watched(self) -> int:
        """Names with at least one watcher now."""
        return len(self._watchers)

    async def look_until(
        self,
        name: str,
        look: Callable[[], Awaitable[T | None]],
        timeout_s: float,
        recheck_s: float | Callable[[], float] | None = None,
        *,
        look_at_deadline: bool = True,
        watching: Watch | None = None,
        carried: Callable[[str], T | None] | None = None,
    ) -> T | None:
        """What ``look()`` finds (not None), looking again at each wake-up of ``name`` and at
        least every ``recheck_s`` (or what it answers after each look: a queue whose look
        learns when its next message is due), until ``timeout_s`` has passed; None when
        nothing was found in time. A ``timeout_s`` of zero or less looks once, without
        watching. The event is cleared before each look, so a wake-up that comes after a
        look still ends the wait.
        A wait that reaches the deadline with no wake-up looks a last time only with
        ``look_at_deadline``: a waiter whose wake-up may be lost wants it (a reply), while
        thousands of idle workers polling their lists must not each cost a round trip per
        timeout.
        ``watching``: an event of ``watch(name)`` the caller registered when the store last
        showed nothing to find (in the same atomic step as a write of its own); the wait
        takes it over (and unwatches it), and skips the first look unless a wake-up has come
        since, saving the round trip that would find nothing.
        ``carried``: what a wake-up that carried something (``Watch.carried``) is worth; what
        it answers (not None) is returned in place of a look, saving that round trip. None
        (the carried value is stale) makes it look as after any wake-up."""
        if timeout_s <= 0:
            if watching is not None:
                self.unwatch(name, watching)
            return await look()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        event = self.watch(name) if watching is None else watching
        # nothing came since the store showed nothing: wait before the first look
        skip_look = watching is not None and not watching.is_set()
        try:
            while True:
                if not skip_look:
                    event.clear()
                    value, event.carried = event.carried, None
                    if value is not None and carried is not None:
                        found = carried(value)
                        if found is not None:
                            return found
                    found = await look()
                    if found is not None:
                        return found
                skip_look = False
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                if recheck_s is None:
                    wait_s = remaining
                else:
                    bound = recheck_s() if callable(recheck_s) else recheck_s
                    wait_s = min(remaining, bound)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await event.wait()
                if not look_at_deadline and not event.is_set() and deadline - loop.time() <= 0:
                    return None
        finally:
            self.unwatch(name, event)

    def unwatch(self, name: str, event: Watch) -> None:
        events = self._watchers.get(name)
        if events is not None:
            events.discard(event)
            if not events:
                del self._watchers[name]

    async def aclose(self) -> None:
        """Stop listening and wake every watcher (it re-checks and finds the store closed)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        self._ring_all()

    def _ring(self, name: str, carried: str | None = None) -> None:
        for event in self._watchers.get(name, ()):
            if carried is not None:
                event.carried = carried
            event.set()

    def _ring_all(self) -> None:
        for events in self._watchers.values():
            for event in events:
                event.set()

    async def _listen(self) -> None:
        await listen(self._client, self._channel, _WakeupSubscriber(self), "wake-ups")


class Watch(asyncio.Event):
    """A watcher's event (``Wakeups.watch``): set by a wake-up of its name, with what the
    last wake-up carried (``carried``) until the watcher takes it."""

    def __init__(self) -> None:
        super().__init__()
        self.carried: str | None = None


class _WakeupSubscriber:
    """What a ``Wakeups`` does with its channel: a message wakes its name; a confirmed
    subscription and an interruption wake everyone (what was published meanwhile is unseen,
    so every watcher looks again)."""

    def __init__(self, wakeups: Wakeups) -> None:
        self._wakeups = wakeups

    def message(self, data: str) -> None:
        name, space, carried = data.partition(" ")
        self._wakeups._ring(name, carried if space else None)

    def confirmed(self) -> None:
        self._wakeups._ring_all()

    def interrupted(self) -> None:
        self._wakeups._ring_all()


class Subscriber(Protocol):
    """Told by ``listen`` what happens on its channel."""

    def message(self, data: str) -> None:
        """A message was published on the channel."""

    def confirmed(self) -> None:
        """Redis confirmed the subscription: at first, and after every reconnection
        (redis-py's own included); messages published before it may be unseen."""

    def interrupted(self) -> None:
        """The connection failed or the listener stops: messages may be missed from now on
        until the next ``confirmed``."""


async def listen(client: Client, channel: str, subscriber: Subscriber, what: str) -> None:
    """Listen to ``channel`` on a pub/sub connection of its own until cancelled, telling
    ``subscriber``; after a failure, reconnect with a pause growing from 50 ms to 2 s (reset
    by a confirmed subscription), logging the failure as ``what``. On a cluster the client
    first reads the node map (its pub/sub needs it)."""
    backoff = _BACKOFF_FIRST_S
    me = asyncio.current_task()
    assert me is not None
    while True:
        pubsub = None
        try:
            if isinstance(client, RedisCluster):
                await client.initialize()
            pubsub = client.pubsub()
            await pubsub.subscribe(channel)
            while True:
                message = await pubsub.get_message(timeout=_LISTEN_SLICE_S)
                if me.cancelling():
                    # redis-py may absorb a cancellation that lands inside a read with a
                    # timeout; whoever cancels must not wait for a listener that goes on.
                    raise asyncio.CancelledError
                if message is None:
                    continue
                kind = message.get("type")
                if kind == "message":
                    subscriber.message(text(message["data"]))
                elif kind == "subscribe":
                    backoff = _BACKOFF_FIRST_S
                    subscriber.confirmed()
        except asyncio.CancelledError:
            subscriber.interrupted()
            raise
        except Exception as e:
            subscriber.interrupted()
            log.warning("%s on %s interrupted (%s); reconnecting", what, channel, e)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_CAP_S)
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
