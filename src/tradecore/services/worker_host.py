"""A worker host: runs the per-user workers of this process.

It consumes start requests from worker-control, runs one task per active user that keeps the
``worker:active:{user_id}`` mark alive (a TTL refreshed by a heartbeat), recovers the requests
a crashed worker left in flight, executes the user's requests in order, and retires the worker
after the idle timeout (12 h by default) - but only when no request is waiting, atomically, so
no request is stranded. Fill checks for a user go through the same worker, serialized with its
orders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    """``mark_ttl_s``: lifetime of the active mark; it is refreshed every third of it.
    ``poll_s``: how long one blocking take waits before the loop looks at the clock."""

    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    mark_ttl_s: float = 30.0
    poll_s: float = 1.0


@attrs.define
class _Slot:
    worker: UserWorker
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None


class WorkerHost:
    """Starts, serves and retires per-user workers in this process."""

    def __init__(
        self,
        directory: WorkerDirectory,
        queue: OrderQueue,
        make_worker: Callable[[str], UserWorker],
        clock: Clock,
        sleeper: Sleeper,
        settings: HostSettings | None = None,
    ) -> None:
        self._directory = directory
        self._queue = queue
        self._make_worker = make_worker
        self._clock = clock
        self._sleeper = sleeper
        self._settings = settings or HostSettings()
        self._slots: dict[str, _Slot] = {}
        self._control: asyncio.Task[None] | None = None

    @property
    def active_users(self) -> frozenset[str]:
        return frozenset(u for u, s in self._slots.items() if s.task is not None)

    async def start(self) -> None:
        """Begin consuming worker-control."""
        if self._control is None:
            self._control = asyncio.create_task(self._consume_control(), name="worker-control")

    async def stop(self) -> None:
        """Stop consuming and end every worker (their marks are cleared)."""
        tasks = [t for t in [self._control, *(s.task for s in self._slots.values())] if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._control = None

    def activate(self, user_id: str) -> None:
        """Make sure the user's worker runs in this host (idempotent)."""
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
        while True:
            try:
                user_id = await self._directory.next_start_request(self._settings.poll_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker-control unreachable; retrying")
                await self._sleeper.sleep(RESTART_DELAY_S)
                continue
            if user_id is not None:
                self.activate(user_id)

    async def _serve(self, user_id: str, slot: _Slot) -> None:
        settings = self._settings
        retired = False
        try:
            await self._directory.mark_active(user_id, settings.mark_ttl_s)
            last_beat = last_activity = self._clock.now()
            for stranded in await self._queue.in_flight(user_id):
                log.warning("recovering order %s of user %s", stranded.order_id, user_id)
                await self._execute(slot, stranded)
            while True:
                request = await self._queue.take(user_id, settings.poll_s)
                if request is not None:
                    await self._execute(slot, request)
                    last_activity = self._clock.now()
                elif self._seconds_since(last_activity) >= settings.idle_timeout_s:
                    retired = await self._directory.retire(user_id)
                    if retired:
                        return
                if self._seconds_since(last_beat) >= settings.mark_ttl_s / 3:
                    await self._directory.mark_active(user_id, settings.mark_ttl_s)
                    last_beat = self._clock.now()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker of user %s stopped on an error", user_id)
        finally:
            slot.task = None
            if retired:
                self._slots.pop(user_id, None)
            else:
                with contextlib.suppress(Exception):
                    await self._directory.clear_active(user_id)

    def _seconds_since(self, since: datetime) -> float:
        return (self._clock.now() - since).total_seconds()

    async def _execute(self, slot: _Slot, request: OrderRequest) -> None:
        async with slot.lock:
            result = await slot.worker.execute(request)
        await self._queue.complete(request, result)
