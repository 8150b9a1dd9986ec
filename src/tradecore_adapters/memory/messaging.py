"""In-memory order queue, worker directory and order-tasks FIFO queue (one event loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic
with respect to every other coroutine, as the Redis commands and scripts are. Expiry (leases,
replies, visibility) follows the injected Clock; blocking calls (``take``, ``wait_result``,
``wait_active``, ``next_start_request``, ``receive``) wait in real time, up to their timeout,
and return as soon as what they wait for arrives.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TypeVar

import attrs

from tradecore.orders import OrderRequest, OrderResult
from tradecore.ports.messaging import FillDelivery, FillTask
from tradecore.ports.runtime import Clock

T = TypeVar("T")

REPLY_TTL_S = 60.0
"""A reply nobody collected is dropped after this long (the API waits at most 30 s)."""

_POLL_S = 0.05
"""Longest real wait between two looks at the order-tasks queue (visibility is by clock)."""

_ANY = "*"


class _Doorbell:
    """Wake-ups by key: ``ring(key)`` wakes every coroutine waiting on that key right now."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[asyncio.Event, int]] = {}

    def ring(self, key: str) -> None:
        entry = self._waiting.pop(key, None)
        if entry is not None:
            entry[0].set()

    async def wait(self, key: str, timeout_s: float) -> None:
        """Return on the next ring of ``key`` or after ``timeout_s``, whichever comes first."""
        entry = self._waiting.get(key)
        event, waiters = entry if entry is not None else (asyncio.Event(), 0)
        self._waiting[key] = (event, waiters + 1)
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            entry = self._waiting.get(key)
            if entry is not None and entry[0] is event:
                if entry[1] <= 1:
                    del self._waiting[key]
                else:
                    self._waiting[key] = (event, entry[1] - 1)


async def _wait_for(
    bell: _Doorbell,
    key: str,
    ready: Callable[[], T | None],
    timeout_s: float,
    slice_s: float | None = None,
) -> T | None:
    """``ready()`` as soon as it is not None, re-checked on every ring of ``key`` (and every
    ``slice_s`` if given); None once ``timeout_s`` of real time passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    while True:
        value = ready()
        if value is not None:
            return value
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        await bell.wait(key, remaining if slice_s is None else min(remaining, slice_s))


@attrs.frozen
class _Lease:
    holder: str
    token: int
    expires_at: datetime


class MemoryWorkerDirectory:
    """WorkerDirectory: leases (active marks) with a time to live, and the worker-control queue.

    Fencing tokens come from a per-user counter that never goes back, even after a lease
    expired or was released. ``attach_queue`` links the order queue whose request lists
    ``retire`` must find empty.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._fences: dict[str, int] = {}
        self._starts: deque[str] = deque()
        self._start_pending: set[str] = set()
        self._marks_bell = _Doorbell()
        self._starts_bell = _Doorbell()
        self._queue: MemoryOrderQueue | None = None

    def attach_queue(self, queue: MemoryOrderQueue) -> None:
        self._queue = queue

    def is_marked(self, user_id: str) -> bool:
        """The mark exists now (synchronous, for the order queue's atomic push)."""
        return self._lease(user_id) is not None

    async def is_active(self, user_id: str) -> bool:
        return self.is_marked(user_id)

    async def request_start(self, user_id: str) -> None:
        if user_id in self._start_pending:
            return
        self._start_pending.add(user_id)
        self._starts.append(user_id)
        self._starts_bell.ring(_ANY)

    async def wait_active(self, user_id: str, timeout_s: float) -> bool:
        marked = await _wait_for(
            self._marks_bell, user_id, lambda: True if self.is_marked(user_id) else None, timeout_s
        )
        return marked is not None

    async def next_start_request(self, timeout_s: float) -> str | None:
        return await _wait_for(self._starts_bell, _ANY, self._pop_start, timeout_s)

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        queue = self._queue
        if queue is None:
            return []
        return [u for u in queue.users_with_requests() if not self.is_marked(u)][:limit]

    async def acquire(self, user_id: str, holder: str, ttl_s: float) -> int | None:
        lease = self._lease(user_id)
        if lease is not None and lease.holder != holder:
            return None
        if lease is None:
            token = self._fences.get(user_id, 0) + 1
            self._fences[user_id] = token
        else:
            token = lease.token
        self._leases[user_id] = _Lease(holder, token, self._expiry(ttl_s))
        self._marks_bell.ring(user_id)
        return token

    async def renew(self, user_id: str, token: int, ttl_s: float) -> bool:
        lease = self._lease(user_id)
        if lease is None or lease.token != token:
            return False
        self._leases[user_id] = attrs.evolve(lease, expires_at=self._expiry(ttl_s))
        return True

    async def renew_many(self, leases: Mapping[str, int], ttl_s: float) -> set[str]:
        return {u for u, token in leases.items() if not await self.renew(u, token, ttl_s)}

    async def release(self, user_id: str, token: int) -> None:
        lease = self._lease(user_id)
        if lease is not None and lease.token == token:
            del self._leases[user_id]

    async def retire(self, user_id: str, token: int) -> bool:
        lease = self._lease(user_id)
        if lease is None or lease.token != token:
            return False
        if self._queue is not None and self._queue.has_waiting(user_id):
            return False
        del self._leases[user_id]
        return True

    def _lease(self, user_id: str) -> _Lease | None:
        """The user's lease unless it expired (an expired one is dropped)."""
        lease = self._leases.get(user_id)
        if lease is None:
            return None
        if lease.expires_at <= self._clock.now():
            del self._leases[user_id]
            return None
        return lease

    def _expiry(self, ttl_s: float) -> datetime:
        return self._clock.now() + timedelta(seconds=ttl_s)

    def _pop_start(self) -> str | None:
        if not self._starts:
            return None
        user_id = self._starts.popleft()
        self._start_pending.discard(user_id)
        return user_id


