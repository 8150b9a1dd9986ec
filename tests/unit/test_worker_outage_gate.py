"""A store outage met by many idle workers of one host: one probes, the others wait.

When the key-value store goes away, every idle worker's take fails once (the store's wake-ups
ring every waiting take, as Redis's listener does when it loses its connection). From then on
only the first of them, the prober, calls the store, on the backoff schedule (0.1 s doubling
to 2 s); the others wait behind the host's outage gate, calling nothing, their leases checked
on the same schedule. When the prober's call goes through, the gate closes and the waiters
resume in batches over less than 2 s. One warning per outage for the host. A waiter whose lease
is lost stops; a prober that stops hands the probing to the longest waiter.

Time is virtual: sleeps wait until the test moves the clock past their end (concurrent sleeps
overlap, as real ones do), so a backoff period can be counted in store calls.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Collection
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from support import NO_ACCOUNTS, queued_row, request_for

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.order_lifecycle import OrderChange
from tradecore.orders import OrderHistoryRecord, OrderRequest, OrderResult, OrderStatus
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

HOLDER, FOREIGN = "host-a", "host-elsewhere:1:x"
TTL_S = 30.0
HOST_LOG = "tradecore.services.execution.worker_host"
PERIOD_S = 2.0  # the backoff cap: a worker on its own would call once per period


async def settle(rounds: int = 30) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@attrs.define
class VirtualSleeper:
    """A Sleeper whose sleeps end when ``advance`` moves the clock past them, earliest first."""

    clock: FakeClock
    slept: list[float] = attrs.field(factory=list)
    _sleeping: list[tuple[datetime, int, asyncio.Future[None]]] = attrs.field(factory=list)
    _order: itertools.count[int] = attrs.field(factory=itertools.count)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        due = self.clock.now() + timedelta(seconds=seconds)
        heapq.heappush(self._sleeping, (due, next(self._order), wake))
        await wake

    async def advance(self, seconds: float) -> None:
        target = self.clock.now() + timedelta(seconds=seconds)
        await settle()
        while self._sleeping and self._sleeping[0][0] <= target:
            due, _, wake = heapq.heappop(self._sleeping)
            self.clock.set(max(due, self.clock.now()))
            if not wake.done():
                wake.set_result(None)
            if not self._sleeping or self._sleeping[0][0] > due:
                await settle()  # every sleep due at this instant ends before anyone runs
        self.clock.set(target)
        await settle()


@attrs.frozen
class Call:
    at: datetime
    user_id: str
    operation: str
    failed: bool


class OutageQueue(MemoryOrderQueue):
    """The order queue on a key-value store that can be down. Takes wait on a bell rung by
    every push and when the store goes down (Redis's wake-ups ring every waiting take when
    their listener loses the connection), then look again. Records every call."""

    def __init__(self, clock: FakeClock, directory: MemoryWorkerDirectory) -> None:
        super().__init__(clock, directory)
        self.clock = clock
        self.down = False
        self.calls: list[Call] = []
        self.completed: list[OrderResult] = []
        self._bells: dict[str, asyncio.Event] = {}

    def go_down(self) -> None:
        self.down = True
        for user_id in list(self._bells):
            self._ring(user_id)

    def come_back(self) -> None:
        self.down = False

    def _ring(self, user_id: str) -> None:
        bell = self._bells.pop(user_id, None)
        if bell is not None:
            bell.set()

    def _check(self, user_id: str, operation: str) -> None:
        self.calls.append(Call(self.clock.now(), user_id, operation, self.down))
        if self.down:
            raise KeyValueStoreUnavailable(f"redis {operation}: ConnectionError")

    async def push(self, request: OrderRequest) -> bool:
        pushed = await super().push(request)
        self._ring(request.user_id)
        return pushed

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._check(user_id, "take")
            request = await super().take(user_id, 0)
            remaining = deadline - loop.time()
            if request is not None or remaining <= 0:
                return request
            bell = self._bells.setdefault(user_id, asyncio.Event())
            try:
                async with asyncio.timeout(remaining):
                    await bell.wait()
            except TimeoutError:
                pass

    async def in_flight(self, user_id: str) -> list[OrderRequest]:
        self._check(user_id, "in-flight list")
        return await super().in_flight(user_id)

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        self._check(request.user_id, "complete")
        await super().complete(request, result)
        self.completed.append(result)

    def failures(self, since: datetime, until: datetime) -> list[Call]:
        return [c for c in self.calls if c.failed and since <= c.at < until]


class HookedOrders(MemoryOrderHistory):
    """Order history that records the statuses applied and can run a hook on a claim."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[tuple[str, OrderStatus]] = []
        self.on_claim: dict[str, Any] = {}

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        updated = await super().transition(order_id, change)
        if updated is not None:
            self.applied.append((order_id, updated.status))
            hook = self.on_claim.pop(order_id, None)
            if hook is not None and updated.status is OrderStatus.SUBMITTED:
                hook()
        return updated


