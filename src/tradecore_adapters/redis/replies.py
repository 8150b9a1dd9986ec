"""One process's order replies, delivered by the notification that announces them.

The worker's ``complete`` script writes the reply to its list (the durable record, kept for
``REPLY_TTL_S``) and publishes ``"{request_id} {reply}"`` on the waiting process's reply
channel, in one step. ``ReplyInbox`` listens on that channel with one connection for every
waiter of the process and hands the reply it carries to the request's waiter: the common
case costs no read of the list at all.

The list is still what makes a reply certain, since pub/sub delivery is best effort. A waiter
reads it (``look``):

1. first, unless its slot was opened (``expect``) before the request was handed over, which
   ``expect`` does only while the listener is subscribed, so any reply published since
   reaches the slot;
2. whenever the listener (re)subscribes or is interrupted: what was published meanwhile is
   unseen (the same rule as ``Wakeups``);
3. after a notification without a reply (a bare request id: a worker of an earlier release);
4. once more at its deadline, in case a notification was lost some other way.

So a lost notification delays a reply to the waiter's deadline, never loses it, and a reply
is never taken from a notification for a request this process does not wait for (it is
dropped: its list holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs

from tradecore_adapters.redis.client import Client, listen

T = TypeVar("T")


@attrs.define(eq=False)
class _Slot:
    """One awaited reply: ``reply`` once a notification carried it; ``look`` while the list
    must be read before waiting (a notification may have been missed)."""

    look: bool
    event: asyncio.Event = attrs.field(factory=asyncio.Event)
    reply: str | None = None
    waiting: bool = False


class ReplyInbox(Generic[T]):
    """Replies published on ``channel`` as ``"{name} {reply}"``, decoded by ``decode``."""

    def __init__(self, client: Client, channel: str, decode: Callable[[str], T]) -> None:
        self._client = client
        self._channel = channel
        self._decode = decode
        self._slots: dict[str, _Slot] = {}
        self._subscribed = False
        self._listener: asyncio.Task[None] | None = None

    @property
    def channel(self) -> str:
        return self._channel

    @property
    def waiting(self) -> int:
        """Replies being waited for now."""
        return sum(1 for slot in self._slots.values() if slot.waiting)

    @property
    def subscribed(self) -> bool:
        """Whether the listener is subscribed now: a reply published from now on reaches it."""
        return self._subscribed

    def expect(self, name: str) -> None:
        """Open the slot of ``name`` before its request is handed over, while the listener is
        subscribed, so a reply published from then on is kept for ``wait``. Otherwise nothing:
        the listener starts with the first ``wait``, which reads the list first anyway (a
        process that hands requests over without waiting, such as a worker host's recovery
        of lost intents, holds no listener and no slots)."""
        if self._subscribed and name not in self._slots:
            self._slots[name] = _Slot(look=False)

    def forget(self, name: str) -> None:
        """Drop the slot of ``name`` unless a ``wait`` holds it (its request was not handed
        over after all, or nobody waited for its reply in time)."""
        slot = self._slots.get(name)
        if slot is not None and not slot.waiting:
            del self._slots[name]

    async def wait(
        self, name: str, look: Callable[[], Awaitable[T | None]], timeout_s: float
    ) -> T | None:
        """The reply to ``name``: from its notification, else from ``look()`` (the list), read
        as the module docstring says; None when nothing came within ``timeout_s``. A
        ``timeout_s`` of zero or less looks once. The slot is closed when the wait ends."""
        if timeout_s <= 0:
            self.forget(name)
            return await look()
        self._listen()
        slot = self._slots.get(name)
        if slot is None or slot.waiting:
            slot = self._slots[name] = _Slot(look=True)
        slot.waiting = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                slot.event.clear()
                if slot.reply is not None:
                    return self._decode(slot.reply)
                if slot.look:
                    slot.look = False
                    found = await look()
                    if found is not None:
                        return found
                    continue  # a notification may have come during the look
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return await look()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await slot.event.wait()
        finally:
            if self._slots.get(name) is slot:
                del self._slots[name]

    async def aclose(self) -> None:
        """Stop listening; every waiter looks at its list once more (and finds the store
        closed, or its reply)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        self._look_all()

    def _listen(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(
                listen(self._client, self._channel, _InboxSubscriber(self), "order replies"),
                name=f"replies:{self._channel}",
            )

    def _deliver(self, data: str) -> None:
        name, space, reply = data.partition(" ")
        slot = self._slots.get(name)
        if slot is None:
            return
        if space:
            slot.reply = reply
        else:
            slot.look = True
        slot.event.set()

    def _look_all(self) -> None:
        for slot in self._slots.values():
            slot.look = True
            slot.event.set()

    def _set_subscribed(self, subscribed: bool) -> None:
        self._subscribed = subscribed
        self._look_all()


class _InboxSubscriber:
    """What a ``ReplyInbox`` does with its channel (``client.listen``)."""

    def __init__(self, inbox: ReplyInbox[Any]) -> None:
        self._inbox = inbox

    def message(self, data: str) -> None:
        self._inbox._deliver(data)

    def confirmed(self) -> None:
        self._inbox._set_subscribed(True)

    def interrupted(self) -> None:
        self._inbox._set_subscribed(False)
