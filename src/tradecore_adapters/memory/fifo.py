"""In-memory order queue, worker directory and order-tasks FIFO queue (one event loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic
with respect to every other coroutine, as the Redis commands and scripts are. Expiry (leases,
replies, visibility) follows the injected Clock; blocking calls (``take``, ``wait_result``,
``wait_active``, ``next_start_request``, ``receive``) wait in real time, up to their timeout,
and return as soon as what they wait for arrives.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import OrderedDict, deque
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
_REPLY_TTL = timedelta(seconds=REPLY_TTL_S)

_POLL_S = 0.05
"""Longest real wait between two looks at the order-tasks queue (visibility is by clock)."""

_ANY = "*"


def _resolve(waiter: asyncio.Future[bool], rung: bool) -> None:
    if not waiter.done():
        waiter.set_result(rung)


class _Doorbell:
    """Wake-ups by key: ``ring(key)`` wakes every coroutine waiting on that key right now."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[asyncio.Future[bool]]] = {}

    def ring(self, key: str) -> None:
        waiters = self._waiting.pop(key, None)
        if waiters is not None:
            for waiter in waiters:
                _resolve(waiter, True)

    async def wait(self, key: str, deadline: float) -> bool:
        """True on the next ring of ``key``; False once the loop's time reached ``deadline``
        without one. A cancelled wait leaves nothing behind."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        waiters = self._waiting.get(key)
        if waiters is None:
            self._waiting[key] = [waiter]
        else:
            waiters.append(waiter)
        timer = loop.call_at(deadline, _resolve, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            if not (waiter.done() and not waiter.cancelled() and waiter.result()):
                self._forget(key, waiter)  # a timeout or a cancellation: still listed

    def _forget(self, key: str, waiter: asyncio.Future[bool]) -> None:
        waiters = self._waiting.get(key)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:  # rung after its timeout: the ring took the list already
            return
        if not waiters:
            del self._waiting[key]


async def _wait_for(
    bell: _Doorbell,
    key: str,
    ready: Callable[[], T | None],
    timeout_s: float,
    pause_s: Callable[[], float | None] | None = None,
) -> T | None:
    """``ready()`` as soon as it is not None, re-checked on every ring of ``key`` and, when
    ``pause_s`` is given, after at most ``pause_s()`` seconds (None: until a ring); None once
    ``timeout_s`` of real time passed. A ``timeout_s`` <= 0 checks once and never waits."""
    value = ready()
    if value is not None or timeout_s <= 0:
        return value
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        wake_at = deadline
        if pause_s is not None:
            pause = pause_s()
            if pause is not None:
                wake_at = min(deadline, loop.time() + pause)
        rung = await bell.wait(key, wake_at)
        value = ready()
        if value is not None or (not rung and wake_at == deadline) or loop.time() >= deadline:
            return value


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
        # Completion order, so expiry order; an OrderedDict finds its oldest entry at once.
        self._replies: OrderedDict[str, tuple[OrderResult, datetime]] = OrderedDict()
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
        taken = self._taken.get(request.user_id)
        if taken is not None:
            for index, candidate in enumerate(taken):
                if candidate.request_id == request.request_id:
                    del taken[index]
                    break
            if not taken:
                del self._taken[request.user_id]
        now = self._clock.now()
        self._drop_expired_replies(now)
        self._replies[request.request_id] = (result, now + _REPLY_TTL)
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
        taken = self._taken.get(user_id)
        if taken is None:
            self._taken[user_id] = [request]
        else:
            taken.append(request)
        return request

    def _collect(self, request_id: str) -> OrderResult | None:
        entry = self._replies.pop(request_id, None)
        if entry is None or entry[1] <= self._clock.now():
            return None
        return entry[0]

    def _drop_expired_replies(self, now: datetime) -> None:
        replies = self._replies
        while replies:  # the expired ones are at the front
            oldest = next(iter(replies))
            if replies[oldest][1] > now:
                return
            del replies[oldest]


@attrs.define
class _Message:
    id: int
    task: FillTask
    visible_at: datetime
    receive_count: int = 0
    in_flight_until: datetime | None = None
    placement: int = 0
    """Bumped on every move between the queue's indexes: entries of an older one are stale."""

    @property
    def receipt(self) -> str:
        return f"{self.id}.{self.receive_count}"


