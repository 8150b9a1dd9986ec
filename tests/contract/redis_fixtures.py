"""Redis for the contract suites, and the key-value harness that runs them on both adapters.

Tests use a dedicated logical database (``TRADECORE_TEST_REDIS_DB``, default 9; never 0) on
``TRADECORE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379``), flushed before each test.
An unreachable server skips the Redis tests with the reason, except in CI (``CI=true``) where
it fails them.

``kv`` is parametrized over ``memory``, ``redis`` and ``cluster``: the same test runs on the
in-memory adapters (on a FakeClock), on the Redis ones against the single server (on the
server's clock), and on the Redis ones against a private three-master Redis Cluster
(``redis_cluster``: started once per session from ``redis-server`` on free loopback ports,
flushed on every master before each test; missing redis-server or redis-cli skips its tests,
and fails them under ``CI=true``). Time is handled by
the harness so no test waits long: ``ttl_s`` reads a key's remaining life, ``lapse`` ends it
(the clock moves past it, or the key is deleted), ``outlive`` waits for a short TTL (tens of
milliseconds) to run out by itself (the clock moves past it; against Redis, bounded polling
until the server dropped the key), and ``pass_time`` lets a short span go by (the fake clock
advances; against Redis it is a real pause of at most 0.25 s).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Literal
from urllib.parse import urlsplit

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis_cluster import ThreeMasterCluster, cluster_for_tests

from tradecore.orders import (
    OrderRequest,
    OrderResult,
)
from tradecore.ports.messaging import FillTask, FillTaskQueue, OrderQueue, WorkerDirectory
from tradecore.ports.protection import (
    AlertThrottle,
    DailyOrderCounter,
    RateLimiter,
    ReplayStore,
    WebhookAdmission,
)
from tradecore.testing import orders as testing_orders
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.protection import (
    MemoryAlertThrottle,
    MemoryDailyOrderCounter,
    MemoryRateLimiter,
    MemoryReplayStore,
    MemoryWebhookAdmission,
)
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory
from tradecore_adapters.redis import (
    RedisAlertThrottle,
    RedisConnections,
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisRateLimiter,
    RedisReplayStore,
    RedisWorkerDirectory,
    connect,
    open_connections,
)
from tradecore_adapters.redis.messaging import mark_key, response_key
from tradecore_adapters.redis.protection import RedisDailyOrderCounter, RedisWebhookAdmission

__all__ = [
    "SHORT_TTL_S",
    "KvHarness",
    "MemoryHarness",
    "RedisHarness",
    "fill_task",
    "kv",
    "order_request",
    "order_result",
    "pubsub_listeners",
    "redis_client",
    "redis_cluster",
    "redis_connections",
    "redis_url",
]

URL_ENV = "TRADECORE_TEST_REDIS_URL"
DB_ENV = "TRADECORE_TEST_REDIS_DB"
DEFAULT_URL = "redis://127.0.0.1:6379"
DEFAULT_DB = 9
LONGEST_REAL_PAUSE_S = 0.25
SHORT_TTL_S = 0.05
"""A time to live that ``outlive`` may wait for."""
_EXPIRY_POLL_S = 0.005
_EXPIRY_POLLS = 400  # 2 s at most: a generous bound for a 50 ms TTL

Kind = Literal["replay", "throttle", "mark", "reply"]


def _test_url() -> str:
    """The server of ``TRADECORE_TEST_REDIS_URL`` with the test database as its path."""
    db = int(os.environ.get(DB_ENV, str(DEFAULT_DB)))
    if db == 0:
        raise pytest.UsageError(f"{DB_ENV}=0: the tests flush their database; pick another")
    return urlsplit(os.environ.get(URL_ENV, DEFAULT_URL))._replace(path=f"/{db}").geturl()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test database's URL, once the server answered a PING."""
    url = _test_url()
    probe = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        probe.ping()
    except redis.RedisError as e:
        reason = f"Redis unreachable at {url}: {e}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true requires Redis)")
        pytest.skip(reason)
    finally:
        probe.close()
    return url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreeMasterCluster]:
    """A private three-master Redis Cluster for the session (see the module docstring)."""
    with cluster_for_tests(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


async def flush(connections: RedisConnections) -> None:
    """Empty the test database, or every master of a cluster."""
    if isinstance(connections.commands, RedisCluster):
        await connections.commands.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        await connections.commands.flushdb()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Redis]:
    """A command client on the flushed test database."""
    client = connect(redis_url, socket_timeout_s=2.0)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def redis_connections(redis_url: str) -> AsyncIterator[RedisConnections]:
    """Command and blocking clients on the flushed test database."""
    connections = open_connections(redis_url)
    await connections.commands.flushdb()
    yield connections
    await connections.aclose()


