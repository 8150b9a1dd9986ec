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

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from tradecore.ports.owner_changes import OwnerChangeListener
from tradecore_adapters.redis.client import listen
from tradecore_adapters.redis.errors import unavailable_on_failure

OWNER_CHANGES_CHANNEL = "webhook:owners:changed"


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
        await listen(self._client, self._channel, _Announcements(self), "owner changes")


class _Announcements:
    """The channel's events, passed on to every listener of a ``RedisOwnerChanges``."""

    def __init__(self, changes: RedisOwnerChanges) -> None:
        self._changes = changes

    def message(self, data: str) -> None:
        for listener in self._changes._listeners:
            listener.changed(data)

    def confirmed(self) -> None:
        for listener in self._changes._listeners:
            listener.resubscribed()

    def interrupted(self) -> None:
        self._changes._tell_interrupted()
