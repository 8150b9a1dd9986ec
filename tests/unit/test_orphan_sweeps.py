"""When a worker host looks for orphaned users (requests waiting with no lease): when it
starts, after another host died (its record lapsed) until that host's leases have run out,
and otherwise once per ``full_sweep_s``, since the look scans the whole store. What a user
depends on: the orders a dead host left are served once its leases run out, whatever the
number of hosts; a host's own record lives while it beats and goes when it stops."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support import worker_over

from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.testing import orders as testing_orders
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.repositories import MemoryOrderHistory
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory

TTL_S = 30.0
SWEEP_S = 5.0
FULL_SWEEP_S = 60.0
HOST = "host-a"
DEAD = "host-b"
USER = "user-1"


class CountingDirectory(MemoryWorkerDirectory):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.sweeps = 0
        self.records: list[str] = []

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        self.sweeps += 1
        return await super().orphaned_users(limit)

    async def host_alive(self, holder: str, ttl_s: float) -> None:
        self.records.append(holder)
        await super().host_alive(holder, ttl_s)


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.directory = CountingDirectory(self.clock)
        self.queue = MemoryOrderQueue(self.clock, self.directory)
        self.directory.attach_queue(self.queue)
        orders, exchange = MemoryOrderHistory(), PaperExchange()
        brokers = PaperBrokerFactory(exchange, PaperExchange(), self.clock)

        def make_worker(user_id: str) -> UserWorker:
            return worker_over(user_id, orders, brokers, self.clock)

        settings = HostSettings(
            poll_s=60.0, mark_ttl_s=TTL_S, sweep_s=SWEEP_S, full_sweep_s=FULL_SWEEP_S
        )
        self.host = WorkerHost(
            self.directory,
            self.queue,
            make_worker,
            self.clock,
            FakeSleeper(self.clock),
            settings,
            holder=HOST,
        )

        self.started = self.clock.now()

    def at(self, seconds: float) -> None:
        """Move the fake clock to ``seconds`` after the world began (never back)."""
        elapsed = (self.clock.now() - self.started).total_seconds()
        assert seconds >= elapsed
        self.clock.advance(seconds - elapsed)

    async def looks(self, first: float, last: float) -> dict[float, list[str] | None]:
        """The control loop's looks every ``SWEEP_S`` from ``first`` to ``last`` seconds
        (fake time): what each returned, by when it ran."""
        looks: dict[float, list[str] | None] = {}
        at = first
        while at <= last:
            self.at(at)
            looks[at] = await self.host.sweep_when_due()
            at += SWEEP_S
        return looks


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    try:
        yield w
    finally:
        await w.host.stop()


def swept_at(looks: dict[float, list[str] | None]) -> list[float]:
    return [at for at, started in looks.items() if started is not None]


async def test_a_host_sweeps_when_it_starts_then_once_per_full_sweep_period(world: World) -> None:
    looks = await world.looks(0.0, 130.0)

    assert swept_at(looks) == [0.0, 60.0, 120.0]
    assert world.directory.sweeps == 3


async def test_a_dead_hosts_users_are_started_after_its_leases_ran_out(world: World) -> None:
    # host-b recorded itself at 0 s and holds the user's lease, renewed by its worker 4 s
    # later (a lease is renewed at most about a heartbeat period after the last record)
    await world.directory.host_alive(DEAD, TTL_S)
    token = await world.directory.acquire(USER, DEAD, TTL_S)
    assert token is not None
    assert await world.queue.push(testing_orders.order_request("r1", USER))
    looks = await world.looks(0.0, 0.0)
    world.at(4.0)
    assert await world.directory.renew(USER, token, TTL_S)  # the lease now ends at 34 s

    looks |= await world.looks(5.0, 100.0)

    # at 0 s (start) nothing is orphaned; host-b's record lapses at 30 s: a sweep every
    # period from then until 30 + 30 + 5 s; the lease ended at 34 s, so the sweep at 35 s
    # starts the user; then nothing until the full sweep period (60 s after the last sweep)
    assert swept_at(looks) == [0.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0]
    assert looks[0.0] == [] and looks[30.0] == []
    assert looks[35.0] == [USER]
    assert USER in world.host.active_users


async def test_the_heartbeat_keeps_the_hosts_record_and_stop_removes_it(world: World) -> None:
    for at in (0.0, 3.0, 5.0):  # written at 0 s and again once heartbeat_age (5 s) passed
        world.at(at)
        await world.host.heartbeat()
    assert world.directory.records == [HOST, HOST]

    world.at(34.0)
    assert await world.directory.lapsed_hosts() == []  # lives until 5 + 30 s
    await world.host.stop()
    world.clock.advance(60.0)
    assert await world.directory.lapsed_hosts() == []  # removed: nobody sweeps for it


async def test_a_host_that_stops_beating_is_reported_lapsed_once(world: World) -> None:
    await world.host.heartbeat()
    world.clock.advance(TTL_S)

    assert await world.directory.lapsed_hosts() == [HOST]
    assert await world.directory.lapsed_hosts() == []
