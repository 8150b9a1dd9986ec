"""In-memory replay store, rate limiter, daily order counter, webhook admission and alert
throttle (one process, one event loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic with
respect to every other coroutine on the loop, as the Redis commands and scripts are. Time comes
from the injected Clock; expired entries behave as absent and are swept now and then so memory
stays bounded by the live keys.
"""

from __future__ import annotations

import heapq
import logging
import math
from datetime import date, datetime, timedelta

from tradecore.limits import RATE_KEY_TTL_S, admit
from tradecore.ports.protection import Admission, DailyCount, DailyQuota, RateDecision
from tradecore.ports.runtime import Clock

log = logging.getLogger(__name__)

_SWEEP_EVERY = 1024


class _ExpiringKeys:
    """Keys with an expiry time; a key at or past its expiry is absent. Expired keys leave as
    time passes, in expiry order (a heap), so no write pays for a scan of every key."""

    def __init__(self) -> None:
        self._expiry: dict[str, datetime] = {}
        self._due: list[tuple[datetime, str]] = []  # (expiry, key), one entry per set

    def live(self, key: str, now: datetime) -> bool:
        expiry = self._expiry.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self._expiry[key]
            return False
        return True

    def set(self, key: str, now: datetime, ttl_s: float) -> None:
        expiry = now + timedelta(seconds=ttl_s)
        self._expiry[key] = expiry
        heapq.heappush(self._due, (expiry, key))
        self._drop_expired(now)

    def delete(self, key: str) -> None:
        self._expiry.pop(key, None)

    def _drop_expired(self, now: datetime) -> None:
        due = self._due
        while due and due[0][0] <= now:
            expiry, key = heapq.heappop(due)
            if self._expiry.get(key) == expiry:  # else set again since, with a later expiry
                del self._expiry[key]

    def __len__(self) -> int:
        return len(self._expiry)


class MemoryReplayStore:
    """ReplayStore: SET NX with a TTL. A TTL below one second is taken as one second. The key
    of a claim is ``key(user_id, fingerprint)``."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._keys = _ExpiringKeys()

    @staticmethod
    def key(user_id: str, fingerprint: str) -> str:
        return f"{user_id}:{fingerprint}"

    async def claim(self, user_id: str, fingerprint: str, ttl_s: int) -> bool:
        return self.claim_at(self._clock.now(), self.key(user_id, fingerprint), ttl_s)

    def now(self) -> datetime:
        """The time by this store's clock (MemoryWebhookAdmission reads it once per step)."""
        return self._clock.now()

    def held(self, key: str, now: datetime | None = None) -> bool:
        """True while ``key`` is claimed at ``now`` (default: the clock's time); synchronous,
        for MemoryWebhookAdmission."""
        return self._keys.live(key, self._clock.now() if now is None else now)

    def claim_at(self, now: datetime, key: str, ttl_s: int) -> bool:
        """``claim`` of ``key`` at ``now``, without a suspension point (for
        MemoryWebhookAdmission)."""
        if self._keys.live(key, now):
            return False
        self._keys.set(key, now, max(1, ttl_s))
        return True

    async def release(self, user_id: str, fingerprint: str) -> None:
        self._keys.delete(self.key(user_id, fingerprint))


