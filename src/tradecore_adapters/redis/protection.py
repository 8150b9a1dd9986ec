"""Replay store, rate limiter, webhook admission and alert throttle on Redis.

Keys: ``webhook:replay:{fingerprint}`` (SET NX EX), ``ratelimit:{user_id}`` (a sorted set of
admitted hits, microsecond scores from the server's clock), ``alert:throttle:{user_id}``
(SET NX EX). Semantics match the in-memory adapters: the limiter applies
``tradecore.limits.admit`` step for step inside one script, and the webhook admission runs
the replay check, that same step and the replay claim inside another.
"""

from __future__ import annotations

import logging
import math
import secrets

from redis.asyncio import Redis

from tradecore.limits import RATE_KEY_TTL_S
from tradecore.ports.protection import Admission, RateDecision
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


# The sliding window, shared by the limiter's script and the webhook admission's script.
# Mirrors tradecore.limits.admit: entries at or before now - window leave; the hit is added
# (and the key's TTL set) only when admitted. Returns {allowed, remaining, retry_after_us}.
_WINDOW = """
local function rate_hit(key, limit, window, ttl_ms, suffix)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cutoff = now - window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', cutoff))
  local count = redis.call('ZCARD', key)
  if count < limit then
    local stamp = string.format('%.0f', now)
    redis.call('ZADD', key, stamp, stamp .. '-' .. suffix)
    redis.call('PEXPIRE', key, ttl_ms)
    return {1, limit - count - 1, 0}
  end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local retry = window
  if oldest[2] then retry = tonumber(oldest[2]) - cutoff end
  return {0, 0, string.format('%.0f', retry)}
end
"""

# KEYS[1] the window; ARGV: limit, window (us), key TTL (ms), a unique member suffix.
_HIT = (
    _WINDOW
    + """
return rate_hit(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4])
"""
)

# KEYS[1] the replay key, KEYS[2] the window; ARGV[1..4] as for _HIT, ARGV[5] the replay TTL
# (s). A replay returns {0} and touches nothing else; otherwise {1, allowed, remaining,
# retry_after_us}, and the replay key was stored exactly when allowed.
_ADMIT = (
    _WINDOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
local rate = rate_hit(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4])
if rate[1] == 1 then
  redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[5])
end
return {1, rate[1], rate[2], rate[3]}
"""
)


def _window_args(limit: int, window_s: float) -> tuple[int, int]:
    """The window in microseconds and the key's TTL in milliseconds (the TTL is
    ``RATE_KEY_TTL_S``, or the window plus 5 s if longer). Raises ValueError."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError("window must be a positive number of seconds")
    window_us = max(1, round(window_s * 1_000_000))
    ttl_ms = round(max(float(RATE_KEY_TTL_S), window_s + 5) * 1000)
    return window_us, ttl_ms


_Reply = int | str | bytes


def _decision(allowed: _Reply, remaining: _Reply, retry_us: _Reply) -> RateDecision:
    """The limiter's answer from the window step's reply."""
    if int(allowed):
        return RateDecision(True, int(remaining), None)
    return RateDecision(False, 0, int(retry_us) / 1_000_000)


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
            window_us, ttl_ms = _window_args(limit, window_s)
            allowed, remaining, retry_us = await self._script(
                keys=[self.key(user_id)],
                args=[limit, window_us, ttl_ms, secrets.token_hex(8)],
            )
            return _decision(allowed, remaining, retry_us)
        except UNAVAILABLE as e:
            log.warning("rate limiter unavailable (%s); admitting the request (fail open)", e)
        except Exception:
            log.exception("rate limiter failed; admitting the request (fail open)")
        return RateDecision(True, max(limit - 1, 0), None)

    async def release(self, user_id: str) -> None:
        """``ZPOPMAX``: the newest hit leaves (members are ordered by their time)."""
        try:
            await self._client.zpopmax(self.key(user_id))
        except UNAVAILABLE as e:
            log.warning("rate limiter unavailable (%s); the hit stays counted", e)
        except Exception:
            log.exception("rate limiter failed; the hit stays counted")


class RedisWebhookAdmission:
    """WebhookAdmission: one script, so one round trip, over the replay key and the window.

    The keys are those of RedisReplayStore and RedisRateLimiter with the same prefixes
    (``webhook:replay:{fingerprint}``, ``ratelimit:{user_id}``): ``RedisReplayStore.release``
    frees a claim made here, and the dashboard's ``RedisRateLimiter.hit`` counts in the same
    window. The script checks the replay key (a replay touches nothing else), runs the
    limiter's own window step (server clock, unique members, key TTL), and stores the replay
    key (SET NX EX, a TTL below one second taken as one second) only when the hit was
    admitted. Raises KeyValueStoreUnavailable; it does not fail open.

    Both keys are passed as KEYS, so the script is correct on one server; on a Redis Cluster
    both names would also need a shared hash tag to land in one slot.
    """

    def __init__(
        self, client: Redis, replay_prefix: str = REPLAY_PREFIX, rate_prefix: str = RATE_PREFIX
    ) -> None:
        self._replay_prefix = replay_prefix
        self._rate_prefix = rate_prefix
        self._script = client.register_script(_ADMIT)

    async def admit(
        self, fingerprint: str, ttl_s: int, user_id: str, limit: int, window_s: float
    ) -> Admission:
        window_us, ttl_ms = _window_args(limit, window_s)
        with unavailable_on_failure("webhook admission"):
            answer = await self._script(
                keys=[f"{self._replay_prefix}{fingerprint}", f"{self._rate_prefix}{user_id}"],
                args=[limit, window_us, ttl_ms, secrets.token_hex(8), max(1, ttl_s)],
            )
        if not int(answer[0]):
            return Admission(fresh=False, rate=None)
        return Admission(fresh=True, rate=_decision(*answer[1:]))


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