def user(i: int) -> str:
    return f"user-{i:03d}"


def account(user_id: str) -> str:
    return f"acct-{user_id}"


class World:
    """One worker host (no control loop: the test runs its heartbeat) serving ``n`` users over
    memory fakes, in virtual time."""

    def __init__(self, n: int) -> None:
        self.users = [user(i) for i in range(n)]
        self.clock = FakeClock()
        self.sleeper = VirtualSleeper(self.clock)
        self.directory = MemoryWorkerDirectory(self.clock)
        self.queue = OutageQueue(self.clock, self.directory)
        self.directory.attach_queue(self.queue)
        self.orders = HookedOrders()
        self.exchange = PaperExchange()
        self.brokers = PaperBrokerFactory(self.exchange, PaperExchange(), self.clock)
        self.fill_tasks = MemoryFillTaskQueue(self.clock)
        self.host = WorkerHost(
            self.directory,
            self.queue,
            self.make_worker,
            self.clock,
            self.sleeper,
            HostSettings(poll_s=60.0, mark_ttl_s=TTL_S),
            holder=HOLDER,
        )
        self._order_ids = itertools.count(1)

    def make_worker(self, user_id: str) -> UserWorker:
        return UserWorker(
            user_id,
            self.orders,
            self.brokers,
            self.fill_tasks,
            self.clock,
            FakeSleeper(self.clock),
            accounts=NO_ACCOUNTS,
        )

    async def serve_all(self) -> None:
        for user_id in self.users:
            self.host.activate(user_id)
        await settle()
        assert self.host.active_users == set(self.users)
        assert all(self.directory.is_marked(u) for u in self.users)

    async def run(self, seconds: float, *, step_s: float = 0.5) -> None:
        """Let ``seconds`` of virtual time pass, with the host's heartbeat every ``step_s``."""
        for _ in range(round(seconds / step_s)):
            await self.sleeper.advance(step_s)
            await self.host.heartbeat()

    async def order(self, user_id: str) -> OrderRequest:
        row = queued_row(
            f"ord-{next(self._order_ids)}",
            user_id=user_id,
            account_id=account(user_id),
            created_at=self.clock.now(),
        )
        await self.orders.add(row)
        return request_for(row, expires_in_s=3600)

    async def serve_one_order_each(self, users: Collection[str]) -> None:
        """Every user's next order is served, each exactly once."""
        requests = [await self.order(u) for u in users]
        for request in requests:
            assert await self.queue.push(request)
        results = await asyncio.gather(*(self.queue.wait_result(r.request_id, 5) for r in requests))
        assert [r.status if r else None for r in results] == [OrderStatus.FILLED] * len(users)
        for r in requests:
            placed = self.exchange.orders(account(r.user_id))
            assert [o.client_order_id for o in placed].count(f"{r.order_id}-entry") == 1
        done = Counter(r.order_id for r in self.queue.completed)
        assert all(done[r.order_id] == 1 for r in requests)
        for user_id in users:
            assert await self.queue.in_flight(user_id) == []

    async def take_lease(self, user_id: str) -> None:
        """Another host takes the user: its lease vanished and was taken elsewhere."""
        token = await self.directory.acquire(user_id, HOLDER, TTL_S)  # ours: the same token
        assert token is not None
        await self.directory.release(user_id, token)
        assert await self.directory.acquire(user_id, FOREIGN, 3600) is not None

    def failing_users(self, since: datetime, until: datetime) -> set[str]:
        return {c.user_id for c in self.queue.failures(since, until)}


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World(200)
    try:
        yield w
    finally:
        await w.host.stop()


def host_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == HOST_LOG and r.levelno == level]


def per_period(world: World, start: datetime, periods: int) -> list[int]:
    """Failing store calls in each backoff period (``PERIOD_S``) from ``start``."""
    step = timedelta(seconds=PERIOD_S)
    return [
        len(world.queue.failures(start + k * step, start + (k + 1) * step)) for k in range(periods)
    ]


