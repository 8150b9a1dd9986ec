"""One process's connections to Postgres and Redis, and their lifecycle.

Made lazily (nothing connects on construction), opened by ``open`` inside the event loop,
closed by ``close``. Both stores have short timeouts so that with one of them down a webhook
still gets its 503 well inside TradingView's 3 s and the sender can resend.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Protocol, TypeVar

import attrs

from tradecore_adapters.postgres import Pool, make_pool
from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.redis import RedisConnections, RedisFillTaskQueue, open_connections
from tradecore_adapters.redis.keys import DEFAULT_SHARDS
from tradecore_adapters.redis.legacy import adopt_legacy_keys
from tradecore_adapters.system import SecretsRandom

DATABASE_TIMEOUT_S = 5.0
CONNECTION_WAIT_S = 1.5
"""How long a request waits for a database connection from the pool."""
REDIS_TIMEOUT_S = 2.0
POOL_SIZE = 10


class Listener(Protocol):
    """A reader of the Redis connections that must stop before they close (a queue's
    wake-up listener)."""

    async def aclose(self) -> None: ...


L = TypeVar("L", bound=Listener)


@attrs.define
class Connections:
    """The process's pool and Redis clients (``Stores`` of the Postgres and Redis set), and
    the listeners on them that must stop before the clients close."""

    pool: Pool
    redis: RedisConnections
    listeners: list[Listener] = attrs.Factory(list)

    @classmethod
    def create(
        cls,
        database_url: str,
        redis_url: str,
        *,
        pool_size: int = POOL_SIZE,
        queue_shards: int = DEFAULT_SHARDS,
    ) -> Connections:
        """``redis_url`` names one server or a cluster (``open_connections``);
        ``queue_shards`` is REDIS_QUEUE_SHARDS."""
        pool = make_pool(
            database_url,
            min_size=1,
            max_size=pool_size,
            timeout_s=CONNECTION_WAIT_S,
            statement_timeout_s=DATABASE_TIMEOUT_S,
        )
        redis = open_connections(
            redis_url, socket_timeout_s=REDIS_TIMEOUT_S, queue_shards=queue_shards
        )
        return cls(pool, redis)

    async def open(self) -> None:
        """Open the pool (raises DatabaseUnavailable when Postgres cannot be reached), check
        Redis (raises KeyValueStoreUnavailable) and adopt the keys an older release left
        under its names (``adopt_legacy_keys``: a SCAN, nothing to do after the first
        start)."""
        with database_errors():
            await self.pool.open(wait=True, timeout=DATABASE_TIMEOUT_S)
        await self.redis.check()
        tasks = RedisFillTaskQueue(self.redis.commands, shards=self.redis.queue_shards)
        await adopt_legacy_keys(self.redis, tasks)

    async def ready(self) -> bool:
        """True when both stores answer now (``/health/ready``)."""
        try:
            async with asyncio.timeout(DATABASE_TIMEOUT_S):
                async with self.pool.connection() as conn:
                    await conn.execute("SELECT 1")
                await self.redis.check()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        for listener in self.listeners:
            await listener.aclose()
        await self.redis.aclose()
        await self.pool.close()


def closed_with(connections: Connections, listener: L) -> L:
    """``listener``, to be stopped by ``connections.close`` before the clients close."""
    connections.listeners.append(listener)
    return listener


def host_identity() -> str:
    """A worker host's lease holder name: host, process and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{SecretsRandom().token_urlsafe(6)}"
