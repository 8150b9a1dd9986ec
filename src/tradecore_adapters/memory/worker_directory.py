"""The in-memory worker directory: per-user leases and the worker-control queue (one event
loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic
with respect to every other coroutine, as the Redis commands and scripts are. Leases and the
hosts' records expire by the injected Clock; ``wait_active`` and ``next_start_request`` wait
in real time, up to their timeout, and return as soon as what they wait for arrives.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Protocol

import attrs

from tradecore.ports.messaging import WorkerLease
from tradecore.ports.runtime import Clock
from tradecore_adapters.memory.doorbell import ANY, Doorbell, wait_for


class RequestLists(Protocol):
    """What the directory reads of the order queue, in the same step as its own change
    (``MemoryOrderQueue`` is one)."""

    def users_with_requests(self) -> list[str]:
        """Users with a request waiting or in flight."""
        ...

    def has_waiting(self, user_id: str) -> bool:
        """A request of ``user_id`` waits to be taken."""
        ...


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
        self._marks_bell = Doorbell()
        self._starts_bell = Doorbell()
        self._queue: RequestLists | None = None
        self._hosts: dict[str, datetime] = {}  # holder -> when its record runs out

    def attach_queue(self, queue: RequestLists) -> None:
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
        self._starts_bell.ring(ANY)

    async def wait_active(self, user_id: str, timeout_s: float) -> bool:
        marked = await wait_for(
            self._marks_bell, user_id, lambda: True if self.is_marked(user_id) else None, timeout_s
        )
        return marked is not None

    async def next_start_request(self, timeout_s: float) -> str | None:
        return await wait_for(self._starts_bell, ANY, self._pop_start, timeout_s)

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        queue = self._queue
        if queue is None:
            return []
        return [u for u in queue.users_with_requests() if not self.is_marked(u)][:limit]

    async def host_alive(self, holder: str, ttl_s: float) -> None:
        self._hosts[holder] = self._expiry(ttl_s)

    async def lapsed_hosts(self) -> list[str]:
        now = self._clock.now()
        lapsed = sorted(h for h, expires_at in self._hosts.items() if expires_at <= now)
        for holder in lapsed:
            del self._hosts[holder]
        return lapsed

    async def host_gone(self, holder: str) -> None:
        self._hosts.pop(holder, None)

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

    async def leases(self, limit: int = 1000) -> list[WorkerLease]:
        live = ((u, self._lease(u)) for u in sorted(self._leases))
        found = [WorkerLease(u, lease.holder, lease.token) for u, lease in live if lease]
        return found[: max(0, limit)]

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
