"""The leases of a worker host's workers: taking, renewing and the heartbeat's schedule,
with the host's own record that the heartbeat keeps alive.

A worker serves its user under the user's lease (the ``worker:active:{user_id}`` mark with a
fencing token, see ``WorkerDirectory``), taken under its host's holder name. The host's
heartbeat renews, in one batch (``renew_many``), every lease of the host last renewed a sixth
of its time to live ago or more; a worker whose lease was not renewed for a third of its time
to live (the heartbeat stalled) renews it itself before taking a request. The lease is checked
before every request is taken: once a renewal says it is lost, the worker finishes the request
in hand and never starts another. The fencing token does not guard writes: it names the lease
in the log lines and keeps a stale worker from renewing, releasing or retiring its
successor's lease.

Why a stale worker is harmless, and why the heartbeat batches: see docs/decisions.md,
"Production runtime".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

import attrs

from tradecore.ports.messaging import WorkerDirectory
from tradecore.ports.runtime import Clock
from tradecore.services.execution.worker import UserWorker


@attrs.define
class WorkerSlot:
    """One user's worker in a host, with the lease its task serves under."""

    worker: UserWorker
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    token: int | None = None  # the lease the task serves under
    renewed_at: datetime | None = None  # when its last renewal was sent
    lost: bool = False  # a renewal failed: take nothing more
    probing: bool = False  # its worker probes the store for the host (an outage)


class HostLeases:
    """The leases a host holds for its worker slots (see the module doc).

    ``slots`` is the host's own table of slots, read here (the host adds and removes them);
    ``holder`` names the host in the leases it takes; ``ttl_s`` is their time to live and
    ``heartbeat_age`` the age at which the heartbeat renews one. ``log`` receives the lost
    leases (the host's logger, so they read as the host's). A call that meets a store outage
    raises ``StoreUnavailable``, recording nothing; the host retries it through its outage
    gate.
    """

    def __init__(
        self,
        directory: WorkerDirectory,
        slots: Mapping[str, WorkerSlot],
        clock: Clock,
        *,
        holder: str,
        ttl_s: float,
        heartbeat_age: timedelta,
        log: logging.Logger,
    ) -> None:
        self._directory = directory
        self._slots = slots
        self._clock = clock
        self._holder = holder
        self._ttl_s = ttl_s
        self._heartbeat_age = heartbeat_age
        self._log = log
        self._next_renewal: datetime | None = None  # the heartbeat's next due lease, if known
        self._recorded_at: datetime | None = None  # the host's record last written (alive)

    async def acquire(self, user_id: str, slot: WorkerSlot) -> int | None:
        """Take the user's lease for this host: its token, recorded on ``slot`` with the time
        the call was sent; None when another holder has the lease."""
        sent = self._clock.now()
        token = await self._directory.acquire(user_id, self._holder, self._ttl_s)
        if token is not None:
            slot.token, slot.renewed_at = token, sent
            due = sent + self._heartbeat_age
            if self._next_renewal is not None and due < self._next_renewal:
                self._next_renewal = due
        return token

    async def renew(self, user_id: str, slot: WorkerSlot, token: int) -> bool:
        """Renew the lease ``token`` of the worker in ``slot``, recording when the call was
        sent; False (with a warning) when it is lost."""
        sent = self._clock.now()
        if await self._directory.renew(user_id, token, self._ttl_s):
            if slot.renewed_at is None or slot.renewed_at < sent:
                slot.renewed_at = sent
            return True
        self._warn_lost(user_id, token)
        return False

    def renewal_due(self, slot: WorkerSlot) -> bool:
        """Whether the worker must renew its lease itself before it takes a request: no
        renewal went through for a third of its time to live (the heartbeat stalled)."""
        assert slot.renewed_at is not None
        return self._seconds_since(slot.renewed_at) >= self._ttl_s / 3

    def gone(self, slot: WorkerSlot) -> bool:
        """Whether the worker must stop (asked by the outage gate): it holds a lease, and the
        heartbeat found it lost or has not renewed it for a whole time to live. A lapsed lease
        counts as lost (the slot is marked so). Before a lease is taken there is nothing to
        lose: False."""
        if slot.token is None:
            return False
        if slot.lost:
            return True
        assert slot.renewed_at is not None
        if self._seconds_since(slot.renewed_at) >= self._ttl_s:
            slot.lost = True
            return True
        return False

    async def heartbeat(self) -> set[str]:
        """Record the host alive for a lease time to live when a sixth of it passed since it
        last did (``WorkerDirectory.host_alive``: other hosts sweep for this one's users
        once the record lapses), then renew, in one batch, every lease of this host last
        renewed a sixth of its time to live ago or more. Returns the users whose lease was
        lost; their workers take nothing more. Until the earliest lease held is due it
        returns after the record, without looking at the workers (the control loop calls it
        after every start request: a burst of activations must not cost a scan of every
        worker each)."""
        now = self._clock.now()  # one clock read
        if self._recorded_at is None or now - self._recorded_at >= self._heartbeat_age:
            await self._directory.host_alive(self._holder, self._ttl_s)
            self._recorded_at = now
        if self._next_renewal is not None and now < self._next_renewal:
            return set()  # no lease is due yet: the slots are not scanned
        renewed_by = now - self._heartbeat_age
        due = {user_id: token for user_id, token, at in self._held() if at <= renewed_by}
        lost: set[str] = set()
        if due:
            sent = self._clock.now()
            lost = await self._directory.renew_many(due, self._ttl_s)
            for user_id, token in due.items():
                slot = self._slots.get(user_id)
                if slot is None or slot.token != token:
                    continue  # the worker ended meanwhile
                if user_id in lost:
                    slot.lost = True
                    self._warn_lost(user_id, token)
                elif slot.renewed_at is None or slot.renewed_at < sent:
                    slot.renewed_at = sent
        self._next_renewal = self._earliest_renewal()
        return lost

    async def leave(self) -> None:
        """Remove the host's record (``WorkerDirectory.host_gone``): the host stops and
        released its leases. The next heartbeat records it again (a restarted host)."""
        self._recorded_at = None
        await self._directory.host_gone(self._holder)

    def _earliest_renewal(self) -> datetime | None:
        """When the first lease held now becomes due (None: none is held). A renewal only
        moves a lease's time later, and a lease taken later is recorded by ``acquire``, so
        until then the heartbeat has nothing to renew."""
        oldest = min((at for _, _, at in self._held()), default=None)
        return None if oldest is None else oldest + self._heartbeat_age

    def _held(self) -> Iterator[tuple[str, int, datetime]]:
        """(user, token, time of the last renewal) of each lease this host holds and has not
        found lost."""
        for user_id, slot in self._slots.items():
            if slot.token is not None and not slot.lost and slot.renewed_at is not None:
                yield user_id, slot.token, slot.renewed_at

    def _warn_lost(self, user_id: str, token: int) -> None:
        self._log.warning("worker of user %s lost its lease (token %d); stopping", user_id, token)

    def _seconds_since(self, since: datetime) -> float:
        return (self._clock.now() - since).total_seconds()