class MemoryRateLimiter:
    """RateLimiter: ``tradecore.limits.admit`` per user; a user's window is dropped once it
    has been idle for the key TTL (``RATE_KEY_TTL_S``, or the window plus 5 s if longer).
    Fails open: any error answers allowed."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._windows: dict[str, tuple[tuple[float, ...], float]] = {}  # entries, expires at
        self._hits = 0

    async def hit(self, user_id: str, limit: int, window_s: float) -> RateDecision:
        try:
            return self.hit_at(self._clock.now(), user_id, limit, window_s)
        except Exception:
            log.exception("rate limiter failed; admitting the request (fail open)")
            return RateDecision(True, max(limit - 1, 0), None)

    def hit_at(self, now: datetime, user_id: str, limit: int, window_s: float) -> RateDecision:
        """``hit`` at ``now``, without a suspension point and without failing open: raises
        ValueError on a negative limit or a non-positive window (for MemoryWebhookAdmission)."""
        now_s = now.timestamp()
        entries, expires_at = self._windows.get(user_id, ((), now_s))
        if expires_at <= now_s:
            entries = ()
        decision = admit(entries, now_s, limit, window_s)
        if decision.allowed:
            ttl = max(float(RATE_KEY_TTL_S), window_s + 5)
            self._windows[user_id] = (decision.kept, now_s + ttl)
        self._sweep(now_s)
        return RateDecision(decision.allowed, decision.remaining, decision.retry_after_s)

    async def release(self, user_id: str) -> None:
        window = self._windows.get(user_id)
        if window is not None and window[0]:
            self._windows[user_id] = (window[0][:-1], window[1])

    def _sweep(self, now_s: float) -> None:
        self._hits += 1
        if self._hits % _SWEEP_EVERY == 0:
            self._windows = {u: w for u, w in self._windows.items() if w[1] > now_s}


class MemoryDailyOrderCounter:
    """DailyOrderCounter: one integer per user and day, created only by ``seed`` and gone
    at the quota's ``expires_at`` (by the clock). ``forget`` drops every counter, as a
    flushed or failed-over Redis would (the next take answers UNSEEDED)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._counts: dict[tuple[str, date], tuple[int, datetime]] = {}  # count, expires at
        self._takes = 0

    async def take(self, user_id: str, quota: DailyQuota) -> DailyCount:
        return self.take_at(self._clock.now(), user_id, quota)

    def exists(self, now: datetime, user_id: str, day: date) -> bool:
        """True while the day's counter lives (synchronous, for MemoryWebhookAdmission)."""
        return self._live(now, (user_id, day)) is not None

    def take_at(self, now: datetime, user_id: str, quota: DailyQuota) -> DailyCount:
        """``take`` at ``now``, without a suspension point (for MemoryWebhookAdmission)."""
        key = (user_id, quota.day)
        live = self._live(now, key)
        self._sweep(now)
        if live is None:
            return DailyCount.UNSEEDED
        count, expires_at = live
        if quota.cap is not None and count >= quota.cap:
            return DailyCount.CAP_REACHED
        self._counts[key] = (count + 1, expires_at)
        return DailyCount.COUNTED

    async def seed(self, user_id: str, quota: DailyQuota, count: int) -> bool:
        key = (user_id, quota.day)
        if self._live(self._clock.now(), key) is not None:
            return False
        self._counts[key] = (max(0, count), quota.expires_at)
        return True

    async def release(self, user_id: str, day: date) -> None:
        key = (user_id, day)
        live = self._live(self._clock.now(), key)
        if live is not None and live[0] > 0:
            self._counts[key] = (live[0] - 1, live[1])

    def forget(self) -> None:
        """Lose every counter (tests: the store's data was lost)."""
        self._counts.clear()

    def _live(self, now: datetime, key: tuple[str, date]) -> tuple[int, datetime] | None:
        entry = self._counts.get(key)
        if entry is not None and entry[1] <= now:
            del self._counts[key]
            return None
        return entry

    def _sweep(self, now: datetime) -> None:
        self._takes += 1
        if self._takes % _SWEEP_EVERY == 0:
            self._counts = {k: v for k, v in self._counts.items() if v[1] > now}


class MemoryWebhookAdmission:
    """WebhookAdmission over a MemoryReplayStore, a MemoryRateLimiter and a
    MemoryDailyOrderCounter: the replay check, the counter's presence, the hit, the claim and
    the daily count run back to back with no ``await`` between them, so the step is atomic on
    the loop; a claim made here is released by ``replay.release``, a hit counts in the same
    window as ``limiter.hit`` and an order in the same counter as ``daily.take``. The step
    reads the time once, from the replay store's clock (build all three on one clock). Does
    not fail open."""

    def __init__(
        self,
        replay: MemoryReplayStore,
        limiter: MemoryRateLimiter,
        daily: MemoryDailyOrderCounter,
    ) -> None:
        self._replay = replay
        self._limiter = limiter
        self._daily = daily

    async def admit(
        self,
        fingerprint: str,
        ttl_s: int,
        user_id: str,
        limit: int,
        window_s: float,
        quota: DailyQuota | None = None,
    ) -> Admission:
        if limit < 0 or not (math.isfinite(window_s) and window_s > 0):
            raise ValueError("limit must not be negative and window must be positive")
        now = self._replay.now()
        key = self._replay.key(user_id, fingerprint)
        if self._replay.held(key, now):
            return Admission(fresh=False, rate=None)
        if quota is not None and not self._daily.exists(now, user_id, quota.day):
            return Admission(fresh=True, rate=None, daily=DailyCount.UNSEEDED)
        rate = self._limiter.hit_at(now, user_id, limit, window_s)
        daily = None
        if rate.allowed:
            self._replay.claim_at(now, key, ttl_s)
            if quota is not None:
                daily = self._daily.take_at(now, user_id, quota)
        return Admission(fresh=True, rate=rate, daily=daily)


class MemoryAlertThrottle:
    """AlertThrottle: one slot per user that lasts ``period_s`` from its claim."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._slots = _ExpiringKeys()

    async def try_claim(self, user_id: str, period_s: int) -> bool:
        now = self._clock.now()
        if self._slots.live(user_id, now):
            return False
        self._slots.set(user_id, now, period_s)
        return True

    async def release(self, user_id: str) -> None:
        self._slots.delete(user_id)
