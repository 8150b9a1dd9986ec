"""The per-user limit on reading the order history (``GET /trading/orders`` and
``GET /trading/orders/{id}``).

Reads count in a bucket of their own (``read:{user_id}``), so following the history never
spends the order budget (``RATE_LIMIT_PER_MINUTE``), and placing orders never starves the
history. ``READS_PER_MINUTE`` (120) is four clients polling every 2 s (30 a minute each); a
script hammering the history gets 429 with ``Retry-After``. (The dashboard's pages read the
history through their own routes, not these.) The limiter
fails open, as for orders: a key-value store outage never blocks reading one's own history.
"""

from __future__ import annotations

from tradecore.ports.protection import RateLimiter
from tradecore.services.vocabulary import Rejected

READS_PER_MINUTE = 120
READ_WINDOW_S = 60.0


class HistoryReads:
    """Counts one history read of a user against ``READS_PER_MINUTE``."""

    def __init__(self, limiter: RateLimiter, per_minute: int = READS_PER_MINUTE) -> None:
        self._limiter = limiter
        self._per_minute = per_minute

    async def admit(self, user_id: str) -> Rejected | None:
        """None when the read may go ahead, else 429 with the time to wait."""
        decision = await self._limiter.hit(f"read:{user_id}", self._per_minute, READ_WINDOW_S)
        if decision.allowed:
            return None
        return Rejected(429, "rate_limited", "Too many history reads", decision.retry_after_s)
