"""``OwnerChanges`` over Redis pub/sub: a change of a webhook owner, announced to every API
process.

``publish`` is one PUBLISH of the user id on ``OWNER_CHANGES_CHANNEL`` (on a cluster a PUBLISH
on any node reaches the subscribers of every node). The listener holds one pub/sub connection
of its own, started by ``subscribe``; like the queues' wake-ups it reconnects after a failure,
with a growing pause. Delivery is best effort, so the listener tells its listeners exactly
when it may miss announcements: ``interrupted`` when the connection fails or the listener
stops, ``resubscribed`` each time Redis confirms the subscription (at first, after each
reconnection, redis-py's own included).

Channels are server-wide, not per database: deployments (or test runs) sharing one server
on different databases hear each other's announcements, which only costs needless drops;
tests name their own channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from tradecore.ports.owner_changes import OwnerChangeListener
from tradecore_adapters.redis.errors import unavailable_on_failure

log = logging.getLogger(__name__)

OWNER_CHANGES_CHANNEL = "webhook:owners:changed"
_LISTEN_SLICE_S = 1.0
_BACKOFF_FIRST_S = 0.05
_BACKOFF_CAP_S = 2.0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisOwnerChanges:
    """Announcements on ``channel`` through ``client`` (a server's or a cluster's)."""

    def __init__(self, client: Redis | RedisCluster, channel: str = OWNER_CHANGES_CHANNEL) -> None:
        self._client = client
        self._channel = channel
        self._listeners: list[OwnerChangeListener] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def channel(self) -> str:
        return self._channel

    async def publish(self, user_id: str) -> None:
        with unavailable_on_failure("publish"):
            await self._client.publish(self._channel, user_id)

    def subscribe(self, listener: OwnerChangeListener) -> None:
        """Add ``listener`` (it hears ``interrupted`` now, so it keeps nothing until the next
        confirmation) and start the listener task if it is not running."""
        self._listeners.append(listener)
        listener.interrupted()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name=f"owners:{self._channel}")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tell_interrupted()

    def _tell_interrupted(self) -> None:
        for listener in self._listeners:
            listener.interrupted()

    async def _listen(self) -> None:
        backoff = _BACKOFF_FIRST_S
        me = asyncio.current_task()
        assert me is not None
        while True:
            pubsub = None
            try:
                if isinstance(self._client, RedisCluster):
                    # a cluster's pub/sub needs the node map, read by the first command
                    await self._client.initialize()
                pubsub = self._client.pubsub()
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
                        user_id = _text(message["data"])
                        for listener in self._listeners:
                            listener.changed(user_id)
                    elif kind == "subscribe":
                        # confirmed, at first or after redis-py reconnected on its own: what
                        # was published before may be unseen
                        backoff = _BACKOFF_FIRST_S
                        for listener in self._listeners:
                            listener.resubscribed()
            except asyncio.CancelledError:
                self._tell_interrupted()
                raise
            except Exception as e:
                self._tell_interrupted()
                log.warning("owner changes on %s interrupted (%s); reconnecting", self._channel, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_CAP_S)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
