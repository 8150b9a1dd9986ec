"""The order-tasks FIFO queue in memory: message groups, delays, visibility timeout, dead
letter (one event loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic
with respect to every other coroutine, as the Redis scripts are. Delays, visibility and the
deduplication window follow the injected Clock; ``receive`` waits in real time, up to its
timeout, and returns as soon as a message is delivered.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from datetime import datetime, timedelta

import attrs

from tradecore.ports.messaging import FillDelivery, FillTask
from tradecore.ports.runtime import Clock
from tradecore_adapters.memory.doorbell import ANY, Doorbell, wait_for

_POLL_S = 0.05
"""Longest real wait between two looks at the order-tasks queue (visibility is by clock)."""


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
        self._bell = Doorbell()

    async def send(self, task: FillTask, delay_s: float) -> None:
        now = self._clock.now()
        if not self._claim_send(task.order_id, now):
            return
        message = _Message(next(self._ids), task, self._after(now, delay_s))
        self._messages[message.id] = message
        heapq.heappush(self._delayed, (message.visible_at, message.id, message.placement))
        self._bell.ring(ANY)

    async def receive(self, timeout_s: float) -> FillDelivery | None:
        deliveries = await self.receive_many(1, timeout_s)
        return deliveries[0] if deliveries else None

    async def receive_many(self, limit: int, timeout_s: float) -> list[FillDelivery]:
        """Every deliverable message up to ``limit``, in delivery order (the port's
        contract); all of them are taken without an ``await`` in between."""
        if limit < 1:
            raise ValueError("limit must be >= 1")

        def deliver() -> list[FillDelivery] | None:
            return self._deliver(limit) or None  # None: wait_for goes on waiting

        return await wait_for(self._bell, ANY, deliver, timeout_s, self._pause_s) or []

    async def ack(self, delivery: FillDelivery) -> None:
        message = self._current(delivery)
        if message is not None:
            del self._messages[message.id]
            self._unplace(message)
            self._bell.ring(ANY)

    async def retry(self, delivery: FillDelivery, delay_s: float) -> None:
        message = self._current(delivery)
        if message is not None:
            self._unplace(message)
            message.in_flight_until = None
            message.visible_at = self._after(self._clock.now(), delay_s)
            heapq.heappush(self._delayed, (message.visible_at, message.id, message.placement))
            self._bell.ring(ANY)

    async def dead_letter(self, delivery: FillDelivery, reason: str) -> None:
        message = self._current(delivery)
        if message is not None:
            del self._messages[message.id]
            self._unplace(message)
            self._dead.append((message.task, reason))
            self._bell.ring(ANY)

    async def dead_letters(self) -> list[tuple[FillTask, str]]:
        return list(self._dead)

    async def pending_count(self) -> int:
        return len(self._messages)

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

    def _deliver(self, limit: int) -> list[FillDelivery]:
        """Up to ``limit`` deliveries, oldest first among the free groups' first visible
        messages (a delivered group is busy, so it comes once)."""
        now = self._clock.now()
        self._reveal_due(now)
        self._release_expired(now)
        ready = self._ready
        deliveries: list[FillDelivery] = []
        while ready and len(deliveries) < limit:
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
            deliveries.append(FillDelivery(message.task, message.receipt, message.receive_count))
        return deliveries

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
