"""Short-lived protective state kept in the key-value store."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs


@runtime_checkable
class ReplayStore(Protocol):
    """Replay fingerprints under ``webhook:replay:{hash}``."""

    async def claim(self, fingerprint: str, ttl_s: int) -> bool:
        """Store the key if absent (SET NX with TTL): True when stored, False when it existed.
        Raises KeyValueStoreUnavailable."""
        ...

    async def release(self, fingerprint: str) -> None:
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
class Admission:
    """The webhook's replay claim and rate-limit hit, decided together.

    ``fresh`` is False for a replay (the fingerprint was already claimed); ``rate`` is then
    None, because nothing else was looked at. Otherwise ``rate`` is the limiter's decision, and
    the fingerprint was claimed exactly when that decision admitted the request (``claimed``).
    """

    fresh: bool
    rate: RateDecision | None

    @property
    def claimed(self) -> bool:
        """True when this call stored the fingerprint (release it if the request fails)."""
        return self.fresh and self.rate is not None and self.rate.allowed


@runtime_checkable
class WebhookAdmission(Protocol):
    """Layer 4 (replay) and the per-user rate limit of the webhook path, as one atomic step
    over the keys of ``ReplayStore`` and ``RateLimiter`` (so ``ReplayStore.release`` frees a
    claim made here, and the webhook and dashboard paths share one rate window)."""

    async def admit(
        self, fingerprint: str, ttl_s: int, user_id: str, limit: int, window_s: float
    ) -> Admission:
        """In this order: a fingerprint already claimed is a replay, and nothing is counted or
        stored; otherwise the request is counted as ``RateLimiter.hit`` counts it; only when
        the limiter admitted it is the fingerprint claimed as ``ReplayStore.claim`` claims it.
        So a replay spends no rate-limit slot and a refused request spends no replay key.
        Raises KeyValueStoreUnavailable (it does not fail open: the replay check cannot be
        skipped) and ValueError for a negative limit or a non-positive window."""
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