class MemoryOrderQueue:
    """OrderQueue: per-user request lists, in-flight lists and reply slots.

    ``push`` checks the directory's mark in the same step as the append. A reply is kept
    until ``wait_result`` collects it (even if it came before the wait began) or until
    ``REPLY_TTL_S`` passed by the clock; a reply is collected once.
    """

    def __init__(self, clock: Clock, directory: MemoryWorkerDirectory) -> None:
        self._clock = clock
        self._directory = directory
        self._waiting: dict[str, deque[OrderRequest]] = {}
        self._taken: dict[str, list[OrderRequest]] = {}
        self._replies: dict[str, tuple[OrderResult, datetime]] = {}
        self._requests_bell = _Doorbell()
        self._replies_bell = _Doorbell()

    def users_with_requests(self) -> list[str]:
        """Users with a request waiting or in flight."""
        users = {u for u, w in self._waiting.items() if w} | {
            u for u, t in self._taken.items() if t
        }
        return sorted(users)

    def has_waiting(self, user_id: str) -> bool:
        """A request of ``user_id`` waits to be taken (synchronous, for ``retire``)."""
        return bool(self._waiting.get(user_id))

    async def push(self, request: OrderRequest) -> bool:
        if not self._directory.is_marked(request.user_id):
            return False
        self._waiting.setdefault(request.user_id, deque()).append(request)
        self._requests_bell.ring(request.user_id)
        return True

    async def wait_result(self, request_id: str, timeout_s: float) -> OrderResult | None:
        return await _wait_for(
            self._replies_bell, request_id, lambda: self._collect(request_id), timeout_s
        )

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        return await _wait_for(
            self._requests_bell, user_id, lambda: self._move_oldest(user_id), timeout_s
        )

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        taken = self._taken.get(request.user_id, [])
        for index, candidate in enumerate(taken):
            if candidate.request_id == request.request_id:
                del taken[index]
                break
        if not taken:
            self._taken.pop(request.user_id, None)
        now = self._clock.now()
        self._drop_expired_replies(now)
        self._replies[request.request_id] = (result, now + timedelta(seconds=REPLY_TTL_S))
        self._replies_bell.ring(request.request_id)

    async def in_flight(self, user_id: str) -> list[OrderRequest]:
        return list(self._taken.get(user_id, []))

    def _move_oldest(self, user_id: str) -> OrderRequest | None:
        waiting = self._waiting.get(user_id)
        if not waiting:
            return None
        request = waiting.popleft()
        if not waiting:
            del self._waiting[user_id]
        self._taken.setdefault(user_id, []).append(request)
        return request

    def _collect(self, request_id: str) -> OrderResult | None:
        entry = self._replies.pop(request_id, None)
        if entry is None or entry[1] <= self._clock.now():
            return None
        return entry[0]

    def _drop_expired_replies(self, now: datetime) -> None:
        # Replies are stored in completion order, so the expired ones are at the front.
        while self._replies:
            oldest = next(iter(self._replies))
            if self._replies[oldest][1] > now:
                return
            del self._replies[oldest]


