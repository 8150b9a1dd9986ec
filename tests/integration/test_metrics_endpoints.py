"""The operators' port of real processes: ``tradecore serve`` and ``tradecore worker`` (in
process, on free ports) export the Prometheus text format; the worker host answers its
health checks; the scrape-time gauges count the real Redis queues as the memory ones."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import psycopg
import pytest
import redis
from psycopg import sql
from smtp_support import free_port

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.ports.messaging import FillTask, FillTaskQueue, OrderQueue, WorkerDirectory
from tradecore.testing.clock import FakeClock
from tradecore.testing.orders import order_request
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory
from tradecore_adapters.metrics import StateGauges
from tradecore_adapters.metrics.gauges import SHARED_TTL_S
from tradecore_adapters.postgres import migrate
from tradecore_adapters.redis import (
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisWorkerDirectory,
    open_connections,
)
from tradecore_adapters.redis.snapshots import RedisSnapshot
from tradecore_entrypoints.cli import run_worker, serve_forever
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.observability import QUEUE_COUNTS_KEY, instrument, metrics_endpoint
from tradecore_entrypoints.settings import ConfigError, Settings

EXPOSITION = "text/plain; version=0.0.4"
ADMIN_URL = os.environ.get(
    "TRADECORE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
STARTUP_TRIES = 400
"""Looks at a starting server's port, 25 ms apart: a bound on the wait, not a measure."""


def redis_url() -> str:
    db = int(os.environ.get("TRADECORE_TEST_REDIS_DB", "9"))
    assert db != 0, "the tests flush their Redis database"
    return f"redis://127.0.0.1:6379/{db}"


@pytest.fixture
def redis_db() -> str:
    url = redis_url()
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        client.flushdb()
    except redis.RedisError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis is required in CI: {e}")
        pytest.skip(f"Redis unreachable at {url}: {e}")
    finally:
        client.close()
    return url


@pytest.fixture
def database_url() -> Iterator[str]:
    name = f"tradecore_test_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.OperationalError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {e}")
        pytest.skip(f"PostgreSQL unreachable: {e}")
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    headers = {} if accept is None else {"Accept": accept}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