def order_request(request_id: str, user_id: str = "u1") -> OrderRequest:
    return testing_orders.order_request(request_id, user_id, quantity=Decimal("1.50"))


def order_result(request: OrderRequest) -> OrderResult:
    return testing_orders.filled_result(request, fill_price=Decimal("100.25"), broker_refs=("b-1",))


def fill_task(order_id: str, user_id: str = "u1") -> FillTask:
    return FillTask(order_id=order_id, user_id=user_id, trading_account_id="acct")


class KvHarness:
    """The adapters of one technology plus the time controls described above."""

    name: str
    replay: ReplayStore
    limiter: RateLimiter
    daily: DailyOrderCounter
    admission: WebhookAdmission
    throttle: AlertThrottle
    queue: OrderQueue
    directory: WorkerDirectory

    def tasks(
        self, visibility_timeout_s: float = 180.0, dedup_window_s: float = 300.0
    ) -> FillTaskQueue:
        raise NotImplementedError

    async def ttl_s(self, kind: Kind, ident: str) -> float | None:
        """Seconds the key of ``kind`` for ``ident`` still lives; None when absent."""
        raise NotImplementedError

    async def lapse(self, kind: Kind, ident: str) -> None:
        """Let the key's time to live run out."""
        raise NotImplementedError

    async def outlive(self, kind: Kind, ident: str) -> None:
        """Return once the key's own time to live (at most ``SHORT_TTL_S``) ran out."""
        raise NotImplementedError

    async def pass_time(self, seconds: float) -> None:
        """Let ``seconds`` (at most 0.25) go by."""
        raise NotImplementedError


class MemoryHarness(KvHarness):
    name = "memory"

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.replay: MemoryReplayStore = MemoryReplayStore(self.clock)
        self.limiter = MemoryRateLimiter(self.clock)
        self.daily: MemoryDailyOrderCounter = MemoryDailyOrderCounter(self.clock)
        self.admission = MemoryWebhookAdmission(self.replay, self.limiter, self.daily)
        self.throttle: MemoryAlertThrottle = MemoryAlertThrottle(self.clock)
        self.directory: MemoryWorkerDirectory = MemoryWorkerDirectory(self.clock)
        self.queue: MemoryOrderQueue = MemoryOrderQueue(self.clock, self.directory)
        self.directory.attach_queue(self.queue)

    def tasks(
        self, visibility_timeout_s: float = 180.0, dedup_window_s: float = 300.0
    ) -> FillTaskQueue:
        return MemoryFillTaskQueue(self.clock, visibility_timeout_s, dedup_window_s)

    async def ttl_s(self, kind: Kind, ident: str) -> float | None:
        # The memory adapters expose no TTL; read their expiry times (read-only).
        expiry: datetime | None
        if kind == "replay":
            expiry = self.replay._keys._expiry.get(ident)
        elif kind == "throttle":
            expiry = self.throttle._slots._expiry.get(ident)
        elif kind == "mark":
            lease = self.directory._leases.get(ident)
            expiry = None if lease is None else lease.expires_at
        else:
            reply = self.queue._replies.get(ident)
            expiry = None if reply is None else reply[1]
        if expiry is None:
            return None
        left = (expiry - self.clock.now()).total_seconds()
        return left if left > 0 else None

    async def lapse(self, kind: Kind, ident: str) -> None:
        left = await self.ttl_s(kind, ident)
        if left is not None:
            self.clock.advance(left)

    async def outlive(self, kind: Kind, ident: str) -> None:
        left = await self.ttl_s(kind, ident)
        assert left is None or left <= SHORT_TTL_S, f"a TTL of {left} s is not short"
        await self.lapse(kind, ident)

    async def pass_time(self, seconds: float) -> None:
        assert seconds <= LONGEST_REAL_PAUSE_S
        self.clock.advance(seconds)


