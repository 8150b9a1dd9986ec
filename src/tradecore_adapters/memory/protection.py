"""In-memory replay store, rate limiter, webhook admission and alert throttle (one process,
one event loop).

Each operation runs without an ``await`` between its read and its write, so it is atomic with
respect to every other coroutine on the loop, as the Redis commands and scripts are. Time comes
from the injected Clock; expired entries behave as absent and are swept now and then so memory
stays bounded by the live keys.
"""

from __future__ import annotations

import heapq
import logging
from datetime import datetime, timedelta

from tradecore.limits import RATE_KEY_TTL_S, admit
from tradecore.ports.protection import Admission, RateDecision
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
    """ReplayStore: SET NX with a TTL. A TTL below one second is taken as one second."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._keys = _ExpiringKeys()

    async def claim(self, fingerprint: str, ttl_s: int) -> bool:
        return self.claim_at(self._clock.now(), fingerprint, ttl_s)

    def now(self) -> datetime:
        """The time by this store's clock (MemoryWebhookAdmission reads it once per step)."""
        return self._clock.now()

    def held(self, fingerprint: str, now: datetime | None = None) -> bool:
        """True while the fingerprint is claimed at ``now`` (default: the clock's time);
        synchronous, for MemoryWebhookAdmission."""
        return self._keys.live(fingerprint, self._clock.now() if now is None else now)

    def claim_at(self, now: datetime, fingerprint: str, ttl_s: int) -> bool:
        """``claim`` at ``now``, without a suspension point (for MemoryWebhookAdmission)."""
        if self._keys.live(fingerprint, now):
            return False
        self._keys.set(fingerprint, now, max(1, ttl_s))
        return True

    async def release(self, fingerprint: str) -> None:
        self._keys.delete(fingerprint)


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


class MemoryWebhookAdmission:
    """WebhookAdmission over a MemoryReplayStore and a MemoryRateLimiter: the replay check, the
    hit and the claim run back to back with no ``await`` between them, so the step is atomic on
    the loop; a claim made here is released by ``replay.release`` and a hit counts in the same
    window as ``limiter.hit``. The step reads the time once, from the replay store's clock
    (build both on one clock). Does not fail open."""

    def __init__(self, replay: MemoryReplayStore, limiter: MemoryRateLimiter) -> None:
        self._replay = replay
        self._limiter = limiter

    async def admit(
        self, fingerprint: str, ttl_s: int, user_id: str, limit: int, window_s: float
    ) -> Admission:
        now = self._replay.now()
        if self._replay.held(fingerprint, now):
            return Admission(fresh=False, rate=None)
        rate = self._limiter.hit_at(now, user_id, limit, window_s)
        if rate.allowed:
            self._replay.claim_at(now, fingerprint, ttl_s)
        return Admission(fresh=True, rate=rate)


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
