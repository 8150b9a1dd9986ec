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
    """The per-user sliding window on the sorted set ``ratelimit:{user_id}``."""

    async def hit(self, user_id: str, limit: int, window_s: float) -> RateDecision:
        """Count one request and say whether it is admitted. Atomic: of N concurrent hits on an
        empty window exactly ``limit`` are admitted. A rejected hit is not counted. Fails open:
        on a store error it answers allowed."""
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
