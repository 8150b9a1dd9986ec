"""Redis clients with explicit timeouts, and wake-ups published over one pub/sub channel.

Two clients share one server: ``commands`` for ordinary commands, bounded by a socket
timeout, and ``blocking`` for blocking pops (BLPOP), which has no socket timeout because a
pop legitimately waits longer; each blocking call is bounded by its own asyncio timeout
instead. A cancelled call drops its connection (redis-py >= 5 does so), so a late reply is
never read by another caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import attrs
from redis import exceptions as rx
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tradecore_adapters.redis.errors import unavailable_on_failure

log = logging.getLogger(__name__)

DEFAULT_SOCKET_TIMEOUT_S = 2.0
DEFAULT_CONNECT_TIMEOUT_S = 1.0
DEFAULT_HEALTH_CHECK_S = 10
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_BLOCKING_CONNECTIONS = 512
DEFAULT_POOL_TIMEOUT_S = 2.0


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
    command. Closing the client closes its pool.
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
    return Redis.from_pool(pool)


@attrs.frozen
class RedisConnections:
    """The two clients of one server (see the module docstring). ``grace_s`` is added to a
    blocking call's own timeout to bound it on the client side."""

    commands: Redis
    blocking: Redis
    grace_s: float = DEFAULT_SOCKET_TIMEOUT_S

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
) -> RedisConnections:
    """The command and blocking clients for ``url`` with the given bounds; a caller waits for
    a free connection at most ``socket_timeout_s``."""
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
    return RedisConnections(commands, blocking, grace_s=socket_timeout_s)


def text(value: str | bytes) -> str:
    """A reply as text, whether or not the client decodes replies."""
    return value.decode() if isinstance(value, bytes) else value


_LISTEN_SLICE_S = 1.0
_BACKOFF_FIRST_S = 0.05
_BACKOFF_CAP_S = 2.0


class Wakeups:
    """Named wake-ups carried by one pub/sub channel, for every process that listens.

    Publishing ``name`` on ``channel`` (a script may do so atomically with a write) sets the
    events of this process's watchers of ``name``. Delivery is best effort: what is published
    while the listener reconnects is lost, so every watcher is woken when a subscription is
    confirmed (at first and after each reconnection) and on every listener error; a watcher
    must re-check its condition after each wake-up, and now and then on its own. The listener
    holds one connection; it starts with the first ``watch``.
    """

    def __init__(self, client: Redis, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None

    @property
    def channel(self) -> str:
        return self._channel

    def watch(self, name: str) -> asyncio.Event:
        """A new event set at the next wake-up of ``name``; pass it to ``unwatch`` when done."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name=f"wakeups:{self._channel}")
        event = asyncio.Event()
        self._watchers.setdefault(name, set()).add(event)
        return event

    @property
    def watched(self) -> int:
        """Names with at least one watcher now."""
        return len(self._watchers)

    def unwatch(self, name: str, event: asyncio.Event) -> None:
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

    def _ring(self, name: str) -> None:
        for event in self._watchers.get(name, ()):
            event.set()

    def _ring_all(self) -> None:
        for events in self._watchers.values():
            for event in events:
                event.set()

    async def _listen(self) -> None:
        backoff = _BACKOFF_FIRST_S
        me = asyncio.current_task()
        assert me is not None
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    message = await pubsub.get_message(timeout=_LISTEN_SLICE_S)
                    if me.cancelling():
                        # redis-py may absorb a cancellation that lands inside a read with a
                        # timeout; ``aclose`` must not wait for a listener that goes on.
                        raise asyncio.CancelledError
                    if message is None:
                        continue
                    kind = message.get("type")
                    if kind == "message":
                        self._ring(text(message["data"]))
                    elif kind == "subscribe":
                        # Confirmed, at first or after redis-py reconnected on its own: what
                        # was published before is unseen, so every watcher looks again.
                        backoff = _BACKOFF_FIRST_S
                        self._ring_all()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("wake-ups on %s interrupted (%s); reconnecting", self._channel, e)
                self._ring_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_CAP_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
