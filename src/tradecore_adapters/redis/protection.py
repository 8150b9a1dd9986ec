"""Replay store, rate limiter and alert throttle on Redis.

Keys: ``webhook:replay:{fingerprint}`` (SET NX EX), ``ratelimit:{user_id}`` (a sorted set of
admitted hits, microsecond scores from the server's clock), ``alert:throttle:{user_id}``
(SET NX EX). Semantics match the in-memory adapters: the limiter applies
``tradecore.limits.admit`` step for step inside one script.
"""

from __future__ import annotations

import logging
import math
import secrets

from redis.asyncio import Redis

from tradecore.limits import RATE_KEY_TTL_S
from tradecore.ports.protection import RateDecision
from tradecore_adapters.redis.errors import UNAVAILABLE, unavailable_on_failure

log = logging.getLogger(__name__)

REPLAY_PREFIX = "webhook:replay:"
RATE_PREFIX = "ratelimit:"
ALERT_PREFIX = "alert:throttle:"


class RedisReplayStore:
    """ReplayStore: ``SET webhook:replay:{fingerprint} 1 NX EX ttl`` (a TTL below one second
    is taken as one second); release deletes. Raises KeyValueStoreUnavailable."""

    def __init__(self, client: Redis, prefix: str = REPLAY_PREFIX) -> None:
        self._client = client
        self._prefix = prefix

    def key(self, fingerprint: str) -> str:
        return f"{self._prefix}{fingerprint}"

    async def claim(self, fingerprint: str, ttl_s: int) -> bool:
        with unavailable_on_failure("replay claim"):
            stored = await self._client.set(self.key(fingerprint), "1", nx=True, ex=max(1, ttl_s))
        return bool(stored)

    async def release(self, fingerprint: str) -> None:
        with unavailable_on_failure("replay release"):
            await self._client.delete(self.key(fingerprint))


# KEYS[1] the window; ARGV: limit, window (us), key TTL (ms), a unique member suffix.
# Mirrors tradecore.limits.admit: entries at or before now - window leave; the hit is added
# (and the TTL set) only when admitted. Returns {allowed, remaining, retry_after_us}.
_HIT = """
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cutoff = now - window
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', cutoff))
local count = redis.call('ZCARD', key)
if count < limit then
  local stamp = string.format('%.0f', now)
  redis.call('ZADD', key, stamp, stamp .. '-' .. ARGV[4])
  redis.call('PEXPIRE', key, ARGV[3])
  return {1, limit - count - 1, 0}
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
local retry = window
if oldest[2] then retry = tonumber(oldest[2]) - cutoff end
return {0, 0, string.format('%.0f', retry)}
"""


class RedisRateLimiter:
    """RateLimiter: one script on ``ratelimit:{user_id}`` using the server's clock.

    Of N concurrent hits on an empty window exactly ``limit`` are admitted; a refused hit is
    not recorded; the key lives ``RATE_KEY_TTL_S`` (or the window plus 5 s if longer) after
    the last admitted hit. Fails open: any error answers allowed.
    """

    def __init__(self, client: Redis, prefix: str = RATE_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._script = client.register_script(_HIT)

    def key(self, user_id: str) -> str:
        return f"{self._prefix}{user_id}"

    async def hit(self, user_id: str, limit: int, window_s: float) -> RateDecision:
        try:
            if limit < 0:
                raise ValueError("limit must not be negative")
            if not (math.isfinite(window_s) and window_s > 0):
                raise ValueError("window must be a positive number of seconds")
            window_us = max(1, round(window_s * 1_000_000))
            ttl_ms = round(max(float(RATE_KEY_TTL_S), window_s + 5) * 1000)
            allowed, remaining, retry_us = await self._script(
                keys=[self.key(user_id)],
                args=[limit, window_us, ttl_ms, secrets.token_hex(8)],
            )
            if int(allowed):
                return RateDecision(True, int(remaining), None)
            return RateDecision(False, 0, int(retry_us) / 1_000_000)
        except UNAVAILABLE as e:
            log.warning("rate limiter unavailable (%s); admitting the request (fail open)", e)
        except Exception:
            log.exception("rate limiter failed; admitting the request (fail open)")
        return RateDecision(True, max(limit - 1, 0), None)


class RedisAlertThrottle:
    """AlertThrottle: ``SET alert:throttle:{user_id} 1 NX EX period``; release deletes. A
    period of zero or less claims without storing anything. Raises KeyValueStoreUnavailable.
    ``prefix`` separates throttles that share a server (e.g. password-reset mails)."""

    def __init__(self, client: Redis, prefix: str = ALERT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix

    def key(self, user_id: str) -> str:
        return f"{self._prefix}{user_id}"

    async def try_claim(self, user_id: str, period_s: int) -> bool:
        if period_s <= 0:
            return True
        with unavailable_on_failure("alert throttle claim"):
            stored = await self._client.set(self.key(user_id), "1", nx=True, ex=period_s)
        return bool(stored)

    async def release(self, user_id: str) -> None:
        with unavailable_on_failure("alert throttle release"):
            await self._client.delete(self.key(user_id))
