"""The worker host's heartbeat: one batched renewal for all its leases, idle workers that make
no round trip of their own, and a worker that lost its lease replaced at the next start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import pytest
from support import NO_ACCOUNTS

from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

USERS = ("user-1", "user-2", "user-3")
FOREIGN = "host-elsewhere:1:x"


class CountingDirectory(MemoryWorkerDirectory):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.single_renewals: list[str] = []
        self.batches: list[dict[str, int]] = []

    async def renew(self, user_id: str, token: int, ttl_s: float) -> bool:
        self.single_renewals.append(user_id)
        return await super().renew(user_id, token, ttl_s)

    async def renew_many(self, leases: Mapping[str, int], ttl_s: float) -> set[str]:
        self.batches.append(dict(leases))
        lost = set()
        for user_id, token in leases.items():
            if not await MemoryWorkerDirectory.renew(self, user_id, token, ttl_s):
                lost.add(user_id)
        return lost


class World:
    def __init__(self, poll_s: float) -> None:
        self.clock = FakeClock()
        self.directory = CountingDirectory(self.clock)
        self.queue = MemoryOrderQueue(self.clock, self.directory)
        self.directory.attach_queue(self.queue)
        orders, exchange = MemoryOrderHistory(), PaperExchange()
        brokers = PaperBrokerFactory(exchange, PaperExchange(), self.clock)
        tasks = MemoryFillTaskQueue(self.clock)
        sleeper = FakeSleeper(self.clock)

        def make_worker(user_id: str) -> UserWorker:
            return UserWorker(
                user_id, orders, brokers, tasks, self.clock, sleeper, accounts=NO_ACCOUNTS
            )

        self.host = WorkerHost(
            self.directory,
            self.queue,
            make_worker,
            self.clock,
            sleeper,
            HostSettings(poll_s=poll_s, mark_ttl_s=30.0),
            holder="host-a",
        )


@pytest.fixture
async def world() -> AsyncIterator[World]:
    # Workers wait up to 60 s of real time per look: only a push or the test's end wakes them.
    w = World(poll_s=60.0)
    try:
        yield w
    finally:
        await w.host.stop()


async def serving(world: World, *users: str) -> None:
    for user_id in users:
        world.host.activate(user_id)
    for user_id in users:
        assert await world.directory.wait_active(user_id, 5)
    for _ in range(5):
        await asyncio.sleep(0)  # let each worker reach its wait


async def test_the_heartbeat_renews_every_due_lease_in_one_batch(world: World) -> None:
    await serving(world, *USERS)
    tokens = {u: await world.directory.acquire(u, "host-a", 30) for u in USERS}

    assert await world.host.heartbeat() == set()
    assert world.directory.batches == []  # nothing due yet

    world.clock.advance(6)
    assert await world.host.heartbeat() == set()
    assert world.directory.batches == [tokens]
    world.clock.advance(27)  # 33 s after the workers took the leases, 27 after the heartbeat
    assert all([await world.directory.is_active(u) for u in USERS])
    assert world.directory.single_renewals == []  # the idle workers made no call of their own


async def test_each_lease_is_renewed_once_it_is_due_whenever_its_worker_started(
    world: World,
) -> None:
    await serving(world, "user-1")
    world.clock.advance(3)
    assert await world.host.heartbeat() == set()  # user-1 is due at 5 s
    await serving(world, "user-2")  # taken at 3 s: due at 8 s
    world.clock.advance(3)

    await world.host.heartbeat()
    assert [set(batch) for batch in world.directory.batches] == [{"user-1"}]  # renewed at 6 s
    world.clock.advance(1.9)
    await world.host.heartbeat()
    assert len(world.directory.batches) == 1  # user-2 is not due before 8 s
    world.clock.advance(0.1)
    await world.host.heartbeat()
    assert set(world.directory.batches[-1]) == {"user-2"}
    world.clock.advance(3)  # 11 s: user-1, renewed at 6 s, is due again
    await world.host.heartbeat()
    assert set(world.directory.batches[-1]) == {"user-1"}
    assert world.directory.single_renewals == []


async def test_a_lease_the_heartbeat_finds_lost_stops_its_worker_and_a_start_replaces_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await serving(world, "user-1", "user-2")
    world.clock.advance(31)  # the heartbeat stalled past the leases' time to live
    intruder = await world.directory.acquire("user-1", FOREIGN, 3600)
    assert intruder is not None

    lost = await world.host.heartbeat()

    assert lost == {"user-1", "user-2"}  # user-2's lease simply expired
    assert any("lost its lease" in r.getMessage() for r in caplog.records)
    assert await world.directory.renew("user-1", intruder, 3600)  # the intruder's is intact
    world.host.activate("user-2")  # its next start request: a new worker, a new lease
    assert await world.directory.wait_active("user-2", 5)
    assert await world.host.heartbeat() == set()  # only the new lease is this host's now
    world.clock.advance(6)
    await world.host.heartbeat()
    assert set(world.directory.batches[-1]) == {"user-2"}


async def test_a_worker_renews_its_own_lease_when_no_heartbeat_runs() -> None:
    w = World(poll_s=0.005)  # activated, never started: no control loop, no heartbeat
    try:
        await serving(w, "user-1")
        w.clock.advance(11)
        for _ in range(200):
            if w.directory.single_renewals:
                break
            await asyncio.sleep(0.005)
        assert w.directory.single_renewals == ["user-1"]
        assert w.directory.batches == []
    finally:
        await w.host.stop()


async def test_a_stopping_host_starts_no_worker(world: World) -> None:
    """A sweep or recovery scan that finishes while the host stops (SIGTERM mid-recovery) must
    not start a worker that nothing would end: the user's requests wait for another host."""
    await serving(world, "user-1")
    stopping = asyncio.create_task(world.host.stop())
    await asyncio.sleep(0)  # stop has begun

    world.host.activate("user-2")
    await stopping

    assert world.host.active_users == frozenset()
    assert not await world.directory.is_active("user-2")
