"""Replay store, rate limiter, daily order counter, webhook admission and alert throttle on
Redis.

Keys, each in its user's hash-tag slot (the braces are literal: one script's keys must share
a slot on a Redis Cluster): ``webhook:replay:{user_id}:fingerprint`` (SET NX EX),
``ratelimit:{user_id}`` (a sorted set of admitted hits, microsecond scores from the server's
clock), ``orders:daily:{user_id}:yyyy-mm-dd`` (an integer created by ``seed`` with SET NX
EXAT, incremented by ``take``), ``alert:throttle:{user_id}`` (SET NX EX). Semantics match the
in-memory adapters: the limiter applies ``tradecore.limits.admit`` step for step inside one
script, and the webhook admission runs the replay check, that same step, the replay claim and
the daily count inside another.
"""

from __future__ import annotations

import logging
import math
import secrets
from datetime import date

from tradecore.limits import RATE_KEY_TTL_S
from tradecore.ports.protection import Admission, DailyCount, DailyQuota, RateDecision
from tradecore_adapters.redis.batching import shared_batcher
from tradecore_adapters.redis.client import Client
from tradecore_adapters.redis.errors import UNAVAILABLE, unavailable_on_failure

log = logging.getLogger(__name__)

REPLAY_PREFIX = "webhook:replay:"
RATE_PREFIX = "ratelimit:"
DAILY_PREFIX = "orders:daily:"
ALERT_PREFIX = "alert:throttle:"


def tagged(prefix: str, user_id: str) -> str:
    """``prefix{user_id}``: the user's hash tag, so all of one user's keys share a slot."""
    return f"{prefix}{{{user_id}}}"


def daily_key(user_id: str, day: date, prefix: str = DAILY_PREFIX) -> str:
    """The counter of ``user_id``'s orders on ``day`` (UTC)."""
    return f"{tagged(prefix, user_id)}:{day.isoformat()}"


class RedisReplayStore:
    """ReplayStore: ``SET webhook:replay:{user_id}:fingerprint 1 NX EX ttl`` (a TTL below one
    second is taken as one second); release deletes. Raises KeyValueStoreUnavailable."""

    def __init__(self, client: Client, prefix: str = REPLAY_PREFIX) -> None:
        self._client = client
        self._prefix = prefix

    def key(self, user_id: str, fingerprint: str) -> str:
        return f"{tagged(self._prefix, user_id)}:{fingerprint}"

    async def claim(self, user_id: str, fingerprint: str, ttl_s: int) -> bool:
        key = self.key(user_id, fingerprint)
        with unavailable_on_failure("replay claim"):
            stored = await self._client.set(key, "1", nx=True, ex=max(1, ttl_s))
        return bool(stored)

    async def release(self, user_id: str, fingerprint: str) -> None:
        with unavailable_on_failure("replay release"):
            await self._client.delete(self.key(user_id, fingerprint))


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

# The daily count, shared by the counter's script and the webhook admission's script. An
# absent counter is left absent (the caller seeds it from the order history); a negative cap
# is no cap. Returns 1 counted, 2 cap reached, 3 unseeded.
_DAILY = """
local function daily_take(key, cap)
  local n = tonumber(redis.call('GET', key))
  if n == nil then return 3 end
  if cap >= 0 and n >= cap then return 2 end
  redis.call('INCR', key)
  return 1
end
"""

# KEYS[1] the window; ARGV: limit, window (us), key TTL (ms), a unique member suffix.
_HIT = (
    _WINDOW
    + """
return rate_hit(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4])
"""
)

# KEYS[1] the daily counter; ARGV[1] the cap (negative: none).
_TAKE = (
    _DAILY
    + """
return daily_take(KEYS[1], tonumber(ARGV[1]))
"""
)

# KEYS[1] the daily counter: one order taken back, never below zero, never created.
_RELEASE = """
local n = tonumber(redis.call('GET', KEYS[1]))
if n ~= nil and n > 0 then
  redis.call('DECR', KEYS[1])
end
return 0
"""

# KEYS[1] the replay key, KEYS[2] the window, KEYS[3] (optional) the daily counter; ARGV[1..4]
# as for _HIT, ARGV[5] the replay TTL (s), ARGV[6] the daily cap (negative: none). A replay
# returns {0} and touches nothing else; an absent daily counter returns {2} and touches
# nothing; otherwise {1, allowed, remaining, retry_after_us, daily}, the replay key stored and
# the daily step run exactly when allowed (daily: 0 not run, else as daily_take answers).
_ADMIT = (
    _WINDOW
    + _DAILY
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
local counted = #KEYS > 2
if counted and redis.call('EXISTS', KEYS[3]) == 0 then
  return {2}
end
local rate = rate_hit(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4])
local daily = 0
if rate[1] == 1 then
  redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[5])
  if counted then daily = daily_take(KEYS[3], tonumber(ARGV[6])) end
