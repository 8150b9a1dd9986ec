"""The in-memory order queue: per-user request lists, in-flight lists and replies (one event
loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic
with respect to every other coroutine, as the Redis commands and scripts are. Replies expire
by the injected Clock; ``take`` and ``wait_result`` wait in real time, up to their timeout,
and return as soon as what they wait for arrives.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from datetime import datetime, timedelta

from tradecore.orders import OrderRequest, OrderResult
from tradecore.ports.messaging import QueueDepth
from tradecore.ports.runtime import Clock
from tradecore_adapters.memory.doorbell import Doorbell, wait_for
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

REPLY_TTL_S = 60.0
"""A reply nobody collected is dropped after this long (the API waits at most 30 s)."""
_REPLY_TTL = timedelta(seconds=REPLY_TTL_S)


class MemoryOrderQueue:
    """OrderQueue: per-user request lists, in-flight lists and reply slots.

    ``push`` checks the directory's mark in the same step as the append, and hands the
    request over when nothing waits and nothing is in flight (into the in-flight list, the
    next ``take`` returns it first, ``in_flight`` leaves it out until then), as the Redis
    queue does. A reply is kept
    until ``wait_result`` collects it (even if it came before the wait began) or until
    ``REPLY_TTL_S`` passed by the clock; a reply is collected once.
    """

    def __init__(self, clock: Clock, directory: MemoryWorkerDirectory) -> None:
        self._clock = clock
        self._directory = directory
        self._waiting: dict[str, deque[OrderRequest]] = {}
        self._taken: dict[str, list[OrderRequest]] = {}
        # user id -> the request ``push`` handed over (in ``_taken`` already) that no take
        # has returned yet
        self._handed: dict[str, OrderRequest] = {}
        # Completion order, so expiry order; an OrderedDict finds its oldest entry at once.
        self._replies: OrderedDict[str, tuple[OrderResult, datetime]] = OrderedDict()
        self._requests_bell = Doorbell()
        self._replies_bell = Doorbell()

    def users_with_requests(self) -> list[str]:
        """Users with a request waiting or in flight."""
        users = {u for u, w in self._waiting.items() if w} | {
            u for u, t in self._taken.items() if t
        }
        return sorted(users)

    def has_waiting(self, user_id: str) -> bool:
        """A request of ``user_id`` waits to be taken, or was handed over and no take has
        returned it (synchronous, for ``retire``)."""
        return bool(self._waiting.get(user_id)) or user_id in self._handed

    async def push(self, request: OrderRequest) -> bool:
        user_id = request.user_id
        if not self._directory.is_marked(user_id):
            return False
        if not self._waiting.get(user_id) and not self._taken.get(user_id):
            self._taken[user_id] = [request]
            self._handed[user_id] = request
        else:
            self._waiting.setdefault(user_id, deque()).append(request)
        self._requests_bell.ring(request.user_id)
        return True

    async def park(self, request: OrderRequest) -> None:
        self._waiting.setdefault(request.user_id, deque()).append(request)
        self._requests_bell.ring(request.user_id)

    async def wait_result(self, request_id: str, timeout_s: float) -> OrderResult | None:
        return await wait_for(
            self._replies_bell, request_id, lambda: self._collect(request_id), timeout_s
        )

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        return await wait_for(
            self._requests_bell, user_id, lambda: self._move_oldest(user_id), timeout_s
        )

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        handed = self._handed.get(request.user_id)
        if handed is not None and handed.request_id == request.request_id:
            del self._handed[request.user_id]
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
        handed = self._handed.get(user_id)
        return [r for r in self._taken.get(user_id, []) if r is not handed]

    async def depths(self, limit: int = 1000) -> list[QueueDepth]:
        depths = []
        for user_id in self.users_with_requests()[: max(0, limit)]:
            handed = int(user_id in self._handed)  # waits, though in ``_taken`` already
            waiting = len(self._waiting.get(user_id, ())) + handed
            depths.append(QueueDepth(user_id, waiting, len(self._taken.get(user_id, ())) - handed))
        return depths

    def _move_oldest(self, user_id: str) -> OrderRequest | None:
        handed = self._handed.pop(user_id, None)
        if handed is not None:
            return handed
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