DEDUP_WINDOW_S = 300.0
"""How long a sent order's task deduplicates further sends of that order (SQS FIFO's window)."""

_Due = tuple[datetime, int, int]
"""An index entry by time: (when, message id, placement)."""


class MemoryFillTaskQueue:
    """FillTaskQueue: the order-tasks FIFO queue with message groups (group = user id).

    Within a group, messages are delivered in send order among those visible, and nothing is
    delivered while the group has a message in flight; among groups, the first visible message
    of a free group in send order comes first. A message in flight past the visibility timeout
    is released and delivered again with a higher ``receive_count``. A settle call (``ack``,
    ``retry``, ``dead_letter``) for a delivery that was already settled or superseded by a
    later delivery of the same message does nothing; until then it is honoured even past the
    visibility timeout, as SQS receipt handles are. A send of an order already sent within
    ``dedup_window_s`` (by the clock) does nothing. Time is taken to go forward: a message
    that became visible, or a delivery whose visibility timeout passed, stays so if the clock
    is set back. ``send``, ``receive`` and the settle calls cost amortized O(log n) in the
    number of messages.
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
        self._messages: dict[int, _Message] = {}
        # Each message has one current entry, of its placement, in one of three heaps (the
        # entries of its earlier placements are stale and skipped when they come up):
        self._delayed: list[_Due] = []  # by visible_at: not yet visible
        self._visible: dict[str, list[tuple[int, int]]] = {}  # group -> (id, placement): visible
        self._leases: list[_Due] = []  # by in_flight_until: in flight
        self._busy: dict[str, int] = {}  # group -> id of its message in flight
        self._ready: list[tuple[int, str]] = []  # (first visible id, group) of free groups
        # Order id -> end of its window, in window order (an OrderedDict finds the oldest).
        self._sent: OrderedDict[str, datetime] = OrderedDict()
        self._dead: list[tuple[FillTask, str]] = []
        self._ids = itertools.count(1)
        self._bell = _Doorbell()

    async def send(self, task: FillTask, delay_s: float) -> None:
        now = self._clock.now()
        if not self._claim_send(task.order_id, now):
            return
        message = _Message(next(self._ids), task, self._after(now, delay_s))
        self._messages[message.id] = message
        heapq.heappush(self._delayed, (message.visible_at, message.id, message.placement))
        self._bell.ring(_ANY)

    async def receive(self, timeout_s: float) -> FillDelivery | None:
        return await _wait_for(self._bell, _ANY, self._deliver, timeout_s, self._pause_s)

    async def ack(self, delivery: FillDelivery) -> None:
        message = self._current(delivery)
        if message is not None:
            del self._messages[message.id]
            self._unplace(message)
            self._bell.ring(_ANY)

    async def retry(self, delivery: FillDelivery, delay_s: float) -> None:
        message = self._current(delivery)
        if message is not None:
            self._unplace(message)
            message.in_flight_until = None
            message.visible_at = self._after(self._clock.now(), delay_s)
            heapq.heappush(self._delayed, (message.visible_at, message.id, message.placement))
            self._bell.ring(_ANY)

    async def dead_letter(self, delivery: FillDelivery, reason: str) -> None:
        message = self._current(delivery)
        if message is not None:
            del self._messages[message.id]
            self._unplace(message)
            self._dead.append((message.task, reason))
            self._bell.ring(_ANY)

    async def dead_letters(self) -> list[tuple[FillTask, str]]:
        return list(self._dead)

    @staticmethod
    def _after(now: datetime, delay_s: float) -> datetime:
        return now + timedelta(seconds=delay_s) if delay_s > 0 else now

    def _claim_send(self, order_id: str, now: datetime) -> bool:
        """Open the order's deduplication window; False when one is open already."""
        sent = self._sent
        while sent:  # windows end in insertion order: drop the ended ones
            oldest = next(iter(sent))
            if sent[oldest] > now:
                break
            del sent[oldest]
        ends_at = sent.get(order_id)
        if ends_at is not None and ends_at > now:
            return False
        sent.pop(order_id, None)  # re-inserted last, in window order
        sent[order_id] = now + self._dedup_window
        return True

    def _current(self, delivery: FillDelivery) -> _Message | None:
        """The message ``delivery`` received, unless it was settled or delivered again since."""
        message_id, _, count = delivery.receipt.partition(".")
        message = self._messages.get(int(message_id)) if message_id.isdigit() else None
        if message is None or message.in_flight_until is None:
            return None
        return message if str(message.receive_count) == count else None

    def _is_placed(self, message_id: int, placement: int) -> bool:
        """An index entry of ``message_id`` with ``placement`` is not stale."""
        message = self._messages.get(message_id)
        return message is not None and message.placement == placement

    def _deliver(self) -> FillDelivery | None:
        now = self._clock.now()
        self._reveal_due(now)
        self._release_expired(now)
        ready = self._ready
        while ready:
            message_id, group = heapq.heappop(ready)
            if group in self._busy or self._first_visible(group) != message_id:
                continue  # stale: the group got busy, or its first message changed
            heapq.heappop(self._visible[group])
            if not self._visible[group]:
                del self._visible[group]
            message = self._messages[message_id]
            message.receive_count += 1
            message.in_flight_until = now + self._visibility
            message.placement += 1
            self._busy[group] = message_id
            heapq.heappush(self._leases, (message.in_flight_until, message_id, message.placement))
            return FillDelivery(message.task, message.receipt, message.receive_count)
        return None

    def _reveal_due(self, now: datetime) -> None:
        """Move the messages whose ``visible_at`` came to their groups' visible messages."""
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, message_id, placement = heapq.heappop(delayed)
            if self._is_placed(message_id, placement):
                message = self._messages[message_id]
                group = message.task.user_id
                self._show(message)
                if group not in self._busy and self._first_visible(group) == message_id:
                    heapq.heappush(self._ready, (message_id, group))  # the group's new first

    def _release_expired(self, now: datetime) -> None:
        """Free the groups whose message in flight passed its visibility timeout; that message
        is visible again (its receipt stays valid until its next delivery)."""
        leases = self._leases
        while leases and leases[0][0] <= now:
            _, message_id, placement = heapq.heappop(leases)
            if self._is_placed(message_id, placement):
                message = self._messages[message_id]
                del self._busy[message.task.user_id]
                self._show(message)
                self._offer(message.task.user_id)

    def _show(self, message: _Message) -> None:
        """Add ``message`` to its group's visible messages."""
        message.placement += 1
        heapq.heappush(
            self._visible.setdefault(message.task.user_id, []), (message.id, message.placement)
        )

    def _first_visible(self, group: str) -> int | None:
        """The id of the group's first visible message (stale entries dropped), or None."""
        visible = self._visible.get(group)
        if visible is None:
            return None
        while visible:
            message_id, placement = visible[0]
            if self._is_placed(message_id, placement):
                return message_id
            heapq.heappop(visible)
        del self._visible[group]
        return None

    def _offer(self, group: str) -> None:
        """Index a free group by its first visible message (an older entry goes stale)."""
        if group not in self._busy:
            first = self._first_visible(group)
            if first is not None:
                heapq.heappush(self._ready, (first, group))

    def _unplace(self, message: _Message) -> None:
        """Take a settled ``message`` out of the indexes: a message in flight frees its group,
        a visible one (past its visibility timeout) leaves its group's visible messages."""
        message.placement += 1
        group = message.task.user_id
        if self._busy.get(group) == message.id:
            del self._busy[group]
            if len(self._leases) > 2 * len(self._busy) + 64:
                self._compact_leases()
        self._offer(group)

    def _compact_leases(self) -> None:
        """Drop the stale entries of settled messages (amortized: they are at least half)."""
        self._leases = [entry for entry in self._leases if self._is_placed(entry[1], entry[2])]
        heapq.heapify(self._leases)

    def _pause_s(self) -> float | None:
        """Real seconds ``receive`` may wait for no ring: until the next message becomes
        visible or the next visibility timeout ends by the clock, at most ``_POLL_S``; None
        (until a ring) when no message is delayed or in flight."""
        leases = self._leases
        while leases and not self._is_placed(leases[0][1], leases[0][2]):
            heapq.heappop(leases)
        due = [entries[0][0] for entries in (self._delayed, leases) if entries]
        if not due:
            return None
        return min(_POLL_S, max(0.0, (min(due) - self._clock.now()).total_seconds()))