class RedisHarness(KvHarness):
    name = "redis"

    def __init__(self, connections: RedisConnections) -> None:
        self.connections = connections
        client = connections.commands
        self.replay: RedisReplayStore = RedisReplayStore(client)
        self.limiter = RedisRateLimiter(client)
        self.daily: RedisDailyOrderCounter = RedisDailyOrderCounter(client)
        self.admission = RedisWebhookAdmission(client)
        self.throttle: RedisAlertThrottle = RedisAlertThrottle(client)
        self.directory = RedisWorkerDirectory(connections)
        self.queue: RedisOrderQueue = RedisOrderQueue(connections)
        self._task_queues: list[RedisFillTaskQueue] = []

    def tasks(
        self, visibility_timeout_s: float = 180.0, dedup_window_s: float = 300.0
    ) -> FillTaskQueue:
        tasks = RedisFillTaskQueue(
            self.connections.commands,
            visibility_timeout_s,
            dedup_window_s=dedup_window_s,
            shards=self.connections.queue_shards,
        )
        self._task_queues.append(tasks)
        return tasks

    def key(self, kind: Kind, ident: str) -> str:
        if kind == "replay":  # ident: "user_id:fingerprint"
            return self.replay.key(*ident.split(":", 1))
        if kind == "throttle":
            return self.throttle.key(ident)
        if kind == "mark":
            return mark_key(ident)
        user_id, _, request_id = ident.rpartition("/")  # ident: "[user_id/]request_id"
        return response_key(user_id or "u1", request_id)

    async def ttl_s(self, kind: Kind, ident: str) -> float | None:
        pttl = int(await self.connections.commands.pttl(self.key(kind, ident)))
        if pttl == -2:
            return None
        return float("inf") if pttl == -1 else pttl / 1000

    async def lapse(self, kind: Kind, ident: str) -> None:
        await self.connections.commands.delete(self.key(kind, ident))

    async def outlive(self, kind: Kind, ident: str) -> None:
        left = await self.ttl_s(kind, ident)
        assert left is None or left <= SHORT_TTL_S, f"a TTL of {left} s is not short"
        key = self.key(kind, ident)
        for _ in range(_EXPIRY_POLLS):
            if not await self.connections.commands.exists(key):  # EXISTS expires a due key
                return
            await asyncio.sleep(_EXPIRY_POLL_S)
        raise AssertionError(f"{key} outlived its time to live")

    async def pass_time(self, seconds: float) -> None:
        assert seconds <= LONGEST_REAL_PAUSE_S
        await asyncio.sleep(seconds)

    async def aclose(self) -> None:
        await self.queue.aclose()
        await self.directory.aclose()
        for tasks in self._task_queues:
            await tasks.aclose()


def _kv_params() -> Iterator[object]:
    yield pytest.param("memory", id="memory")
    yield pytest.param("redis", id="redis", marks=pytest.mark.redis)
    yield pytest.param("cluster", id="cluster", marks=pytest.mark.redis)


@pytest.fixture(params=list(_kv_params()))
async def kv(request: pytest.FixtureRequest) -> AsyncIterator[KvHarness]:
    """The key-value adapters of one technology (see the module docstring)."""
    if request.param == "memory":
        yield MemoryHarness()
        return
    if request.param == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    else:
        url = request.getfixturevalue("redis_url")
    connections = open_connections(url)
    await flush(connections)
    harness = RedisHarness(connections)
    yield harness
    await harness.aclose()
    await connections.aclose()


async def pubsub_listeners(
    client: Redis, *, exclude: set[str] | frozenset[str] = frozenset(), rounds: int = 300
) -> list[str]:
    """The ids of the test database's pub/sub listeners not in ``exclude``, once there is one
    (at most ``rounds`` looks, 10 ms apart). Channels are server-wide, so listeners of other
    databases (other processes sharing the server) are left out, and left alone."""
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    ids: list[str] = []
    for _ in range(rounds):
        listeners = await client.client_list(_type="pubsub")
        ids = [
            c["id"]
            for c in listeners
            if int(c["db"]) == db and int(c["sub"]) > 0 and c["id"] not in exclude
        ]
        if ids:
            return ids
        await asyncio.sleep(0.01)
    return ids
