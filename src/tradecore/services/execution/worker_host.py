"""A worker host: runs the per-user workers of this process.

Several hosts share the users. For each start request from worker-control the host takes the
user's lease under its own holder name (``worker_leases``); when another holder has it, that
holder serves the user and the start request is let go. Otherwise one task of this host serves
the user: it recovers the requests a crashed worker left in flight, executes the user's
requests in order, and retires after the idle timeout (12 h by default), atomically and only
while no request waits, so none is stranded. Every ``sweep_s`` the host starts the users whose
requests wait with no lease (their host died), and in a task of its own it hands over again the
order intents an API made durable but died before pushing (``QueuedRecovery``).

A store outage (``StoreUnavailable``) never completes a request with a wrong result. Every
store call of a worker (taking, renewing or retiring its lease, listing its requests in
flight, taking a request, executing and completing one) goes through the host's one
``OutageGate`` and is retried there; a request being executed stays in flight and is executed
again (once it has a result, only the result is published again). After an interrupted take
the worker executes what its in-flight list holds before it takes another request. A worker
whose lease is lost or lapsed meanwhile (``LeaseGone``) stops, releasing nothing and leaving
its requests for the next holder. The control loop (sweep, heartbeat, start requests) is not
behind the gate: it backs off on its own (``OUTAGE_BACKOFF_S`` doubling up to
``OUTAGE_BACKOFF_MAX_S``) and logs the outage once.

Fill checks for a user go through this host's worker for the user, serialized with its orders.

Why: see docs/decisions.md, "Worker hosts through a store outage".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta

import attrs

from tradecore.errors import StoreUnavailable
from tradecore.orders import OrderHistoryRecord, OrderRequest, OrderResult
from tradecore.ports.broker import BrokerOrder
from tradecore.ports.messaging import OrderQueue, WorkerDirectory
from tradecore.ports.runtime import Clock, Sleeper
from tradecore.services.execution.cancellation import raise_if_cancelled
from tradecore.services.execution.outage_gate import (
    OUTAGE_BACKOFF_MAX_S,
    OUTAGE_BACKOFF_S,
    LeaseGone,
    OutageGate,
)
from tradecore.services.execution.queued_recovery import QueuedRecovery
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_leases import HostLeases, WorkerSlot

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 12 * 3600.0
DEFAULT_MARK_TTL_S = 30.0
DEFAULT_RECOVERY_GRACE_S = 30.0
DEFAULT_FULL_SWEEP_S = 60.0


@attrs.frozen
class HostSettings:
    """``mark_ttl_s``: lifetime of the lease (the active mark); the host's heartbeat renews
    it every sixth of it, the worker itself when a third has passed. ``poll_s``: how long one
    blocking take waits before the worker looks at the clock (its idle time, its lease) and
    the longest wait of the control loop. ``sweep_s``: how often the host asks which hosts
    died (``WorkerDirectory.lapsed_hosts``); after one did, the host looks for orphaned users
    (requests waiting with no lease) every ``sweep_s`` until the dead host's leases have run
    out, and starts them, so no request waits for the user's next order; the recovery of lost
    intents runs as often. ``full_sweep_s``: how often the host looks for orphaned users when
    no host died (and once when it starts), for orphans no dead host explains (a lease lost
    with the store's data). The look is a scan of the whole store, so it is not run every
    ``sweep_s`` by every host.
    ``recovery_grace_s``: how long an order intent must have been ``queued`` before the
    recovery may hand it over again (its API died between commit and push). A live API pushes
    within min(``worker_start_timeout_s``, half its response wait) of its commit, so the
    default (the default order response wait, twice that bound) leaves the other half for
    the commit and the push themselves; a shorter grace only costs a harmless duplicate push.
    """

    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    mark_ttl_s: float = DEFAULT_MARK_TTL_S
    poll_s: float = 1.0
    sweep_s: float = 5.0
    recovery_grace_s: float = DEFAULT_RECOVERY_GRACE_S
    full_sweep_s: float = DEFAULT_FULL_SWEEP_S

    @property
    def heartbeat_age(self) -> timedelta:
        """A lease renewed this long ago or more is due for the heartbeat (a sixth of its
        time to live)."""
        return timedelta(seconds=self.mark_ttl_s / 6)


class WorkerHost:
    """Starts, serves and retires per-user workers in this process.

    ``holder`` names this host in the leases it takes; it must differ from every other host
    sharing the directory, including a restarted process on the same machine (the
    composition passes something like ``hostname:pid:random``).
    """

    def __init__(
        self,
        directory: WorkerDirectory,
        queue: OrderQueue,
        make_worker: Callable[[str], UserWorker],
        clock: Clock,
        sleeper: Sleeper,
        settings: HostSettings | None = None,
        *,
        holder: str,
        recovery: QueuedRecovery | None = None,
    ) -> None:
        if not holder:
            raise ValueError("a worker host needs a non-empty holder name")
        self._holder = holder
        self._directory = directory
        self._queue = queue
        self._make_worker = make_worker
        self._clock = clock
        self._sleeper = sleeper
        self._settings = settings or HostSettings()
        self._slots: dict[str, WorkerSlot] = {}
        self._leases = HostLeases(
            directory,
            self._slots,
            clock,
            holder=holder,
            ttl_s=self._settings.mark_ttl_s,
            heartbeat_age=self._settings.heartbeat_age,
            log=log,
        )
        self._recovery = recovery
        self._control: asyncio.Task[None] | None = None
        self._recovering: asyncio.Task[None] | None = None
        self._recovery_failing = False
        self._stopping = False
        self._confirming: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        # The orphan sweep's schedule (``sweep_when_due``): when the last one ran, and until
        # when a dead host's leases may still run out.
        self._swept_at: datetime | None = None
        self._sweep_until: datetime | None = None
        self._gate = OutageGate[WorkerSlot](
            lease_gone=self._leases.gone, clock=clock, sleeper=sleeper, log=log
        )

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def active_users(self) -> frozenset[str]:
        return frozenset(u for u, s in self._slots.items() if s.task is not None)

    async def start(self) -> None:
        """Begin consuming worker-control."""
        self._stopping = False
        if self._control is None:
            self._control = asyncio.create_task(self._consume_control(), name="worker-control")

    async def stop(self) -> None:
        """Stop consuming and end every worker (their leases are released). From its first
        step no worker starts here any more (``activate`` does nothing): a sweep or a scan
        still finishing as it is cancelled would otherwise start one that nothing ends, and
        the host's shutdown would wait for it."""
        self._stopping = True
        slots = (s.task for s in self._slots.values())
        tasks = [t for t in [self._control, self._recovering, *slots, *self._gate.tasks] if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._control = self._recovering = None
        for slot in list(self._slots.values()):
            await self._close_worker(slot)
        await asyncio.gather(*self._closing)
        try:
            await self._leases.leave()
        except Exception as e:  # its record runs out; another host then sweeps once
            log.warning("the host's record could not be removed (%s)", e)

    def activate(self, user_id: str) -> None:
        """Make sure the user is served: by this host, unless another holder has the lease
        (then this task ends at once). Idempotent while the task runs; a worker that lost
        its lease is replaced at once (it stops at its next look). Nothing once ``stop``
        began: the user's requests wait for another host (or this one's next start)."""
        if self._stopping:
            return
        slot = self._slots.get(user_id)
        if slot is not None and slot.task is not None and not slot.lost:
            # A start request while our worker runs: the API saw no lease (the key-value
            # store lost it, or it lapsed). Check now instead of at the next renewal.
            check = asyncio.create_task(self._confirm_lease(user_id, slot))
            self._confirming.add(check)
            check.add_done_callback(self._confirming.discard)
            return
        if slot is None or slot.lost:
            # the replacement shares the lock, so the user's orders never run side by side
            lock = asyncio.Lock() if slot is None else slot.lock
            slot = WorkerSlot(self._make_worker(user_id), lock=lock)
            self._slots[user_id] = slot
        if slot.task is None:
            slot.task = asyncio.create_task(self._serve(user_id, slot), name=f"worker:{user_id}")

    async def _close_worker(self, slot: WorkerSlot) -> None:
        """Close the broker connections of a worker that serves no more (never raises)."""
        try:
            await slot.worker.close()
        except Exception:
            log.warning("closing the broker connections of a worker failed", exc_info=True)

    async def _confirm_lease(self, user_id: str, slot: WorkerSlot) -> None:
        """Renew the running worker's lease at once; when it is gone, replace the worker
        now (the old one stops taking requests) so the waiting order is served."""
        token = slot.token
        try:
            if token is None or await self._directory.renew(
                user_id, token, self._settings.mark_ttl_s
            ):
                return
        except Exception:
            log.exception("lease of user %s could not be checked", user_id)
            return
        log.warning("worker of user %s lost its lease (token %d); replacing it", user_id, token)
        slot.lost = True
        if slot.task is not None and not slot.lock.locked():
            slot.task.cancel()  # waiting for a request, not executing one
        self.activate(user_id)

    async def check_order_status(self, row: OrderHistoryRecord) -> BrokerOrder | None:
        """Fill verification's check, run by the order's user worker between its orders."""
        slot = self._slot(row.user_id)
        async with slot.lock:
            return await slot.worker.check_order_status(row)

    def _slot(self, user_id: str) -> WorkerSlot:
        slot = self._slots.get(user_id)
        if slot is None:
            slot = WorkerSlot(self._make_worker(user_id))
            self._slots[user_id] = slot
        return slot

    async def _consume_control(self) -> None:
        """Sweep, heartbeat and start requests, in a loop. A failure (an outage) is retried
        after a backoff (``OUTAGE_BACKOFF_S`` doubling up to ``OUTAGE_BACKOFF_MAX_S``) and
        logged once: a warning when it begins, a debug line per retry, an info line after."""
        settings = self._settings
        wait_s = min(settings.poll_s, settings.sweep_s, settings.heartbeat_age.total_seconds())
        last_look: datetime | None = None
        retries = 0
        delay = OUTAGE_BACKOFF_S
        while True:
            raise_if_cancelled()
            try:
                if last_look is None or self._seconds_since(last_look) >= settings.sweep_s:
                    last_look = self._clock.now()
                    self._begin_recovery()
                    await self.sweep_when_due()
                await self.heartbeat()
                # before the turn's long wait: a cancellation the sweep or the heartbeat
                # absorbed (cancellation.py) ends the loop now, not after that wait
                raise_if_cancelled()
                user_id = await self._directory.next_start_request(wait_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if retries:
                    log.debug("worker-control still unreachable (%s)", e)
                elif isinstance(e, StoreUnavailable):
                    log.warning("worker-control unreachable (%s); retrying", e)
                else:
                    log.exception("worker-control failed; retrying")
                retries += 1
                await self._sleeper.sleep(delay)
                delay = min(delay * 2, OUTAGE_BACKOFF_MAX_S)
                continue
            if retries:
                log.info("worker-control reachable again after %d retries", retries)
                retries, delay = 0, OUTAGE_BACKOFF_S
            if user_id is not None:
                self.activate(user_id)

    async def sweep_when_due(self) -> list[str] | None:
        """Sweep (``sweep``) when this host has not swept yet, when a host died (its record
        lapsed: ``WorkerDirectory.lapsed_hosts``) until that host's leases have run out, or
        when ``full_sweep_s`` passed since the last sweep; the users started, or None when
        no sweep was due. The control loop calls it every ``sweep_s``.

        A dead host's leases outlive its record by little: each lease was renewed at most
        about ``heartbeat_age`` after the host last wrote its record, and both live
        ``mark_ttl_s``. Sweeping every ``sweep_s`` from the record's lapse until one time to
        live and one more period later therefore sweeps after every lease of the host has
        run out, and finds each user it left."""
        settings = self._settings
        lapsed = await self._directory.lapsed_hosts()
        now = self._clock.now()
        if lapsed:
            log.warning("worker hosts %s stopped; looking for the users they served", lapsed)
            self._sweep_until = now + timedelta(seconds=settings.mark_ttl_s + settings.sweep_s)
        due = (
            self._swept_at is None
            or (self._sweep_until is not None and now <= self._sweep_until)
            or self._seconds_since(self._swept_at) >= settings.full_sweep_s
        )
        if not due:
            return None
        started = await self.sweep()
        self._swept_at = now
        return started

    async def sweep(self) -> list[str]:
        """Start the users whose requests wait with no lease (a dead host's); their new
        workers recover what is waiting or in flight. Returns the users started here."""
        orphans = await self._directory.orphaned_users()
        for user_id in orphans:
            log.warning("user %s has requests but no worker: starting one", user_id)
            self.activate(user_id)
        return orphans

    async def recover_lost(self) -> list[str]:
        """One scan of ``QueuedRecovery`` (none without it): hands over again the intents an
        API made durable but never pushed; their users without a worker are started here.
        Returns the order ids handed over."""
        if self._recovery is None:
            return []
        return await self._recovery.scan(self.activate)

    def _begin_recovery(self) -> None:
        """Start a ``recover_lost`` scan in a task of its own unless one still runs: beside the
        control loop rather than in it, since a slow or unreachable order history must never
        delay the leases' heartbeat. A failed scan is logged once per failing streak and tried
        again at the next sweep (nothing is lost meanwhile)."""
        if self._recovery is None or (self._recovering and not self._recovering.done()):
            return
        self._recovering = asyncio.create_task(self._recover_once(), name="queued-recovery")

    async def _recover_once(self) -> None:
        try:
            await self.recover_lost()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not self._recovery_failing:
                log.warning("recovery of queued orders failed (%s); retrying", e)
            self._recovery_failing = True
        else:
            if self._recovery_failing:
                log.info("recovery of queued orders works again")
            self._recovery_failing = False

    async def heartbeat(self) -> set[str]:
        """The host's heartbeat (``HostLeases.heartbeat``), which the control loop runs:
        keeps the host's record alive and renews every due lease of this host in one batch;
        returns the users whose lease was lost (their workers take nothing more)."""
        return await self._leases.heartbeat()

    async def _serve(self, user_id: str, slot: WorkerSlot) -> None:
        settings = self._settings
        token: int | None = None
        ended = False  # the lease was never ours, is lost, or was retired: nothing to release
        try:
            token = await self._acquire(user_id, slot)
            if token is None:
                log.debug("user %s is served by another host", user_id)
                ended = True
                return
            assert slot.renewed_at is not None
            last_activity = slot.renewed_at
            stranded = deque(await self._recover(user_id, slot))
            while True:
                raise_if_cancelled()
                if slot.lost:
                    ended = True
                    return
                if self._leases.renewal_due(slot) and not await self._renew(user_id, slot, token):
                    ended = True
                    return
                if not stranded:
                    stranded.extend(await self._take(user_id, slot))
                request = stranded.popleft() if stranded else None
                if request is not None:
                    await self._execute(user_id, slot, request)
                    last_activity = self._clock.now()
                elif self._seconds_since(last_activity) >= settings.idle_timeout_s:
                    if await self._retire(user_id, slot, token):
                        ended = True
                        return
                    # Refused: a request waits, or the lease is no longer ours; a renewal
                    # tells which before anything else is taken.
                    if not await self._renew(user_id, slot, token):
                        ended = True
                        return
        except LeaseGone:
            ended = True  # not ours any more: everything stays for the next holder
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker of user %s stopped on an error", user_id)
        finally:
            slot.task, slot.token = None, None
            if ended:
                if self._slots.get(user_id) is slot:
                    del self._slots[user_id]
                    # its broker connections end with it (not awaited here: a cancelled task)
                    closing = asyncio.create_task(self._close_worker(slot))
                    self._closing.add(closing)
                    closing.add_done_callback(self._closing.discard)
            elif token is not None and not slot.lost:
                # a lost lease is not ours to release: after a key-value store flush the
                # replacement may hold the same holder name and token
                try:
                    await self._directory.release(user_id, token)
                except Exception as e:
                    log.warning(
                        "worker of user %s could not release its lease (%s); it lapses in %g s",
                        user_id,
                        e,
                        settings.mark_ttl_s,
                    )

    async def _acquire(self, user_id: str, slot: WorkerSlot) -> int | None:
        """``HostLeases.acquire`` through outages (the outage gate: with no lease yet, until
        the store is back)."""

        async def acquire() -> int | None:
            return await self._leases.acquire(user_id, slot)

        return await self._gate.outlast(user_id, slot, "taking its lease", acquire)

    async def _renew(self, user_id: str, slot: WorkerSlot, token: int) -> bool:
        """``HostLeases.renew`` through outages. Raises ``LeaseGone`` (see
        ``OutageGate.outlast``)."""

        async def renew() -> bool:
            return await self._leases.renew(user_id, slot, token)

        return await self._gate.outlast(user_id, slot, "renewing its lease", renew)

    async def _recover(self, user_id: str, slot: WorkerSlot) -> list[OrderRequest]:
        """The user's in-flight requests (a crashed worker's), through outages."""

        async def in_flight() -> list[OrderRequest]:
            return await self._queue.in_flight(user_id)

        stranded = await self._gate.outlast(
            user_id, slot, "listing its requests in flight", in_flight
        )
        for request in stranded:
            log.warning("recovering order %s of user %s", request.order_id, user_id)
        return stranded

    async def _take(self, user_id: str, slot: WorkerSlot) -> list[OrderRequest]:
        """The user's next request ([] when none came within ``poll_s``), through outages.
        After an interrupted take, the in-flight list first: a take whose answer was lost
        may have moved a request there, and it is executed before any other. (Nothing else
        of this worker is in flight: it completes each request before it takes the next.)
        While its worker probes the store for the host, a take does not wait."""
        interrupted = recovered = False

        async def take() -> list[OrderRequest]:
            nonlocal interrupted, recovered
            if interrupted:
                stranded = await self._queue.in_flight(user_id)
                if stranded:
                    recovered = True
                    return stranded
            interrupted = True
            timeout_s = 0.0 if slot.probing else self._settings.poll_s
            request = await self._queue.take(user_id, timeout_s)
            interrupted = False
            return [] if request is None else [request]

        taken = await self._gate.outlast(user_id, slot, "taking a request", take)
        if recovered:
            for request in taken:
                log.warning(
                    "recovering order %s of user %s (in flight after the outage)",
                    request.order_id,
                    user_id,
                )
        return taken

    async def _retire(self, user_id: str, slot: WorkerSlot, token: int) -> bool:
        """``WorkerDirectory.retire`` through outages (see ``OutageGate.outlast``)."""

        async def retire() -> bool:
            return await self._directory.retire(user_id, token)

        return await self._gate.outlast(user_id, slot, "retiring", retire)

    def _seconds_since(self, since: datetime) -> float:
        return (self._clock.now() - since).total_seconds()

    async def _execute(self, user_id: str, slot: WorkerSlot, request: OrderRequest) -> None:
        """Execute ``request`` and publish its result, through store outages (see the module
        doc): once it has the result, only the publication is tried again. Raises
        ``LeaseGone`` when the lease was lost before the result was published: the request
        is left in flight for the next holder."""
        result: OrderResult | None = None

        async def execute_and_complete() -> None:
            nonlocal result
            if result is None:
                async with slot.lock:
                    result = await slot.worker.execute(request)
            await self._queue.complete(request, result)

        await self._gate.outlast(user_id, slot, f"order {request.order_id}", execute_and_complete)
