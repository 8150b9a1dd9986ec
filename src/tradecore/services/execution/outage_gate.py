"""The outage gate: how a host's per-user workers wait out a store outage together.

Each worker's store calls go through the host's one gate (``OutageGate.outlast``). The first
call to fail (``StoreUnavailable``) while the gate is closed opens it, and its worker becomes
the prober: the only one that calls the store again, on a backoff (``OUTAGE_BACKOFF_S``
doubling up to ``OUTAGE_BACKOFF_MAX_S``), with its ``probing`` flag set (a take it probes with
does not wait for a request). Every other call that fails while the gate is open waits,
calling nothing, its lease checked on the backoff schedule; it stops (``LeaseGone``) once the
lease is gone. When the prober's call goes through the gate closes, and the waiting workers
call again, first come first, in at most ``RESUME_BATCHES`` batches ``RESUME_INTERVAL_S``
apart. When the prober stops first (its lease lost, its task cancelled, an error), the longest
waiter still holding its lease probes in its place; with none left, the gate closes and the
next call to fail opens it again. Only calls that failed wait: a call never looks at the gate
before it is made.

The gate logs a warning when it opens, an info line when it closes (how long, how many
workers waited), a warning for the first worker that lost its lease during the outage, and
every other per-worker line at debug.

Why one gate per host: see docs/decisions.md, "Worker hosts through a store outage".
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Generic, Protocol, TypeVar

import attrs

from tradecore.errors import StoreUnavailable
from tradecore.ports.runtime import Clock, Sleeper

T = TypeVar("T")

OUTAGE_BACKOFF_S = 0.1
OUTAGE_BACKOFF_MAX_S = 2.0
"""The wait before the first retry of a call a store outage interrupted, and the cap of its
doubling (a worker's calls and the control loop's)."""
RESUME_BATCHES = 20
RESUME_INTERVAL_S = 0.1
"""After an outage the workers that waited for the store resume in at most ``RESUME_BATCHES``
batches, one every ``RESUME_INTERVAL_S`` (all within 2 s), not all at once."""


class GatedWorker(Protocol):
    """A worker whose store calls go through the gate, as the gate sees it."""

    probing: bool
    """Set by the gate while the worker probes the store for the host, cleared when it stops
    probing; a call made meanwhile should wait for nothing but the store."""


W = TypeVar("W", bound=GatedWorker)


class LeaseGone(Exception):
    """The worker's lease was lost or lapsed while it waited out a store outage."""


class _Wake(enum.Enum):
    """Why a worker waiting behind the outage gate was woken."""

    PROBE = "probe"  # the prober stopped: this worker probes now
    RESUME = "resume"  # the outage is over and its turn came: it calls again
    STOP = "stop"  # its lease is lost or lapsed


@attrs.define(eq=False)
class _Call(Generic[W]):
    """A worker's store call that met an outage, as the outage gate sees it."""

    user_id: str
    worker: W
    what: str
    probing: _Outage[W] | None = None  # the outage this call probes the store for
    wake: asyncio.Future[_Wake] | None = None  # while it waits behind the gate


@attrs.define(eq=False)
class _Outage(Generic[W]):
    """A store outage as the host's workers meet it (the gate open): one call, the prober's,
    is retried on the backoff schedule; the others wait, first come first resumed."""

    opened_at: datetime
    prober: _Call[W] | None = None
    delay: float = OUTAGE_BACKOFF_S  # the prober's next backoff
    retries: int = 0  # calls of its probers after the first
    waiters: dict[_Call[W], None] = attrs.field(factory=dict)  # an ordered set
    waited: int = 0  # workers that waited for it
    stopped: int = 0  # workers that stopped during it, their lease lost
    over: bool = False
    task: asyncio.Task[None] | None = None  # the waiters' lease checks, or their resumption