@attrs.define
class _Message:
    id: int
    task: FillTask
    visible_at: datetime
    receive_count: int = 0
    in_flight_until: datetime | None = None

    @property
    def receipt(self) -> str:
        return f"{self.id}.{self.receive_count}"


DEDUP_WINDOW_S = 300.0
"""How long a sent order's task deduplicates further sends of that order (SQS FIFO's window)."""


class MemoryFillTaskQueue:
    """FillTaskQueue: the order-tasks FIFO queue with message groups (group = user id).

    Within a group, messages are delivered in send order among those visible, and nothing is
    delivered while the group has a message in flight. A message in flight past the
    visibility timeout is released and delivered again with a higher ``receive_count``. A
    settle call (``ack``, ``retry``, ``dead_letter``) for a delivery that was already settled
    or superseded by a later delivery of the same message does nothing; until then it is
    honoured even past the visibility timeout, as SQS receipt handles are. A send of an order
    already sent within ``dedup_window_s`` (by the clock) does nothing.
    """

    def __init__(
        self,
        clock: Clock,
        visibility_timeout_s: float = 180.0,
        dedup_window_s: float = DEDUP_WINDOW_S,
    ) -> None:
        self._clock = clock
        self._visibility = timedelta(seconds=visibility_timeout_s)
        self._dedup_window = timedelta(seconds=dedup_window_s)
        self._messages: dict[int, _Message] = {}  # send order
        self._sent: dict[str, datetime] = {}  # order id -> end of its window, oldest first
        self._dead: list[tuple[FillTask, str]] = []
        self._ids = itertools.count(1)
        self._bell = _Doorbell()

    async def send(self, task: FillTask, delay_s: float) -> None:
        if not self._claim_send(task.order_id):
            return
        message = _Message(next(self._ids), task, self._after(delay_s))
        self._messages[message.id] = message
        self._bell.ring(_ANY)

    async def receive(self, timeout_s: float) -> FillDelivery | None:
        return await _wait_for(self._bell, _ANY, self._deliver, timeout_s, _POLL_S)

    async def ack(self, delivery: FillDelivery) -> None:
        message = self._current(delivery)
        if message is not None:
            del self._messages[message.id]
            self._bell.ring(_ANY)

    async def retry(self, delivery: FillDelivery, delay_s: float) -> None:
        message = self._current(delivery)
        if message is not None:
            message.in_flight_until = None
            message.visible_at = self._after(delay_s)
            self._bell.ring(_ANY)

    async def dead_letter(self, delivery: FillDelivery, reason: str) -> None:
        message = self._current(delivery)
        if message is not None:
            del self._messages[message.id]
            self._dead.append((message.task, reason))
            self._bell.ring(_ANY)

    async def dead_letters(self) -> list[tuple[FillTask, str]]:
        return list(self._dead)

    def _after(self, delay_s: float) -> datetime:
        return self._clock.now() + timedelta(seconds=max(0.0, delay_s))

    def _claim_send(self, order_id: str) -> bool:
        """Open the order's deduplication window; False when one is open already."""
        now = self._clock.now()
        while self._sent:  # windows end in insertion order: drop the ended ones
            oldest, oldest_ends_at = next(iter(self._sent.items()))
            if oldest_ends_at > now:
                break
            del self._sent[oldest]
        ends_at = self._sent.get(order_id)
        if ends_at is not None and ends_at > now:
            return False
        self._sent.pop(order_id, None)  # re-inserted last, in window order
        self._sent[order_id] = now + self._dedup_window
        return True

    def _current(self, delivery: FillDelivery) -> _Message | None:
        """The message ``delivery`` received, unless it was settled or delivered again since."""
        message_id, _, count = delivery.receipt.partition(".")
        message = self._messages.get(int(message_id)) if message_id.isdigit() else None
        if message is None or message.in_flight_until is None:
            return None
        return message if str(message.receive_count) == count else None

    def _deliver(self) -> FillDelivery | None:
        now = self._clock.now()
        busy: set[str] = set()
        for message in self._messages.values():
            if message.in_flight_until is not None and message.in_flight_until > now:
                busy.add(message.task.user_id)
        for message in self._messages.values():
            if message.task.user_id in busy or message.visible_at > now:
                continue
            message.receive_count += 1
            message.in_flight_until = now + self._visibility
            return FillDelivery(message.task, message.receipt, message.receive_count)
        return None
