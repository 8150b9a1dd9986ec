"""The per-user sliding-window rate limit and the plan rules (simulation only, daily caps).

``admit`` is the one definition of the sliding window: the in-memory limiter applies it and
the Redis script mirrors it step for step (drop entries at or before ``now - window``, count,
add ``now`` only when admitted, key TTL ``RATE_KEY_TTL_S``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta

import attrs

from tradecore.identity import Plan

RATE_LIMIT_PER_MINUTE = 60
RATE_WINDOW_S = 60
RATE_KEY_TTL_S = 65
DAILY_COUNT_GRACE_S = 3600
"""How long a day's order counter outlives the day: a request whose clock is a little behind
still finds its day's counter (a missing one would only be seeded again, never under-count)."""


@attrs.frozen
class WindowDecision:
    """The answer for one hit.

    ``kept`` is the window to store afterwards: the entries still inside it, plus ``now`` when
    the hit was admitted. ``retry_after_s`` (set only when refused) is the time until the oldest
    entry leaves the window.
    """

    allowed: bool
    remaining: int
    retry_after_s: float | None
    kept: tuple[float, ...]


def admit(
    window_entries: Sequence[float], now_s: float, limit: int, window_s: float
) -> WindowDecision:
    """Decide one hit at ``now_s`` against the admitted hits ``window_entries`` (seconds).

    Entries ``<= now_s - window_s`` have left the window. The hit is admitted when fewer than
    ``limit`` remain; a refused hit is not recorded. Over non-decreasing hit times, no interval
    of length ``window_s`` ever holds more than ``limit`` admitted hits.
    Raises ValueError on a negative limit, a non-positive window or a non-finite time.
    """
    if limit < 0:
        raise ValueError("limit must not be negative")
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError("window must be a positive number of seconds")
    if not math.isfinite(now_s):
        raise ValueError("time must be finite")
    cutoff = now_s - window_s
    inside = tuple(sorted(e for e in window_entries if e > cutoff))
    if len(inside) < limit:
        kept = (*inside, now_s)
        return WindowDecision(True, limit - len(kept), None, kept)
    retry_after = inside[0] - cutoff if inside else window_s
    return WindowDecision(False, 0, retry_after, inside)


# --- Plans ------------------------------------------------------------------------------------

_CAP_ENTRY = re.compile(r"([A-Za-z]+)\s*=\s*([0-9]{1,9})")


@attrs.frozen
class PlanCaps:
    """Daily order caps per plan (``PLAN_DAILY_ORDER_CAPS``, default ``free=100,pro=1000``)."""

    caps: tuple[tuple[Plan, int], ...]

    def cap(self, plan: Plan) -> int | None:
        for known, value in self.caps:
            if known is plan:
                return value
        return None

    @classmethod
    def parse(cls, text: str) -> PlanCaps:
        """Parse ``plan=count`` pairs separated by commas (spaces around them allowed).

        Every plan must appear exactly once (names are case-insensitive); counts are
        non-negative decimal integers. Raises ValueError naming the problem."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("plan caps: empty; expected e.g. 'free=100,pro=1000'")
        found: dict[Plan, int] = {}
        for raw in text.split(","):
            item = raw.strip()
            match = _CAP_ENTRY.fullmatch(item)
            if match is None:
                raise ValueError(f"plan caps: {item!r} is not of the form plan=count")
            name, count = match.group(1).lower(), match.group(2)
            try:
                plan = Plan(name)
            except ValueError:
                known = ", ".join(p.value for p in Plan)
                raise ValueError(f"plan caps: unknown plan {name!r} (known: {known})") from None
            if plan in found:
                raise ValueError(f"plan caps: plan {name!r} given twice")
            found[plan] = int(count)
        missing = [p.value for p in Plan if p not in found]
        if missing:
            raise ValueError(f"plan caps: no cap for plan(s) {', '.join(missing)}")
        return cls(tuple((p, found[p]) for p in Plan))

    def render(self) -> str:
        """The environment-variable form, e.g. ``free=100,pro=1000``."""
        return ",".join(f"{plan.value}={value}" for plan, value in self.caps)


def real_orders_allowed(plan: Plan) -> bool:
    """The free plan trades in simulation only."""
    return plan is not Plan.FREE


def daily_cap_reached(plan: Plan, orders_today: int, caps: PlanCaps) -> bool:
    """True when ``orders_today`` (orders since the start of the UTC day) leaves no room for
    one more. A plan without a cap is not capped."""
    cap = caps.cap(plan)
    return cap is not None and orders_today >= cap


def start_of_utc_day(now: datetime) -> datetime:
    """Midnight UTC of the day ``now`` falls on; ValueError for a naive datetime."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    utc = now.astimezone(UTC)
    return utc.replace(hour=0, minute=0, second=0, microsecond=0)


def utc_day(now: datetime) -> date:
    """The UTC calendar day ``now`` falls on (the day ``start_of_utc_day`` starts)."""
    return start_of_utc_day(now).date()


def daily_count_expiry(day: date) -> datetime:
    """When the order counter of ``day`` may go: the day's end plus ``DAILY_COUNT_GRACE_S``."""
    end = datetime.combine(day, time(), tzinfo=UTC) + timedelta(days=1)
    return end + timedelta(seconds=DAILY_COUNT_GRACE_S)
