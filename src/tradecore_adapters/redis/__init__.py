"""Redis adapters (``redis.asyncio`` from redis-py >= 5): the replay store, the rate limiter,
the alert throttle, the API <-> worker bus and the order-tasks FIFO queue.

Keys follow the specification's "Internal messages"; every script reads the server's clock,
so several API and worker processes agree on time. Connection and timeout failures surface
as ``KeyValueStoreUnavailable`` (the rate limiter alone fails open).
"""

from __future__ import annotations

from tradecore_adapters.redis.client import RedisConnections, Wakeups, connect, open_connections
from tradecore_adapters.redis.fifo import RedisFillTaskQueue
from tradecore_adapters.redis.messaging import RedisOrderQueue, RedisWorkerDirectory
from tradecore_adapters.redis.protection import (
    RedisAlertThrottle,
    RedisDailyOrderCounter,
    RedisRateLimiter,
    RedisReplayStore,
    RedisWebhookAdmission,
)

__all__ = [
    "RedisAlertThrottle",
    "RedisConnections",
    "RedisDailyOrderCounter",
    "RedisFillTaskQueue",
    "RedisOrderQueue",
    "RedisRateLimiter",
    "RedisReplayStore",
    "RedisWebhookAdmission",
    "RedisWorkerDirectory",
    "Wakeups",
    "connect",
    "open_connections",
]