end
return {1, rate[1], rate[2], rate[3], daily}
"""
)

_DAILY_ANSWERS = {1: DailyCount.COUNTED, 2: DailyCount.CAP_REACHED, 3: DailyCount.UNSEEDED}


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

    def __init__(self, client: Client, prefix: str = RATE_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._script = client.register_script(_HIT)

    def key(self, user_id: str) -> str:
        return tagged(self._prefix, user_id)

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


class RedisDailyOrderCounter:
    """DailyOrderCounter: ``orders:daily:{user_id}:yyyy-mm-dd``, an integer. ``take`` is one
    script (read, compare with the cap, INCR); ``seed`` is ``SET NX EXAT`` at the quota's
    expiry; ``release`` is one script (DECR when above zero). The day is the caller's, never
    the server's clock. ``take`` and ``seed`` raise KeyValueStoreUnavailable."""

    def __init__(self, client: Client, prefix: str = DAILY_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)

    def key(self, user_id: str, day: date) -> str:
        return daily_key(user_id, day, self._prefix)

    async def take(self, user_id: str, quota: DailyQuota) -> DailyCount:
        with unavailable_on_failure("daily count"):
            answer = await self._take(keys=[self.key(user_id, quota.day)], args=[_cap_arg(quota)])
        return _DAILY_ANSWERS[int(answer)]

    async def seed(self, user_id: str, quota: DailyQuota, count: int) -> bool:
        key = self.key(user_id, quota.day)
        with unavailable_on_failure("daily count seed"):
            stored = await self._client.set(
                key, max(0, count), nx=True, exat=math.ceil(quota.expires_at.timestamp())
            )
        return bool(stored)

    async def release(self, user_id: str, day: date) -> None:
        try:
            await self._release(keys=[self.key(user_id, day)], args=[])
        except UNAVAILABLE as e:
            log.warning("daily counter unavailable (%s); the order stays counted", e)
        except Exception:
            log.exception("daily counter failed; the order stays counted")


def _cap_arg(quota: DailyQuota) -> int:
    return -1 if quota.cap is None else max(0, quota.cap)


class RedisWebhookAdmission:
    """WebhookAdmission: one script, so one round trip, over the replay key, the window and
    (with a quota) the daily counter.

    The keys are those of RedisReplayStore, RedisRateLimiter and RedisDailyOrderCounter with
    the same prefixes, all in the user's hash-tag slot: ``RedisReplayStore.release`` frees a
    claim made here, and the dashboard's ``RedisRateLimiter.hit`` and
    ``RedisDailyOrderCounter.take`` count in the same window and counter. The script checks
    the replay key (a replay touches nothing else), then that the day's counter exists (an
    absent one touches nothing: the caller seeds it), runs the limiter's own window step
    (server clock, unique members, key TTL), and only when the hit was admitted stores the
    replay key (SET NX EX, a TTL below one second taken as one second) and counts the order
    against the cap. Raises KeyValueStoreUnavailable; it does not fail open.
    """

    def __init__(
        self,
        client: Client,
        replay_prefix: str = REPLAY_PREFIX,
        rate_prefix: str = RATE_PREFIX,
        daily_prefix: str = DAILY_PREFIX,
    ) -> None:
        self._replay_prefix = replay_prefix
        self._rate_prefix = rate_prefix
        self._daily_prefix = daily_prefix
        self._script = client.register_script(_ADMIT)
        self._batch = shared_batcher(client)  # shares pipelines with the order path's calls

    async def admit(
        self,
        fingerprint: str,
        ttl_s: int,
        user_id: str,
        limit: int,
        window_s: float,
        quota: DailyQuota | None = None,
    ) -> Admission:
        window_us, ttl_ms = _window_args(limit, window_s)
        keys = [
            f"{tagged(self._replay_prefix, user_id)}:{fingerprint}",
            tagged(self._rate_prefix, user_id),
        ]
        cap = -1
        if quota is not None:
            keys.append(daily_key(user_id, quota.day, self._daily_prefix))
            cap = _cap_arg(quota)
        args: list[str | int] = [limit, window_us, ttl_ms, secrets.token_hex(8), max(1, ttl_s), cap]
        with unavailable_on_failure("webhook admission"):
            answer = await self._batch.script(self._script, keys, args)
        if int(answer[0]) == 0:
            return Admission(fresh=False, rate=None)
        if int(answer[0]) == 2:
            return Admission(fresh=True, rate=None, daily=DailyCount.UNSEEDED)
        daily = int(answer[4])
        return Admission(
            fresh=True,
            rate=_decision(*answer[1:4]),
            daily=_DAILY_ANSWERS[daily] if daily else None,
        )


class RedisAlertThrottle:
    """AlertThrottle: ``SET alert:throttle:{user_id} 1 NX EX period``; release deletes. A
    period of zero or less claims without storing anything. Raises KeyValueStoreUnavailable.
    ``prefix`` separates throttles that share a server (e.g. password-reset mails)."""

    def __init__(self, client: Client, prefix: str = ALERT_PREFIX) -> None:
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