class OutageGate(Generic[W]):
    """One host's outage gate (see the module doc).

    ``lease_gone(worker)``: whether the worker must stop, its lease lost or lapsed (False
    while it holds no lease yet: then there is nothing to lose). The gate asks before each
    retry and while the worker waits. ``clock`` and ``sleeper`` time the backoff, the
    resumption and the durations logged; ``log`` receives the gate's lines (the host's
    logger, so they read as the host's).
    """

    def __init__(
        self,
        *,
        lease_gone: Callable[[W], bool],
        clock: Clock,
        sleeper: Sleeper,
        log: logging.Logger,
    ) -> None:
        self._lease_gone = lease_gone
        self._clock = clock
        self._sleeper = sleeper
        self._log = log
        self._outage: _Outage[W] | None = None  # the gate is open while this is set
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def tasks(self) -> frozenset[asyncio.Task[None]]:
        """The gate's running tasks (the waiters' lease checks, their resumption); the host
        cancels them when it stops."""
        return frozenset(self._tasks)

    async def outlast(
        self, user_id: str, worker: W, what: str, call: Callable[[], Awaitable[T]]
    ) -> T:
        """``call()``'s value, through store outages (``StoreUnavailable``), behind the gate.
        ``what`` names the call in the log lines. A call that fails while the gate is closed
        opens it and becomes the prober: it calls again after a backoff (``OUTAGE_BACKOFF_S``
        doubling up to ``OUTAGE_BACKOFF_MAX_S``) until its call goes through, which closes
        the gate. A call that fails while the gate is open waits, calling nothing, until the
        gate closes and its turn to resume comes (``RESUME_BATCHES``), or until it is made the
        prober because the prober stopped; then it calls again. Before each retry, and while
        it waits, the gate asks ``lease_gone(worker)``; raises ``LeaseGone`` when so, trying
        nothing more. Any other error of ``call()`` propagates at once."""
        me: _Call[W] | None = None  # this call as the gate sees it, once it failed
        waited = False
        try:
            while True:
                try:
                    value = await call()
                except StoreUnavailable as e:
                    if me is None:
                        me = _Call(user_id, worker, what)
                    outage = me.probing
                    if outage is not None:
                        self._log.debug(
                            "worker of user %s: %s still unavailable (%s)", user_id, what, e
                        )
                    elif self._outage is None:
                        outage = self._open(me, e)
                    else:
                        self._log.debug(
                            "worker of user %s: %s interrupted (%s); waiting for the store",
                            user_id,
                            what,
                            e,
                        )
                        waited = True
                        await self._wait(me, self._outage)
                        continue  # over, or made the prober: call again now
                    await self._sleeper.sleep(outage.delay)
                    outage.delay = min(outage.delay * 2, OUTAGE_BACKOFF_MAX_S)
                    outage.retries += 1
                    if self._lease_gone(worker):
                        self._stopping(me, outage)
                else:
                    if me is not None and me.probing is not None:
                        self._close(me, me.probing)
                    elif waited:
                        self._log.debug(
                            "worker of user %s: %s went through after the outage", user_id, what
                        )
                    return value
        finally:
            if me is not None and me.probing is not None:
                self._hand_over(me.probing)  # it stops without having seen the store back

    def _open(self, me: _Call[W], error: StoreUnavailable) -> _Outage[W]:
        """Open the gate with ``me`` as its prober."""
        outage: _Outage[W] = _Outage(opened_at=self._clock.now())
        self._outage = outage
        self._make_prober(me, outage)
        self._log.warning(
            "store unavailable; workers waiting for it (worker of user %s: %s interrupted (%s),"
            " retrying until the store is back)",
            me.user_id,
            me.what,
            error,
        )
        return outage

    def _make_prober(self, call: _Call[W], outage: _Outage[W]) -> None:
        outage.prober, call.probing, call.worker.probing = call, outage, True

    def _close(self, prober: _Call[W], outage: _Outage[W]) -> None:
        """The prober's call went through: close the gate and let the waiters resume, in
        batches."""
        prober.probing, prober.worker.probing = None, False
        self._end(outage)
        self._log.info(
            "store available again: worker of user %s: %s went through after %d retries;"
            " the outage lasted %.1f s, %d workers waited for it, %d stopped (lease lost)",
            prober.user_id,
            prober.what,
            outage.retries,
            self._seconds_since(outage.opened_at),
            outage.waited,
            outage.stopped,
        )
        if outage.waiters:
            batch = -(-len(outage.waiters) // RESUME_BATCHES)  # ceiling
            self._resume(outage, batch)
            if outage.waiters:
                self._spawn(outage, self._resume_rest(outage, batch))

    def _end(self, outage: _Outage[W]) -> None:
        outage.over, outage.prober = True, None
        if self._outage is outage:
            self._outage = None
        if outage.task is not None:
            outage.task.cancel()  # the lease checks: a waiter checks its own before it calls
            outage.task = None

    def _hand_over(self, outage: _Outage[W]) -> None:
        """The prober stops before the store is back: the longest waiter whose lease is kept
        probes now. With none left, the gate closes (the next failing call opens it again)."""
        prober = outage.prober
        if prober is not None:
            prober.probing, prober.worker.probing = None, False
        outage.prober = None
        while outage.waiters:
            waiter = next(iter(outage.waiters))
            if waiter.wake is None or waiter.wake.done():
                outage.waiters.pop(waiter)  # cancelled: it leaves on its own
                continue
            if self._lease_gone(waiter.worker):
                self._stopping(waiter, outage, raising=False)
                self._wake(outage, waiter, _Wake.STOP)
                continue
            self._make_prober(waiter, outage)
            self._log.debug("worker of user %s probes the store now", waiter.user_id)
            self._wake(outage, waiter, _Wake.PROBE)
            return
        self._end(outage)
        self._log.info(
            "store still unavailable, but no worker waits for it any more after %.1f s"
            " (%d waited, %d stopped: lease lost); the next failing call probes again",
            self._seconds_since(outage.opened_at),
            outage.waited,
            outage.stopped,
        )

    async def _wait(self, me: _Call[W], outage: _Outage[W]) -> None:
        """Wait, calling nothing, until the outage is over and ``me``'s turn to resume came
        (when the gate opened again meanwhile, until that outage is over too), or until
        ``me`` is made the prober. Raises ``LeaseGone`` when its lease is gone."""
        while True:
            outage.waited += 1
            me.wake = asyncio.get_running_loop().create_future()
            outage.waiters[me] = None
            if outage.task is None or outage.task.done():
                self._spawn(outage, self._check_leases(outage))
            try:
                wake = await me.wake
            finally:
                outage.waiters.pop(me, None)
                me.wake = None
            if wake is _Wake.STOP:
                raise LeaseGone  # logged by whoever found it
            if self._lease_gone(me.worker):
                self._stopping(me, outage)
            if wake is _Wake.PROBE:
                outage.retries += 1
                return
            if self._outage is None:
                self._log.debug("worker of user %s: %s resumes", me.user_id, me.what)
                return
            outage = self._outage  # open again before this worker's turn came

    def _wake(self, outage: _Outage[W], call: _Call[W], why: _Wake) -> None:
        outage.waiters.pop(call, None)
        if call.wake is not None and not call.wake.done():
            call.wake.set_result(why)

    def _resume(self, outage: _Outage[W], batch: int) -> None:
        for waiter in list(itertools.islice(outage.waiters, batch)):
            self._wake(outage, waiter, _Wake.RESUME)

    async def _resume_rest(self, outage: _Outage[W], batch: int) -> None:
        """Resume the waiters of an outage that is over, a batch every ``RESUME_INTERVAL_S``."""
        while outage.waiters:
            await self._sleeper.sleep(RESUME_INTERVAL_S)
            self._resume(outage, batch)

    async def _check_leases(self, outage: _Outage[W]) -> None:
        """While the gate is open and workers wait: check their leases on the backoff
        schedule, and stop the workers whose lease is gone (no worker calls with a lost
        lease; waiting, it calls nothing)."""
        delay = OUTAGE_BACKOFF_S
        while outage.waiters and not outage.over:
            await self._sleeper.sleep(delay)
            delay = min(delay * 2, OUTAGE_BACKOFF_MAX_S)
            for waiter in list(outage.waiters):
                if self._lease_gone(waiter.worker):
                    self._stopping(waiter, outage, raising=False)
                    self._wake(outage, waiter, _Wake.STOP)

    def _spawn(self, outage: _Outage[W], work: Coroutine[object, object, None]) -> None:
        """Run the outage's lease checks or its resumption (one at a time) in a task."""
        task = asyncio.create_task(work, name="worker-outage")
        outage.task = task
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if outage.task is finished:
                outage.task = None

        task.add_done_callback(done)

    def _stopping(self, call: _Call[W], outage: _Outage[W], *, raising: bool = True) -> None:
        """``call``'s worker lost its lease during the outage: log it (a warning for the
        first of the outage, debug after) and, by default, raise ``LeaseGone``."""
        outage.stopped += 1
        self._log.log(
            logging.WARNING if outage.stopped == 1 else logging.DEBUG,
            "worker of user %s lost its lease during a store outage (%s); stopping, its"
            " requests are left to the next holder",
            call.user_id,
            call.what,
        )
        if raising:
            raise LeaseGone

    def _seconds_since(self, since: datetime) -> float:
        return (self._clock.now() - since).total_seconds()