async def until_up(url: str, task: asyncio.Task[None]) -> None:
    """Return once ``url`` answers (the process is up); fail if the process ended first."""
    for _ in range(STARTUP_TRIES):
        if task.done():
            task.result()
            raise AssertionError("the process stopped before it served")
        try:
            await get(url)
            return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.025)
    raise AssertionError(f"{url} never answered")


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Any], asyncio.Task[None]]]:
    """Runs a ``serve_forever`` / ``run_worker`` coroutine taking ``stop``; stops it after."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def start(make: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(make(stop))
        tasks.append(task)
        return task

    yield start
    stop.set()
    await asyncio.gather(*tasks)


async def test_the_api_exports_metrics_on_its_own_port(
    running: Callable[[Any], asyncio.Task[None]],
) -> None:
    api_port, metrics_port = free_port(), free_port()
    settings = Settings(metrics_port=metrics_port)
    task = running(
        lambda stop: serve_forever(
            settings, "127.0.0.1", api_port, demo=False, echo=lambda _: None, stop=stop
        )
    )
    await until_up(f"http://127.0.0.1:{metrics_port}/metrics", task)

    status, _, _ = await get(f"http://127.0.0.1:{api_port}/no/such/page")
    assert status == 404
    status, content_type, text = await get(f"http://127.0.0.1:{metrics_port}/metrics")

    assert status == 200
    assert content_type.startswith(EXPOSITION)
    assert 'tradecore_http_requests_total{method="GET",route="unmatched",status="404"} 1.0' in text
    assert "tradecore_queue_gauges_up 1.0" in text
    # the embedded runtime runs its workers in the API process
    assert "tradecore_worker_host_workers 0.0" in text
    openmetrics = await get(
        f"http://127.0.0.1:{metrics_port}/metrics", "application/openmetrics-text; version=1.0.0"
    )
    assert openmetrics[1].startswith("application/openmetrics-text")
    assert openmetrics[2].endswith("# EOF\n")
    assert (await get(f"http://127.0.0.1:{api_port}/metrics"))[0] == 404
    assert (await get(f"http://127.0.0.1:{metrics_port}/health/ready"))[0] == 404


async def test_a_worker_host_exports_metrics_and_answers_its_health_checks(
    running: Callable[[Any], asyncio.Task[None]], database_url: str, redis_db: str
) -> None:
    await migrate(database_url)
    port = free_port()
    settings = Settings(
        database_url=database_url,
        redis_url=redis_db,
        jwt_secret=secrets.token_urlsafe(48),
        encryption_key=secrets.token_urlsafe(32),
        metrics_port=port,
    )
    task = running(lambda stop: run_worker(settings, stop))
    base = f"http://127.0.0.1:{port}"
    await until_up(base + "/health/live", task)

    live = await get(base + "/health/live")
    ready = await get(base + "/health/ready")
    status, content_type, text = await get(base + "/metrics")

    assert live[0] == 200
    assert ready[0] == 200, ready[2]
    assert '"workers": true' in ready[2] and '"stores": true' in ready[2]
    assert status == 200 and content_type.startswith(EXPOSITION)
    assert "tradecore_worker_host_workers 0.0" in text
    assert "tradecore_worker_host_leases 0.0" in text
    assert "tradecore_queue_gauges_up 1.0" in text
    assert "tradecore_users_waiting_without_worker 0.0" in text


async def test_a_worker_host_is_not_ready_until_its_workers_run() -> None:
    container = build_container(Settings())
    metrics = instrument(container)
    system = container.services.system()
    async with metrics_endpoint(metrics, system, Settings(), worker_host=True) as server:
        base = f"http://127.0.0.1:{server.port}"
        before = await get(base + "/health/ready")
        async with system.running(workers=True):
            during = await get(base + "/health/ready")
        after = await get(base + "/health/ready")

    assert before[0] == 503 and '"workers": false' in before[2]
    assert during[0] == 200
    assert after[0] == 503


# --- the gauges on each technology -------------------------------------------------------


Ports = tuple[OrderQueue, WorkerDirectory, FillTaskQueue]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def ports(request: pytest.FixtureRequest) -> AsyncIterator[Ports]:
    if request.param == "memory":
        clock = FakeClock()
        directory = MemoryWorkerDirectory(clock)
        queue = MemoryOrderQueue(clock, directory)
        directory.attach_queue(queue)
        yield queue, directory, MemoryFillTaskQueue(clock)
        return
    connections = open_connections(request.getfixturevalue("redis_db"))
    redis_queue = RedisOrderQueue(connections)
    fill_tasks = RedisFillTaskQueue(connections.commands)
    yield redis_queue, RedisWorkerDirectory(connections), fill_tasks
    await redis_queue.aclose()
    await fill_tasks.aclose()
    await connections.aclose()


def values(gauges: StateGauges) -> dict[str, float]:
    return {s.name: s.value for family in gauges.collect() for s in family.samples}


async def test_the_gauges_count_the_queues(ports: Ports) -> None:
    queue, directory, fill_tasks = ports
    assert await directory.acquire("u1", "host-a", 30.0) is not None
    assert await directory.acquire("u3", "host-b", 30.0) is not None
    assert await queue.push(order_request("r1", "u1"))
    assert await queue.take("u1", 0.0) is not None  # now in flight
    assert await queue.push(order_request("r2", "u1"))
    await queue.park(order_request("r3", "u2"))  # no worker holds u2
    await fill_tasks.send(FillTask("o1", "u1", "acct"), 0.0)
    await fill_tasks.send(FillTask("o2", "u2", "acct"), 60.0)
    delivery = await fill_tasks.receive(1.0)
    assert delivery is not None
    await fill_tasks.dead_letter(delivery, "gave up")
    gauges = StateGauges(queue, directory, fill_tasks, ("host-a", lambda: 1))

    await gauges.refresh()

    assert values(gauges) == {
        "tradecore_queue_gauges_up": 1,
        "tradecore_order_requests_waiting": 2,
        "tradecore_order_requests_in_flight": 1,
        "tradecore_users_waiting_without_worker": 1,
        "tradecore_worker_leases": 2,
        "tradecore_fill_tasks_pending": 1,
        "tradecore_fill_dead_letters": 1,
        "tradecore_worker_host_workers": 1,
        "tradecore_worker_host_leases": 1,
    }


class Unreadable:
    """Queue, directory and order-tasks reads that fail as an unreachable store does: a
    process whose gauges report counts with these read them from the shared snapshot."""

    async def depths(self, limit: int = 1000) -> Any:
        raise KeyValueStoreUnavailable("unreadable")

    leases = depths

    async def pending_count(self) -> int:
        raise KeyValueStoreUnavailable("unreadable")

    async def dead_letters(self) -> Any:
        raise KeyValueStoreUnavailable("unreadable")


@pytest.mark.redis
async def test_processes_report_one_shared_read_of_the_counts_until_it_lapses(
    redis_db: str,
) -> None:
    connections = open_connections(redis_db)
    queue, directory = RedisOrderQueue(connections), RedisWorkerDirectory(connections)
    fill_tasks = RedisFillTaskQueue(connections.commands)
    shared = RedisSnapshot(connections.commands, QUEUE_COUNTS_KEY)
    unreadable: Any = Unreadable()
    try:
        assert await directory.acquire("u1", "host-a", 30.0) is not None
        assert await directory.acquire("u2", "host-b", 30.0) is not None
        assert await directory.acquire("u3", "host-b", 30.0) is not None
        assert await queue.push(order_request("r1", "u1"))
        reader = StateGauges(queue, directory, fill_tasks, ("host-a", lambda: 1), shared=shared)
        other = StateGauges(
            unreadable, unreadable, unreadable, ("host-b", lambda: 2), shared=shared
        )

        await reader.refresh()
        await other.refresh()  # within the shared read's lifetime: no scan of its own

        assert values(other) == {
            "tradecore_queue_gauges_up": 1,
            "tradecore_order_requests_waiting": 1,
            "tradecore_order_requests_in_flight": 0,
            "tradecore_users_waiting_without_worker": 0,
            "tradecore_worker_leases": 3,
            "tradecore_fill_tasks_pending": 0,
            "tradecore_fill_dead_letters": 0,
            "tradecore_worker_host_workers": 2,
            "tradecore_worker_host_leases": 2,  # host-b's own, from the shared read
        }
        assert values(reader)["tradecore_worker_host_leases"] == 1
        pttl = int(await connections.commands.pttl(QUEUE_COUNTS_KEY))
        assert 0 < pttl <= SHARED_TTL_S * 1000

        await connections.commands.delete(QUEUE_COUNTS_KEY)  # as when it lapses
        await other.refresh()

        assert values(other)["tradecore_queue_gauges_up"] == 0  # it read its own stores
    finally:
        await queue.aclose()
        await directory.aclose()
        await fill_tasks.aclose()
        await connections.aclose()


async def test_an_unreachable_store_is_reported_not_raised() -> None:
    connections = open_connections(f"redis://127.0.0.1:{free_port()}/9", connect_timeout_s=0.5)
    queue = RedisOrderQueue(connections)
    gauges = StateGauges(
        queue, RedisWorkerDirectory(connections), RedisFillTaskQueue(connections.commands)
    )
    try:
        await gauges.refresh()
    finally:
        await queue.aclose()
        await connections.aclose()

    assert values(gauges) == {"tradecore_queue_gauges_up": 0}


async def test_a_metrics_port_taken_is_a_configuration_error() -> None:
    first, second = build_container(Settings()), build_container(Settings())
    metrics, other = instrument(first), instrument(second)
    system = first.services.system()
    async with metrics_endpoint(metrics, system, Settings(), worker_host=False) as taken:
        settings = Settings(metrics_port=taken.port)
        with pytest.raises(ConfigError, match="METRICS_HOST:METRICS_PORT: cannot listen"):
            async with metrics_endpoint(
                other, second.services.system(), settings, worker_host=False
            ):
                pass
