"""A worker host: runs the per-user workers of this process.

Several hosts share the users. A host consumes start requests from worker-control and, for
each, takes the user's lease (the ``worker:active:{user_id}`` mark with a fencing token, see
``WorkerDirectory``) under its own holder name. If another holder has the lease, that holder
serves the user and this host lets the start request go. Otherwise one task of this host
serves the user: it keeps the lease alive with a heartbeat (``renew`` every third of its time
to live), recovers the requests a crashed worker left in flight, executes the user's requests
in order, and retires after the idle timeout (12 h by default) - but only when no request is
waiting, atomically, so no request is stranded. A host that dies stops renewing; its leases
run out and its users are started elsewhere at their next request.

The lease is checked before every request is taken: once ``renew`` says the lease is lost (a
stalled heartbeat let it expire, and maybe another host took it), the worker finishes the
request in hand and never starts another. A lost lease can still leave a stale worker
running one request next to its successor (the one in hand, which the successor also finds
in flight); that is harmless, because execution is idempotent: the order-history row moves
only by compare-and-set transitions (``queued -> submitted -> <outcome>``), so only one
worker's outcome is recorded, and each broker order carries a client order id derived from
the order-history id, so the broker returns the order it already has instead of placing a
second one. The fencing token therefore does not guard writes; it names the lease in the
log lines and makes sure a stale worker can neither renew, release nor retire its
successor's lease.

Fill checks for a user go through this host's worker object for the user, serialized with
its orders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from datetime import datetime

import attrs

from tradecore.broker import BrokerOrder
from tradecore.orders import OrderHistoryRecord, OrderRequest
from tradecore.ports.messaging import OrderQueue, WorkerDirectory
from tradecore.ports.runtime import Clock, Sleeper
from tradecore.services.worker import UserWorker

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 12 * 3600.0
RESTART_DELAY_S = 1.0


@attrs.frozen
class HostSettings:
    """``mark_ttl_s``: lifetime of the lease (the active mark); it is renewed every third of
    it. ``poll_s``: how long one blocking take waits before the loop looks at the clock.
    ``sweep_s``: how often the host looks for orphaned users (requests waiting with no
    lease: their host died) and starts them, so no request waits for the user's next order."""

    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    mark_ttl_s: float = 30.0
    poll_s: float = 1.0
    sweep_s: float = 5.0


@attrs.define
class _Slot:
    worker: UserWorker
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None


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
        self._slots: dict[str, _Slot] = {}
        self._control: asyncio.Task[None] | None = None

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def active_users(self) -> frozenset[str]:
        return frozenset(u for u, s in self._slots.items() if s.task is not None)

    async def start(self) -> None:
        """Begin consuming worker-control."""
        if self._control is None:
            self._control = asyncio.create_task(self._consume_control(), name="worker-control")

    async def stop(self) -> None:
        """Stop consuming and end every worker (their leases are released)."""
        tasks = [t for t in [self._control, *(s.task for s in self._slots.values())] if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._control = None

    def activate(self, user_id: str) -> None:
        """Make sure the user is served: by this host, unless another holder has the lease
        (then this task ends at once). Idempotent while the task runs."""
        slot = self._slot(user_id)
        if slot.task is None:
            slot.task = asyncio.create_task(self._serve(user_id, slot), name=f"worker:{user_id}")

    async def check_order_status(self, row: OrderHistoryRecord) -> BrokerOrder | None:
        """Fill verification's check, run by the order's user worker between its orders."""
        slot = self._slot(row.user_id)
        async with slot.lock:
            return await slot.worker.check_order_status(row)

    def _slot(self, user_id: str) -> _Slot:
        slot = self._slots.get(user_id)
        if slot is None:
            slot = _Slot(self._make_worker(user_id))
            self._slots[user_id] = slot
        return slot

    async def _consume_control(self) -> None:
        last_sweep: datetime | None = None
        while True:
            try:
                if last_sweep is None or self._seconds_since(last_sweep) >= self._settings.sweep_s:
                    last_sweep = self._clock.now()
                    await self.sweep()
                user_id = await self._directory.next_start_request(self._settings.poll_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker-control unreachable; retrying")
                await self._sleeper.sleep(RESTART_DELAY_S)
                continue
            if user_id is not None:
                self.activate(user_id)

    async def sweep(self) -> list[str]:
        """Start the users whose requests wait with no lease (a dead host's); their new
        workers recover what is waiting or in flight. Returns the users started here."""
        orphans = await self._directory.orphaned_users()
        for user_id in orphans:
            log.warning("user %s has requests but no worker: starting one", user_id)
            self.activate(user_id)
        return orphans

    async def _serve(self, user_id: str, slot: _Slot) -> None:
        settings = self._settings
        token: int | None = None
        ended = False  # the lease was never ours, is lost, or was retired: nothing to release
        try:
            token = await self._directory.acquire(user_id, self._holder, settings.mark_ttl_s)
            if token is None:
                log.debug("user %s is served by another host", user_id)
                ended = True
                return
            last_beat = last_activity = self._clock.now()
            stranded = deque(await self._queue.in_flight(user_id))
            while True:
                if self._seconds_since(last_beat) >= settings.mark_ttl_s / 3:
                    if not await self._renew(user_id, token):
                        ended = True
                        return
                    last_beat = self._clock.now()
                request: OrderRequest | None
                if stranded:
                    request = stranded.popleft()
                    log.warning("recovering order %s of user %s", request.order_id, user_id)
                else:
                    request = await self._queue.take(user_id, settings.poll_s)
                if request is not None:
                    await self._execute(slot, request)
                    last_activity = self._clock.now()
                elif self._seconds_since(last_activity) >= settings.idle_timeout_s:
                    if await self._directory.retire(user_id, token):
                        ended = True
                        return
                    # Refused: a request waits, or the lease is no longer ours; a renewal
                    # tells which before anything else is taken.
                    if not await self._renew(user_id, token):
                        ended = True
                        return
                    last_beat = self._clock.now()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker of user %s stopped on an error", user_id)
        finally:
            slot.task = None
            if ended:
                self._slots.pop(user_id, None)
            elif token is not None:
                with contextlib.suppress(Exception):
                    await self._directory.release(user_id, token)

    async def _renew(self, user_id: str, token: int) -> bool:
        """Renew the lease; False (with a warning) when it is lost."""
        if await self._directory.renew(user_id, token, self._settings.mark_ttl_s):
            return True
        log.warning("worker of user %s lost its lease (token %d); stopping", user_id, token)
        return False

    def _seconds_since(self, since: datetime) -> float:
        return (self._clock.now() - since).total_seconds()

    async def _execute(self, slot: _Slot, request: OrderRequest) -> None:
        async with slot.lock:
            result = await slot.worker.execute(request)
        await self._queue.complete(request, result)
