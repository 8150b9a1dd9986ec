"""Short-lived protective state kept in the key-value store."""

from __future__ import annotations

import enum
from datetime import date, datetime
from typing import Protocol, runtime_checkable

import attrs


@runtime_checkable
class ReplayStore(Protocol):
    """Replay fingerprints, one key per user and fingerprint (``webhook:replay:{user_id}:hash``
    on Redis: the user's hash tag, so the admission script's keys share one cluster slot)."""

    async def claim(self, user_id: str, fingerprint: str, ttl_s: int) -> bool:
        """Store the key if absent (SET NX with TTL): True when stored, False when it existed.
        Raises KeyValueStoreUnavailable."""
        ...

    async def release(self, user_id: str, fingerprint: str) -> None:
        """Delete the key (the request it guarded was not made durable). Idempotent."""
        ...


@attrs.frozen
class RateDecision:
    """A rate-limiter answer. ``retry_after_s`` is set when not allowed."""

    allowed: bool
    remaining: int
    retry_after_s: float | None = None


@runtime_checkable
class RateLimiter(Protocol):
    """The per-user sliding window on the sorted set ``ratelimit:{user_id}`` (and the
    identity flows' windows, whose keys name a client address or a digest of an account)."""

    async def hit(self, user_id: str, limit: int, window_s: float) -> RateDecision:
        """Count one request and say whether it is admitted. Atomic: of N concurrent hits on an
        empty window exactly ``limit`` are admitted. A rejected hit is not counted. Fails open:
        on a store error it answers allowed."""
        ...

    async def release(self, user_id: str) -> None:
        """Take back the newest admitted hit of the window, if any: an attempt counted by
        ``hit`` that turned out not to count (a login that succeeded). Never raises: on a
        store error the hit stays counted (logged)."""
        ...


@attrs.frozen
class DailyQuota:
    """One order's claim on its user's daily order cap.

    ``day`` is the UTC day the order's ``created_at`` falls on (the caller's clock decides it,
    never the store's, so the count and ``OrderHistory.count_since`` agree on the day);
    ``cap`` is the plan's cap (None: the order is counted and never refused); the day's
    counter lives until ``expires_at`` (past the day's end, ``tradecore.limits``).
    """

    day: date
    cap: int | None
    expires_at: datetime


class DailyCount(enum.Enum):
    """The daily counter's answer for one order."""

    COUNTED = "counted"
    """There was room: the order took a slot (release it if no order row is written)."""
    CAP_REACHED = "cap_reached"
    """The day's count is at the cap: nothing was counted."""
    UNSEEDED = "unseeded"
    """The day's counter does not exist (a new day, or the store lost it): nothing was counted
    or stored; seed it from the order history (``DailyOrderCounter.seed``) and ask again."""


@runtime_checkable
class DailyOrderCounter(Protocol):
    """Each user's orders of one UTC day (``orders:daily:{user_id}:yyyy-mm-dd`` on Redis): a
    count of the rows ``OrderHistory.count_since(user, start of the day)`` counts, kept in the
    key-value store so the cap costs no database read per order."""

    async def take(self, user_id: str, quota: DailyQuota) -> DailyCount:
        """Atomically: UNSEEDED when the day's counter is absent (nothing stored); COUNTED
        (the counter incremented) when it is below the cap; else CAP_REACHED. Of N concurrent
        takes with room for k, exactly k are COUNTED. Raises KeyValueStoreUnavailable."""
        ...

    async def seed(self, user_id: str, quota: DailyQuota, count: int) -> bool:
        """Create the day's counter at ``count`` (living until ``quota.expires_at``) unless it
        exists (SET NX): True when this call created it. Raises KeyValueStoreUnavailable."""
        ...

    async def release(self, user_id: str, day: date) -> None:
        """Take back one COUNTED order that wrote no order row (a later check refused it).
        Never below zero, never creates the counter. Never raises: on a store error the order
        stays counted (an over-count refuses early; it never lets an order past the cap)."""
        ...


@attrs.frozen
class Admission:
    """The webhook's replay claim, rate-limit hit and daily count, decided together.

    ``fresh`` is False for a replay (the fingerprint was already claimed); ``rate`` is then
    None, because nothing else was looked at. Otherwise ``rate`` is the limiter's decision, and
    the fingerprint was claimed exactly when that decision admitted the request (``claimed``).
    ``daily`` is the daily counter's answer for an admitted request when a quota was given
    (None otherwise: a replay, a rate refusal, or no quota). When it is ``UNSEEDED`` nothing at
    all was stored or counted (``rate`` is None): seed the counter and admit again.
    """

    fresh: bool
    rate: RateDecision | None
    daily: DailyCount | None = None

    @property
    def claimed(self) -> bool:
        """True when this call stored the fingerprint (release it if the request fails)."""
        return self.fresh and self.rate is not None and self.rate.allowed

    @property
    def unseeded(self) -> bool:
        """True when the daily counter must be seeded before the request can be decided."""
        return self.daily is DailyCount.UNSEEDED


@runtime_checkable
class WebhookAdmission(Protocol):
    """Layer 4 (replay), the per-user rate limit and the daily count of the webhook path, as
    one atomic step over the keys of ``ReplayStore``, ``RateLimiter`` and
    ``DailyOrderCounter`` (so ``ReplayStore.release`` frees a claim made here, and the webhook
    and dashboard paths share one rate window and one daily count)."""

    async def admit(
        self,
        fingerprint: str,
        ttl_s: int,
        user_id: str,
        limit: int,
        window_s: float,
        quota: DailyQuota | None = None,
    ) -> Admission:
        """In this order: a fingerprint already claimed is a replay, and nothing is counted or
        stored; with a ``quota`` whose day's counter is absent, the answer is ``UNSEEDED`` and
        nothing is counted or stored; otherwise the request is counted as ``RateLimiter.hit``
        counts it; only when the limiter admitted it is the fingerprint claimed as
        ``ReplayStore.claim`` claims it and (with a quota) the order counted as
        ``DailyOrderCounter.take`` counts it. So a replay spends no rate-limit slot and a
        rate-refused request spends no replay key and no daily slot. Raises
        KeyValueStoreUnavailable (it does not fail open: the replay check cannot be skipped)
        and ValueError for a negative limit or a non-positive window."""
        ...


@runtime_checkable
class AlertThrottle(Protocol):
    """At most one attack e-mail per user per period."""

    async def try_claim(self, user_id: str, period_s: int) -> bool:
        """Atomically claim the user's slot: True if none was claimed within ``period_s``."""
        ...

    async def release(self, user_id: str) -> None:
        """Give the slot back (the mail was not handed to the server)."""
        ...