async def test_idle_workers_wait_behind_one_prober_and_all_serve_their_next_order_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=HOST_LOG)
    await world.serve_all()
    start = world.clock.now()

    world.queue.go_down()
    await world.run(20.0)

    # Every take in progress failed once, as the store went away; then one call per period.
    assert len(world.queue.failures(start, start + timedelta(seconds=0.01))) == 200
    counts = per_period(world, start, 10)
    assert counts[0] == 200 + 4  # the wave, and the prober's retries at 0.1, 0.3, 0.7, 1.5 s
    assert counts[1:] == [1] * 9, counts  # O(1), not O(workers)
    assert len(world.failing_users(start + timedelta(seconds=1), world.clock.now())) == 1
    assert world.host.active_users == set(world.users)  # all of them wait, in place
    [warning] = host_records(caplog, logging.WARNING)  # one for the host, not one per worker
    assert warning.startswith("store unavailable; workers waiting for it")

    back = world.clock.now()
    world.queue.come_back()
    await world.run(5.0, step_s=0.05)

    [info] = [m for m in host_records(caplog, logging.INFO) if "store available again" in m]
    assert "199 workers waited for it" in info
    # The waiters resumed spread over less than 2 s, at most 10 (200 / 20 batches) at once.
    resumed: dict[str, datetime] = {}
    for c in world.queue.calls:
        if c.at >= back and not c.failed:
            resumed.setdefault(c.user_id, c.at)
    assert set(resumed) == set(world.users)
    firsts = sorted(resumed.values())
    assert timedelta(seconds=1) < firsts[-1] - firsts[0] < timedelta(seconds=PERIOD_S)
    assert max(Counter(firsts).values()) <= 11  # a batch, and the prober
    assert host_records(caplog, logging.WARNING) == [warning]  # nothing more

    await world.serve_one_order_each(world.users)
    assert world.host.active_users == set(world.users)


async def test_a_worker_whose_lease_is_lost_while_it_waits_stops_and_calls_nothing_more(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await world.serve_all()
    start = world.clock.now()
    world.queue.go_down()
    await world.run(4.0)
    [prober] = world.failing_users(start + timedelta(seconds=1), world.clock.now())
    waiter = next(u for u in world.users if u != prober)

    await world.take_lease(waiter)
    lost_at = world.clock.now()
    await world.run(3.0)  # the heartbeat finds it lost; the waiter's next lease check stops it

    assert waiter not in world.host.active_users
    assert [c for c in world.queue.calls if c.user_id == waiter and c.at >= lost_at] == []
    assert any(
        "lost its lease during a store outage" in m for m in host_records(caplog, logging.WARNING)
    )

    world.queue.come_back()
    await world.run(5.0, step_s=0.05)

    others = [u for u in world.users if u != waiter]
    assert world.host.active_users == set(others)
    await world.serve_one_order_each(others)
    assert await world.directory.acquire(waiter, FOREIGN, 3600) is not None  # still the other's


@pytest.mark.parametrize("how", ["lease lost", "task cancelled"])
async def test_when_the_prober_stops_another_worker_probes_and_the_host_recovers(
    world: World, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.DEBUG, logger=HOST_LOG)
    await world.serve_all()
    start = world.clock.now()
    world.queue.go_down()
    await world.run(6.0)
    [prober] = world.failing_users(start + timedelta(seconds=1), world.clock.now())

    await world.take_lease(prober)
    if how == "task cancelled":
        world.host.activate(prober)  # a start request: the lease is found lost, the task ended
    await world.run(10.0)

    assert prober not in world.host.active_users
    # From its last call on, another worker probes alone, on the backoff schedule.
    last = max(c.at for c in world.queue.calls if c.user_id == prober)
    after = [c for c in world.queue.calls if c.failed and c.at > last]
    [successor] = {c.user_id for c in after}
    assert successor != prober
    gaps = [(b.at - a.at).total_seconds() for a, b in itertools.pairwise(after)]
    assert len(after) >= 3 and set(gaps) == {PERIOD_S}
    assert any(f"worker of user {successor} probes the store now" in m for m in caplog.messages)

    world.queue.come_back()
    await world.run(5.0, step_s=0.05)

    others = [u for u in world.users if u != prober]
    assert world.host.active_users == set(others)
    opened, *lost = host_records(caplog, logging.WARNING)
    assert opened.startswith("store unavailable; workers waiting for it")
    assert lost and all(f"worker of user {prober} lost its lease" in m for m in lost)
    [info] = [m for m in host_records(caplog, logging.INFO) if "store available again" in m]
    assert f"worker of user {successor}" in info
    await world.serve_one_order_each(others)


async def test_an_order_in_hand_when_the_outage_begins_is_completed_once_after_it() -> None:
    world = World(50)
    try:
        await world.serve_all()
        busy = world.users[7]
        request = await world.order(busy)
        world.orders.on_claim[request.order_id] = world.queue.go_down  # mid-order
        assert await world.queue.push(request)
        await settle()

        await world.run(10.0)
        assert world.queue.completed == []  # executed, not published: still in flight
        assert await MemoryOrderQueue.in_flight(world.queue, busy) == [request]
        world.queue.come_back()
        await world.run(5.0, step_s=0.05)

        result = await world.queue.wait_result(request.request_id, 5)
        assert result is not None and result.status is OrderStatus.FILLED
        assert world.queue.completed == [result]
        assert [s for o, s in world.orders.applied if o == request.order_id] == [
            OrderStatus.SUBMITTED,
            OrderStatus.FILLED,
        ]
        assert len(world.exchange.orders(account(busy))) == 1
        await world.serve_one_order_each(world.users)
    finally:
        await world.host.stop()
